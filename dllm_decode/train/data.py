"""Training data: generated ParallelBench-style records -> tokenized, left-padded canvases.

A training sequence is exactly what a decoder sees at inference: the chat-rendered prompt
(``render_messages`` through the tokenizer's chat template, as the eval codec renders it), then
the generation region of ``G`` positions holding the reference answer, EOS, and EOS padding.
Records are drawn fresh every step from the clean-room generators (``split="train"``; the eval
set uses ``split="validation"``), seeded by ``(seed, step)`` only, so a resumed run sees the
same data as an uninterrupted one.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.eval.parallelbench.codec import TokenizerCodec
from dllm_decode.eval.parallelbench.generate import generate_task
from dllm_decode.eval.parallelbench.prompts import reference_answer

Example = tuple[str, Mapping[str, Any]]  # (task id, record)


@dataclass(frozen=True)
class Batch:
    """A batch of clean canvases.

    tokens: ``[B, L]`` int64, left-padded prompt then the ``G`` answer positions.
    valid: ``[B, L]`` bool, False on left padding.
    prompt_length: ``P``; the answer region is ``[P, L)``.
    content: ``[B, G]`` bool, answer positions before the first EOS (the list text itself).
    tasks: the task id of each row.
    """

    tokens: Tensor
    valid: Tensor
    prompt_length: int
    content: Tensor
    tasks: tuple[str, ...]

    @property
    def answer(self) -> Tensor:
        """``[B, G]`` the clean answer region (targets)."""
        return self.tokens[:, self.prompt_length:]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.tokens.to(device), self.valid.to(device), self.prompt_length,
                     self.content.to(device), self.tasks)


def max_items_at(step: int, steps: int, min_items: int, max_items: int,
                 curriculum: float) -> int:
    """Longest list length at ``step``: grows linearly from ``min_items + 1`` to ``max_items``
    over the first ``curriculum * steps`` steps, then stays at ``max_items``."""
    start = min(min_items + 1, max_items)
    ramp = curriculum * steps
    if ramp <= 0 or step >= ramp:
        return max_items
    return start + int((max_items - start) * step / ramp)


def _scramble_copy(prompt: list[int], answer: list[int], eos_id: int, pool: Sequence[int],
                   rng: random.Random) -> None:
    """In place: the answer text (before EOS) and its last occurrence in the prompt get the
    same random tokens from ``pool``."""
    n = answer.index(eos_id) if eos_id in answer else len(answer)
    text = answer[:n]
    at = next((i for i in range(len(prompt) - n, -1, -1) if prompt[i:i + n] == text), None)
    if at is None:
        raise ValueError("copy answer not found in its prompt; cannot scramble")
    new = [rng.choice(pool) for _ in range(n)]
    prompt[at:at + n] = new
    answer[:n] = new


class TaskData:
    """Tokenizes generated records into ``Batch`` es.

    Args:
        tokenizer: a ``PreTrainedTokenizerFast`` with a chat template and an EOS token.
        tasks: generator task ids (``waiting_line/copy``, ...).
        gen_length: ``G``; every answer + EOS must fit.
        icl_examples: demonstrations per prompt.
    """

    def __init__(self, tokenizer: Any, tasks: Sequence[str], gen_length: int,
                 icl_examples: int = 1) -> None:
        self.codec = TokenizerCodec(tokenizer)
        self.tokenizer = tokenizer
        self.tasks = tuple(tasks)
        self.gen_length = gen_length
        self.icl_examples = icl_examples
        self.eos_id = self.codec.eos_token_ids[0]
        self.pad_id = self.codec.pad_token_id
        self._pool: list[int] | None = None  # scramble_pool(), built on first use

    def answer_ids(self, record: Mapping[str, Any]) -> list[int]:
        """Reference answer ids + EOS, EOS-padded to ``G``.

        Raises:
            ValueError: the answer does not fit in ``G`` positions.
        """
        ids = self.tokenizer(reference_answer(record), add_special_tokens=False)["input_ids"]
        if len(ids) + 1 > self.gen_length:
            raise ValueError(f"answer of {len(ids)} tokens + EOS does not fit gen_length="
                             f"{self.gen_length}; raise --gen-length or lower --max-items")
        return ids + [self.eos_id] * (self.gen_length - len(ids))

    def scramble_pool(self) -> list[int]:
        """Token ids that occur inside names (the pool scrambled copies draw from)."""
        from dllm_decode.eval.parallelbench.generate import format_list
        from dllm_decode.eval.parallelbench.names import FIRST_NAMES, LAST_NAMES

        names = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES[:1]]
        names += [f"{FIRST_NAMES[0]} {last}" for last in LAST_NAMES]
        frame = set(self.tokenizer(format_list(["A B", "C D"]), add_special_tokens=False)
                    ["input_ids"])
        ids = self.tokenizer(format_list(names), add_special_tokens=False)["input_ids"]
        return sorted(set(ids) - frame)

    def collate(self, examples: Sequence[Example], extra_pad: int = 0,
                scramble: random.Random | None = None) -> Batch:
        """Left-pad prompts to a common length (+ ``extra_pad``) and append the answers.

        ``scramble``: copy-task rows get every token of their list (brackets and separators
        included) replaced by random name-pool tokens, identically in the prompt and the
        answer. A warm-up curriculum: with nothing predictable from position inside the list,
        the only way to lower the loss is to copy, which forms the copying circuit that every
        Waiting Line task needs (plain data sits on a plateau for thousands of steps).
        """
        prompts = [self.codec.encode(task, record) for task, record in examples]
        answers = [self.answer_ids(record) for _, record in examples]
        if scramble is not None:
            if self._pool is None:
                self._pool = self.scramble_pool()
            pool = self._pool
            for (task, _), prompt, answer in zip(examples, prompts, answers, strict=True):
                if task.rsplit("/", 1)[-1] == "copy":
                    _scramble_copy(prompt, answer, self.eos_id, pool, scramble)
        p = max(len(x) for x in prompts) + extra_pad
        b, g = len(examples), self.gen_length
        tokens = torch.full((b, p + g), self.pad_id, dtype=torch.long)
        valid = torch.zeros(b, p + g, dtype=torch.bool)
        for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
            tokens[i, p - len(prompt):] = torch.tensor(prompt + answer)
            valid[i, p - len(prompt):] = True
        answer_t = tokens[:, p:]
        before_eos = (answer_t == self.eos_id).long().cumsum(1) == 0
        return Batch(tokens, valid, p, before_eos, tuple(t for t, _ in examples))

    def draw(self, seed: int, step: int, batch_size: int, min_items: int,
             max_items: int) -> list[Example]:
        """``batch_size`` training examples for ``step``; tasks drawn uniformly from the task list
        (a task listed twice is drawn twice as often), lengths balanced."""
        rng = random.Random(f"{seed}:{step}")
        counts = Counter(rng.choice(self.tasks) for _ in range(batch_size))
        examples: list[Example] = []
        for task in sorted(counts):
            records = generate_task(task, counts[task], rng.randrange(2**31),
                                    min_len=min_items, max_len=max_items,
                                    icl_examples=self.icl_examples, split="train")
            examples += [(task, r) for r in records]
        rng.shuffle(examples)
        return examples

    def eval_examples(self, size: int, min_items: int, max_items: int,
                      seed: int = 0) -> list[Example]:
        """A fixed held-out set (``split="validation"``): ``ceil(size / tasks)`` per task."""
        tasks = tuple(dict.fromkeys(self.tasks))  # a task repeated in --tasks weighs training only
        per_task = -(-size // len(tasks))
        examples: list[Example] = []
        for i, task in enumerate(tasks):
            records = generate_task(task, per_task, seed + i, min_len=min_items,
                                    max_len=max_items, icl_examples=self.icl_examples,
                                    split="validation")
            examples += [(task, r) for r in records]
        return examples
