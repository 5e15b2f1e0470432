"""Sweep grids: YAML (policies x params x block lengths x steps x tasks) -> decoding configs.

Grid file (every key optional except ``sweeps``)::

    model: tiny-llada              # the CLI's --model wins
    tokenizer: null                # default: the model directory
    source: official               # "official" (data: dir) or "generated" (clean-room sets)
    data: /path/to/output/test     # released ParallelBench tree (official source)
    num_samples: 100               # generated source: records per task
    data_seed: 0                   # generated source: seed (held-out "test" split)
    icl_examples: 1                # generated source: demonstrations per prompt (released: 1)
    tasks: [waiting_line, puzzle/sudoku_n4_12]   # ids, categories, or "benchmark" (the 17)
    limit: 20                      # first N docs per task
    batch_size: 1
    warmup: 0                      # discarded decode calls before each config's first batch
    sweeps:
      - policy: [low_confidence, random]
        tokens_per_step: [1, 2, 4] # k: steps = gen_length / k  (or give steps: [...])
        block_length: [full, 8]    # "full" = gen_length
      - policy: threshold
        params: {tau: [0.7, 0.9]}  # lists are crossed, scalars fixed
        block_length: full
      - policy: threshold          # composed: selector + stopper + truncator
        stopper: sched             # a name (sched, prophet) or an import path
        truncator: eotp            # a name (eotp, eos_cut) or an import path
        params: {tau: 0.9, stopper.tau_low: [2.0, 2.5]}   # stopper.* / truncator.* address parts
      - policy: my_pkg.rules:TopTwo   # a user class by import path (or file.py:Class)

``policy``, ``stopper`` and ``truncator`` may be lists (crossed); ``policy: default`` is the
model family's preset with its parameters and cache (``policies.defaults``; resolved by the
runner once the model is loaded, recorded as ``default``). Per sweep also: ``cache``
(default ``none``), ``temperature`` (0.0), ``seed`` (0), ``gen_length`` (``auto`` = the task's
max_tokens, or an int). ``block_length: model`` is the model's own block size (block
diffusion: LLaDA2, Fast-dLLM v2, SDAR) or canvas length (DiffusionGemma), for any
``gen_length``; those models refuse ``full``. A config is skipped (and reported) when ``k``
does not divide ``gen_length``, a numeric block length does not divide it, or ``steps`` is
not a positive multiple of the block count (the v1 validity rules).

``tokens_per_step`` sets the step count; the per-step budget rule is the model family's (a
Dream model uses Dream's time grid, which at ``steps = G`` commits no token in the first step
and two in the last, as Dream's own sampler does). ``params`` may also set ``SamplerConfig``
fields, e.g. ``params: {schedule: llada}`` for exactly ``k`` per step on any family.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from dllm_decode.eval.parallelbench.tasks import BENCHMARK_TASKS, TASK_SPECS, task_spec
from dllm_decode.policies.import_path import is_import_path
from dllm_decode.policies.resolve import STOPPERS, TRUNCATORS, split_params

SOURCES: Final[tuple[str, ...]] = ("official", "generated")
_GRID_KEYS: Final[frozenset[str]] = frozenset(
    {"model", "tokenizer", "source", "data", "num_samples", "data_seed", "icl_examples",
     "tasks", "limit",
     "batch_size", "warmup", "sweeps"}
)  # fmt: skip
_SWEEP_KEYS: Final[frozenset[str]] = frozenset(
    {"policy", "stopper", "truncator", "params", "block_length", "steps", "tokens_per_step",
     "cache", "temperature", "seed", "gen_length"}
)  # fmt: skip
#: Characters of the sha256 hex digest kept as a config id.
HASH_CHARS: Final[int] = 16
#: ``block_length`` value: the model's own block size (block diffusion) or canvas length
#: (uniform noise); recorded as ``null``
MODEL_BLOCK: Final = "model"


@dataclass(frozen=True)
class DecodeConfig:
    """One decoding configuration (everything that changes the generations of a model)."""

    model: str
    policy: str
    params: tuple[tuple[str, Any], ...] = ()
    cache: str = "none"
    gen_length: int = 32
    block_length: int | None = None
    steps: int | None = None
    temperature: float = 0.0
    seed: int = 0
    stopper: str | None = None
    truncator: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``params`` as a mapping), the row's ``config`` field.

        ``stopper`` / ``truncator`` appear only when set, so configs without them keep the
        hash they had before composition existed.
        """
        out = asdict(self)
        out["params"] = dict(self.params)
        for part in ("stopper", "truncator"):
            if out[part] is None:
                del out[part]
        return out

    @property
    def config_hash(self) -> str:
        """Stable id of the config (sha256 of its canonical JSON)."""
        canonical = json.dumps(self.as_dict(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_CHARS]

    @property
    def tokens_per_step(self) -> float | None:
        """``gen_length / steps`` for fixed schedules; ``None`` for adaptive ones."""
        return None if self.steps is None else self.gen_length / self.steps


@dataclass(frozen=True)
class Sweep:
    """One cartesian sweep of a grid (see the module docstring)."""

    policy: tuple[str, ...]
    params: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    stopper: tuple[str | None, ...] = (None,)
    truncator: tuple[str | None, ...] = (None,)
    block_length: tuple[int | str | None, ...] = ("full",)
    steps: tuple[int | None, ...] = (None,)
    tokens_per_step: tuple[int, ...] | None = None
    cache: tuple[str, ...] = ("none",)
    temperature: tuple[float, ...] = (0.0,)
    seed: tuple[int, ...] = (0,)
    gen_length: tuple[int | str, ...] = ("auto",)


@dataclass(frozen=True)
class Grid:
    """A parsed grid file."""

    sweeps: tuple[Sweep, ...]
    tasks: tuple[str, ...] = BENCHMARK_TASKS
    model: str | None = None
    tokenizer: str | None = None
    source: str = "official"
    data: str | None = None
    num_samples: int = 100
    data_seed: int = 0
    icl_examples: int = 1
    limit: int | None = None
    batch_size: int = 1
    warmup: int = 0
    skipped: list[str] = field(default_factory=list, compare=False)


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, list | tuple) else (value,)


