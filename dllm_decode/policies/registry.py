"""Name -> preset (a selector plus optional stopper/truncator) for ``make_policy`` and the CLI."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dllm_decode.policies.adaptive import EntropyBounded, EntropyThreshold, Factor, Threshold
from dllm_decode.policies.confidence import Origin, RandomOrder, TopK
from dllm_decode.types import ScoreKind


@dataclass(frozen=True)
class Policy:
    """A composed decoding policy: a selector, and optionally a stopper and a truncator.

    ``Policy(MyRule(), stopper=SchED(), truncator=EoTP())`` is the Python spelling of
    composition (by names: ``policies.compose.compose``). The parts are checked against their
    protocols (``select`` / ``should_stop`` / ``truncate``, ``TypeError`` otherwise); a stopper
    with per-generation memory (``SchED``) gets it through the selector, which is wrapped in
    ``sched.Supervised`` for that unless it already supervises this stopper.
    """

    selector: Any
    stopper: Any = None
    truncator: Any = None
    name: str = "custom"

    def __post_init__(self) -> None:
        from dllm_decode.policies.compose import attach

        selector = attach(self.selector, self.stopper, self.truncator)
        if selector is not self.selector:
            object.__setattr__(self, "selector", selector)


PRESETS: dict[str, Callable[..., Any]] = {
    "low_confidence": lambda **kw: TopK(score=ScoreKind.PROB, **kw),
    "random": lambda **kw: RandomOrder(**kw),
    "maskgit_plus": lambda **kw: TopK(score=ScoreKind.PROB, **kw),
    "topk_margin": lambda **kw: TopK(score=ScoreKind.MARGIN, **kw),
    "entropy": lambda **kw: TopK(score=ScoreKind.NEG_ENTROPY, **kw),
    "origin": lambda **kw: Origin(**kw),
    "threshold": lambda **kw: Threshold(**kw),
    "factor": lambda **kw: Factor(**kw),
    "eb": lambda **kw: EntropyBounded(**kw),
    "entropy_threshold": lambda **kw: EntropyThreshold(**kw),
}

#: the family's default schedule for each preset that is not adaptive
DREAM_NAMES = frozenset({"maskgit_plus", "topk_margin", "entropy", "origin"})


def register(name: str, factory: Callable[..., Any]) -> None:
    """Add a preset (e.g. from a plugin or a later module)."""
    PRESETS[name] = factory


def make_policy(name: str | Policy | Any, **params: Any) -> Policy:
    """Build a named preset, or a user class given as ``module:Class`` / ``file.py:Class``,
    with its parameters; pass-through for policy objects."""
    if isinstance(name, Policy):
        return name
    if isinstance(name, str) and ":" in name:
        from dllm_decode.policies.compose import build_from_path

        return build_from_path(name, params)
    if not isinstance(name, str):
        if not hasattr(name, "select"):
            raise TypeError(f"policy must be a name or have select(state); got {type(name)}")
        return Policy(selector=name, name=type(name).__name__)
    load_optional_presets()
    if name not in PRESETS:
        raise ValueError(f"unknown policy {name!r}; valid names: {sorted(PRESETS)}")
    factory = PRESETS[name]
    try:
        built = factory(**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for policy {name!r}: {err}; accepted: "
                         f"{_accepted(factory)}") from None
    return built if isinstance(built, Policy) else Policy(selector=built, name=name)


def _accepted(factory: Callable[..., Any]) -> list[str]:
    try:
        obj = factory()
        return sorted(inspect.signature(type(obj)).parameters)
    except Exception:  # noqa: BLE001 - best-effort help text
        return []


def load_optional_presets() -> None:
    """Import policy modules that register presets (later methods live in their own files)."""
    import importlib

    for mod in ("sched", "learn2pd", "ete", "history", "s2d2", "window"):
        try:
            importlib.import_module(f"dllm_decode.policies.{mod}")
        except ModuleNotFoundError as err:
            if err.name != f"dllm_decode.policies.{mod}":
                raise
