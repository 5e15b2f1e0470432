"""Decoding methods x cache modes on the long-answer test bed (Test bed III, issue 53).

For every model, policy, cache mode and task (``copy``, ``shuffle``, ``carry``), ``--n``
held-out prompts (test split, ``--seed``) are decoded greedily with the library's sampler at
``--gen-length`` (128) in blocks of ``--block-length`` (32) and graded (exact match; shuffle:
any permutation). One CSV row per model x policy x cache x task: ``accuracy`` (a fraction),
``nfe`` (forwards per answer, extra forwards included), ``tpf`` (tokens per forward,
``dllm_decode.speed``: answer tokens up to EOS / NFE, pooled), ``positions`` (token positions
run through the model per answer, ``Generation.step_positions``), ``rounds`` (the batch's
decoding step of the answer's last commit + 1: its NFE at batch 1; in a batch it also counts
the steps the row waited for others in a block), ``wall_s_per_answer`` /
``cpu_s_per_answer``, ``note`` (why a model refused the policy or cache mode: the row then
has no figures) and the environment. The Markdown table
(beside the CSV) averages the tasks per (model, policy, cache), marks the Pareto front of
accuracy vs TPF and names the best TPF at >= 99 % of ``low_confidence_k1``'s accuracy
(``--best`` prints it); the plot (``<out>_pareto.png``) has accuracy vs TPF and accuracy vs
positions computed (relative to ``low_confidence_k1`` without a cache) per model.

Policies: ``low_confidence_k1`` is one token per step (low confidence, steps = gen length);
any other name is a preset with its defaults. A spec may add a stopper / truncator with ``+``
and parameters (policy or ``SamplerConfig`` fields, as ``dllm-decode generate --param``)
after ``:``: ``threshold:tau=0.7``, ``threshold+eotp``, ``threshold+sched:stopper.tau_low=2``,
``low_confidence:steps=32``. Models: ``oracle`` (exact), ``oracle-cal`` (the calibration knobs
of ``bench_testbed.py``'s oracle-cal) and any long-answer checkpoint by bundled name or path
(a directory with ``long_answer_vocab.json``, ``train.testbed_long.export_student``).

``--frontier``: ``low_confidence_k1``, every preset and every stopper / truncator composed with
``threshold``, x cache modes none, prefix, dual, block_causal, dllm_cache, window (each model
refuses what does not apply, in ``note``), blocks of 32, on ``--models`` (default the calibrated
oracle and both students), with a budget estimate printed first. ``--workers`` (default 2)
decodes configs in parallel processes (one torch thread each). ``--render`` rebuilds the
table, plot and summary from an existing CSV.

    OMP_NUM_THREADS=1 python benchmarks/bench_testbed_long.py --models oracle testbed-long-llada \
        --policies low_confidence_k1,threshold --cache none,dual --n 20 --out results/x.csv
    OMP_NUM_THREADS=1 python benchmarks/bench_testbed_long.py --frontier
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Final

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_testbed as bt  # noqa: E402
from bench_testbed_long_report import (  # noqa: E402
    BASELINE,
    CACHES,
    read_csv,
    render,
    write_csv,
)

from dllm_decode.eval.parallelbench.testbed_long import (  # noqa: E402
    LONG_TASKS,
    grade,
    long_oracle,
    long_records,
)
from dllm_decode.models.long_answer import EOS, LongCodec, long_codec_for  # noqa: E402

STUDENTS: Final = ("testbed-long-llada", "testbed-long-sdar")
FRONTIER_MODELS: Final = ("oracle-cal", *STUDENTS)
#: default --n of --frontier (prompts per task): the budget below at n = 4 is 67 CPU-minutes,
#: ~33 minutes on 2 workers (an upper bound: measured at batch 1 on a loaded machine; batches
#: of 4 make the cached modes ~40 % cheaper); n = 5 would leave no margin under 45 minutes
FRONTIER_N: Final = 4
#: mean CPU seconds per answer of one frontier policy (44 policies: a refused one costs 0) per
#: model kind and cache mode, measured on 2026-11-29 by this script itself: ``--frontier
#: --n 1 --tasks copy --workers 1`` (batch 1, one thread, 2 cores shared with two training
#: runs) on 2.4M-parameter students (hidden 192, 4 layers) exported early in training (their
#: confidence low: adaptive policies near 128 forwards, so an upper bound for trained ones).
#: One-token-per-step answers cost 2.7 s (llada, none), 0.75 (dual), 2.6 (sdar, none),
#: 0.69 (block_causal) at batch 1; 2.6, 0.46, 2.5, 0.41 at batch 4; LoPA ~11.5 s (none)
MEAN_COST: Final[dict[str, dict[str, float]]] = {
    "oracle": {"none": 0.055},
    "bidirectional": {"none": 2.213, "prefix": 1.054, "dual": 0.712, "dllm_cache": 1.343,
                      "window": 0.615},
    "block_causal": {"none": 1.239, "block_causal": 0.360},
}
NOTE_REFUSED, NOTE_ERROR = "refused", "error"

_MODELS: dict[tuple[str, int], tuple[Any, LongCodec]] = {}  # per process


# ---- specs --------------------------------------------------------------------------------
def cast(value: str) -> Any:
    """``--param``'s casting: int, float, true / false / none, else the string."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return {"true": True, "false": False, "none": None}.get(value.lower(), value)


