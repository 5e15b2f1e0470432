"""Clean-room generators for ParallelBench-compatible Waiting Line and Puzzle tasks.

Records follow the released JSONL schema (see ``dllm_decode/eval/parallelbench/__init__.py``):
``input`` (template fields + ``icl_examples``), ``answer`` (a string, or a dict for tasks with
many valid answers), optional ``output_format`` (the infill skeleton) and ``metadata``.

Semantics pinned by the benchmark (and by tests):

* Waiting Line positions are **0-based**; ``insert`` at position ``n`` appends.
* ``sort`` is the plain string sort of "First Last", i.e. by *first* name, although the prompt
  says "by last name" (the released data does the same).
* ``shuffle`` answers always differ from the input order.

Everything is driven by one ``random.Random(seed)``: the same arguments give the same records.
Held-out evaluation: ``split=`` keeps only instances whose :func:`record_key` hashes into that
split's buckets, so train / validation / test instances never coincide whatever the seeds.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
from typing import Any, Final

from dllm_decode.eval.parallelbench.names import FIRST_NAMES, LAST_NAMES
from dllm_decode.eval.parallelbench.sudoku import (  # noqa: F401  (re-exported)
    SUDOKU_BOX,
    SUDOKU_DIGITS,
    SUDOKU_SIDE,
    is_sudoku_solution,
    sudoku_completions,
    sudoku_solutions,
)

WAITING_LINE_OPS: Final[tuple[str, ...]] = (
    "copy", "reverse", "sort", "shuffle",
    "insert_index", "insert_random", "remove_index", "remove_random",
    "replace_index", "replace_random",
)  # fmt: skip
#: Every task name the generator accepts by default (``puzzle/sudoku_n4_<givens>`` with other
#: given counts and ``puzzle/latin_square_n<size>`` with other sizes are accepted too).
TASKS: Final[tuple[str, ...]] = (
    *(f"waiting_line/{op}" for op in WAITING_LINE_OPS),
    *(f"waiting_line_n15/{op}" for op in WAITING_LINE_OPS),
    "puzzle/latin_square_n4",
    "puzzle/sudoku_n4_12",
)
SPLITS: Final[tuple[str, ...]] = ("train", "validation", "test")
#: Share of instance-hash buckets (out of ``_SPLIT_BUCKETS``) owned by each split.
_SPLIT_SHARES: Final[dict[str, int]] = {"test": 10, "validation": 10, "train": 80}
_SPLIT_BUCKETS: Final[int] = 100
#: Default list lengths per Waiting Line family (released data: 25 each of 3..6, or all 15).
_DEFAULT_LENGTHS: Final[dict[str, tuple[int, int]]] = {
    "waiting_line": (3, 6),
    "waiting_line_n15": (15, 15),
}
#: Latin-square symbols are drawn from A-Z and 0-9, as in the released task.
SYMBOL_POOL: Final[str] = string.ascii_uppercase + string.digits
#: Fewest givens for which a 4x4 Sudoku can have a unique solution.
SUDOKU_MIN_GIVENS: Final[int] = 4
#: Rejection-sampling budget for unique-solution puzzles / split-filtered instances.
MAX_TRIES: Final[int] = 10_000
MASK_ITEM: Final[str] = "[MASK]"

Record = dict[str, Any]
#: ``(first_names, last_names)`` a Waiting Line person is drawn from
NamePool = tuple[tuple[str, ...], tuple[str, ...]]


def format_list(items: list[str]) -> str:
    """Render names as the benchmark's list literal: ``["A B", "C D"]``."""
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def _output_format(length: int) -> str:
    return format_list([MASK_ITEM] * length)


# ---------------------------------------------------------------- task names and splits


def parse_task(task: str) -> tuple[str, str, int | None]:
    """Split a task id into ``(family, kind, size)``.

    ``family`` is ``waiting_line``, ``waiting_line_n15`` or ``puzzle``; ``kind`` the operation
    (``copy`` ...) or ``latin_square`` / ``sudoku``; ``size`` the Latin-square side or the number
    of Sudoku givens (``None`` for Waiting Line).

    Raises:
        ValueError: for an unknown task, listing the valid names.
    """
    family, _, name = task.partition("/")
    if family in _DEFAULT_LENGTHS and name in WAITING_LINE_OPS:
        return family, name, None
    if family == "puzzle":
        match = re.fullmatch(r"latin_square_n(\d+)", name)
        if match and 2 <= int(match[1]) <= len(SYMBOL_POOL):
            return family, "latin_square", int(match[1])
        match = re.fullmatch(r"sudoku_n4_(\d+)", name)
        if match and SUDOKU_MIN_GIVENS <= int(match[1]) <= SUDOKU_SIDE**2:
            return family, "sudoku", int(match[1])
    raise ValueError(
        f"unknown generator task {task!r}; valid: {', '.join(TASKS)} "
        f"(or puzzle/sudoku_n4_<4..16>, puzzle/latin_square_n<2..36>)"
    )


