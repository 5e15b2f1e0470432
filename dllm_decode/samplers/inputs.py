"""Validation of ``generate`` inputs: clear errors instead of tracebacks from inside torch."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import SamplerConfig
from dllm_decode.memory import check_fits, decode_bytes, model_device
from dllm_decode.types import CacheMode


def check_inputs(model: Any, prompt_ids: Tensor | list, attention_mask: Tensor | None,
                 cfg: SamplerConfig) -> tuple[Tensor, Tensor]:
    """-> (prompt ``[B, P]`` int64, valid ``[B, P]`` bool). Raises ``ValueError`` on bad input."""
    if not isinstance(prompt_ids, Tensor):
        try:
            prompt_ids = torch.tensor(prompt_ids, dtype=torch.long)
        except (TypeError, ValueError) as err:
            raise ValueError("prompt_ids must be a [B, P] integer tensor or a rectangular list "
                             f"of lists (left-pad ragged prompts): {err}") from None
    if prompt_ids.dim() == 1:
        raise ValueError("prompt_ids must be 2-D [B, P]; got 1-D (use prompt_ids[None])")
    if prompt_ids.dim() != 2 or prompt_ids.shape[0] == 0 or prompt_ids.shape[1] == 0:
        raise ValueError(f"prompt_ids must be a non-empty [B, P] tensor, got shape "
                         f"{tuple(prompt_ids.shape)}")
    if prompt_ids.is_floating_point() or prompt_ids.dtype == torch.bool:
        raise ValueError(f"prompt_ids must hold integer token ids, got {prompt_ids.dtype}")
    prompt = prompt_ids.long()
    b, p = prompt.shape
    if attention_mask is None:
        valid = torch.ones_like(prompt, dtype=torch.bool)
    else:
        attention_mask = torch.as_tensor(attention_mask, device=prompt.device)
        if tuple(attention_mask.shape) != (b, p):
            raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} must equal "
                             f"prompt_ids shape {(b, p)}")
        if not torch.isin(attention_mask, torch.tensor([0, 1], device=prompt.device)).all():
            raise ValueError("attention_mask must contain only 0 (padding) and 1 (token)")
        valid = attention_mask.bool()
        if (valid[:, 1:].long() < valid[:, :-1].long()).any():
            raise ValueError("attention_mask must be left padding (zeros before ones in a row); "
                             "right padding would put pads inside the canvas")
        empty = ~valid.any(1)
        if empty.any():
            raise ValueError(f"rows {empty.nonzero().flatten().tolist()} are all padding; "
                             "every row needs at least one prompt token")
    vocab = model.vocab_size
    real = prompt[valid]
    if (real < 0).any() or (real >= vocab).any():
        raise ValueError(f"prompt token ids must be in [0, {vocab}); got min {int(real.min())}, "
                         f"max {int(real.max())}")
    mask_id = model.mask_token_id  # None: a uniform-noise model has no mask token
    if mask_id is not None and not cfg.allow_prompt_masks and (real == mask_id).any():
        raise ValueError(f"the prompt contains the mask token ({model.mask_token_id}); pass "
                         "allow_prompt_masks=True for infilling (masked prompt positions then "
                         "compete for commits like block positions, as in LLaDA's generate)")
    total = p + cfg.gen_length
    if total > model.max_length:
        raise ValueError(f"prompt length {p} + gen_length {cfg.gen_length} = {total} exceeds "
                         f"the model's max length {model.max_length}")
    cached = cfg.cache != CacheMode.NONE
    fed = (cfg.block_length or cfg.gen_length) if cached else total
    check_fits(decode_bytes(model, b, total, fed, cached), model_device(model, prompt.device),
               f"decoding {b} row(s) of prompt {p} + gen_length {cfg.gen_length}",
               "lower gen_length or the batch size (or use a device with more memory)")
    return prompt, valid