def parse_policy(text: str) -> tuple[str, str | None, str | None, dict[str, Any]]:
    """``(preset, stopper, truncator, params)`` of ``NAME[+PART...][:KEY=VALUE,...]``
    (``low_confidence_k1``: ``low_confidence`` at ``steps = gen_length``, filled later).

    Raises: ``ValueError`` for a part that is neither a stopper nor a truncator, a malformed
    parameter or an unknown preset name."""
    from dllm_decode.policies import resolve  # importing the package fills its tables

    segments = text.split(":")
    cut = len(segments)
    while cut > 1 and "=" in segments[cut - 1]:  # trailing KEY=VALUE segments
        cut -= 1
    name, params = ":".join(segments[:cut]), {}
    for pair in ",".join(segments[cut:]).split(",") if cut < len(segments) else []:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"policy {text!r}: expected KEY=VALUE after ':', got {pair!r}")
        params[key.strip()] = cast(value.strip())
    base, *parts = name.split("+")
    stopper = truncator = None
    for part in parts:
        if part in resolve.STOPPERS and stopper is None:
            stopper = part
        elif part in resolve.TRUNCATORS and truncator is None:
            truncator = part
        else:
            raise ValueError(f"policy {text!r}: {part!r} is not a stopper "
                             f"({', '.join(resolve.STOPPERS)}) or truncator "
                             f"({', '.join(resolve.TRUNCATORS)}), or a second one")
    head = base.split(":")[0]
    if ":" in base and head in (BASELINE, *resolve.PRESETS):
        raise ValueError(f"policy {text!r}: expected KEY=VALUE after {head + ':'!r}")
    if base != BASELINE and base not in resolve.PRESETS and ":" not in base:
        raise ValueError(f"policy {text!r}: unknown preset {base!r}; valid: {BASELINE}, "
                         f"{', '.join(resolve.PRESETS)} (or an import path module:Class)")
    return base, stopper, truncator, params


def frontier_policies() -> list[str]:
    """``low_confidence_k1``, every preset with its defaults (``low_confidence``'s default is
    the baseline itself) and every stopper / truncator composed with ``threshold``."""
    from dllm_decode.policies import resolve

    presets = [p for p in resolve.PRESETS if p != "low_confidence"]
    composed = [f"threshold+{p}" for p in (*resolve.STOPPERS, *resolve.TRUNCATORS)]
    return [BASELINE, *presets, *composed]


