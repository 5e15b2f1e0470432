"""Test bed III, long answers: the word-level codec and the exact posterior of its tasks.

Three tasks whose answers fill a 128-token canvas (256 where only the oracle decodes), each a
long run of easy positions with sparse hard decisions, as real answers are:

* ``copy``: the prompt holds K names ``n , n , ... , n``; the answer repeats them (one valid
  answer; K 32-60 at 128 tokens, so the EOS position varies with K).
* ``shuffle``: the same prompt over K distinct names; any permutation is valid. Given any set of
  committed answer tokens, every open name slot is uniform over the names not yet written
  (separators and EOS are certain), so committing two name slots together is wrong with
  probability about 1/(open names): the dependency a parallel decoder must respect.
* ``carry``: the prompt holds K slots, each a name (a "set") or ``_`` ("keep"); the answer's
  slot j is the last name set at or before j (carry-forward). Each answer token is predictable
  from one input (its own slot, or its left neighbour's answer), yet a run of keeps depends on a
  set far to its left.

Layout (``slots`` = gen_length - 2): prompt ``<task>`` + a region of ``slots`` tokens
(``<fill>``-padded) + ``<answer>``; answer ``gen_length`` positions, content then ``<eos>``.
Region slot j sits at position 1 + j and answer slot j at ``slots + 2 + j``: every copied item
is at a fixed offset from the answer position that copies it.

The posterior is in closed form (no enumeration), so ``LongAnswerOracle``
(``models/long_oracle.py``) decodes any length exactly; ``tests/test_testbed_long.py`` checks it
against brute force over permutations on small lists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.models.oracle_base import EOS, MASK, PAD

LONG_TASKS: Final = ("copy", "shuffle", "carry")
ANSWER, FILL, SEP, KEEP = "<answer>", "<fill>", ",", "_"
#: the vocabulary file a long-answer checkpoint ships (``long_codec_for`` reads it)
LONG_VOCAB_FILE: Final = "long_answer_vocab.json"


class LongCodec:
    """Vocabulary, prompt / answer encoding and the exact conditionals of the long tasks.

    Args:
        names: the name pool (one token each).
        gen_length: answer positions (the prompt region holds ``gen_length - 2`` slots).
    """

    def __init__(self, names: Iterable[str], gen_length: int = 128) -> None:
        names = list(dict.fromkeys(names))
        specials = [PAD, EOS, MASK, ANSWER, FILL, SEP, KEEP, *(f"<{t}>" for t in LONG_TASKS)]
        clash = set(names) & set(specials)
        if clash:
            raise ValueError(f"names clash with long-answer vocabulary tokens: {sorted(clash)}")
        if not isinstance(gen_length, int) or gen_length < 8:
            raise ValueError(f"gen_length must be an int >= 8, got {gen_length!r}")
        self.vocab: tuple[str, ...] = tuple(specials + names)
        self.token_id: dict[str, int] = {t: i for i, t in enumerate(self.vocab)}
        self.first_name = len(specials)
        self.names: tuple[str, ...] = tuple(names)
        self.gen_length = gen_length
        self.slots = gen_length - 2
        self.prompt_length = self.slots + 2
        self._task_of = {self.token_id[f"<{t}>"]: t for t in LONG_TASKS}

    # ---- ids ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def tid(self, token: str) -> int:
        """Id of a special token or name (``KeyError`` naming the token otherwise)."""
        try:
            return self.token_id[token]
        except KeyError:
            raise KeyError(f"{token!r} is not in the long-answer vocabulary (names are the "
                           f"codec's pool of {len(self.names)})") from None

    def max_items(self, task: str) -> int:
        """The longest list ``task`` fits in ``gen_length`` (content + one EOS)."""
        check_task(task)
        return self.slots if task == "carry" else (self.slots + 1) // 2

    # ---- text of a record -----------------------------------------------------------------
    def region(self, task: str, items: Sequence[str]) -> list[int]:
        """The prompt region's content ids: ``n , n , ...`` (copy, shuffle) or the slots
        (carry: names and ``_``)."""
        check_task(task)
        if task == "carry":
            return [self.tid(t) for t in items]
        ids: list[int] = []
        for i, name in enumerate(items):
            ids += ([self.token_id[SEP]] if i else []) + [self.tid(name)]
        return ids

    def encode_prompt(self, record: Mapping[str, Any]) -> list[int]:
        """``<task> region <fill>.. <answer>``: ``prompt_length`` ids."""
        task, items = record_task(record)
        content = self.region(task, items)
        if len(content) + 1 > self.gen_length or len(content) > self.slots:
            raise ValueError(f"{task} with {len(items)} items does not fit gen_length "
                             f"{self.gen_length} (at most {self.max_items(task)})")
        fill = [self.token_id[FILL]] * (self.slots - len(content))
        return [self.token_id[f"<{task}>"], *content, *fill, self.token_id[ANSWER]]

    def reference_answer(self, record: Mapping[str, Any]) -> list[int]:
        """One valid answer (the input order for shuffle), EOS-padded to ``gen_length``."""
        task, items = record_task(record)
        if task == "carry":
            out, last = [], None
            for t in items:
                last = t if t != KEEP else last
                if last is None:
                    raise ValueError("a carry list must start with a name")
                out.append(self.tid(last))
        else:
            out = self.region(task, items)
        return out + [self.token_id[EOS]] * (self.gen_length - len(out))

    def decode(self, ids: Iterable[int]) -> str:
        """Ids as text up to the first EOS: tokens joined by spaces, which the checkpoint's
        tokenizer (``write_vocab``) maps back to the same ids (each name is one token)."""
        out = []
        for i in ids:
            tok = self.vocab[int(i)]
            if tok == EOS:
                break
            out.append(tok)
        return " ".join(out)

    def parse_prompt(self, ids: Sequence[int]) -> tuple[str, tuple[str, ...]]:
        """``(task, items)`` of prompt ids (left padding before the task token skipped)."""
        start = next((i for i, t in enumerate(ids) if t in self._task_of), None)
        if start is None:
            raise ValueError("no long-answer task token in the prompt; encode prompts with "
                             "LongCodec.encode_prompt()")
        task = self._task_of[ids[start]]
        body = [t for t in ids[start + 1:] if t not in (self.token_id[FILL],
                                                         self.token_id[ANSWER])]
        if task == "carry":
            return task, tuple(self.vocab[t] for t in body)
        return task, tuple(self.vocab[t] for t in body[0::2])

    # ---- the exact posterior --------------------------------------------------------------
    def conditionals(self, task: str, items: Sequence[str], region: Tensor) -> Tensor:
        """Exact per-position conditionals of the answer given its committed tokens.

        Args:
            task, items: the prompt's task and list.
            region: ``[R, G]`` answer canvases; ``mask`` entries are unknown (hidden or not
                yet decoded), every other entry is conditioned on.

        Returns: float64 probabilities ``[R, G, V]``. Copy and carry have one answer (a point
        mass everywhere). Shuffle: separators and EOS are certain; each open name slot is
        uniform over the names not committed in that row (a committed position: a point mass
        on its token). A row whose committed tokens no
        valid answer matches falls back to the distribution given the prompt alone.
        """
        ref = torch.tensor(self.reference_answer({"task": task, "items": list(items)}),
                           device=region.device)
        r, g = region.shape
        probs = torch.zeros(r, g, self.vocab_size, dtype=torch.float64, device=region.device)
        probs.scatter_(2, ref.expand(r, g)[..., None], 1.0)
        if task != "shuffle":
            return probs
        k = len(items)
        names = torch.tensor([self.tid(n) for n in items], device=region.device)
        slot = torch.zeros(g, dtype=torch.bool, device=region.device)
        slot[0:2 * k - 1:2] = True
        known = region != self.token_id[MASK]
        # structure positions must hold their token; name slots a list name, each at most once
        wrong_fixed = (known & ~slot & (region != ref)).any(-1)
        hits = (region[:, :, None] == names) & (known & slot)[..., None]  # [R, G, K]
        per_name = hits.sum(1)  # [R, K]
        stray = ((known & slot).sum(-1) != per_name.sum(-1))
        ok = ~wrong_fixed & ~stray & (per_name <= 1).all(-1)  # [R]
        used = (per_name > 0) & ok[:, None]  # the fallback conditions on nothing
        free = (~used).double()
        uniform = free / free.sum(-1, keepdim=True).clamp_min(1)  # [R, K]
        rows = torch.zeros(r, self.vocab_size, dtype=torch.float64, device=region.device)
        rows.index_add_(1, names, uniform)
        probs = torch.where(slot[None, :, None], rows[:, None, :], probs)
        own = torch.zeros_like(probs).scatter_(2, region[..., None], 1.0)
        return torch.where((known & ok[:, None])[..., None], own, probs)

    def valid(self, task: str, items: Sequence[str], answer: Sequence[int]) -> bool:
        """Whether answer ids (``gen_length`` of them, EOS-padded) are a valid answer."""
        ref = self.reference_answer({"task": task, "items": list(items)})
        ans = [int(a) for a in answer][: self.gen_length]
        if len(ans) != len(ref):
            return False
        if task != "shuffle":
            return ans == ref
        fixed_ok = all(a == b for j, (a, b) in enumerate(zip(ans, ref, strict=True))
                       if j % 2 or j >= 2 * len(items) - 1)
        return fixed_ok and sorted(ans[0:2 * len(items) - 1:2]) == sorted(ref[0:2 * len(items)
                                                                              - 1:2])

    # ---- files ----------------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        return {"names": list(self.names), "gen_length": self.gen_length,
                "tasks": list(LONG_TASKS), "answer_token": ANSWER}

    def write_vocab(self, directory: str | Path) -> None:
        """``long_answer_vocab.json`` and a word-level ``tokenizer.json`` (+ config) in
        ``directory``: every entry an added token, so ``tokenizer(text)`` gives the codec's ids."""
        from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(self.vocab)}))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        specials = {PAD, EOS, MASK}
        tok.add_tokens([AddedToken(t, normalized=False) for t in self.vocab
                        if t not in specials])
        tok.add_special_tokens([AddedToken(t, normalized=False) for t in (PAD, EOS, MASK)])
        tok.save(str(directory / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD,
                  "eos_token": EOS, "mask_token": MASK,
                  "model_max_length": self.prompt_length + self.gen_length,
                  "clean_up_tokenization_spaces": False}
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (directory / LONG_VOCAB_FILE).write_text(json.dumps(self.spec(), indent=1) + "\n")


def check_task(task: str) -> None:
    if task not in LONG_TASKS:
        raise ValueError(f"unknown long-answer task {task!r}; valid: {', '.join(LONG_TASKS)}")


def record_task(record: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """``(task, items)`` of a long-answer record (``{"task": ..., "items": [...]}``)."""
    task, items = record.get("task"), record.get("items")
    check_task(str(task))
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"a long-answer record needs a non-empty 'items' list, got {items!r}")
    if task == "shuffle" and len(set(items)) != len(items):
        raise ValueError("shuffle items must be distinct names")
    return str(task), tuple(items)


def long_codec_for(directory: str | Path) -> LongCodec | None:
    """The codec of a long-answer checkpoint directory (``None`` if it is not one)."""
    path = Path(directory) / LONG_VOCAB_FILE
    if not path.is_file():
        return None
    spec = json.loads(path.read_text())
    return LongCodec(spec["names"], int(spec["gen_length"]))
