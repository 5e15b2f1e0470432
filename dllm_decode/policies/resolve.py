"""One policy spec -> one ``Policy``, in one pass: ``resolve_policy``.

A spec is a preset name (``"threshold"``), a user class or factory by import path
(``package.module:Name`` or ``path/to/file.py:Name``) or an object (a ``Policy`` or a
selector); a stopper and a truncator may be added the same ways. Every front end resolves
with this function: ``DiffusionSampler``, the CLI (``--policy`` / ``--stopper`` /
``--truncator`` / ``--param``), grid sweeps (``policy:`` / ``stopper:`` / ``truncator:`` /
``params:``), lm-eval's ``policy=`` and serving adapters. ``make_policy`` and ``compose`` are
its two older spellings.

Parameters are one flat mapping: a bare name (or ``policy.NAME``) goes to the selector /
preset, ``stopper.NAME`` to the stopper, ``truncator.NAME`` to the truncator. Each part goes
through the same steps, in order: name -> factory (``PRESETS`` / ``STOPPERS`` /
``TRUNCATORS``, or the imported object) -> accepted parameters (unknown names are a
``ValueError`` with the closest valid one) -> parameter types -> build -> the built
components' fields (``validate.check_fields``) -> the part's protocol (``TypeError``).

The name tables are filled in one place, ``policies/presets.py`` (run by
``import dllm_decode.policies``); ``register`` / ``register_stopper`` / ``register_truncator``
add a plugin's names.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, Final

from dllm_decode.policies.import_path import is_import_path, load_object
from dllm_decode.policies.policy import Policy, check_part, components
from dllm_decode.policies.validate import check_fields, check_value

#: preset name -> factory(**params) returning a selector or a ``Policy`` (``policies.presets``)
PRESETS: dict[str, Callable[..., Any]] = {}
#: stopper name -> factory(**params) (``--stopper`` / grid ``stopper:``)
STOPPERS: dict[str, Callable[..., Any]] = {}
#: truncator name -> factory(**params) (``--truncator`` / grid ``truncator:``)
TRUNCATORS: dict[str, Callable[..., Any]] = {}
#: parameter prefixes and the part they address (a bare name addresses the selector)
PREFIXES: Final[dict[str, str]] = {"policy": "selector", "selector": "selector",
                                   "stopper": "stopper", "truncator": "truncator"}
_TABLES: Final = {"selector": PRESETS, "stopper": STOPPERS, "truncator": TRUNCATORS}


def register(name: str, factory: Callable[..., Any]) -> None:
    """Add a preset (e.g. from a plugin)."""
    PRESETS[name] = factory


def register_stopper(name: str, factory: Callable[..., Any]) -> None:
    """Add a named stopper (e.g. from a plugin)."""
    STOPPERS[name] = factory


def register_truncator(name: str, factory: Callable[..., Any]) -> None:
    """Add a named truncator (e.g. from a plugin)."""
    TRUNCATORS[name] = factory


def resolve_policy(spec: Any = "low_confidence", params: Mapping[str, Any] | None = None, *,
                   stopper: Any = None, truncator: Any = None) -> Policy:
    """The ``Policy`` for a spec, its parameters and an optional stopper / truncator.

    Args:
        spec: preset name, import path ``module:Name`` / ``file.py:Name``, ``Policy`` or
            selector object.
        params: flat parameters (``split_params``): bare / ``policy.`` names for ``spec``,
            ``stopper.`` / ``truncator.`` names for the added parts. None with an object.
        stopper: ``None``, a name in ``STOPPERS``, an import path or a stopper object.
        truncator: ``None``, a name in ``TRUNCATORS``, an import path or a truncator object.

    Raises:
        ValueError: unknown names or parameters (with the closest valid one), parameters of
            the wrong type or beside an object, or a second stopper / truncator for a preset
            that has one.
        TypeError: a part that does not satisfy its protocol.
    """
    parts = split_params(params)
    base = _resolve_selector(spec, parts["selector"])
    for role, given in (("stopper", stopper), ("truncator", truncator)):
        if given is None and parts[role]:
            raise ValueError(f"parameters {sorted(parts[role])} given but no {role}")
        if given is not None and getattr(base, role) is not None:
            raise ValueError(f"policy {base.name!r} already has a {role}; drop --{role} or "
                             "use its base preset")
    if stopper is None and truncator is None:
        return base
    stop = base.stopper if stopper is None else _resolve_part(stopper, "stopper",
                                                              parts["stopper"])
    trunc = base.truncator if truncator is None else _resolve_part(truncator, "truncator",
                                                                   parts["truncator"])
    names = [base.name] + [s if isinstance(s, str) else type(s).__name__
                           for s in (stopper, truncator) if s is not None]
    return Policy(selector=base.selector, stopper=stop, truncator=trunc, name="+".join(names))


def make_policy(name: str | Policy | Any, **params: Any) -> Policy:
    """``resolve_policy(name, params)``: a preset, a user class by import path or an object
    (parameters beside an object are an error: configure the object itself)."""
    return resolve_policy(name, params)


def compose(policy: Any = "low_confidence", *, stopper: Any = None, truncator: Any = None,
            params: Mapping[str, Any] | None = None) -> Policy:
    """``resolve_policy(policy, params, stopper=..., truncator=...)`` (keyword spelling)."""
    return resolve_policy(policy, params, stopper=stopper, truncator=truncator)


def _resolve_selector(spec: Any, params: dict[str, Any]) -> Policy:
    """The selector part of the pass: an object passes through, a name or import path is
    built (a factory may return a ready ``Policy``; anything else must be a selector)."""
    if not isinstance(spec, str):
        if params:
            raise ValueError(f"parameters {sorted(params)} cannot be applied to a policy object "
                             f"({type(spec).__name__}); configure the object itself")
        if isinstance(spec, Policy):
            return spec
        if not hasattr(spec, "select"):
            raise TypeError(f"policy must be a name or have select(state); got {type(spec)}")
        return Policy(selector=spec, name=type(spec).__name__)
    where = repr(spec) if is_import_path(spec) else f"policy {spec!r}"
    built = _build(_factory(spec, "selector"), params, where)
    if isinstance(built, Policy):
        return built
    return Policy(selector=check_part(built, "selector", spec), name=spec)


def _resolve_part(spec: Any, role: str, params: dict[str, Any]) -> Any:
    """A stopper or truncator from a name, an import path or an object (returned as is)."""
    if not isinstance(spec, str):
        if params:
            raise ValueError(f"parameters {sorted(params)} given for a {role} object")
        return check_part(spec, role)
    return check_part(_build(_factory(spec, role), params, repr(spec)), role, spec)


def _factory(spec: str, role: str) -> Callable[..., Any]:
    """Name (or import path) -> the factory that builds it."""
    if is_import_path(spec):
        factory = load_object(spec)
        if not callable(factory):
            raise TypeError(f"{spec!r} is a {type(factory).__name__}, not a class or factory")
        return factory
    table = _TABLES[role]
    if spec in table:
        return table[spec]
    if role == "selector":
        close = difflib.get_close_matches(spec, sorted(table), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown policy {spec!r}{hint}; valid names: {sorted(table)}")
    raise ValueError(f"unknown {role} {spec!r}; valid: {sorted(table)} or an import path "
                     "'package.module:ClassName'")


def _build(factory: Callable[..., Any], params: Mapping[str, Any], where: str) -> Any:
    """``factory(**params)`` after the parameter checks, then the built components' fields."""
    params = dict(params)
    accepted = accepted_by(factory, params) if params else None
    unknown = sorted(set(params) - set(accepted)) if accepted is not None else []
    if unknown:
        what = (f"unknown parameter(s) {unknown} for {where}" if where.startswith("policy ")
                else f"bad parameters for {where}: unknown {unknown}")
        raise ValueError(f"{what}; its parameters: {accepted}{did_you_mean(unknown, accepted)}")
    if params:
        check_types(factory, params, where)
    try:
        built = factory(**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for {where}: {err}; accepted: {accepted}") from None
    for comp in components(built):
        check_fields(comp, f"{where} ({type(comp).__name__})")
    return built


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


def split_params(params: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Flat parameters -> ``{"selector": {...}, "stopper": {...}, "truncator": {...}}``.

    ``stopper.NAME`` / ``truncator.NAME`` address those parts; ``policy.NAME`` or a bare name
    the selector (or preset).

    Raises:
        ValueError: an unknown prefix.
    """
    out: dict[str, dict[str, Any]] = {"selector": {}, "stopper": {}, "truncator": {}}
    for key, value in (params or {}).items():
        prefix, dot, name = str(key).partition(".")
        if not dot:
            out["selector"][key] = value
        elif prefix in PREFIXES and name:
            out[PREFIXES[prefix]][name] = value
        else:
            raise ValueError(f"parameter {key!r}: the prefix must be one of "
                             f"{sorted(PREFIXES)} (or none, for the policy)")
    return out


def part_params(spec: Any, role: str, params: Mapping[str, Any] | None = None
                ) -> list[str] | None:
    """Parameter names the part ``spec`` (selector / preset, stopper or truncator: a name or an
    import path) accepts; ``[]`` for objects (configured already); ``None`` if unknown."""
    if spec is None or not isinstance(spec, str):
        return []
    factory = load_object(spec) if is_import_path(spec) else _TABLES[role].get(spec)
    return None if factory is None else accepted_by(factory, dict(params or {}))


def unknown_params(policy: Any, params: Mapping[str, Any] | None, *, stopper: Any = None,
                   truncator: Any = None) -> list[tuple[str, list[str]]]:
    """``[(flat key, the part's accepted flat names)]`` for every parameter that no part of
    ``resolve_policy(policy, params, stopper=..., truncator=...)`` accepts (parts that accept
    anything are skipped).

    Raises:
        ValueError: an unknown prefix (``split_params``).
    """
    parts = split_params(params)
    out = []
    for role, spec in (("selector", policy), ("stopper", stopper), ("truncator", truncator)):
        given = parts[role]
        if not given or spec is None:
            continue
        accepted = part_params(spec, role, given)
        if accepted is None:
            continue
        prefix = "" if role == "selector" else f"{role}."
        out += [(f"{prefix}{k}", [f"{prefix}{a}" for a in accepted])
                for k in sorted(set(given) - set(accepted))]
    return out
