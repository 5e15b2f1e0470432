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
    with its parameters; pass-through for policy objects.

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
    if ":" in name:  # an import path: the user's class or factory (``compose.build_from_path``)
        from dllm_decode.policies.compose import build_from_path

        return build_from_path(name, params)
    load_optional_presets()
    if name not in PRESETS:
        close = difflib.get_close_matches(name, sorted(PRESETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown policy {name!r}{hint}; valid names: {sorted(PRESETS)}")
    factory = PRESETS[name]
    accepted = accepted_params(name, params)
    unknown = sorted(set(params) - set(accepted or params))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for policy {name!r}; its parameters: "
                         f"{accepted}{did_you_mean(unknown, accepted or [])}")
    check_types(factory, params, f"policy {name!r}")
    try:
        built = factory(**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for policy {name!r}: {err}; accepted: "
                         f"{accepted}") from None
    policy = built if isinstance(built, Policy) else Policy(selector=built, name=name)
    for comp in components(policy):
        check_fields(comp, f"policy {name!r} ({type(comp).__name__})")
    return policy


def accepted_params(name: str, params: dict[str, Any] | None = None) -> list[str] | None:
    """Parameter names the preset or import path ``name`` accepts (``accepted_by``); ``None``
    if unknown (not a preset, or an open factory that cannot be built with defaults)."""
    if ":" in name:
        from dllm_decode.policies.compose import load_object

        return accepted_by(load_object(name), params)
    load_optional_presets()
    factory = PRESETS.get(name)
    return None if factory is None else accepted_by(factory, params)


def accepted_by(factory: Callable[..., Any], params: dict[str, Any] | None = None
                ) -> list[str] | None:
    """Parameter names ``factory`` (a preset, a stopper / truncator factory or a user class)
    accepts: its named keywords plus the fields of every component it builds (built with
    ``params``' ``base``, for composed presets); ``None`` if unknown (an open ``**kwargs``
    factory whose components cannot be listed)."""
    try:
        sig = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    names = {p.name for p in sig if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    open_ = any(p.kind is p.VAR_KEYWORD for p in sig)
    try:
        built = factory(**{k: v for k, v in (params or {}).items() if k == "base"})
    except Exception:  # noqa: BLE001 - e.g. a preset that needs a file; names stay unknown
        return sorted(names) if names and not open_ else None
    comps = [c for c in components(built) if is_dataclass(c)]
    if open_ and not comps:
        return None
    for comp in comps:
        names |= {f.name for f in fields(comp)}
    return sorted(names - {"selector", "stopper", "truncator"})


def check_types(factory: Callable[..., Any], params: dict[str, Any], where: str) -> None:
    """Type-check ``params`` against the annotations of ``factory`` and of the components it
    builds by default, before building (a str compared inside a factory is opaque)."""
    try:
        sig = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        sig = []
    annotations = {p.name: p.annotation for p in sig if p.annotation is not inspect.Parameter.empty}
    try:
        built = factory(**{k: v for k, v in params.items() if k == "base"})
    except Exception:  # noqa: BLE001 - nothing more to learn without valid parameters
        built = None
    for comp in components(built):
        if is_dataclass(comp):
            annotations.update({f.name: f.type for f in fields(comp)
                                if f.name not in annotations})
    for key, value in params.items():
        if key in annotations:
            check_value(where, key, value, annotations[key])


def did_you_mean(keys: Any, valid: Any) -> str:
    """`` (did you mean 'a' -> 'b'?)`` for the keys with a close valid name, else ``""``."""
    hints = [f"{k!r} -> {c[0]!r}?" for k in sorted(keys)
             if (c := difflib.get_close_matches(k, sorted(valid), n=1))]
    return f" (did you mean {', '.join(hints)})" if hints else ""


def components(built: Any) -> list[Any]:
    """The parts of a built ``Policy`` (or the one component ``built``), wrappers unwrapped
    (``Supervised.selector`` and the like)."""
    out: list[Any] = []
    todo = ([built.selector, built.stopper, built.truncator] if isinstance(built, Policy)
            else [built])
    while todo:
        comp = todo.pop()
        if comp is None or any(comp is c for c in out):
            continue
        out.append(comp)
        if is_dataclass(comp) and not isinstance(comp, type):
            todo += [getattr(comp, f.name) for f in fields(comp)
                     if f.name in ("selector", "stopper", "base", "inner")]
    return out


def load_optional_presets() -> None:
    """Import policy modules that register presets (later methods live in their own files)."""
    import importlib

    for mod in ("sched", "learn2pd", "ete", "history", "s2d2", "window", "editing",
                "fastdllm2", "renoise", "frechet", "credit", "dilated"):
        try:
            importlib.import_module(f"dllm_decode.policies.{mod}")
        except ModuleNotFoundError as err:
            if err.name != f"dllm_decode.policies.{mod}":
                raise