def split_list(values: Iterable[str] | None) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (both spellings on the command line)."""
    return [v for item in values or [] for v in item.split(",") if v]


# ---- models -------------------------------------------------------------------------------
def load(name: str, gen_length: int) -> tuple[Any, LongCodec]:
    """The model and its codec at ``gen_length`` (cached per process)."""
    key = (name, gen_length)
    if key not in _MODELS:
        if name in ("oracle", "oracle-cal"):
            oracle = long_oracle(gen_length, **(bt.CALIBRATED if name == "oracle-cal" else {}))
            _MODELS[key] = oracle, oracle.codec
        else:
            from dllm_decode.models.loading import load_model, resolve_path

            directory = resolve_path(name)
            codec = long_codec_for(directory)
            if codec is None:
                raise ValueError(f"{name}: {directory} is not a long-answer checkpoint (no "
                                 "long_answer_vocab.json; train.testbed_long.export_student "
                                 "writes one)")
            model = load_model(directory, dtype=torch.float32)
            _MODELS[key] = model, LongCodec(codec.names, gen_length)
    return _MODELS[key]


def model_kind(model: Any) -> str:
    """``oracle``, ``bidirectional`` or ``block_causal`` (the cost table's keys)."""
    if not hasattr(model, "layers"):
        return "oracle"
    return "block_causal" if getattr(model, "block_size", None) else "bidirectional"


# ---- one config ---------------------------------------------------------------------------
def row_figures(model: Any, codec: LongCodec, records: Sequence[dict[str, Any]], gen: Any
                ) -> list[dict[str, float]]:
    """Per answer of one ``Generation``: ``valid``, ``nfe``, ``tokens`` (up to EOS), ``rounds``
    (steps until its last commit) and ``positions`` (run through the model until then, a
    separate prefill included). A truncated answer reads as EOS after its length."""
    from dllm_decode.speed import answer_lengths

    eos = codec.tid(EOS)
    cols = torch.arange(gen.answer.shape[1])[None]
    answer = gen.answer.masked_fill(cols >= gen.lengths[:, None], eos)
    tokens = answer_lengths(answer, model.eos_token_ids, gen.lengths)
    rounds = (gen.commit_step.max(1).values + 1).tolist()
    steps = [float(p) for p in gen.step_positions or []]
    done = [0.0]
    for p in steps:
        done.append(done[-1] + p)
    prefill = float(gen.positions or 0.0) - done[-1]
    out = []
    for rec, ids, nfe, n_tok, k in zip(records, answer.tolist(), gen.nfe.tolist(), tokens,
                                       rounds, strict=True):
        out.append({"valid": float(grade(codec, rec, ids)), "nfe": float(nfe),
                    "tokens": float(n_tok), "rounds": float(k),
                    "positions": prefill + done[min(k, len(done) - 1)]})
    return out


def task_row(per: list[dict[str, float]], wall: float, cpu: float) -> dict[str, Any]:
    """The figures of one task's answers (means; ``tpf`` pooled)."""
    n = len(per)
    nfe = sum(r["nfe"] for r in per)
    return {"n": n, "accuracy": round(sum(r["valid"] for r in per) / n, 4),
            "nfe": round(nfe / n, 3),
            "tpf": round(sum(r["tokens"] for r in per) / nfe, 3) if nfe else 0.0,
            "rounds": round(sum(r["rounds"] for r in per) / n, 3),
            "positions": round(sum(r["positions"] for r in per) / n, 1),
            "wall_s_per_answer": round(wall / n, 4), "cpu_s_per_answer": round(cpu / n, 4),
            "note": ""}


def refusal(exc: BaseException) -> str:
    """The ``note`` of a config a model refused (or that failed): kind and first line."""
    kind = NOTE_REFUSED if isinstance(exc, (ValueError, NotImplementedError, TypeError)) \
        else NOTE_ERROR
    line = (str(exc).strip().splitlines() or [""])[0]
    return f"{kind}: {type(exc).__name__}: {line}"


def run_config(model_name: str, policy: str, cache: str, tasks: Sequence[str], n: int,
               seed: int, gen_length: int, block_length: int | None, batch: int
               ) -> list[dict[str, Any]]:
    """The rows (one per task) of one (model, policy, cache); a refusal fills ``note``."""
    from dllm_decode.policies.capabilities import capabilities_of
    from dllm_decode.samplers.build import build_sampler

    torch.set_num_threads(1)
    head = {"model": model_name, "policy": policy, "cache": cache}
    tail = {"gen_length": gen_length, "block_length": block_length or gen_length,
            "seed": seed, **environment()}
    empty = {k: "" for k in ("accuracy", "nfe", "tpf", "rounds", "positions",
                             "wall_s_per_answer", "cpu_s_per_answer")}
    try:
        model, codec = load(model_name, gen_length)
        base, stopper, truncator, params = parse_policy(policy)
        params = {"gen_length": gen_length, "block_length": block_length, "temperature": 0.0,
                  **({"steps": gen_length} if base == BASELINE else {}), **params}
        name = "low_confidence" if base == BASELINE else base
        sampler = build_sampler(model, name, stopper=stopper, truncator=truncator, cache=cache,
                                params=params)
        if capabilities_of(sampler.policy.selector).slides_blocks and block_length:
            # DSB slides its own window of B masked positions: the generation is one loop
            # block, as its authors run it (loop blocks would force leftovers at their ends)
            params["block_length"] = None
            tail["block_length"] = gen_length
            sampler = build_sampler(model, name, stopper=stopper, truncator=truncator,
                                    cache=cache, params=params)
    except Exception as exc:  # noqa: BLE001 - a refusal is a row, not a crash
        note = refusal(exc)
        return [{**head, "task": t, "n": 0, **empty, "note": note, **tail} for t in tasks]
    rows: list[dict[str, Any]] = []
    note = ""
    for task in tasks:
        if note:
            rows.append({**head, "task": task, "n": 0, **empty, "note": note, **tail})
            continue
        records = long_records(task, n, seed, gen_length=gen_length)
        per: list[dict[str, float]] = []
        wall = cpu = 0.0
        try:
            with torch.no_grad():
                for i in range(0, n, batch):
                    chunk = records[i:i + batch]
                    ids = torch.tensor([codec.encode_prompt(r) for r in chunk])
                    t0, c0 = time.perf_counter(), time.thread_time()
                    gen = sampler.generate(ids)
                    wall += time.perf_counter() - t0
                    cpu += time.thread_time() - c0
                    per += row_figures(model, codec, chunk, gen)
        except Exception as exc:  # noqa: BLE001
            note = refusal(exc)
            rows.append({**head, "task": task, "n": 0, **empty, "note": note, **tail})
            continue
        rows.append({**head, "task": task, **task_row(per, wall, cpu), **tail})
    return rows


@lru_cache(maxsize=1)
def commit() -> str:
    return bt.commit()


def environment() -> dict[str, Any]:
    """The environment columns every bench script writes."""
    return {"device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "cpu": platform.processor() or
            platform.machine(), "commit": commit(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}


# ---- runs ---------------------------------------------------------------------------------
def estimate(models: Sequence[str], policies: Sequence[str], caches: Sequence[str],
             tasks: Sequence[str], n: int, gen_length: int, workers: int) -> str:
    """A budget line from ``MEAN_COST`` (scaled with gen_length^2: every answer position is a
    forward's width and a step); cache modes a model refuses cost nothing."""
    seconds, configs = 0.0, 0
    scale = (gen_length / 128) ** 2
    for name in models:
        try:
            kind = model_kind(load(name, gen_length)[0])
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--models {name}: {exc}") from None
        for cache in caches:
            configs += len(policies)
            seconds += MEAN_COST[kind].get(cache, 0.0) * scale * len(policies) * n * len(tasks)
    answers = configs * n * len(tasks)
    return (f"budget: {len(models)} models x {len(policies)} policies x {len(caches)} caches = "
            f"{configs} configs, {answers} answers at n={n}; estimated "
            f"{seconds / 60:.0f} CPU-min, ~{seconds / 60 / max(1, workers):.0f} min on "
            f"{workers} worker(s) (MEAN_COST: measured per-answer means, an upper bound)")


def run(models: Sequence[str], policies: Sequence[str], caches: Sequence[str],
        tasks: Sequence[str], n: int, seed: int, gen_length: int, block_length: int | None,
        batch: int, workers: int, out: Path | None = None) -> list[dict[str, Any]]:
    """Every (model, policy, cache) config, in order; progress lines as configs finish (and
    the CSV rewritten after each, when ``out`` is given)."""
    items = [(m, p, c) for m in models for p in policies for c in caches]
    args = (tasks, n, seed, gen_length, block_length, batch)
    done: dict[int, list[dict[str, Any]]] = {}
    start = time.perf_counter()

    def report(i: int, rows: list[dict[str, Any]]) -> None:
        done[i] = rows
        m, p, c = items[i]
        figures = [r for r in rows if r["n"]]
        if figures:
            acc = sum(r["accuracy"] for r in figures) / len(figures)
            tpf = sum(r["tpf"] * r["nfe"] for r in figures) / sum(r["nfe"] for r in figures)
            line = (f"acc {acc:6.3f} TPF {tpf:6.2f} positions "
                    f"{sum(r['positions'] for r in figures) / len(figures):9.0f} "
                    f"{sum(r['wall_s_per_answer'] for r in figures) / len(figures):6.3f} s/ans")
        else:
            line = rows[0]["note"][:110]
        print(f"{bt.progress(len(done), len(items), start)} {m:20s} {p:26s} {c:12s} {line}",
              flush=True)
        if out is not None:
            write_csv([r for j in sorted(done) for r in done[j]], out)

    if workers <= 1:
        for i, item in enumerate(items):
            report(i, run_config(*item, *args))
    else:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(run_config, *item, *args): i for i, item in enumerate(items)}
            for fut in as_completed(futures):
                report(futures[fut], fut.result())
    return [r for i in sorted(done) for r in done[i]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=None,
                    help="oracle, oracle-cal, bundled names or checkpoint paths (comma- or "
                         "space-separated; default: oracle-cal; --frontier: oracle-cal and "
                         "both students)")
    ap.add_argument("--policies", nargs="+", default=None,
                    help=f"{BASELINE} or preset specs NAME[+STOPPER|+TRUNCATOR][:K=V,...] "
                         f"(default: {BASELINE} threshold)")
    ap.add_argument("--cache", nargs="+", default=None,
                    help=f"cache modes ({', '.join(CACHES)}; default none; --frontier: all)")
    ap.add_argument("--tasks", nargs="+", default=None, help=f"default: {' '.join(LONG_TASKS)}")
    ap.add_argument("--n", type=int, default=None,
                    help=f"held-out prompts per task (default 20; --frontier {FRONTIER_N})")
    ap.add_argument("--seed", type=int, default=0, help="seed of the held-out records")
    ap.add_argument("--gen-length", type=int, default=128, choices=(128, 256))
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16, help="prompts per generate call")
    ap.add_argument("--workers", type=int, default=2,
                    help="parallel decoding processes (one torch thread each; 1: in process)")
    ap.add_argument("--out", type=Path, default=None,
                    help="CSV (the .md table and _pareto.png go beside it; default "
                         "benchmarks/results/testbed_long[_frontier].csv)")
    ap.add_argument("--frontier", action="store_true",
                    help="every preset and composition x every cache mode (see the docstring)")
    ap.add_argument("--best", action="store_true",
                    help="print the best TPF at >= 99 %% of low_confidence_k1 per model")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the configs' budget estimate and stop")
    ap.add_argument("--render", action="store_true",
                    help="rebuild the table and plot from --out's CSV (no decoding)")
    args = ap.parse_args(argv)
    out = args.out or bt.RESULTS / ("testbed_long_frontier.csv" if args.frontier
                                    else "testbed_long.csv")
    command = ("`OMP_NUM_THREADS=1 python benchmarks/bench_testbed_long.py "
               + " ".join(sys.argv[1:] if argv is None else argv) + "`")
    if args.render:
        rows = read_csv(out)
        old = out.with_suffix(".md")
        render(rows, out, old.read_text().splitlines()[0] if old.exists() else command,
               args.best)
        return 0
    models = split_list(args.models) or list(FRONTIER_MODELS if args.frontier
                                              else ["oracle-cal"])
    policies = split_list(args.policies) or (frontier_policies() if args.frontier
                                             else [BASELINE, "threshold"])
    caches = split_list(args.cache) or list(CACHES if args.frontier else ["none"])
    tasks = split_list(args.tasks) or list(LONG_TASKS)
    n = args.n or (FRONTIER_N if args.frontier else 20)
    for p in policies:  # a typo fails now, not 40 minutes in
        parse_policy(p)
    bad = sorted(set(caches) - set(CACHES))
    if bad:
        raise SystemExit(f"--cache: unknown modes {bad}; valid: {', '.join(CACHES)}")
    bad = sorted(set(tasks) - set(LONG_TASKS))
    if bad:
        raise SystemExit(f"--tasks: unknown {bad}; valid: {', '.join(LONG_TASKS)}")
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the spawned workers
    print(estimate(models, policies, caches, tasks, n, args.gen_length, args.workers),
          flush=True)
    if args.dry_run:
        return 0
    rows = run(models, policies, caches, tasks, n, args.seed, args.gen_length,
               args.block_length, args.batch, args.workers, out)
    write_csv(rows, out)
    render(rows, out, command, args.best)
    print(f"wrote {out}, {out.with_suffix('.md').name}, {out.stem}_pareto.png", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
