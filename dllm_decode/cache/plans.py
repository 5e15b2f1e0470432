"""Which positions each forward computes, per ``CacheMode``.

* ``none``: the whole canvas every step (exact).
* ``prefix`` (Fast-dLLM): a full forward at block start (and every ``refresh_every`` steps)
  stores K/V for every position; later forwards feed ``[block_start, L)`` against the cached
  prefix. Approximate: the prefix K/V go stale as the block changes. Its cached steps carry
  ``double_draw`` (``Feed``): where Fast-dLLM's loop draws twice; the plan says where, the
  proposal maker decides for whom (the selector's ``reference_loop``).
* ``dual`` (Fast-dLLM): the same refresh; later forwards feed only the block, overwriting its
  K/V, against the cached prefix *and* suffix.
* ``block_causal`` (block-diffusion models): blocks are causal, so committed blocks are written
  once and are exact. A block's first forward also feeds the previous (now clean) block, which
  stores its final K/V in the same forward instead of a separate one.

* ``window`` (Window-Diffusion): phases of full and pruned steps over per-row position sets;
  see ``dllm_decode.cache.window``.
* ``dllm_cache`` (dLLM-Cache): the whole canvas every step, each layer reusing its cached
  features (prompt / response refreshed at their own intervals, a share of the response in
  between); see ``dllm_decode.cache.dllm_cache``.
* ``sub_block`` (Fast-dLLM v2's ``use_block_cache``): ``block_causal`` across blocks; inside a
  block, each row's current sub-block alone against the block's K/V of its last refresh
  (approximate); see ``dllm_decode.cache.sub_block``. ``separate_prefill``: ``prefill``.

Every fed span writes its fresh K/V in place (positions are distinct), then attends over the
cache. Models with shifted logits (Dream) get one extra row on the left so the first position of
a span has its prediction. Right after a refresh a cached forward equals full recomputation.
With ``causal_prefix`` (block-diffusion models) queries left of the current block attend causally
(S2D2's AR-like caching), in every mode, so cached and uncached decoding stay identical.

A plan may need a few integers on the host to shape its next forward (the window plan's fed
width); ``prepare`` returns them as a tensor that the sampler folds into its one host sync per
step and hands back to ``forward`` as ``host``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.fed import Fed, Feed
from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.kernels.reference import block_causal_mask
from dllm_decode.types import CacheMode, DiffusionLM


class ForwardPlan:
    """Runs the model for one step according to the cache mode (one plan per generation).

    Args:
        model: the ``DiffusionLM``.
        mode: the cache mode (``window`` and ``sub_block`` have plans of their own; see
            ``cache.table.make_plan``).
        valid: ``[B', L]`` key validity (False: left padding; the sampler clears truncated
            tails in place).
        positions: ``[B', L]`` RoPE positions.
        refresh_every: ``prefix``/``dual``: also refresh every R steps inside a block.
        causal_prefix: block-diffusion models: queries left of the current block attend
            causally (see the module docstring).
        cache: a ``BlockKVCache`` of this batch and length to reuse (its content is
            overwritten; ``None``: a new one, ``model.new_cache``).
    """

    def __init__(self, model: DiffusionLM, mode: CacheMode, valid: Tensor, positions: Tensor,
                 refresh_every: int | None = None, *, causal_prefix: bool = False,
                 cache: BlockKVCache | None = None) -> None:
        if mode in (CacheMode.BLOCK_CAUSAL, CacheMode.SUB_BLOCK) and (
                model.attention != "block_causal"):
            raise ValueError(f"cache={mode.value!r} needs a block-diffusion model; this model's "
                             f"attention is {model.attention!r} (use none, prefix or dual)")
        if model.attention == "block_causal" and mode in (CacheMode.PREFIX, CacheMode.DUAL):
            raise ValueError(f"cache={mode.value!r} is for bidirectional models; block-diffusion "
                             "models use cache='block_causal' (exact) or 'none'")
        if causal_prefix and model.attention != "block_causal":
            raise ValueError("causal_prefix needs a block-diffusion model (attention="
                             f"'block_causal'); this model's attention is {model.attention!r}")
        self.model, self.mode = model, mode
        self.valid, self.positions = valid, positions  # [B', L]
        self.refresh_every = refresh_every
        self.causal_prefix = causal_prefix
        self.shift = int(model.logit_shift)
        self.length = valid.shape[1]
        self.cache: BlockKVCache | None = None
        if mode is not CacheMode.NONE:
            self.cache = cache if cache is not None and (cache.batch_size, cache.max_len) == (
                valid.shape[0], self.length) else model.new_cache(valid.shape[0], self.length)
        self.clean_upto = 0  # block_causal: K/V of [0, clean_upto) are final
        # no padding and nothing truncated: bidirectional forwards need no mask (SDPA's fast
        # path). One host read here, before the step loop; ``restrict`` clears it.
        self.dense = bool(valid.all())
        self.boundary = 0  # causal_prefix: queries left of this position attend causally
        #: S2D2 ``draft_ver`` (block-causal models): in the step's forward, queries of the
        #: current block left of the row's first masked position attend causally too
        self.draft_causal = False
        self._draft_upto: Tensor | None = None  # [B'] first masked position (block end if none)
        # per-generation memo of the step's index tensors and masks, keyed by host integers
        # (a block's steps reuse them: no per-step arange / mask building); ``restrict``
        # clears the masks that depend on ``valid``
        self._memo: dict[tuple, Any] = {}

    def _arange(self, lo: int, hi: int) -> Tensor:
        """Cached ``arange(lo, hi)`` on the plan's device (read-only)."""
        key = ("arange", lo, hi)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = torch.arange(lo, hi, device=self.valid.device)
        return out

    def _structure(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """``[N, Lk]`` keys each query may see by position alone (``None``: all of them)."""
        if self.model.attention != "block_causal":
            return None
        allowed = block_causal_mask(q_pos[None], k_pos[None], self.model.block_size)[0]
        if self.causal_prefix:
            causal = k_pos[None, :] <= q_pos[:, None]
            allowed = torch.where((q_pos < self.boundary)[:, None], causal, allowed)
        return allowed

    def restrict(self, visible: Tensor) -> None:
        """Hide keys from later forwards: ``valid &= visible`` (``[B', L]``; truncation)."""
        self.valid &= visible
        self.dense = False
        self._memo = {k: v for k, v in self._memo.items() if k[0] == "arange"}

    def _keys_mask(self, start: int, end: int) -> Tensor | None:
        """Visible keys for queries at canvas positions ``[start, end)``: the key mask
        ``[B', L]`` when every query sees the same keys (``None``: every key, no padding) —
        the form the cached attention kernel takes — else ``[B', N, L]``.

        Block-causal queries that all lie in one block (and right of a causal prefix) share
        their keys: everything before the block's end. That is decided from the integers
        alone, so the common block-causal step runs the kernel path too.
        """
        key = ("keys", start, end, self.boundary if self.causal_prefix else 0)
        if key not in self._memo:
            self._memo[key] = self._build_keys_mask(start, end)
        return self._memo[key]

    def _build_keys_mask(self, start: int, end: int) -> Tensor | None:
        keys = self._arange(0, self.length)
        if self.model.attention == "block_causal":
            size = self.model.block_size
            if start // size == (end - 1) // size and not (
                    self.causal_prefix and start < self.boundary):
                return self.valid & (keys < (start // size + 1) * size)[None]
        if self.model.attention == "block_causal" and not self.causal_prefix:
            # rows of the canvas-wide structure, built once per generation ([L, L] bool)
            if ("structure",) not in self._memo:
                self._memo[("structure",)] = self._structure(keys, keys)
            allowed = self._memo[("structure",)][start:end]
        else:
            allowed = self._structure(self._arange(start, end), keys)
        if allowed is None:
            return None if self.dense else self.valid
        return self.valid[:, None, :].expand(-1, end - start, -1) & allowed

    def _run(self, canvas: Tensor, start: int, end: int, lo: int, hi: int,
             use_cache: bool) -> Tensor:
        span = self._arange(start, end)
        # logits of every fed row: no row selection (an index_select copying all of them)
        rows = None if (lo, hi) == (start, end) else self._arange(lo - start, hi - start)
        tokens = canvas if (start, end) == (0, self.length) else canvas[:, start:end]
        key = ("span", start, end)
        if key not in self._memo:  # RoPE positions (and tables) and cache slots of the span
            self._memo[key] = pos = self.positions[:, start:end]
            self._memo[("slots", start, end)] = span.expand_as(pos)
            tables = getattr(self.model, "rope_tables", None)  # DecoderLM models have them
            self._memo[("rope", start, end)] = None if tables is None else tables(pos)
        pos = self._memo[key]
        rope = {} if self._memo[("rope", start, end)] is None else {
            "rope": self._memo[("rope", start, end)]}
        drafting = self._draft_upto is not None
        if use_cache:
            mask = self._keys_mask(start, end)
            if drafting:
                mask = self._draft_mask(mask, span, self._arange(0, self.length))
            slots = self._memo[("slots", start, end)]
            return self.model(tokens, pos, cache=self.cache, slots=slots, mask=mask, store=True,
                              hidden_rows=rows, **rope)
        key = ("self_mask", start, end, self.boundary if self.causal_prefix else 0)
        if key not in self._memo:
            self._memo[key] = self._self_mask(start, end, span)
        mask = self._memo[key]
        if drafting:
            mask = self._draft_mask(mask, span, span)
        return self.model(tokens, pos, mask=mask, hidden_rows=rows, **rope)

    def _self_mask(self, start: int, end: int, span: Tensor) -> Tensor | None:
        """Uncached forwards over ``[start, end)``: ``[B', N, N]`` or ``None`` (all visible)."""
        allowed = self._structure(span, span)
        mask = None
        if allowed is not None or not self.dense:
            mask = self.valid[:, start:end][:, None, :].expand(-1, end - start, -1)
            if allowed is not None:
                mask = mask & allowed
        return mask

    def _draft_mask(self, mask: Tensor | None, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``mask`` (``None``, keys ``[B', Lk]`` or ``[B', N, Lk]``) with the draft-causal rows:
        queries in ``[block aligned start, first masked position)`` see keys ``<=`` their own
        position only (S2D2 Eq. 4, ``draft_ver``). Per row, no host sync."""
        b, n = self.valid.shape[0], q_pos.shape[0]
        if mask is None:
            mask = torch.ones(b, n, k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
        elif mask.dim() == 2:
            mask = mask[:, None, :].expand(-1, n, -1)
        rows = (q_pos[None] >= self.boundary) & (q_pos[None] < self._draft_upto[:, None])
        causal = k_pos[None, None, :] <= q_pos[None, :, None]
        return torch.where(rows[:, :, None], mask & causal, mask)

    def prepare(self, canvas: Tensor, step_in_block: int, lo: int, *,
                final: bool = False) -> Tensor | None:
        """Integers the next ``forward`` needs on the host (``[k]`` int64; ``None``: none).

        ``final``: the block's last scheduled step. May be called for a step that is then
        skipped (the block turned out to be complete).
        """
        return None

    def forward(self, canvas: Tensor, block: tuple[int, int], aligned_start: int,
                step_in_block: int, lo: int, full_span: bool,
                host: list[int] | None = None) -> Fed:
        """One forward for a step: ``feed`` (the host bookkeeping) then ``run`` (the tensors).

        Args:
            canvas: ``[B', L]`` tokens (B' = 2B under CFG).
            block: ``(start, end)`` of the current block; ``aligned_start`` is the block's
                absolute-aligned start (block-diffusion models; else equal to ``start``).
            step_in_block: 0 at block entry.
            lo: first canvas row whose logits are wanted (earliest eligible position).
            full_span: logits wanted up to the end of the canvas (stoppers), not the block.
            host: the values of ``prepare``'s tensor, read on the host (unused here).
        """
        self._draft_upto = None
        if self.draft_causal and self.model.attention == "block_causal":
            bs, be = aligned_start, block[1]
            pos = torch.arange(bs, be, device=canvas.device)
            open_ = canvas[:, bs:be] == self.model.mask_token_id
            self._draft_upto = torch.where(open_, pos, be).min(1).values
        return self.run(canvas, self.feed(block, aligned_start, step_in_block, lo, full_span))

    def feed(self, block: tuple[int, int], aligned_start: int, step_in_block: int, lo: int,
             full_span: bool) -> Feed:
        """The host half of ``forward``: which span this step feeds and scores (host integers
        only, no tensor work), and the plan's per-block bookkeeping (the causal boundary, the
        block-causal clean prefix). ``run`` does the tensor half; a captured step
        (``samplers.graph``) calls ``feed`` on the host every step and replays ``run``."""
        bs, be = block
        length = self.length
        hi = length if full_span else be
        mode = self.mode
        self.boundary = aligned_start
        refresh = step_in_block == 0 or (
            self.refresh_every is not None and step_in_block % self.refresh_every == 0)
        if mode is CacheMode.NONE:
            return Feed(0, length, lo, hi, False, 0, length, True)
        if mode in (CacheMode.PREFIX, CacheMode.DUAL) and refresh:
            return Feed(0, length, lo, hi, True, 0, length, True)
        if mode is CacheMode.PREFIX:
            start = max(bs - self.shift, 0)
            return Feed(start, length, max(lo, bs), hi, True, bs, length - bs, False,
                        double_draw=True)
        if mode is CacheMode.DUAL:
            start = max(bs - self.shift, 0)
            return Feed(start, be, max(lo, bs), be, True, bs, be - bs, False)
        # block_causal: feed [clean_upto, be); the previous block gets its final K/V here
        start = max(min(self.clean_upto, aligned_start) - self.shift, 0)
        self.clean_upto = aligned_start
        return Feed(start, be, max(lo, aligned_start), be, True, aligned_start,
                    be - aligned_start, step_in_block == 0)

    def prefill(self, canvas: Tensor, start: int, end: int, aligned: int) -> int:
        """``separate_prefill``: the K/V of the prompt's complete blocks ``[0, aligned)`` in a
        forward of their own (as Fast-dLLM v2's reference prefills) when the first block
        ``(start, end)`` begins inside the prompt's last block (``start > aligned > 0``; by
        default the first step computes them). A block-aligned prompt needs none: the first
        step is that prefill (it predicts the first answer token). Returns 0 or 1 calls."""
        if self.mode not in (CacheMode.BLOCK_CAUSAL, CacheMode.SUB_BLOCK):
            raise ValueError("separate_prefill needs cache='block_causal' or 'sub_block' "
                             f"(a block-diffusion model's K/V cache); cache is {self.mode.value!r}")
        if aligned == 0 or start == aligned:
            return 0
        self._run(canvas, 0, aligned, aligned - 1, aligned, True)  # stores K/V; logits unused
        self.clean_upto = aligned
        return 1

    def run(self, canvas: Tensor, feed: Feed) -> Fed:
        """The tensor half of ``forward``: the model over ``feed``'s span (no host sync)."""
        logits = self._run(canvas, feed.start, feed.end, feed.lo, feed.hi, feed.use_cache)
        return Fed(logits, self._arange(feed.lo, feed.hi), feed.fed_start, feed.fed_width,
                   refresh=feed.refresh, double_draw=feed.double_draw, span=(feed.lo, feed.hi),
                   positions=feed.end - feed.start)

    def extra_width(self, n: int) -> int:
        """Token positions per row an ``extra_forward`` of ``n`` tokens runs: ``n`` against a
        cache, ``L + n`` without one (the canvas is recomputed beside them)."""
        return n if self.cache is not None else self.length + n

    def extra_forward(self, canvas: Tensor, tokens: Tensor, positions: Tensor,
                      mask: Tensor) -> Tensor:
        """A forward that stores nothing (``StepModel.forward``; the caller counts it).

        Args:
            canvas: ``[B', L]`` the step's canvas (recomputed when there is no cache).
            tokens, positions: ``[B', N]`` the fed tokens and their RoPE positions.
            mask: ``[B', N, L + N]`` bool: columns ``[0, L)`` canvas keys, ``[L, L + N)`` the
                fed tokens.

        Returns: logits ``[B', N, V]``.
        """
        if self.cache is not None:
            return self.model(tokens, positions, cache=self.cache, mask=mask, store=False)
        # no cache: one forward over [canvas | tokens]; the canvas attends as it does in the
        # plan's own forwards (and never to the fed tokens), the fed tokens as ``mask`` says
        b, n = tokens.shape
        length = self.length
        span = torch.arange(length, device=canvas.device)
        self_mask = self.valid[:, None, :].expand(-1, length, -1)
        allowed = self._structure(span, span)
        if allowed is not None:
            self_mask = self_mask & allowed
        top = torch.cat([self_mask, self_mask.new_zeros(b, length, n)], dim=2)
        full = torch.cat([top, mask], dim=1)  # [B', L + N, L + N]
        rows = torch.arange(length, length + n, device=canvas.device)
        return self.model(torch.cat([canvas, tokens], 1), torch.cat([self.positions, positions],
                          1), mask=full, hidden_rows=rows)


def forward_plan(model: DiffusionLM, mode: CacheMode, valid: Tensor, positions: Tensor,
                 cfg: Any, family: str = "", cache: BlockKVCache | None = None,
                 sub_block: int | None = None) -> ForwardPlan:
    """The ``none`` / ``prefix`` / ``dual`` / ``block_causal`` plan from a ``SamplerConfig``
    (a ``cache.table.PLANS`` builder; ``family`` and ``sub_block`` are not used here)."""
    return ForwardPlan(model, mode, valid, positions, cfg.refresh_every,
                       causal_prefix=bool(cfg.causal_prefix), cache=cache)