def split_seed(task: str, split: str) -> int:
    """A stable seed for ``(task, split)``; seeds of different splits never coincide.

    The seed is ``3 * h + index(split)`` for a hash ``h`` of the task, so the residue mod 3
    identifies the split. Pair it with ``generate_task(..., split=split)`` for instance-level
    disjointness (seeds alone cannot stop two RNG streams from drawing the same puzzle).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    digest = hashlib.sha256(task.encode()).hexdigest()
    return (int(digest[:12], 16) % 2**28) * len(SPLITS) + SPLITS.index(split)


def record_key(task: str, record: Record) -> str:
    """Canonical identity of a problem instance (its input fields minus demonstrations).

    Waiting Line lists of any length share the ``waiting_line`` family, so a key also matches
    an instance of the n15 variant with identical content.
    """
    family, kind, _ = parse_task(task)
    family = "waiting_line" if family.startswith("waiting_line") else family
    fields = {k: v for k, v in record["input"].items() if k != "icl_examples"}
    return f"{family}/{kind}:" + json.dumps(fields, sort_keys=True)


def split_of(task: str, record: Record) -> str:
    """Which split (``train`` / ``validation`` / ``test``) owns this instance."""
    bucket = int(hashlib.sha256(record_key(task, record).encode()).hexdigest()[:8], 16)
    bucket %= _SPLIT_BUCKETS
    for split in ("test", "validation", "train"):
        if bucket < _SPLIT_SHARES[split]:
            return split
        bucket -= _SPLIT_SHARES[split]
    raise AssertionError("split shares must sum to the bucket count")


# ---------------------------------------------------------------- waiting line


def _draw_people(rng: random.Random, count: int, pool: NamePool | None = None) -> list[str]:
    first, last = pool or (FIRST_NAMES, LAST_NAMES)
    if len(first) * len(last) <= count:
        raise ValueError(f"{len(first)} x {len(last)} names cannot give {count} people")
    people: list[str] = []
    while len(people) < count:
        name = f"{rng.choice(first)} {rng.choice(last)}"
        if name not in people:
            people.append(name)
    return people


def _waiting_line_record(op: str, length: int, rng: random.Random,
                         pool: NamePool | None = None) -> Record:
    """One Waiting Line record with ``length`` people (plus one newcomer for insert/replace)."""
    people = _draw_people(rng, length + 1, pool)
    names, newcomer = people[:length], people[length]
    action, _, mode = op.partition("_")
    inputs: dict[str, Any] = {"context": format_list(names)}
    metadata: dict[str, Any] = {"length": length}
    answer: str | dict[str, Any]
    has_skeleton = op in ("copy", "shuffle") or action in ("insert", "replace")

    if op == "copy":
        answer = format_list(names)
    elif op == "reverse":
        answer = format_list(names[::-1])
    elif op == "sort":
        answer = format_list(sorted(names))  # plain string order: by first name (benchmark quirk)
    elif op == "shuffle":
        if length < 2:
            raise ValueError("shuffle needs lists of at least 2 people")
        shuffled = names[:]
        while shuffled == names:
            rng.shuffle(shuffled)
        answer = {"input": names, "example": format_list(shuffled)}
    else:
        index = rng.randint(0, length) if action == "insert" else rng.randint(0, length - 1)
        result = names[:]
        if action == "insert":
            result.insert(index, newcomer)
        elif action == "remove":
            del result[index]
        else:
            result[index] = newcomer
        if action != "remove":
            inputs["word"] = newcomer
        if mode == "index":
            inputs["index"] = index
            answer = format_list(result)
        else:  # any valid answer is accepted; store the input, the newcomer and one example
            answer = {"input": names}
            if action != "remove":
                answer["word"] = newcomer
            answer["example"] = format_list(result)
        metadata["index"] = index if mode == "index" else None
        if action != "remove":
            metadata["word"] = newcomer

    record: Record = {"input": inputs, "answer": answer}
    if has_skeleton:
        count = length + (action == "insert")
        record["output_format"] = _output_format(count)
    record["metadata"] = metadata
    return record


def _length_schedule(n: int, min_len: int, max_len: int) -> list[int]:
    """Balanced lengths in ascending order: ``n // k`` per length, remainder to the shortest."""
    lengths = list(range(min_len, max_len + 1))
    per, extra = divmod(n, len(lengths))
    return [length for i, length in enumerate(lengths) for _ in range(per + (i < extra))]


# ---------------------------------------------------------------- puzzles


