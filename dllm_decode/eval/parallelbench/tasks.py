"""Registry of ParallelBench task ids: category, v1 metric (grader) and generation budget."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dllm_decode.eval.parallelbench.generate import WAITING_LINE_OPS
from dllm_decode.eval.parallelbench.graders import grade

#: Generation budget (max_tokens) of the v1 sweeps: 32 for Waiting Line, 64 for the rest.
WAITING_LINE_MAX_TOKENS: Final[int] = 32
DEFAULT_MAX_TOKENS: Final[int] = 64
#: The 15-name variant was run with 128 tokens in v1's dLLM-vs-LLM comparison (15 names do
#: not fit in 32 tokens).
WAITING_LINE_N15_MAX_TOKENS: Final[int] = 128
#: Reporting categories of the 17 benchmark tasks.
CATEGORIES: Final[tuple[str, ...]] = ("waiting_line", "text_writing", "puzzle")

_WAITING_LINE_METRICS: Final[dict[str, str]] = {
    "shuffle": "list_shuffle_score",
    "insert_random": "list_random_insert_score",
    "remove_random": "list_random_remove_score",
    "replace_random": "list_random_replace_score",
}
_W2S_LEVELS: Final[tuple[str, ...]] = ("easy", "medium", "hard")
_W2S_SIZES: Final[tuple[int, ...]] = (1, 3, 4, 5, 6, 7)


@dataclass(frozen=True)
class TaskSpec:
    """One task id.

    name: ``<category dir>/<task>`` as in the released tree, e.g. ``waiting_line/copy``.
    category: reporting group (:data:`CATEGORIES`, or ``waiting_line_n15`` / ``variants``).
    metric: v1 metric name, a key of :data:`~.graders.GRADERS`.
    max_tokens: generation length used by the v1 sweeps.
    icl_examples: demonstrations per prompt in the released data.
    """

    name: str
    category: str
    metric: str
    max_tokens: int
    icl_examples: int

    def grade(self, prediction: str, record: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Score one prediction (see :func:`~.graders.grade`)."""
        return grade(self.metric, prediction, record, **kwargs)


def _build() -> dict[str, TaskSpec]:
    specs: dict[str, TaskSpec] = {}
    for family, category, budget in (
        ("waiting_line", "waiting_line", WAITING_LINE_MAX_TOKENS),
        ("waiting_line_n15", "waiting_line_n15", WAITING_LINE_N15_MAX_TOKENS),
    ):
        for op in WAITING_LINE_OPS:
            metric = _WAITING_LINE_METRICS.get(op, "list_match_score")
            specs[f"{family}/{op}"] = TaskSpec(f"{family}/{op}", category, metric, budget, 1)
    for name, metric in (
        ("paraphrase_summarize/chatgpt-paraphrases", "paraphrase_score"),
        ("paraphrase_summarize/samsum", "summary_score"),
    ):
        specs[name] = TaskSpec(name, "text_writing", metric, DEFAULT_MAX_TOKENS, 0)
    for level in _W2S_LEVELS:
        variants = [("", "text_writing")] + [(f"_n{k}", "variants") for k in _W2S_SIZES]
        for suffix, category in variants:
            name = f"words_to_sentence/{level}{suffix}"
            specs[name] = TaskSpec(name, category, "sentence_to_words_score", DEFAULT_MAX_TOKENS, 0)
    specs["puzzle/latin_square_n4"] = TaskSpec(
        "puzzle/latin_square_n4", "puzzle", "latin_square_score", DEFAULT_MAX_TOKENS, 1
    )
    specs["puzzle/sudoku_n4_12"] = TaskSpec(
        "puzzle/sudoku_n4_12", "puzzle", "sudoku_score", DEFAULT_MAX_TOKENS, 1
    )
    return specs


#: Every released task id (17 benchmark tasks, 10 n15 variants, 18 words-to-sentence variants).
TASK_SPECS: Final[dict[str, TaskSpec]] = _build()
#: The 17 tasks of the benchmark proper.
BENCHMARK_TASKS: Final[tuple[str, ...]] = tuple(
    name for name, spec in TASK_SPECS.items() if spec.category in CATEGORIES
)


def task_spec(name: str) -> TaskSpec:
    """Spec of a released task id, or of a generated puzzle variant
    (``puzzle/sudoku_n4_<givens>``, ``puzzle/latin_square_n<size>``).

    Raises:
        KeyError: unknown task, listing the released ids.
    """
    if name in TASK_SPECS:
        return TASK_SPECS[name]
    if re.fullmatch(r"puzzle/sudoku_n4_\d+", name):
        return TaskSpec(name, "variants", "sudoku_score", DEFAULT_MAX_TOKENS, 1)
    if re.fullmatch(r"puzzle/latin_square_n\d+", name):
        return TaskSpec(name, "variants", "latin_square_score", DEFAULT_MAX_TOKENS, 1)
    raise KeyError(f"unknown ParallelBench task {name!r}; known: {', '.join(TASK_SPECS)}")
