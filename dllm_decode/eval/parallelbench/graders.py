"""Rule-based ParallelBench graders (Waiting Line lists, Latin square, Sudoku) and the registry.

Every grader has the signature ``grader(prediction: str, record: Mapping) -> dict`` where
``record`` is the released JSONL record, and returns at least ``score`` (lenient parsing) and
``score_strict`` (exact output format), both in [0, 1], plus named components.

List parsing follows v1: the lenient parser takes the text after the *last* ``[`` up to the next
``]`` (either bracket may be missing), splits on commas and strips spaces and double quotes. The
strict parser accepts only an output that is exactly one list literal ``["A B", "C D"]``: both
brackets, ``", "`` separators, every item double-quoted with no inner quote.

Benchmark quirks kept for comparability (the graders compare against the stored answers):

* ``waiting_line/sort`` references are sorted by the whole "First Last" string, i.e. by *first*
  name, although the prompt asks for last-name order.
* ``*_index`` positions are 0-based; inserting at position ``n`` appends.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from dllm_decode.eval.parallelbench.generate import SUDOKU_SIDE, sudoku_completions
from dllm_decode.eval.parallelbench.text_graders import (
    paraphrase_score,
    sentence_to_words_score,
    summary_score,
)

Grader = Callable[..., dict[str, Any]]
_STRICT_LIST: Final[re.Pattern[str]] = re.compile(r'\[(?:"[^"]*"(?:, "[^"]*")*)?\]')
_STRICT_SUDOKU_ROW: Final[re.Pattern[str]] = re.compile(rf"\d{{{SUDOKU_SIDE}}}")


# ---------------------------------------------------------------- list parsing


def parse_list(text: str) -> list[str]:
    """Lenient list parse: segment after the last ``[`` up to the next ``]``, comma-split.

    Empty items are dropped, so ``"[]"`` and ``""`` both parse to ``[]``.
    """
    start = text.rfind("[")
    segment = text[start + 1 :] if start >= 0 else text
    end = segment.find("]")
    if end >= 0:
        segment = segment[:end]
    items = (item.strip().strip('"').strip() for item in segment.split(","))
    return [item for item in items if item]


def parse_list_strict(text: str) -> list[str] | None:
    """Strict list parse of the whole (stripped) output; ``None`` if it is not exactly one list
    literal with ``", "`` separators and double-quoted items."""
    text = text.strip()
    if not _STRICT_LIST.fullmatch(text):
        return None
    return re.findall(r'"([^"]*)"', text)


def _list_result(
    prediction: str, judge: Callable[[list[str]], bool], **components: Any
) -> dict[str, Any]:
    strict = parse_list_strict(prediction)
    return {
        "score": float(judge(parse_list(prediction))),
        "score_strict": float(strict is not None and judge(strict)),
        "format_ok": float(strict is not None),
        **components,
    }


def _answer_input(record: Mapping[str, Any]) -> list[str]:
    answer = record["answer"]
    if not isinstance(answer, Mapping) or "input" not in answer:
        raise ValueError("multi-answer list task needs answer = {'input': [...], ...}")
    return list(answer["input"])


# ---------------------------------------------------------------- list graders


def list_match_score(prediction: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """1 iff the predicted list equals the reference list (copy, reverse, sort, *_index).

    ``sort`` references are by first name and ``*_index`` positions are 0-based (see module
    docstring); this grader just compares with the stored reference.
    """
    answer = record["answer"]
    if not isinstance(answer, str):
        raise ValueError("list_match_score needs a string answer")
    reference = parse_list(answer)
    return _list_result(prediction, lambda items: items == reference)


def list_shuffle_score(prediction: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """1 iff the prediction is a permutation of the input *and* differs from the input order."""
    source = _answer_input(record)

    def judge(items: list[str]) -> bool:
        return sorted(items) == sorted(source) and items != source

    return _list_result(prediction, judge)


def list_random_insert_score(prediction: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """1 iff the new person is present and removing them leaves exactly the input list."""
    source, word = _answer_input(record), record["answer"]["word"]

    def judge(items: list[str]) -> bool:
        if word not in items:
            return False
        rest = items[:]
        rest.remove(word)
        return rest == source

    return _list_result(prediction, judge)


def list_random_remove_score(prediction: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """1 iff the prediction is the input with exactly one person removed (order preserved)."""
    source = _answer_input(record)

    def judge(items: list[str]) -> bool:
        return any(items == source[:i] + source[i + 1 :] for i in range(len(source)))

    return _list_result(prediction, judge)


def list_random_replace_score(prediction: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """1 iff the prediction is the input with exactly one person replaced by the new one."""
    source, word = _answer_input(record), record["answer"]["word"]

    def judge(items: list[str]) -> bool:
        return any(items == source[:i] + [word] + source[i + 1 :] for i in range(len(source)))

    return _list_result(prediction, judge)


# ---------------------------------------------------------------- puzzles


def _latin_symbols(record: Mapping[str, Any]) -> list[str]:
    answer = record["answer"]
    if isinstance(answer, Mapping) and "symbols" in answer:
        return [str(s) for s in answer["symbols"]]
    return parse_list(str(record["input"]["symbols"]))


def _is_latin_square(rows: Sequence[Sequence[str]], symbols: Sequence[str]) -> bool:
    size, target = len(symbols), sorted(symbols)
    if len(rows) != size or any(sorted(row) != target for row in rows):
        return False
    return all(sorted(row[c] for row in rows) == target for c in range(size))


def latin_square_score(prediction: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """Any valid Latin square over the record's symbols scores 1.

    Lenient: among non-empty lines keep those whose comma-separated cells (stripped) form
    exactly the symbol *set*; the first ``size`` kept lines must form a Latin square (each row
    and column holds every symbol once). Strict: the stripped output is exactly ``size`` lines
    of ``size`` comma-separated cells with no spaces, forming a Latin square.
    """
    symbols = _latin_symbols(record)
    size = len(symbols)
    lines = [line for line in prediction.split("\n") if line.strip()]
    rows = [[cell.strip() for cell in line.split(",")] for line in lines]
    kept = [row for row in rows if set(row) == set(symbols)]
    lenient = len(kept) >= size and _is_latin_square(kept[:size], symbols)
    strict_rows = [line.split(",") for line in prediction.strip().split("\n")]
    strict = _is_latin_square(strict_rows, symbols)
    return {"score": float(lenient), "score_strict": float(strict)}


def _sudoku_grid(prediction: str, strict: bool) -> str | None:
    if strict:
        lines = prediction.strip().split("\n")
        ok = len(lines) == SUDOKU_SIDE and all(_STRICT_SUDOKU_ROW.fullmatch(x) for x in lines)
        return "".join(lines) if ok else None
    cleaned = (line.replace(" ", "").replace(",", "").strip() for line in prediction.split("\n"))
    rows = [row for row in cleaned if _STRICT_SUDOKU_ROW.fullmatch(row)]
    return "".join(rows) if len(rows) == SUDOKU_SIDE else None


def sudoku_score(prediction: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """1 iff the predicted grid equals the stored solution.

    Lenient: drop spaces and commas per line, keep lines of exactly 4 digits; there must be
    exactly 4 such lines. Strict: the stripped output is exactly 4 lines of 4 digits.
    Component ``valid``: the (lenient) grid solves the puzzle, which equals ``score`` whenever
    the puzzle has a unique solution (every released and generated puzzle does).
    """
    solution = str(record["answer"]).replace("\n", "")
    puzzle = str(record["input"]["sudoku"]).replace("\n", "")
    lenient, strict = _sudoku_grid(prediction, False), _sudoku_grid(prediction, True)
    return {
        "score": float(lenient == solution),
        "score_strict": float(strict == solution),
        "valid": float(lenient is not None and lenient in sudoku_completions(puzzle)),
    }


# ---------------------------------------------------------------- registry

#: v1 metric name -> grader.
GRADERS: Final[dict[str, Grader]] = {
    "list_match_score": list_match_score,
    "list_shuffle_score": list_shuffle_score,
    "list_random_insert_score": list_random_insert_score,
    "list_random_remove_score": list_random_remove_score,
    "list_random_replace_score": list_random_replace_score,
    "latin_square_score": latin_square_score,
    "sudoku_score": sudoku_score,
    "sentence_to_words_score": sentence_to_words_score,
    "summary_score": summary_score,
    "paraphrase_score": paraphrase_score,
}


#: Metrics whose graders accept ``backends=`` (see :mod:`.text_graders`).
TEXT_METRICS: Final[frozenset[str]] = frozenset(
    {"sentence_to_words_score", "summary_score", "paraphrase_score"}
)


def grade(metric: str, prediction: str, record: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Score one prediction with the named v1 metric (``kwargs`` go to text graders).

    Raises:
        KeyError: unknown metric, listing the known ones.
    """
    if metric not in GRADERS:
        raise KeyError(f"unknown metric {metric!r}; known: {sorted(GRADERS)}")
    if metric not in TEXT_METRICS:
        kwargs = {}  # rule-based graders take no options; callers may pass backends uniformly
    return GRADERS[metric](prediction, record, **kwargs)