def _latin_square_record(size: int, rng: random.Random) -> Record:
    symbols = rng.sample(SYMBOL_POOL, size)
    rows = [[symbols[(r + c) % size] for c in range(size)] for r in range(size)]
    rng.shuffle(rows)
    columns = list(range(size))
    rng.shuffle(columns)
    square = "\n".join(",".join(row[c] for c in columns) for row in rows)
    return {
        "input": {"size": size, "symbols": "[" + ", ".join(symbols) + "]"},
        "answer": {"symbols": symbols, "example": square},
        "metadata": {"length": size},
    }


def _grid_text(cells: str) -> str:
    return "\n".join(cells[r * SUDOKU_SIDE : (r + 1) * SUDOKU_SIDE] for r in range(SUDOKU_SIDE))


def _sudoku_record(givens: int, rng: random.Random) -> Record:
    """A 4x4 Sudoku with ``givens`` filled cells and a unique solution."""
    for _ in range(MAX_TRIES):
        solution = rng.choice(sudoku_solutions())
        blanks = set(rng.sample(range(SUDOKU_SIDE**2), SUDOKU_SIDE**2 - givens))
        puzzle = "".join("0" if i in blanks else v for i, v in enumerate(solution))
        if len(sudoku_completions(puzzle)) == 1:
            return {
                "input": {"sudoku": _grid_text(puzzle)},
                "answer": _grid_text(solution),
                "metadata": {"length": givens},
            }
    raise RuntimeError(f"no unique 4x4 Sudoku with {givens} givens after {MAX_TRIES} draws")


# ---------------------------------------------------------------- public entry point


def generate_task(
    task: str,
    n: int,
    seed: int,
    *,
    min_len: int | None = None,
    max_len: int | None = None,
    icl_examples: int = 1,
    split: str | None = None,
    names: NamePool | None = None,
) -> list[Record]:
    """Generate ``n`` records of ``task`` in the released ParallelBench JSONL schema.

    Args:
        task: a name from :data:`TASKS` (or another Sudoku given count / Latin-square size).
        n: number of records (>= 0).
        seed: seed of the single ``random.Random`` that drives everything.
        min_len, max_len: Waiting Line list lengths (inclusive); default 3..6, or 15..15 for
            ``waiting_line_n15``. Lengths are balanced (``n // k`` each, the remainder to the
            shortest) and emitted in ascending order, like the released files. Ignored by puzzles.
        icl_examples: demonstrations attached to each record under ``input.icl_examples``
            (drawn after the main records, so the main records do not depend on this count).
        split: if given (``train`` / ``validation`` / ``test``), keep only instances owned by
            that split (:func:`split_of`); demonstrations are drawn from the same split.
        names: ``(first, last)`` name lists for Waiting Line people (default: the full lists).

    Returns:
        ``n`` records (dicts). Deterministic in all arguments.

    Raises:
        ValueError: bad task, split, counts or lengths.
    """
    family, kind, size = parse_task(task)
    if n < 0 or icl_examples < 0:
        raise ValueError(f"n and icl_examples must be >= 0, got {n} and {icl_examples}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    rng = random.Random(seed)
    if family == "puzzle":
        side = SUDOKU_SIDE if size is None else size
        builder = _latin_square_record if kind == "latin_square" else _sudoku_record
        lo = hi = 0  # puzzles have no list length

        def make(length: int) -> Record:
            return builder(side, rng)
    else:
        default_min, default_max = _DEFAULT_LENGTHS[family]
        lo = default_min if min_len is None else min_len
        hi = default_max if max_len is None else max_len
        if not 1 <= lo <= hi:
            raise ValueError(f"need 1 <= min_len <= max_len, got {lo}..{hi}")

        def make(length: int) -> Record:
            return _waiting_line_record(kind, length, rng, names)

    def draw(length: int) -> Record:
        for _ in range(MAX_TRIES):
            record = make(length)
            if split is None or split_of(task, record) == split:
                return record
        raise RuntimeError(f"could not draw a {split!r} instance of {task} in {MAX_TRIES} tries")

    records = [draw(length) for length in _length_schedule(n, lo, hi)]
    if icl_examples == 0:
        return records
    # Demonstrations: unbalanced lengths, drawn after every main record, shot-major order.
    demos = [draw(rng.randint(lo, hi)) for _ in range(n * icl_examples)]
    if kind == "sudoku":  # released Sudoku demonstrations carry only input and answer
        demos = [{"input": d["input"], "answer": d["answer"]} for d in demos]
    out = []
    for i, record in enumerate(records):
        inputs = dict(record["input"])
        inputs["icl_examples"] = [demos[shot * n + i] for shot in range(icl_examples)]
        out.append({**record, "input": inputs})
    return out
