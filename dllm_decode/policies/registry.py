"""Name -> preset (a selector plus optional stopper/truncator) for ``make_policy`` and the CLI."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from dllm_decode.policies.adaptive import EntropyBounded, EntropyThreshold, Factor, Threshold
from dllm_decode.policies.confidence import Origin, RandomOrder, TopK
from dllm_decode.policies.validate import check_fields, check_value
from dllm_decode.types import ScoreKind


@dataclass(frozen=True)
class Policy:
    """A composed decoding policy: a selector, and optionally a stopper and a truncator."""

    selector: Any
    stopper: Any = None
    truncator: Any = None
    name: str = "custom"


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
    """Build a named preset with its parameters; pass-through for policy objects.

    Unknown parameter names are a ``ValueError`` listing the preset's own parameters (for a
    composed preset such as ``sched``: its stopper's and its base's) with the closest match;
    every built component's number / bool fields are type-checked (``validate.check_fields``).
    Parameters beside a policy object are an error: configure the object itself.
    """
    if not isinstance(name, str):
        if params:
            raise ValueError(f"parameters {sorted(params)} cannot be applied to a policy object "
                             f"({type(name).__name__}); configure the object itself")
        if isinstance(name, Policy):
            return name
        if not hasattr(name, "select"):
            raise TypeError(f"policy must be a name or have select(state); got {type(name)}")
        return Policy(selector=name, name=type(name).__name__)
    load_optional_presets()
    if name not in PRESETS:
        close = difflib.get_close_matches(name, sorted(PRESETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown policy {name!r}{hint}; valid names: {sorted(PRESETS)}")
    factory = PRESETS[name]
    accepted = accepted_params(name, params)
    unknown = sorted(set(params) - set(accepted or params))
    if unknown:
        hints = [f"{k!r} -> {c[0]!r}?" for k in unknown
                 if (c := difflib.get_close_matches(k, accepted or [], n=1))]
        raise ValueError(f"unknown parameter(s) {unknown} for policy {name!r}; its parameters: "
                         f"{accepted}" + (f" (did you mean {', '.join(hints)})" if hints else ""))
    annotations = _annotations(name, params)
    for key, value in params.items():  # types first: a str compared inside a factory is opaque
        if key in annotations:
            check_value(f"policy {name!r}", key, value, annotations[key])
    try:
        built = factory(**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for policy {name!r}: {err}; accepted: "
                         f"{accepted}") from None
    policy = built if isinstance(built, Policy) else Policy(selector=built, name=name)
    for comp in _components(policy):
        check_fields(comp, f"policy {name!r} ({type(comp).__name__})")
    return policy


def accepted_params(name: str, params: dict[str, Any] | None = None) -> list[str] | None:
    """Parameter names the preset ``name`` accepts: its factory's named keywords plus the
    fields of every component it builds (with ``params``' ``base``, for composed presets);
    ``None`` if unknown (not a preset, or it cannot be built with defaults)."""
    load_optional_presets()
    factory = PRESETS.get(name)
    if factory is None:
        return None
    sig = inspect.signature(factory).parameters.values()
    names = {p.name for p in sig if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    try:
        built = factory(**{k: v for k, v in (params or {}).items() if k == "base"})
    except Exception:  # noqa: BLE001 - e.g. a preset that needs a file; names stay unknown
        return sorted(names) if names else None
    policy = built if isinstance(built, Policy) else Policy(selector=built)
    for comp in _components(policy):
        names |= {f.name for f in fields(comp)} if is_dataclass(comp) else set()
    return sorted(names - {"selector", "stopper", "truncator"})


def _annotations(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Parameter name -> annotation, from the preset's factory and its default components."""
    factory = PRESETS[name]
    out = {p.name: p.annotation for p in inspect.signature(factory).parameters.values()
           if p.annotation is not inspect.Parameter.empty}
    try:
        built = factory(**{k: v for k, v in params.items() if k == "base"})
    except Exception:  # noqa: BLE001 - nothing more to learn without valid parameters
        return out
    policy = built if isinstance(built, Policy) else Policy(selector=built)
    for comp in _components(policy):
        if is_dataclass(comp):
            out.update({f.name: f.type for f in fields(comp) if f.name not in out})
    return out


def _components(policy: Policy) -> list[Any]:
    """The policy's components, wrappers unwrapped (``Supervised.selector`` and the like)."""
    out: list[Any] = []
    todo = [policy.selector, policy.stopper, policy.truncator]
    while todo:
        comp = todo.pop()
        if comp is None or any(comp is c for c in out):
            continue
        out.append(comp)
        if is_dataclass(comp):
            todo += [getattr(comp, f.name) for f in fields(comp)
                     if f.name in ("selector", "stopper", "base", "inner")]
    return out


def load_optional_presets() -> None:
    """Import policy modules that register presets (later methods live in their own files)."""
    import importlib

    for mod in ("sched", "learn2pd", "ete", "history", "s2d2", "window"):
        try:
            importlib.import_module(f"dllm_decode.policies.{mod}")
        except ModuleNotFoundError as err:
            if err.name != f"dllm_decode.policies.{mod}":
                raise
