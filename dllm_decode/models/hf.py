"""Adapter for any Hugging Face masked LM whose forward returns ``.logits`` (no KV cache).

Useful for encoder-style masked LMs (BERT/RoBERTa/ModernBERT-like) and for ``trust_remote_code``
diffusion checkpoints run through their own modeling code. Attention is treated as
bidirectional and logits as position-aligned unless ``logit_shift=1`` is given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class HFMaskedLM(nn.Module):
    """Wrap ``hf_model`` (``forward(input_ids, attention_mask=...) -> .logits``)."""

    def __init__(self, hf_model: nn.Module, *, mask_token_id: int | None = None,
                 eos_token_ids: tuple[int, ...] | None = None, logit_shift: int = 0,
                 max_length: int | None = None) -> None:
        super().__init__()
        self.hf = hf_model
        cfg = getattr(hf_model, "config", None)
        mask = mask_token_id if mask_token_id is not None else getattr(cfg, "mask_token_id", None)
        if mask is None:
            raise ValueError("mask_token_id is not in the model config; pass mask_token_id=")
        self.mask_token_id = int(mask)
        eos = eos_token_ids
        if eos is None:
            raw = getattr(cfg, "eos_token_id", None) or getattr(cfg, "sep_token_id", None)
            eos = tuple(raw) if isinstance(raw, list) else ((raw,) if raw is not None else ())
        self.eos_token_ids = tuple(int(e) for e in eos)
        self.attention = "bidirectional"
        self.block_size = None
        self.logit_shift = int(logit_shift)
        self.vocab_size = int(cfg.vocab_size)
        self.max_length = int(max_length or getattr(cfg, "max_position_embeddings", 2048))
        self.family = "hf"

    def rope_positions(self, valid: Tensor) -> Tensor:
        b, length = valid.shape
        return torch.arange(length, device=valid.device).expand(b, length)

    def new_cache(self, batch_size: int, max_len: int) -> Any:
        raise ValueError("HFMaskedLM has no KV cache; use cache='none'")

    def forward(self, tokens: Tensor, positions: Tensor, *, cache: Any = None,
                slots: Tensor | None = None, mask: Tensor | None = None, store: bool = True,
                hidden_rows: Tensor | None = None) -> Tensor:
        """tokens ``[B, N]`` -> logits ``[B, N, V]`` (or rows ``hidden_rows``).

        ``mask`` may be a key mask ``[B, N]`` or ``[B, N, N]`` whose rows are identical (key
        padding); anything else cannot be expressed through an HF ``attention_mask``.
        """
        if cache is not None:
            raise ValueError("HFMaskedLM has no KV cache; use cache='none'")
        attn = None
        if mask is not None:
            if mask.dim() == 3:
                if not bool((mask == mask[:, :1]).all()):
                    raise ValueError("HFMaskedLM supports key-padding masks only")
                mask = mask[:, 0]
            attn = mask.long()
        out = self.hf(input_ids=tokens, attention_mask=attn)
        logits = out.logits
        if self.logit_shift:
            logits = torch.cat((logits[:, :1], logits[:, :-1]), dim=1)
        if hidden_rows is not None:
            logits = logits[:, hidden_rows]
        return logits
