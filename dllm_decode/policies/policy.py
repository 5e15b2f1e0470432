"""``Policy``: a selector, and optionally a stopper and a truncator, checked against their
protocols (``policies.base``). Built by name in ``policies.resolve``; by object here."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Final

from dllm_decode.policies.supervised import Supervised

#: the method each part must have (the ``policies.base`` protocols)
PROTOCOL: Final[dict[str, str]] = {"selector": "select", "stopper": "should_stop",
                                   "truncator": "truncate"}


@dataclass(frozen=True)
class Policy:
    """A composed decoding policy: a selector, and optionally a stopper and a truncator.

    ``Policy(MyRule(), stopper=SchED(), truncator=EoTP())`` is the Python spelling of
    composition (by names: ``policies.resolve.resolve_policy`` / ``compose``). The parts are
    checked against their protocols (``select`` / ``should_stop`` / ``truncate``, ``TypeError``
    otherwise); a stopper with per-generation memory (``SchED``) gets it through the selector,
    which is wrapped in ``Supervised`` for that unless it already supervises this stopper.
    """

    selector: Any
    stopper: Any = None
    truncator: Any = None
    name: str = "custom"

    def __post_init__(self) -> None:
        selector = attach(self.selector, self.stopper, self.truncator)
        if selector is not self.selector:
            object.__setattr__(self, "selector", selector)


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


def attach(selector: Any, stopper: Any, truncator: Any) -> Any:
    """Check the parts against their protocols and return the selector to use.

    A stopper with per-generation memory (``init_memory``, e.g. ``SchED``) needs the selector
    to own it (the sampler initialises only the selector's memory): the selector is then
    wrapped in ``Supervised`` unless it already supervises this stopper.
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
    return Supervised(selector, stopper)


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
