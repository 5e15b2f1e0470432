"""``cache="sub_block"``: Fast-dLLM v2's block-level cache (``use_block_cache``).

Wu et al., "Fast-dLLM v2: Efficient Block-Diffusion LLM", arXiv 2509.26328; reference
NVlabs/Fast-dLLM ``v2/generation_functions.py`` ``batch_sample`` (upstream d259b48) and the
``generate`` / ``forward(use_block_cache=True, block_past_key_values, replace_position)`` of
the Hugging Face ``modeling.py`` of ``Efficient-Large-Model/Fast_dLLM_v2_7B``.

For block-diffusion models whose selector commits inside sub-blocks
(``Capabilities.sub_block_size``: ``fastdllm_v2``). Across blocks it is ``block_causal``: a
block's first step (its entry) feeds the previous block and the current one, so committed
blocks hold their exact, final K/V. Inside a block, per row, from its second step on:

* **refresh**: the whole block is fed against the cached prefix and its K/V are stored (the
  block-level cache), when the row has no block cache yet or the first position of its current
  sub-block is still masked (a sub-block forward has no row left of the sub-block, so it cannot
  predict that position: the model's shift gives the first fed row its own output, exactly as
  the reference's ``cat(logits[:, :1], logits[:, :-1])`` over the sub-block does);
* **sub-block forward**: otherwise only the row's current sub-block (``S`` positions) is fed,
  against the prefix and the block's K/V of the last refresh (**stale**: the block's other
  positions keep the K/V they had then); the sub-block's fresh K/V overwrite its slots (the
  reference's ``replace_position`` writes into its block cache in place), so later sub-block
  forwards see them. Its first row's logits are not scored (``Fed.live``).

The block cache exists once a full forward of the block ran with the block's first position
decided: a block whose first token is predicted by the previous block's last position (the AR
token of Fast-dLLM v2) gets it at its entry step, and its next step refreshes, as the reference
creates the block cache with the first forward after its cache-commit forward.

Right after a refresh the logits equal the exact ``block_causal`` cache's (tested); between
refreshes they drift (``diagnostics.drift.measure_drift`` reports it). Rows are independent: each
row's refresh decision is its own. A step whose rows disagree runs two model calls over the
batch (the sub-block forward, then the refresh with the K/V of the sub-block rows' block
restored afterwards), counted in ``Generation.forwards``; each row counts one forward in its
NFE. Deviation: the reference decides for the whole batch (a refresh when any row needs one),
so its rows depend on their neighbours. When ``S`` does not divide the block (the reference
then never ends), the last sub-block's forward is widened to the left to ``S`` positions,
which it recomputes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.fed import Fed
from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.types import CacheMode


class SubBlockPlan(ForwardPlan):
    """The ``sub_block`` plan (module docstring): ``sub_block`` is the sub-block size ``S``.

    Per step (after the block's entry), ``prepare`` decides each row's forward from the
    canvas (``[2]`` host integers folded into the sampler's one sync: any refresh row, any
    sub-block row) and ``forward`` runs the calls and returns the logits of each row's current
    sub-block, ``Fed.rows`` ``[B', S]``.
    """

    def __init__(self, model: Any, valid: Tensor, positions: Tensor, sub_block: int | None, *,
                 causal_prefix: bool = False, cache: BlockKVCache | None = None) -> None:
        super().__init__(model, CacheMode.SUB_BLOCK, valid, positions,
                         causal_prefix=causal_prefix, cache=cache)
        if sub_block is None:
            raise ValueError("cache='sub_block' needs a policy that decodes in sub-blocks "
                             "(Capabilities.sub_block_size, e.g. policy 'fastdllm_v2'); use "
                             "cache='block_causal' with this policy")
        self.sub = int(sub_block)
        b = valid.shape[0]
        device = valid.device
        #: [B'] the row's block K/V are cached from a refresh with the block's first position
        #: decided (reset at each block's entry)
        self.have_block = torch.zeros(b, dtype=torch.bool, device=device)
        self._refresh = self._sub = self._start = None  # [B'] set by ``prepare``
        self._block: tuple[int, int] | None = None  # (aligned start, end) of the last forward

    def _current(self, canvas: Tensor, a: int, be: int) -> tuple[Tensor, Tensor, Tensor]:
        """Per row: ``(start, masked_first, has)``: the offset of its current sub-block in
        ``[a, be)`` (the one holding its first mask; the last one without masks), whether that
        sub-block's first position is masked, whether the block has a mask."""
        masked = canvas[:, a:be] == self.model.mask_token_id  # [B', W]
        w = be - a
        pos = self._arange(0, w)
        first = torch.where(masked, pos, w - 1).min(1).values  # [B']
        start = first // self.sub * self.sub
        return start, masked.gather(1, start[:, None])[:, 0], masked.any(1)

    def prepare(self, canvas: Tensor, step_in_block: int, lo: int, *,
                final: bool = False) -> Tensor | None:
        """``[2]``: (any row refreshes, any row runs a sub-block forward); ``None`` at a
        block's entry (always the block-causal forward)."""
        if step_in_block == 0 or self._block is None:
            return None
        a, be = self._block
        start, first_masked, has = self._current(canvas, a, be)
        refresh = has & (~self.have_block | first_masked)
        self._refresh, self._sub, self._start = refresh, has & ~refresh, start
        return torch.stack([refresh.any(), self._sub.any()]).long()

    def forward(self, canvas: Tensor, block: tuple[int, int], aligned_start: int,
                step_in_block: int, lo: int, full_span: bool,
                host: list[int] | None = None) -> Fed:
        """The block's entry: the ``block_causal`` forward; later steps: each row's refresh
        or sub-block forward (``prepare``'s ``host`` integers say which calls run)."""
        a, be = aligned_start, block[1]
        if step_in_block == 0 or not host:
            fed = super().forward(canvas, block, aligned_start, step_in_block, lo, full_span)
            self._block = (a, be)
            decided = canvas[:, a] != self.model.mask_token_id if a < self.length else None
            self.have_block = torch.zeros_like(self.have_block) if decided is None else decided
            return fed
        self._draft_upto = None
        any_refresh, any_sub = bool(host[0]), bool(host[1])
        refresh, sub, start = self._refresh, self._sub, self._start
        if not any_refresh and not any_sub:  # nothing masked (exact_steps): refresh every row
            any_refresh, refresh = True, torch.ones_like(refresh)
        width = be - a
        s = min(self.sub, width)
        left = a + torch.clamp(start, max=width - s)  # [B'] the fed window's first position
        window = left[:, None] + self._arange(0, s)[None]  # [B', S] canvas positions
        logits = self._window_forward(canvas, window, be) if any_sub else None
        if any_refresh:
            lo_kv = max(a - self.shift, 0)
            saved = None
            if any_sub:  # keep the sub-block rows' block K/V (the refresh call rewrites them)
                saved = (self.cache.k[:, :, :, lo_kv:be].clone(),
                         self.cache.v[:, :, :, lo_kv:be].clone())
            full = self._run(canvas, lo_kv, be, a, be, True)  # [B', W, V] rows [a, be)
            if saved is not None:
                keep = sub[None, :, None, None, None]
                for buf, old in zip((self.cache.k, self.cache.v), saved, strict=True):
                    buf[:, :, :, lo_kv:be] = torch.where(keep, old, buf[:, :, :, lo_kv:be])
            idx = (window - a)[..., None].expand(-1, -1, full.shape[-1])
            scored = full.gather(1, idx)
            logits = scored if logits is None else torch.where(
                refresh[:, None, None], scored, logits)
            self.have_block = self.have_block | (
                refresh & (canvas[:, a] != self.model.mask_token_id))
        rows_refresh = refresh if any_refresh else torch.zeros_like(refresh)
        # a sub-block forward's first fed row has no left neighbour: not scored there
        live = (window > (a + start)[:, None]) | (
            (window == (a + start)[:, None]) & rows_refresh[:, None])
        return Fed(logits, window, a, width, refresh=any_refresh and not any_sub,
                   live=live, refreshed=rows_refresh, calls=int(any_sub) + int(any_refresh),
                   positions=s * any_sub + (be - max(a - self.shift, 0)) * any_refresh)

    def _window_forward(self, canvas: Tensor, window: Tensor, be: int) -> Tensor:
        """Each row's window ``[B', S]`` fed against the cache (keys before ``be``); stores
        its K/V. Returns logits ``[B', S, V]`` (the model's shift inside the window)."""
        key = ("sub_keys", be)
        if key not in self._memo:
            self._memo[key] = self.valid & (self._arange(0, self.length) < be)[None]
        pos = self.positions.gather(1, window)
        return self.model(canvas.gather(1, window), pos, cache=self.cache, slots=window,
                          mask=self._memo[key], store=True)


def sub_block_plan(model: Any, mode: CacheMode, valid: Tensor, positions: Tensor, cfg: Any,
                   family: str = "", cache: BlockKVCache | None = None,
                   sub_block: int | None = None) -> SubBlockPlan:
    """The ``sub_block`` plan from a ``SamplerConfig`` and the selector's sub-block size
    (``Capabilities.sub_block_size``; a ``cache.table.PLANS`` builder)."""
    if cfg.cfg_scale > 0:  # its rows choose their own sub-blocks: the halves would differ
        raise ValueError("cache='sub_block' does not support classifier-free guidance "
                         "(cfg_scale > 0); use cache='block_causal'")
    return SubBlockPlan(model, valid, positions, sub_block, causal_prefix=bool(cfg.causal_prefix),
                        cache=cache)