def _expand_tasks(names: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for name in names:
        name = str(name)
        if name == "benchmark":
            out.extend(BENCHMARK_TASKS)
        elif "/" in name:
            try:
                task_spec(name)  # validates
            except KeyError:
                raise ValueError(_unknown_task(name)) from None
            out.append(name)
        else:
            members = [t for t in TASK_SPECS if t.split("/")[0] == name]
            if not members:
                raise ValueError(_unknown_task(name))
            out.extend(members)
    return tuple(dict.fromkeys(out))


def _unknown_task(name: str) -> str:
    categories = sorted({t.split("/")[0] for t in TASK_SPECS})
    valid = ["benchmark", *categories, *sorted(TASK_SPECS)]
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"grid: unknown task or category {name!r}{hint}; valid: 'benchmark', categories "
            f"{categories}, task ids {sorted(TASK_SPECS)}, or the puzzle variants "
            "'puzzle/sudoku_n4_<givens>' / 'puzzle/latin_square_n<size>'")


def _parse_sweep(raw: Mapping[str, Any], where: str) -> Sweep:
    unknown = set(raw) - _SWEEP_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; valid: {sorted(_SWEEP_KEYS)}")
    if "policy" not in raw:
        raise ValueError(f"{where}: every sweep needs a policy")
    if "steps" in raw and "tokens_per_step" in raw:
        raise ValueError(f"{where}: give steps or tokens_per_step, not both")
    params = raw.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}: params must be a mapping of name -> value(s)")
    try:
        parts = split_params(params)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    for role, table in (("stopper", STOPPERS), ("truncator", TRUNCATORS)):
        specs = _as_tuple(raw.get(role))
        if parts[role] and None in specs:
            raise ValueError(f"{where}: {role}.* parameters given without a {role}")
        bad = [s for s in specs if s is not None and not is_import_path(s) and s not in table]
        if bad:
            raise ValueError(f"{where}: unknown {role} {bad}; valid: {sorted(table)} or an "
                             "import path 'package.module:ClassName'")
    clash = sorted(set(map(str, params)) & _SWEEP_KEYS)
    if clash:
        raise ValueError(f"{where}: params {clash} are sweep keys (the runner sets them for "
                         f"every config); give them beside 'params', not inside it")
    _check_sweep_params(raw, params, where)
    fields_ = {key: _as_tuple(raw[key]) for key in raw if key not in ("policy", "params")}
    return Sweep(
        policy=_as_tuple(raw["policy"]),
        params=tuple(sorted((str(k), _as_tuple(v)) for k, v in params.items())),
        **fields_,
    )


