"""Composition: selector + stopper + truncator, by object, by name or by import path.

One spelling everywhere:

* Python: ``Policy(MyRule(), stopper=SchED(), truncator=EoTP())`` or, by names,
  ``compose("threshold", stopper="sched", truncator="eotp", params={"tau": 0.8,
  "stopper.tau_low": 2.0})``;
* grids: ``policy: threshold``, ``stopper: sched``, ``truncator: eotp`` in a sweep, with
  ``params: {tau: 0.8, stopper.tau_low: [2.0, 2.5]}``;
* CLI: ``--policy threshold --stopper sched --truncator eotp --param tau=0.8
  --param stopper.tau_low=2.0``.

Parameters are one flat mapping: a bare name (or ``policy.NAME``) goes to the selector / preset,
``stopper.NAME`` to the stopper, ``truncator.NAME`` to the truncator. Any part may be a user
class given as an import path, ``package.module:ClassName`` or ``path/to/file.py:ClassName``,
built with its parameters and checked against the protocol (``select`` / ``should_stop`` /
``truncate``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

#: the method each part must have (the ``policies.base`` protocols)
PROTOCOL: Final[dict[str, str]] = {"selector": "select", "stopper": "should_stop",
                                   "truncator": "truncate"}
#: parameter prefixes and the part they address (a bare name addresses the selector)
PREFIXES: Final[dict[str, str]] = {"policy": "selector", "selector": "selector",
                                   "stopper": "stopper", "truncator": "truncator"}


def _sched(**params: Any) -> Any:
    from dllm_decode.policies.sched import SchED

    return SchED(**params)


def _prophet(answer_offset: int = 0, answer_length: int = 5, **params: Any) -> Any:
    from dllm_decode.policies.confidence import TopK
    from dllm_decode.policies.sched import prophet_policy

    return prophet_policy(base=TopK(), answer_offset=answer_offset,
                          answer_length=answer_length, **params).stopper


def _eotp(**params: Any) -> Any:
    from dllm_decode.policies.learn2pd import EoTP

    return EoTP(**params)


def _eos_cut(**params: Any) -> Any:
    from dllm_decode.policies.window import EosCut

    return EosCut(**params)


#: stopper name -> factory(**params) (``--stopper`` / grid ``stopper:``)
STOPPERS: dict[str, Callable[..., Any]] = {"sched": _sched, "prophet": _prophet}
#: truncator name -> factory(**params) (``--truncator`` / grid ``truncator:``)
TRUNCATORS: dict[str, Callable[..., Any]] = {"eotp": _eotp, "eos_cut": _eos_cut}


def register_stopper(name: str, factory: Callable[..., Any]) -> None:
    """Add a named stopper (e.g. from a plugin)."""
    STOPPERS[name] = factory


def register_truncator(name: str, factory: Callable[..., Any]) -> None:
    """Add a named truncator (e.g. from a plugin)."""
    TRUNCATORS[name] = factory


def is_import_path(spec: Any) -> bool:
    """True for ``module:Name`` / ``file.py:Name`` strings."""
    return isinstance(spec, str) and ":" in spec


def load_object(spec: str) -> Any:
    """The object named by ``package.module:Name`` or ``path/to/file.py:Name``.

    The current directory is searched too (console scripts do not put it on ``sys.path``).

    Raises:
        ValueError: a malformed spec, a module that cannot be imported or a missing name.
    """
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"import path must be 'package.module:Name' or 'file.py:Name', "
                         f"got {spec!r}")
    if module_name.endswith(".py"):
        module = _load_file(Path(module_name), spec)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            cwd = os.getcwd()
            if cwd in sys.path or err.name != module_name.split(".")[0]:
                raise ValueError(f"cannot import {module_name!r} for {spec!r}: {err}") from None
            sys.path.insert(0, cwd)
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as again:
                raise ValueError(f"cannot import {module_name!r} for {spec!r}: {again}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} ({spec!r})") from None


def _load_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise ValueError(f"policy file not found: {path} ({spec!r})")
    name = f"_dllm_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses resolve their module while the file runs
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def check_part(obj: Any, role: str, origin: str = "") -> Any:
    """``obj`` if it satisfies the ``role`` protocol, else a ``TypeError`` that says why."""
    method = PROTOCOL[role]
    if isinstance(obj, str) and not origin:
        raise TypeError(f"{role} {obj!r} is a name: Policy takes objects; build by name with "
                        f"compose({obj!r}, ...) (stopper=/truncator= names work there too)")
    if isinstance(obj, type):
        raise TypeError(f"{role} {obj.__name__} is a class: pass an instance, "
                        f"{obj.__name__}(...)")
    if not callable(getattr(obj, method, None)):
        what = f" built from {origin!r}" if origin else ""
        raise TypeError(f"{role} {type(obj).__name__}{what} does not satisfy the {role} "
                        f"protocol: it needs a method {method}(state"
                        f"{', commit' if role == 'truncator' else ''}) (see "
                        "dllm_decode.policies.base)")
    return obj


def build_part(spec: Any, role: str, params: Mapping[str, Any] | None = None) -> Any:
    """A stopper or truncator from a name, an import path or an object (returned as is).

    Raises:
        ValueError: an unknown name, bad parameters, or parameters given with an object.
        TypeError: the built object does not satisfy the protocol.
    """
    params = dict(params or {})
    if not isinstance(spec, str):
        if params:
            raise ValueError(f"parameters {sorted(params)} given for a {role} object")
        return check_part(spec, role)
    if is_import_path(spec):
        return check_part(_construct(load_object(spec), params, spec), role, spec)
    table = STOPPERS if role == "stopper" else TRUNCATORS
    if spec not in table:
        raise ValueError(f"unknown {role} {spec!r}; valid: {sorted(table)} or an import path "
                         "'package.module:ClassName'")
    return check_part(_construct(table[spec], params, spec), role, spec)


def _construct(factory: Any, params: Mapping[str, Any], spec: str) -> Any:
    """``factory(**params)`` after the parameter checks (``validate``): unknown names with the
    closest valid one, number / bool types; the built components' fields are checked too."""
    from dllm_decode.policies.registry import accepted_by, check_types, components, did_you_mean
    from dllm_decode.policies.validate import check_fields

    if not callable(factory):
        raise TypeError(f"{spec!r} is a {type(factory).__name__}, not a class or factory")
    params = dict(params)
    accepted = accepted_by(factory, params) if params else None
    unknown = sorted(set(params) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ValueError(f"bad parameters for {spec!r}: unknown {unknown}; its parameters: "
                         f"{accepted}{did_you_mean(unknown, accepted)}")
    if params:
        check_types(factory, params, repr(spec))
    try:
        built = factory(**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for {spec!r}: {err}") from None
    for comp in components(built):
        check_fields(comp, f"{spec!r} ({type(comp).__name__})")
    return built


def part_params(spec: Any, role: str, params: Mapping[str, Any] | None = None
                ) -> list[str] | None:
    """Parameter names the part ``spec`` (selector / preset, stopper or truncator: a name or an
    import path) accepts; ``[]`` for objects (configured already); ``None`` if unknown."""
    from dllm_decode.policies.registry import accepted_by, accepted_params

    if spec is None or not isinstance(spec, str):
        return []
    if role == "selector" or is_import_path(spec):
        return accepted_params(spec, dict(params or {}))
    factory = (STOPPERS if role == "stopper" else TRUNCATORS).get(spec)
    return None if factory is None else accepted_by(factory)


def unknown_params(policy: Any, params: Mapping[str, Any] | None, *, stopper: Any = None,
                   truncator: Any = None) -> list[tuple[str, list[str]]]:
    """``[(flat key, the part's accepted flat names)]`` for every parameter that no part of
    ``compose(policy, stopper, truncator)`` accepts (parts that accept anything are skipped).

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


def build_from_path(spec: str, params: Mapping[str, Any]) -> Any:
    """``make_policy`` for an import path: the user's class (or factory) with ``params``.

    A factory may return a ready ``Policy``; anything else must be a selector.
    """
    from dllm_decode.policies.registry import Policy

    built = _construct(load_object(spec), params, spec)
    if isinstance(built, Policy):
        return built
    return Policy(selector=check_part(built, "selector", spec), name=spec)


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


def compose(policy: Any = "low_confidence", *, stopper: Any = None, truncator: Any = None,
            params: Mapping[str, Any] | None = None) -> Any:
    """Build a ``Policy`` from a selector / preset, an optional stopper and truncator.

    Args:
        policy: preset name, import path ``module:Class``, ``Policy`` or selector object.
        stopper: ``None``, a name in ``STOPPERS``, an import path or a stopper object.
        truncator: ``None``, a name in ``TRUNCATORS``, an import path or a truncator object.
        params: flat parameters (see ``split_params``).

    Raises:
        ValueError: the preset already has a stopper / truncator and another one is given,
            or bad names / parameters.
    """
    from dllm_decode.policies.registry import Policy, make_policy

    parts = split_params(params)
    if not isinstance(policy, str) and parts["selector"]:
        raise ValueError(f"parameters {sorted(parts['selector'])} given for a policy object")
    base = make_policy(policy, **parts["selector"])
    for role, spec in (("stopper", stopper), ("truncator", truncator)):
        if spec is None and parts[role]:
            raise ValueError(f"parameters {sorted(parts[role])} given but no {role}")
    if stopper is None and truncator is None:
        return base
    stop = base.stopper if stopper is None else build_part(stopper, "stopper", parts["stopper"])
    trunc = (base.truncator if truncator is None
             else build_part(truncator, "truncator", parts["truncator"]))
    for role, old, new in (("stopper", base.stopper, stopper),
                           ("truncator", base.truncator, truncator)):
        if old is not None and new is not None:
            raise ValueError(f"policy {base.name!r} already has a {role}; drop --{role} or "
                             "use its base preset")
    names = [base.name] + [s if isinstance(s, str) else type(s).__name__
                           for s in (stopper, truncator) if s is not None]
    return Policy(selector=base.selector, stopper=stop, truncator=trunc, name="+".join(names))


def attach(selector: Any, stopper: Any, truncator: Any) -> Any:
    """Check the parts against their protocols and return the selector to use.

    A stopper with per-generation memory (``init_memory``, e.g. ``SchED``) needs the selector
    to own it (the sampler initialises only the selector's memory): the selector is then
    wrapped in ``sched.Supervised`` unless it already supervises this stopper.
    """
    check_part(selector, "selector")
    if truncator is not None:
        check_part(truncator, "truncator")
        if callable(getattr(truncator, "init_memory", None)):
            raise ValueError(f"truncator {type(truncator).__name__} has init_memory: truncators "
                             "keep no per-generation memory (keep it in the selector's)")
    if stopper is None:
        return selector
    check_part(stopper, "stopper")
    if not callable(getattr(stopper, "init_memory", None)):
        return selector
    if getattr(selector, "stopper", None) is stopper:  # already a Supervised(., stopper)
        return selector
    from dllm_decode.policies.sched import Supervised

    return Supervised(selector, stopper)

