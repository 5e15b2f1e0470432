"""The exact oracle of the long-answer test bed (Test bed III, ``models/long_answer.py``).

``LongAnswerOracle.forward`` returns, at every masked answer position, the log of its exact
conditional given the prompt and every committed answer token (closed form: a point mass for
copy and carry; for shuffle, uniform over the names not yet written). It decodes every task at
128 and 256 tokens with no training and anchors the frontier. It serves plain forwards of
whole canvases only and refuses, in one line, every other forward (packed rows, per-query
masks, partial or cached canvases), like the Waiting Line oracle. ``calibrated`` gives the same
knobs as ``WaitingLineOracle.calibrated`` (floor, temperature, noise, confusion).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dllm_decode.models.calibration import Calibration, confusion_partners
from dllm_decode.models.long_answer import ANSWER, LongCodec
from dllm_decode.models.oracle import CALIBRATED_FLOOR
from dllm_decode.models.oracle_base import WordOracleAttrs, visible_keys

REFUSED = "LongAnswerOracle cannot serve this forward exactly"
USE_INSTEAD = ("; the long-answer oracle serves plain forwards of whole canvases only: decode "
               "it with cache='none' and a policy without extra forwards, or use a trained "
               "student (testbed-long-llada)")


class LongAnswerOracle(WordOracleAttrs, nn.Module):
    """The exact-conditional model of the long-answer tasks.

    Args:
        names: the name pool (the codec's vocabulary).
        gen_length: the answer length it was built for (prompts carry ``gen_length - 2``
            slots); answers of other lengths are refused.
        calibration: knobs that make logits model-like (default: exact).

    Satisfies the ``DiffusionLM`` contract: bidirectional, position-aligned logits, no cache.
    Forward cost: a Python pass over the rows plus one closed-form posterior per row.
    """

    def __init__(self, names: Iterable[str], *, gen_length: int = 128,
                 calibration: Calibration | None = None) -> None:
        super().__init__()
        self.codec = LongCodec(names, gen_length)
        self.vocab = self.codec.vocab
        self.token_id = self.codec.token_id
        self.calibration = calibration or Calibration()
        self._names, self._partners = confusion_partners(self.vocab, self.codec.first_name)
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)

    def calibrated(self, *, floor: float = CALIBRATED_FLOOR, temperature: float = 1.0,
                   noise: float = 0.0, confusion: float = 0.0, seed: int = 0
                   ) -> LongAnswerOracle:
        """A copy with model-like logits (see ``models.calibration.Calibration``)."""
        cal = Calibration(floor=floor, temperature=temperature, noise=noise,
                          confusion=confusion, seed=seed)
        return LongAnswerOracle(self.codec.names, gen_length=self.codec.gen_length,
                                calibration=cal)

    # ---- DiffusionLM attributes (the rest: WordOracleAttrs) --------------------------------
    @property
    def max_length(self) -> int:
        return self.codec.prompt_length + self.codec.gen_length

    def new_cache(self, batch_size: int, max_len: int) -> None:
        raise NotImplementedError(f"{REFUSED}: the long-answer oracle has no K/V cache"
                                  f"{USE_INSTEAD}")

    def prompt_batch(self, records: list[dict[str, Any]]) -> Tensor:
        """Prompt ids ``[B, P]`` of records (all prompts have the same length)."""
        return torch.tensor([self.codec.encode_prompt(r) for r in records], dtype=torch.long)

    # ---- the model ------------------------------------------------------------------------
    def forward(self, tokens: Tensor, positions: Tensor, *, cache: Any = None,
                slots: Tensor | None = None, mask: Tensor | None = None, store: bool = True,
                hidden_rows: Tensor | None = None) -> Tensor:
        """Logits ``[B, N, V]`` (float32): log conditionals at masked answer positions,
        point masses elsewhere (``NEG_LOGIT`` or the calibration's floor off the support).

        Args:
            tokens: ``[B, N]`` whole canvases (prompt ending in ``<answer>``, then the answer).
            positions: ``[B, N]``, ``p, p + 1, ...`` along each row.
            mask: ``None`` or plain full visibility (bool ``[B, N]`` or ``[B, N, N]`` with one
                key mask for every query); a hidden answer key reads as masked.
            hidden_rows: optional ``[R]`` indices into N; logits only for those rows.
            cache, slots, store: must be unused (no cache).
        """
        if cache is not None:
            raise ValueError(f"{REFUSED}: a K/V cache was passed{USE_INSTEAD}")
        if tokens.dim() != 2 or tokens.shape != positions.shape:
            raise ValueError(f"tokens {tuple(tokens.shape)} and positions "
                             f"{tuple(positions.shape)} must both be [B, N]")
        b, n = tokens.shape
        hidden = ~visible_keys(mask, b, n, tokens.device, refused=REFUSED,
                               use_instead=USE_INSTEAD)
        if n > 1 and not bool((positions.diff(dim=1) == 1).all()):
            raise ValueError(f"{REFUSED}: positions must run p, p + 1, ... along each row "
                             f"(one whole canvas){USE_INSTEAD}")
        codec, answer_id, cal = self.codec, self.token_id[ANSWER], self.calibration
        probs = torch.zeros(b, n, self.vocab_size, dtype=torch.float64, device=tokens.device)
        probs.scatter_(2, tokens[..., None], 1.0)
        logits = torch.empty_like(probs)
        names, partners = self._names.to(tokens.device), self._partners.to(tokens.device)
        for row, ids in enumerate(tokens.tolist()):
            if ids.count(answer_id) != 1:
                raise ValueError(f"{REFUSED}: row {row} holds {ids.count(answer_id)} <answer> "
                                 f"tokens (the oracle needs exactly one whole canvas){USE_INSTEAD}")
            start = ids.index(answer_id) + 1
            if n - start != codec.gen_length:
                raise ValueError(f"this oracle was built for gen_length {codec.gen_length}, "
                                 f"row {row} has {n - start} answer positions; build "
                                 f"LongAnswerOracle(names, gen_length={n - start})")
            task, items = codec.parse_prompt(ids[:start])
            first = start - codec.prompt_length
            if bool(hidden[row, max(first, 0):start].any()):
                raise ValueError(f"{REFUSED}: the mask hides a prompt position of row {row}"
                                 f"{USE_INSTEAD}")
            region = tokens[row, start:].masked_fill(hidden[row, start:], self.mask_token_id)
            masked = region == self.mask_token_id
            cond = cal.confuse(codec.conditionals(task, items, region[None])[0], names,
                               partners)
            probs[row, start:] = torch.where(masked[:, None], cond, probs[row, start:])
            prompt = ids[max(first, 0):start]
            logits[row] = cal.logits(probs[row][None], F.pad(masked, (start, 0))[None],
                                     prompt)[0]
        logits = logits.float()
        return logits if hidden_rows is None else logits[:, hidden_rows]
