"""Which positions each forward computes, per ``CacheMode``.

* ``none``: the whole canvas every step (exact).
* ``prefix`` (Fast-dLLM): a full forward at block start (and every ``refresh_every`` steps)
  stores K/V for every position; later forwards feed ``[block_start, L)`` against the cached
  prefix. Approximate: the prefix K/V go stale as the block changes.
* ``dual`` (Fast-dLLM): the same refresh; later forwards feed only the block, overwriting its
  K/V, against the cached prefix *and* suffix.
* ``block_causal`` (block-diffusion models): blocks are causal, so committed blocks are written
  once and are exact. A block's first forward also feeds the previous (now clean) block, which
  stores its final K/V in the same forward instead of a separate one.

Every fed span writes its fresh K/V in place (positions are distinct), then attends over the
cache. Models with shifted logits (Dream) get one extra row on the left so the first position of
a span has its prediction. Right after a refresh a cached forward equals full recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.models.base import DiffusionLM, block_causal_mask
from dllm_decode.types import CacheMode


@dataclass
class Fed:
    """What one forward computed.

    logits: ``[B', R, V]`` for canvas rows ``rows`` (``[R]`` long, shared by the batch).
    fed_start / fed_width: the canvas span the *reference* decoder's forward covers (random
    draws in ``rng="reference"`` mode use this shape). ``refresh``: a full-canvas forward.
    ``double_draw``: Fast-dLLM's prefix loop draws (and discards) one extra Gumbel tensor.
    """

    logits: Tensor
    rows: Tensor
    fed_start: int
    fed_width: int
    refresh: bool
    double_draw: bool = False


def _rows(lo: int, hi: int, canvas: Tensor) -> Tensor:
    return torch.arange(lo, hi, device=canvas.device)


class ForwardPlan:
    """Runs the model for one step according to the cache mode (one plan per generation)."""

    def __init__(self, model: DiffusionLM, mode: CacheMode, valid: Tensor, positions: Tensor,
                 refresh_every: int | None = None) -> None:
        if mode is CacheMode.BLOCK_CAUSAL and model.attention != "block_causal":
            raise ValueError("cache='block_causal' needs a block-diffusion model; this model's "
                             f"attention is {model.attention!r} (use none, prefix or dual)")
        if model.attention == "block_causal" and mode in (CacheMode.PREFIX, CacheMode.DUAL):
            raise ValueError(f"cache={mode.value!r} is for bidirectional models; block-diffusion "
                             "models use cache='block_causal' (exact) or 'none'")
        if mode is CacheMode.WINDOW:
            raise ValueError("cache='window' is provided by the Window-Diffusion policy")
        self.model, self.mode = model, mode
        self.valid, self.positions = valid, positions  # [B', L]
        self.refresh_every = refresh_every
        self.shift = int(model.logit_shift)
        self.length = valid.shape[1]
        self.cache: BlockKVCache | None = None
        if mode is not CacheMode.NONE:
            self.cache = model.new_cache(valid.shape[0], self.length)
        self.clean_upto = 0  # block_causal: K/V of [0, clean_upto) are final

    def _keys_mask(self, q_pos: Tensor) -> Tensor:
        """``[B', N, L]`` visible keys for queries at canvas positions ``q_pos [N]``."""
        mask = self.valid[:, None, :].expand(-1, q_pos.numel(), -1)
        if self.model.attention == "block_causal":
            k_pos = torch.arange(self.length, device=self.valid.device)
            mask = mask & block_causal_mask(q_pos[None], k_pos[None], self.model.block_size)
        return mask

    def _run(self, canvas: Tensor, start: int, end: int, lo: int, hi: int,
             use_cache: bool) -> Tensor:
        span = torch.arange(start, end, device=canvas.device)
        rows = torch.arange(lo, hi, device=canvas.device) - start
        tokens, pos = canvas[:, start:end], self.positions[:, start:end]
        if use_cache:
            mask = self._keys_mask(span)
            return self.model(tokens, pos, cache=self.cache, slots=span.expand_as(tokens),
                              mask=mask, store=True, hidden_rows=rows)
        valid = self.valid[:, start:end]
        mask = valid[:, None, :].expand(-1, end - start, -1)
        if self.model.attention == "block_causal":
            mask = mask & block_causal_mask(span[None], span[None], self.model.block_size)
        return self.model(tokens, pos, mask=mask, hidden_rows=rows)

    def forward(self, canvas: Tensor, block: tuple[int, int], aligned_start: int,
                step_in_block: int, lo: int, full_span: bool) -> Fed:
        """One forward for a step.

        Args:
            canvas: ``[B', L]`` tokens (B' = 2B under CFG).
            block: ``(start, end)`` of the current block; ``aligned_start`` is the block's
                absolute-aligned start (block-diffusion models; else equal to ``start``).
            step_in_block: 0 at block entry.
            lo: first canvas row whose logits are wanted (earliest eligible position).
            full_span: logits wanted up to the end of the canvas (stoppers), not the block.
        """
        bs, be = block
        length = self.length
        hi = length if full_span else be
        mode = self.mode
        refresh = step_in_block == 0 or (
            self.refresh_every is not None and step_in_block % self.refresh_every == 0)
        if mode is CacheMode.NONE:
            logits = self._run(canvas, 0, length, lo, hi, use_cache=False)
            return Fed(logits, _rows(lo, hi, canvas), 0, length, refresh=True)
        if mode in (CacheMode.PREFIX, CacheMode.DUAL) and refresh:
            logits = self._run(canvas, 0, length, lo, hi, use_cache=True)
            return Fed(logits, _rows(lo, hi, canvas), 0, length, refresh=True)
        if mode is CacheMode.PREFIX:
            start = max(bs - self.shift, 0)
            lo = max(lo, bs)
            logits = self._run(canvas, start, length, lo, hi, use_cache=True)
            return Fed(logits, _rows(lo, hi, canvas), bs, length - bs, refresh=False,
                       double_draw=True)
        if mode is CacheMode.DUAL:
            start = max(bs - self.shift, 0)
            lo, hi = max(lo, bs), be
            logits = self._run(canvas, start, be, lo, hi, use_cache=True)
            return Fed(logits, _rows(lo, hi, canvas), bs, be - bs, refresh=False)
        # block_causal: feed [clean_upto, be); the previous block gets its final K/V here
        start = max(min(self.clean_upto, aligned_start) - self.shift, 0)
        lo, hi = max(lo, aligned_start), be
        logits = self._run(canvas, start, be, lo, hi, use_cache=True)
        self.clean_upto = aligned_start
        return Fed(logits, _rows(lo, hi, canvas), aligned_start, be - aligned_start,
                   refresh=step_in_block == 0)
