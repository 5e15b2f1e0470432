"""Waiting Line answer sets: the valid answers of a record, by enumeration.

Shared by the exact oracle (``oracle.py``) and the graders of the word-level test bed.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Final

#: the ten Waiting Line operations the oracle knows
TASK_NAMES: Final = (
    "copy", "reverse", "sort", "shuffle", "insert_index", "insert_random",
    "remove_index", "remove_random", "replace_index", "replace_random",
)
#: shuffle answers are enumerated (n! - 1 of them); beyond this list length that is too many
MAX_SHUFFLE_ITEMS: Final = 8


def task_name(task: str) -> str:
    """``"waiting_line/copy"``, ``"waiting_line_n15/copy"`` or ``"copy"`` -> ``"copy"``."""
    family, _, name = task.rpartition("/")
    if name not in TASK_NAMES or family not in ("", "waiting_line", "waiting_line_n15"):
        raise ValueError(f"not a Waiting Line task: {task!r}; the oracle knows "
                         f"{', '.join(TASK_NAMES)} (optionally prefixed by 'waiting_line/')")
    return name


@lru_cache(maxsize=4096)
def valid_answers(task: str, items: tuple[str, ...], word: str | None = None,
                  index: int | None = None) -> tuple[tuple[str, ...], ...]:
    """Every valid answer list of a Waiting Line instance, without duplicates, in a fixed order.

    Positions are 0-based; ``sort`` is the plain string order (by first name), as in the
    benchmark; ``shuffle`` is every permutation except the input order.
    """
    op = task_name(task)
    n = len(items)
    needs_word = op.startswith(("insert", "replace"))
    if needs_word and word is None:
        raise ValueError(f"{op} needs the new person's name (word)")
    if op.endswith("_index") and index is None:
        raise ValueError(f"{op} needs an index")
    if op == "copy":
        out = [items]
    elif op == "reverse":
        out = [items[::-1]]
    elif op == "sort":
        out = [tuple(sorted(items))]
    elif op == "shuffle":
        if n > MAX_SHUFFLE_ITEMS:
            raise ValueError(f"shuffle oracle enumerates n! answers; n={n} > "
                             f"{MAX_SHUFFLE_ITEMS} is not supported")
        out = [p for p in itertools.permutations(items) if p != items]
    else:
        action = op.split("_")[0]
        slots = range(n + 1) if action == "insert" else range(n)
        if op.endswith("_index"):
            if index not in slots:
                raise ValueError(f"{op}: index {index} out of range for {n} items")
            slots = [index]
        out = []
        for i in slots:
            if action == "insert":
                out.append(items[:i] + (word,) + items[i:])
            elif action == "remove":
                out.append(items[:i] + items[i + 1:])
            else:
                out.append(items[:i] + (word,) + items[i + 1:])
    return tuple(dict.fromkeys(out))


def record_fields(record: Mapping[str, Any]) -> tuple[tuple[str, ...], str | None, int | None]:
    """``(items, word, index)`` of a record in the ParallelBench JSONL schema."""
    inputs = record["input"]
    items = tuple(json.loads(inputs["context"]))
    index = inputs.get("index")
    return items, inputs.get("word"), None if index is None else int(index)


def is_valid(task: str, record: Mapping[str, Any], prediction: Sequence[str]) -> bool:
    """Whether a predicted item list is one of the record's valid answers."""
    return tuple(prediction) in valid_answers(task_name(task), *record_fields(record))
