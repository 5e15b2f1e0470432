"""The encoder-decoder cache plan of a uniform-noise model (DiffusionGemma): ``CanvasPlan``.

A uniform-noise model decodes canvas after canvas against a K/V cache that only its causal
encoder writes (``model.encode``): at a block's start the plan appends the prompt (first
canvas) or the previous finished canvas to the cache, the per-block action that plays the
part of a mask plan's refresh. Every step's forward is the bidirectional decoder over the
cached prefix plus the whole canvas (``model.decode``), self-conditioned on the previous
step's tempered logits, which the plan carries from step to step (``condition``) and drops at
each block start. Reference: transformers 5.24 ``models/diffusion_gemma``
(``DiffusionGemmaGenerationMixin``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class CanvasPlan:
    """One generation's cache and self-conditioning state (one per ``generate``).

    Args:
        model: a uniform-noise model (``new_cache``, ``encode``, ``decode``).
        prompt: ``[B, P]`` token ids; valid: ``[B, P]`` bool (False = left padding).
        length: the cache's length (prompt plus every canvas).
    """

    def __init__(self, model: Any, prompt: Tensor, valid: Tensor, length: int) -> None:
        self.model, self.prompt, self.valid = model, prompt, valid
        self.cache = model.new_cache(prompt.shape[0], length)
        self.self_cond: Tensor | None = None  # [B, C, V] the previous step's tempered logits

    def start_block(self, block: int, previous: Tensor | None) -> None:
        """Block ``block``'s cache action: encode the prompt (block 0) or the previous canvas
        ``previous [B, C]`` into the cache; self-conditioning starts empty."""
        if block == 0:
            self.model.encode(self.prompt, self.cache, self.valid)
        else:
            self.model.encode(previous, self.cache, prompt=False)
        self.self_cond = None

    def forward(self, canvas: Tensor) -> Tensor:
        """``canvas [B, C]`` -> ``[B, C, V]`` logits of the decoder over cache + canvas."""
        return self.model.decode(canvas, self.cache, self.self_cond)

    def condition(self, tempered: Tensor, frozen: Tensor) -> None:
        """The next step's self-conditioning input: ``tempered [B, C, V]``, except in rows
        ``frozen [B]`` (stopped earlier), which keep theirs (as the reference does)."""
        sc = self.self_cond
        self.self_cond = tempered if sc is None else torch.where(frozen[:, None, None], sc,
                                                                  tempered)
