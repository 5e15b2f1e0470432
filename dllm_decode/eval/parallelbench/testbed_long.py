"""Test bed III, long answers: the name pool, held-out record generators and the grader.

Tasks, layout and the exact posterior are ``dllm_decode.models.long_answer`` (the codec) and
``models.long_oracle`` (the oracle). Records are ``{"task", "items", "split", "seed"}``; a
record is in the test split when a hash of its instance says so (one in ``TEST_SHARE``) and
training draws reject those, so held-out prompts are never trained on whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dllm_decode.eval.parallelbench.names import FIRST_NAMES, LAST_NAMES
from dllm_decode.models.long_answer import KEEP, LONG_TASKS, LongCodec, check_task, record_task
from dllm_decode.models.long_oracle import LongAnswerOracle

#: 100 full names: every 5th of the short test bed's 25 x 20 pool (one token each)
LONG_NAMES: Final = tuple(f"{f} {l}" for f in FIRST_NAMES[:25] for l in LAST_NAMES[:20])[::5]
#: list lengths per task at each answer length (content + EOS fit the answer)
LONG_LENGTHS: Final = {
    128: {"copy": (32, 60), "shuffle": (16, 32), "carry": (64, 126)},
    256: {"copy": (64, 124), "shuffle": (32, 60), "carry": (128, 254)},
}
#: probability that a carry slot after the first sets a new name
CARRY_SET: Final = 0.125
#: one instance in TEST_SHARE is held out
TEST_SHARE: Final = 16
SPLITS: Final = ("train", "test")


def long_codec(gen_length: int = 128) -> LongCodec:
    """The test bed's codec over ``LONG_NAMES``."""
    return LongCodec(LONG_NAMES, gen_length)


def long_oracle(gen_length: int = 128, **calibration: Any) -> LongAnswerOracle:
    """The exact oracle (``calibration`` knobs: ``LongAnswerOracle.calibrated``)."""
    oracle = LongAnswerOracle(LONG_NAMES, gen_length=gen_length)
    return oracle.calibrated(**calibration) if calibration else oracle


def lengths(task: str, gen_length: int) -> tuple[int, int]:
    """The list-length range of ``task`` at ``gen_length`` (128 and 256 are the bed's)."""
    check_task(task)
    if gen_length not in LONG_LENGTHS:
        raise ValueError(f"gen_length must be one of {sorted(LONG_LENGTHS)}, got {gen_length}")
    return LONG_LENGTHS[gen_length][task]


def is_test(task: str, items: Sequence[str]) -> bool:
    """Whether an instance belongs to the held-out split (a hash of task and items)."""
    digest = hashlib.sha256(f"{task}:{'|'.join(items)}".encode()).digest()
    return digest[0] % TEST_SHARE == 0


def draw_items(task: str, k: int, rng: random.Random) -> list[str]:
    """One list of ``k`` items: names with replacement (copy), distinct names (shuffle), or a
    carry list (a name, then each slot a new name with probability ``CARRY_SET`` else ``_``)."""
    check_task(task)
    if task == "shuffle":
        if k > len(LONG_NAMES):
            raise ValueError(f"shuffle needs distinct names: k <= {len(LONG_NAMES)}, got {k}")
        return rng.sample(LONG_NAMES, k)
    if task == "copy":
        return [rng.choice(LONG_NAMES) for _ in range(k)]
    return [rng.choice(LONG_NAMES)] + [rng.choice(LONG_NAMES) if rng.random() < CARRY_SET
                                       else KEEP for _ in range(k - 1)]


def long_records(task: str, n: int, seed: int, *, split: str = "test", gen_length: int = 128,
                 length: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """``n`` records of ``task`` from ``split`` (lengths uniform in the task's range, or in
    ``length``); a function of ``(task, seed, split, gen_length, length)`` only."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    lo, hi = length or lengths(task, gen_length)
    codec = long_codec(gen_length)
    if not 1 <= lo <= hi <= codec.max_items(task):
        raise ValueError(f"{task} lengths must lie in [1, {codec.max_items(task)}] at "
                         f"gen_length {gen_length}, got {lo}..{hi}")
    rng = random.Random(f"long:{task}:{seed}:{split}:{gen_length}")
    out: list[dict[str, Any]] = []
    while len(out) < n:
        items = draw_items(task, rng.randint(lo, hi), rng)
        if is_test(task, items) == (split == "test"):
            out.append({"task": task, "items": items, "split": split, "seed": seed})
    return out


def grade(codec: LongCodec, record: Mapping[str, Any], answer: Sequence[int]) -> bool:
    """Exact match (copy, carry) or validity (shuffle: a permutation of the list, separators
    and EOS in place) of ``gen_length`` answer ids."""
    task, items = record_task(record)
    return codec.valid(task, items, answer)


__all__ = ["CARRY_SET", "LONG_LENGTHS", "LONG_NAMES", "LONG_TASKS", "TEST_SHARE", "draw_items",
           "grade", "is_test", "lengths", "long_codec", "long_oracle", "long_records"]