def _check_sweep_params(raw: Mapping[str, Any], params: Mapping[str, Any], where: str) -> None:
    """Unknown policies, and params that no part of a composed sweep (nor ``SamplerConfig``)
    accepts, fail at grid load (the check ``DiffusionSampler`` / ``build_sampler`` make)."""
    from dllm_decode.config import SamplerConfig
    from dllm_decode.policies.defaults import DEFAULT_POLICY
    from dllm_decode.policies.resolve import PRESETS, unknown_params

    first = {str(k): _as_tuple(v)[0] for k, v in params.items()}
    first = {k: v for k, v in first.items() if k not in SamplerConfig.field_names()}
    for name in map(str, _as_tuple(raw["policy"])):
        if name == DEFAULT_POLICY:  # the model family's preset: checked when it is built
            continue
        if not is_import_path(name) and name not in PRESETS:
            close = difflib.get_close_matches(name, sorted(PRESETS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}: unknown policy {name!r}{hint}; valid: {sorted(PRESETS)}, "
                             f"{DEFAULT_POLICY!r} (the model family's preset) or an import path "
                             "'package.module:ClassName'")
        for stopper, truncator in itertools.product(_as_tuple(raw.get("stopper")),
                                                    _as_tuple(raw.get("truncator"))):
            try:
                bad = unknown_params(name, first, stopper=stopper, truncator=truncator)
            except ValueError:  # an import path that does not load here: checked when built
                if any(map(is_import_path, (name, stopper, truncator))):
                    continue
                raise
            if bad:
                unknown = sorted(k for k, _ in bad)
                accepted = sorted({a for _, valid in bad for a in valid})
                parts = "".join(f" / {role} {spec!r}" for role, spec in
                                (("stopper", stopper), ("truncator", truncator)) if spec)
                raise ValueError(f"{where}: params {unknown} are neither parameters of policy "
                                 f"{name!r}{parts} ({accepted}) nor SamplerConfig fields")


def parse_grid(raw: Mapping[str, Any]) -> Grid:
    """Validate a grid mapping (e.g. from YAML).

    Raises:
        ValueError: unknown keys, missing sweeps, bad source / task names / sizes.
    """
    unknown = set(raw) - _GRID_KEYS
    if unknown:
        raise ValueError(f"grid: unknown keys {sorted(unknown)}; valid: {sorted(_GRID_KEYS)}")
    sweeps = raw.get("sweeps")
    if not sweeps or not isinstance(sweeps, list):
        raise ValueError("grid: 'sweeps' must be a non-empty list")
    source = raw.get("source", "official")
    if source not in SOURCES:
        raise ValueError(f"grid: source must be one of {SOURCES}, got {source!r}")
    for key in ("batch_size", "num_samples"):
        if key in raw and int(raw[key]) < 1:
            raise ValueError(f"grid: {key} must be >= 1, got {raw[key]!r}")
    if int(raw.get("icl_examples", 1)) < 0:
        raise ValueError(f"grid: icl_examples must be >= 0, got {raw['icl_examples']!r}")
    options = {k: raw[k] for k in raw if k not in ("sweeps", "tasks")}
    tasks = _expand_tasks(_as_tuple(raw.get("tasks", "benchmark")))
    parsed = tuple(_parse_sweep(s, f"sweeps[{i}]") for i, s in enumerate(sweeps))
    return Grid(sweeps=parsed, tasks=tasks, **options)


def load_grid(path: str | Path) -> Grid:
    """Read and validate a grid YAML file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"grid file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ValueError(f"{path}: invalid YAML{at}: {problem}") from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: a grid must be a YAML mapping")
    return parse_grid(raw)


def expand_configs(grid: Grid, task: str, model: str) -> list[DecodeConfig]:
    """The distinct valid decoding configs of ``grid`` for one task (in grid order).

    Invalid combinations are skipped and described in ``grid.skipped``.
    """
    budget = task_spec(task).max_tokens
    configs: list[DecodeConfig] = []
    for sweep in grid.sweeps:
        names = [name for name, _ in sweep.params]
        schedule = sweep.tokens_per_step or sweep.steps
        for combo in itertools.product(
            sweep.policy, itertools.product(*(v for _, v in sweep.params)), sweep.cache,
            sweep.temperature, sweep.seed, sweep.gen_length, sweep.block_length, schedule,
            sweep.stopper, sweep.truncator,
        ):  # fmt: skip
            policy, values, cache, temperature, seed, gen, block, sched, stop, trunc = combo
            gen_length = budget if gen == "auto" else int(gen)
            block_length = (None if block == MODEL_BLOCK
                            else gen_length if block in ("full", None) else int(block))
            steps = sched
            if sweep.tokens_per_step is not None:
                if gen_length % int(sched):
                    grid.skipped.append(f"{task}: k={sched} does not divide {gen_length}")
                    continue
                steps = gen_length // int(sched)
            if block_length is not None and gen_length % block_length:
                grid.skipped.append(f"{task}: block {block_length} does not divide {gen_length}")
                continue
            blocks = 1 if block_length is None else gen_length // block_length
            if steps is not None and (int(steps) < 1 or int(steps) % blocks):
                grid.skipped.append(f"{task}: steps={steps} not a multiple of {blocks} blocks")
                continue
            configs.append(
                DecodeConfig(
                    model=model, policy=str(policy), params=tuple(zip(names, values, strict=True)),
                    cache=str(cache), gen_length=gen_length, block_length=block_length,
                    steps=None if steps is None else int(steps), temperature=float(temperature),
                    seed=int(seed), stopper=None if stop is None else str(stop),
                    truncator=None if trunc is None else str(trunc),
                )
            )  # fmt: skip
    return list(dict.fromkeys(configs))
