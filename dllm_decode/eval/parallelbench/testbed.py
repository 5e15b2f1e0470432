"""The word-level test bed's records: the name pool (500 full names) and zero-shot Waiting
Line records over it (``waiting_line_records``). The rest of the test bed (vocabulary,
tokenizer, grading, the oracle over it) is ``dllm_decode.train.testbed``, which re-exports
these; the sweep runner's test-bed mode reads them from here."""

from __future__ import annotations

from typing import Any, Final

from dllm_decode.eval.parallelbench.generate import generate_task, split_seed
from dllm_decode.eval.parallelbench.names import FIRST_NAMES, LAST_NAMES
from dllm_decode.models.waiting_line import task_name

#: first and last names of the test-bed pool (the first entries of the generator's lists)
TESTBED_POOL: Final = (tuple(FIRST_NAMES[:25]), tuple(LAST_NAMES[:20]))
#: every full name of the pool, in vocabulary order
TESTBED_NAMES: Final = tuple(f"{f} {l}" for f in TESTBED_POOL[0] for l in TESTBED_POOL[1])
#: list lengths of test-bed records
MIN_ITEMS: Final = 3
MAX_ITEMS: Final = 5


def waiting_line_records(task: str, n: int, seed: int | None = None, *, split: str = "test",
                    length: int | None = None) -> list[dict[str, Any]]:
    """``n`` Waiting Line records of ``task`` over the test-bed pool (zero-shot).

    Args:
        task: ``"copy"`` or ``"waiting_line/copy"`` (any of the ten operations).
        n: number of records; lengths 3..5 balanced (or all ``length``).
        seed: generator seed (default: the split's stable seed for the task).
        split: which instance split to draw from (training uses ``"train"``).
    """
    full = f"waiting_line/{task_name(task)}"
    seed = split_seed(full, split) if seed is None else seed
    lo, hi = (length, length) if length else (MIN_ITEMS, MAX_ITEMS)
    return generate_task(full, n, seed, min_len=lo, max_len=hi, icl_examples=0, split=split,
                         names=TESTBED_POOL)
