"""Parameter checks for policy dataclasses: types from the annotations, ranges where declared.

``check_fields`` runs on every component a preset builds (``make_policy``) and in the
``__post_init__`` of the common selectors, so ``tau="high"`` or ``gamma=nan`` fail where they
are given, with the parameter, the value and what is allowed, instead of deep inside a decode.
"""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from typing import Any

_NUMBER = frozenset({"float", "int"})


def check_fields(obj: Any, where: str) -> None:
    """Raise ``ValueError`` if a number / bool field of the dataclass ``obj`` has the wrong type.

    Number fields (annotated ``float`` / ``int``, optionally ``| None``) reject strings, bools
    and NaN; ``int`` fields reject non-integral floats; ``bool`` fields accept only bools.
    """
    if not is_dataclass(obj):
        return
    for f in fields(obj):
        check_value(where, f.name, getattr(obj, f.name), f.type)


def annotation(ann: Any) -> str:
    """An annotation as the string ``from __future__ import annotations`` leaves."""
    return ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))


def check_value(where: str, name: str, value: Any, ann: Any) -> None:
    """Check one value against a number / bool annotation (others are not checked)."""
    text = annotation(ann)
    parts = {p.strip() for p in text.split("|")}
    if value is None and "None" in parts:
        return
    kinds = parts - {"None"}
    if kinds and kinds <= _NUMBER:
        _check_number(where, name, value, text, integral=kinds == {"int"})
    elif kinds == {"bool"} and not isinstance(value, bool):
        raise ValueError(f"{where}: {name} must be a bool, got {value!r} "
                         f"({type(value).__name__})")


def _check_number(where: str, name: str, value: Any, ann: str, *, integral: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {name} must be a number ({ann}), got {value!r} "
                         f"({type(value).__name__})")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{where}: {name} must be a number, got NaN")
    if integral and not float(value).is_integer():
        raise ValueError(f"{where}: {name} must be an integer, got {value!r}")


def check_range(where: str, name: str, value: float, lo: float | None = None,
                hi: float | None = None, *, lo_open: bool = False,
                hi_open: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number in the interval (bounds as
    given; ``None`` = unbounded). Also rejects strings, bools and NaN."""
    _check_number(where, name, value, "float", integral=False)
    low_ok = lo is None or (value > lo if lo_open else value >= lo)
    high_ok = hi is None or (value < hi if hi_open else value <= hi)
    if not (low_ok and high_ok and math.isfinite(value)):
        left = "(-inf" if lo is None else ("(" if lo_open else "[") + f"{lo:g}"
        right = "inf)" if hi is None else f"{hi:g}" + (")" if hi_open else "]")
        raise ValueError(f"{where}: {name} must be a finite number in {left}, {right}, "
                         f"got {value!r}")
