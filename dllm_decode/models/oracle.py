"""An exact "oracle" model for the Waiting Line tasks: logits are the true conditionals.

For a canvas whose prompt states a Waiting Line task and whose generation region is partly
committed, ``WaitingLineOracle.forward`` returns, at every still-masked position of the
generation region, the log of the exact conditional marginal of that position under the task's
answer distribution (uniform over the valid answers, as the generators draw them) given the
prompt and every committed token. It is the perfect model of ParallelBench's theory: any error
a decoder makes against it is caused by parallel decoding alone (the conditional total
correlation of the answer), never by the model.

Vocabulary (word level, so one token per list item and the closed forms hold exactly):

* specials ``<pad>``, ``<eos>``, ``<mask>``, ``<answer>`` (ends the prompt);
* one token per task (``<copy>``, ``<reverse>``, ...), ``[``, ``]``, ``,``;
* index tokens ``<0>`` .. ``<max_items>``; one token per full name ("First Last").

Prompt: ``<task> [<index>] [word] [ name , name , ... ] <answer>`` (left padding allowed);
with ``slots=S`` the list is followed by ``2 (S - n)`` ``<fill>`` tokens, so every list item
sits at a fixed offset from ``<answer>`` whatever its length n.
Answer: ``[ name , ... , name ]`` followed by ``<eos>`` up to the generation length.

Conditioning on an impossible canvas (committed tokens that no valid answer matches, which
parallel decoding can produce) falls back to the distribution given the prompt alone.

``calibration=Calibration(floor=1e-6, temperature=..., noise=..., confusion=...)`` (or
:meth:`WaitingLineOracle.calibrated`) turns the exact conditionals into finite, seeded,
model-like logits (``calibration.py``); the default is the exact oracle.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dllm_decode.models.calibration import Calibration, confusion_partners
from dllm_decode.models.oracle_base import (  # noqa: F401  (EOS, MASK, PAD re-exported)
    EOS,
    MASK,
    PAD,
    WordOracleAttrs,
    visible_keys,
)
from dllm_decode.models.waiting_line import (  # noqa: F401  (re-exported)
    MAX_SHUFFLE_ITEMS,
    TASK_NAMES,
    is_valid,
    record_fields,
    task_name,
    valid_answers,
)

#: log-probability of impossible tokens in the exact oracle (finite, so softmax stays finite)
#: the word-level vocabulary file a test-bed checkpoint ships (``codec_for`` reads it)
VOCAB_FILE: Final = "waiting_line_vocab.json"
NEG_LOGIT: Final = -1.0e9
#: the calibrated oracle's floor probability for impossible tokens (log = -13.8)
CALIBRATED_FLOOR: Final = 1.0e-6
#: prompts whose answer tables an oracle keeps (oldest dropped first)
TABLE_CACHE: Final = 4096

#: how every forward the oracle cannot serve exactly is refused, and what to use instead
REFUSED: Final = "WaitingLineOracle cannot serve this forward exactly"
USE_INSTEAD: Final = ("; the oracle serves plain forwards of whole canvases only: decode it "
                      "with a policy without extra forwards (not lopa, wino, s2d2) or use a "
                      "trained test-bed checkpoint (testbed-llada)")

ANSWER, FILL = "<answer>", "<fill>"
OPEN, CLOSE, SEP = "[", "]", ","


class WaitingLineOracle(WordOracleAttrs, nn.Module):
    """The exact-conditional model over a word-level vocabulary (see the module docstring).

    Args:
        names: every full name that may occur (input lists and new persons).
        max_items: the longest list (index tokens ``<0>`` .. ``<max_items>`` exist).
        max_length: the longest canvas accepted.
        calibration: knobs that make logits model-like (default: exact, see
            ``dllm_decode.models.calibration``).

    Satisfies the ``DiffusionLM`` contract: bidirectional, position-aligned logits, no cache;
    it serves plain forwards of whole canvases only and refuses every other forward (packed
    rows, per-query masks: ``forward``). Forward cost is a Python pass over the batch rows
    plus one scatter per distinct prompt.
    """

    def __init__(self, names: Iterable[str], *, max_items: int = 16,
                 max_length: int = 1024, calibration: Calibration | None = None,
                 slots: int | None = None) -> None:
        super().__init__()
        names = list(dict.fromkeys(names))
        specials = [PAD, EOS, MASK, ANSWER, *(f"<{t}>" for t in TASK_NAMES), OPEN, CLOSE, SEP,
                    FILL]
        indices = [f"<{i}>" for i in range(max_items + 1)]
        clash = set(names) & set(specials + indices)
        if clash:
            raise ValueError(f"names clash with oracle vocabulary tokens: {sorted(clash)}")
        self.vocab: tuple[str, ...] = tuple(specials + indices + names)
        self.token_id: dict[str, int] = {t: i for i, t in enumerate(self.vocab)}
        self.max_items = max_items
        self._max_length = max_length
        self._task_of = {self.token_id[f"<{t}>"]: t for t in TASK_NAMES}
        self._index_of = {self.token_id[t]: i for i, t in enumerate(indices)}
        self._first_name = len(specials) + len(indices)
        self.calibration = calibration or Calibration()
        self._tables: dict[tuple[tuple[int, ...], int], Tensor] = {}
        if slots is not None and not 1 <= slots <= max_items:
            raise ValueError(f"slots must lie in [1, max_items={max_items}], got {slots}")
        self.slots = slots
        self._names, self._partners = confusion_partners(self.vocab, self._first_name)
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)

    def calibrated(self, *, floor: float = CALIBRATED_FLOOR, temperature: float = 1.0,
                   noise: float = 0.0, confusion: float = 0.0, seed: int = 0
                   ) -> WaitingLineOracle:
        """A copy over the same vocabulary with model-like logits (see ``Calibration``)."""
        cal = Calibration(floor=floor, temperature=temperature, noise=noise,
                          confusion=confusion, seed=seed)
        names = self.vocab[self._first_name:]
        return WaitingLineOracle(names, max_items=self.max_items, max_length=self._max_length,
                                 calibration=cal, slots=self.slots)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], **kwargs: Any
                     ) -> WaitingLineOracle:
        """An oracle whose vocabulary holds every name of ``records`` (demonstrations too)."""
        names: list[str] = []
        for record in records:
            for rec in (record, *(record["input"].get("icl_examples") or [])):
                items, word, _ = record_fields(rec)
                names.extend(items + ((word,) if word else ()))
        return cls(names, **kwargs)

    # ---- DiffusionLM attributes (the rest: WordOracleAttrs) --------------------------------
    @property
    def max_length(self) -> int:
        return self._max_length

    def new_cache(self, batch_size: int, max_len: int) -> None:
        raise NotImplementedError("WaitingLineOracle has no K/V cache; decode with cache='none'")

    # ---- encoding -------------------------------------------------------------------------
    def encode_prompt(self, task: str, record: Mapping[str, Any]) -> list[int]:
        """Prompt ids of a ParallelBench record (demonstrations are ignored)."""
        items, word, index = record_fields(record)
        ids = [self.token_id[f"<{task_name(task)}>"]]
        if index is not None:
            if not 0 <= index <= self.max_items:
                raise ValueError(f"index {index} exceeds max_items={self.max_items}")
            ids.append(self.token_id[f"<{index}>"])
        if word is not None:
            ids.append(self._name_id(word))
        fill = []
        if self.slots is not None:  # fixed-width list region: the list ends at a fixed offset
            if len(items) > self.slots:
                raise ValueError(f"{len(items)} items exceed the prompt's {self.slots} slots")
            fill = [self.token_id[FILL]] * (2 * (self.slots - len(items)))
        return ids + self.encode_items(items) + fill + [self.token_id[ANSWER]]

    def encode_items(self, items: Sequence[str]) -> list[int]:
        """``[ a , b , ... ]`` as ids."""
        ids = [self.token_id[OPEN]]
        for i, item in enumerate(items):
            ids += ([self.token_id[SEP]] if i else []) + [self._name_id(item)]
        return ids + [self.token_id[CLOSE]]

    def encode_answer(self, items: Sequence[str], gen_length: int) -> list[int]:
        """Answer ids padded with EOS to ``gen_length`` (truncated if longer)."""
        ids = self.encode_items(items) + [self.token_id[EOS]]
        return (ids + [self.token_id[EOS]] * gen_length)[:gen_length]

    def prompt_batch(self, task: str, records: Sequence[Mapping[str, Any]]
                     ) -> tuple[Tensor, Tensor]:
        """Left-padded prompt ids ``[B, P]`` and attention mask ``[B, P]`` (bool)."""
        rows = [self.encode_prompt(task, r) for r in records]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        valid = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            valid[i, width - len(r):] = True
        return ids, valid

    def decode(self, ids: Iterable[int]) -> str:
        """Answer text in the benchmark's list format (``["A B", "C D"]``), cut at the first EOS.

        Tokens render literally (names double-quoted, ``,`` as ``", "``), so malformed token
        sequences give malformed text for the graders to reject.
        """
        out = []
        for i in ids:
            tok = self.vocab[int(i)]
            if tok == EOS:
                break
            if tok == SEP:
                out.append(", ")
            elif tok in (OPEN, CLOSE) or int(i) < self._first_name:
                out.append(tok)
            else:
                out.append(f'"{tok}"')
        return "".join(out)

    def _name_id(self, name: str) -> int:
        if name not in self.token_id or self.token_id[name] < self._first_name:
            raise KeyError(f"name {name!r} is not in the oracle vocabulary; build the oracle "
                           f"with WaitingLineOracle.from_records(...) or pass it in names")
        return self.token_id[name]

    # ---- the model ------------------------------------------------------------------------
    def parse_prompt(self, ids: Sequence[int]) -> tuple[str, tuple[str, ...], str | None,
                                                        int | None]:
        """``(task, items, word, index)`` from prompt ids (left padding skipped)."""
        start = next((i for i, t in enumerate(ids) if t in self._task_of), None)
        if start is None:
            raise ValueError("no task token in the prompt; encode prompts with encode_prompt()")
        task = self._task_of[ids[start]]
        rest = list(ids[start + 1:])
        if rest and rest[-1] == self.token_id[ANSWER]:
            rest = rest[:-1]
        while rest and rest[-1] == self.token_id[FILL]:
            rest = rest[:-1]
        index = self._index_of.get(rest[0]) if rest else None
        if index is not None:
            rest = rest[1:]
        word = None
        if rest and rest[0] >= self._first_name:
            word, rest = self.vocab[rest[0]], rest[1:]
        if not rest or rest[0] != self.token_id[OPEN] or rest[-1] != self.token_id[CLOSE]:
            raise ValueError(f"malformed prompt list: {[self.vocab[t] for t in ids]}")
        items = tuple(self.vocab[t] for t in rest[1:-1:2])
        return task, items, word, index

    def answer_table(self, prompt_ids: Sequence[int], gen_length: int) -> Tensor:
        """Every valid answer of a prompt as ids ``[M, G]`` (EOS-padded; memoised per prompt,
        the returned tensor must not be modified)."""
        key = (tuple(prompt_ids), gen_length)
        table = self._tables.get(key)
        if table is None:
            task, items, word, index = self.parse_prompt(prompt_ids)
            answers = valid_answers(task, items, word, index)
            table = torch.tensor([self.encode_answer(a, gen_length) for a in answers],
                                 dtype=torch.long)
            if len(self._tables) >= TABLE_CACHE:
                self._tables.pop(next(iter(self._tables)))
            self._tables[key] = table
        return table

    def marginals(self, answers: Tensor, canvas: Tensor) -> Tensor:
        """Exact per-position conditionals for canvases that share one prompt.

        Args:
            answers: ``[M, G]`` the valid answers (uniformly likely a priori).
            canvas: ``[R, G]`` generation regions; non-mask entries are committed tokens.

        Returns: float64 probabilities ``[R, G, V]``: for each row, the distribution of each
        position over the answers consistent with that row's committed tokens (all answers
        when none is consistent).
        """
        known = canvas != self.mask_token_id  # [R, G]
        match = (answers[None] == canvas[:, None]) | ~known[:, None]  # [R, M, G]
        weight = match.all(dim=-1).double()  # [R, M]
        none = weight.sum(-1, keepdim=True) == 0
        weight = torch.where(none, torch.ones_like(weight), weight)
        weight = weight / weight.sum(-1, keepdim=True)
        r, g = canvas.shape
        probs = torch.zeros(r, g, self.vocab_size, dtype=torch.float64, device=canvas.device)
        index = answers.T[None].expand(r, g, -1)  # [R, G, M]
        return probs.scatter_add_(2, index, weight[:, None, :].expand(r, g, -1))

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        *,
        cache: Any = None,
        slots: Tensor | None = None,
        mask: Tensor | None = None,
        store: bool = True,
        hidden_rows: Tensor | None = None,
    ) -> Tensor:
        """Logits ``[B, N, V]`` (float32): log conditionals at masked answer positions.

        Args:
            tokens: ``[B, N]`` the whole canvas (prompt, ``<answer>``, generation region).
            positions: ``[B, N]`` positions, ``p, p + 1, ...`` along each row.
            cache: must be ``None`` (the oracle has no cache).
            slots: ignored (cache only).
            mask: ``None`` or plain full visibility: a bool key mask ``[B, N]``, or ``[B, N, N]``
                whose every query row is the same key mask (what the sampler passes for left
                padding and truncated tails). A hidden answer position is an unknown token (read
                as masked, so its own prediction is its conditional too); hidden keys before
                the prompt's task token are ignored (left padding).
            store: ignored (cache only).
            hidden_rows: optional ``[R]`` indices into N; logits only for those rows.

        Refused with a one-line ``ValueError`` (never served approximately): a mask that lets
        queries see different keys (LoPA's packed branches, WINO's shadow block, S2D2's
        verifier), keys beyond the fed tokens, a hidden prompt token, positions that do not
        run ``p, p + 1, ...`` along the row, and a row without exactly one ``<answer>``.

        Committed and prompt positions get a point mass on their own token; impossible tokens
        get ``NEG_LOGIT`` (or the calibration's floor; masked answer positions also get its
        confusion, temperature and noise). Deterministic; syncs to the host (it parses prompts
        in Python).
        """
        if cache is not None:
            raise ValueError("WaitingLineOracle does not support a K/V cache; use cache='none'")
        if tokens.dim() != 2 or tokens.shape != positions.shape:
            raise ValueError(f"tokens {tuple(tokens.shape)} and positions "
                             f"{tuple(positions.shape)} must both be [B, N]")
        b, n = tokens.shape
        hidden = ~visible_keys(mask, b, n, tokens.device, refused=REFUSED,
                               use_instead=USE_INSTEAD)  # [B, N] keys no query sees
        if n > 1 and not bool((positions.diff(dim=1) == 1).all()):
            raise ValueError(f"{REFUSED}: positions must run p, p + 1, ... along each row (one "
                             f"whole canvas); got repeated or packed positions{USE_INSTEAD}")
        probs = torch.zeros(b, n, self.vocab_size, dtype=torch.float64, device=tokens.device)
        probs.scatter_(2, tokens[..., None], 1.0)
        answer_id = self.token_id[ANSWER]
        groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
        for row, (ids, off) in enumerate(zip(tokens.tolist(), hidden.tolist(), strict=True)):
            if answer_id not in ids:
                raise ValueError("the oracle needs the whole canvas (prompt ending in "
                                 "<answer>) in every forward; partial/cached forwards are "
                                 "not supported")
            if ids.count(answer_id) > 1:
                raise ValueError(f"{REFUSED}: row {row} holds {ids.count(answer_id)} <answer> "
                                 f"tokens (several canvases packed in one row){USE_INSTEAD}")
            start = ids.index(answer_id) + 1
            first = next((i for i, t in enumerate(ids) if t in self._task_of), 0)
            if any(off[first:start]):
                raise ValueError(f"{REFUSED}: the mask hides prompt position "
                                 f"{off.index(True, first)} of row {row} (only left padding "
                                 "before the task token and answer positions may be hidden)")
            # keyed from the task token: left padding changes neither the answers nor the
            # calibration's noise (a row decodes as it does alone)
            groups.setdefault((tuple(ids[first:start]), start), []).append(row)
        cal = self.calibration
        logits = torch.empty_like(probs)
        names, partners = self._names.to(tokens.device), self._partners.to(tokens.device)
        for (prompt, start), rows in groups.items():
            answers = self.answer_table(prompt, n - start).to(tokens.device)
            # a hidden answer key is an unknown token: conditioned on as a mask
            region = tokens[rows, start:].masked_fill(hidden[rows, start:], self.mask_token_id)
            masked = region == self.mask_token_id
            cond = cal.confuse(self.marginals(answers, region), names, partners)
            probs[rows, start:] = torch.where(masked[..., None], cond, probs[rows, start:])
            first = start - len(prompt)  # the task token: noise is drawn from there on
            logits[rows, first:] = cal.logits(probs[rows, first:],
                                              F.pad(masked, (len(prompt), 0)), prompt)
            if first:  # left padding: point masses, as alone
                logits[rows, :first] = cal.logits(probs[rows, :first],
                                                  masked.new_zeros(len(rows), first), prompt)
        logits = logits.float()
        return logits if hidden_rows is None else logits[:, hidden_rows]


def codec_for(directory: str | Path) -> WaitingLineOracle | None:
    """The word-level codec of a checkpoint directory (``None`` if it is not a test-bed one).

    The returned oracle is used only for ``encode_prompt`` / ``decode`` (its vocabulary equals
    the checkpoint's).
    """
    path = Path(directory) / VOCAB_FILE
    if not path.is_file():
        return None
    spec = json.loads(path.read_text())
    return WaitingLineOracle(spec["names"], max_items=int(spec["max_items"]),
                             slots=spec.get("slots"))
