"""Streaming-dLLM's suffix pruning: prefix K/V, the current block, a window of the masks after
it and the last position, at their true positions.

Y. Xiao et al., "Streaming-dLLM: Accelerating Diffusion LLMs via Suffix Pruning and Dynamic
Decoding", arXiv 2601.17917; reference ``generate_with_prefix_cache`` in
xiaoshideta/Streaming-dLLM ``LLaDA-1.5/generate.py`` @ c4320c2 (suffix picker
``LLaDA-1.5/sampler.py::deterministic_window_tail_sampler`` with ``tail_keep=1``).

For the block ``[bs, be)`` of a canvas of length ``L`` the forwards see only the **kept**
positions ``K = [0, be) + W + T``: ``W`` the first ``window`` positions of ``[be, L)`` and
``T`` the last ``tail`` positions of the canvas when ``L - be > window`` (else ``W`` already
reaches the end). The suffix past the block is all masks, so the far masks are dropped and the
tail keeps the sequence's end at its true RoPE position (the paper's attenuation argument).

* The block's **first step** feeds every kept position (the reference's pruned full forward)
  and stores their K/V; attention sees the kept positions only.
* Its **following steps** feed the block, the window and the tail against the K/V of
  ``[0, bs)`` stored by the first step. So the prefix K/V of a block are computed in a
  forward whose context was already pruned, as in the reference.
* Shifted logits (Dream): the following steps also feed the position left of the block as a
  **query only** (its hidden state predicts the block's first position): its fresh K/V are
  hidden, the keys are the stored ``[0, bs)`` (its first-step K/V included) and the fresh
  block, window and tail, so every other row equals the authors' Dream forward
  (``Dream/model/generation_utils_block.py``: ``x[:, bs:]`` against the ``[0, bs)`` cache).
  Those forwards attend without storing (``store=False``: SDPA, not the Triton kernels). The
  authors' Dream code reads the block's first position from its own output in those
  forwards; its first-step rule (``policies.streaming``, ``first="position"``) commits that
  position first, so the two agree token for token; the left neighbour keeps other selectors
  correct.

``Fed.fed_start`` / ``fed_width`` are the reference forward's span (the first step: ``0`` and
``|K|``; later: ``bs`` and ``|K| - bs``): its random draws have that shape, and the mask ratio
of ``policies.streaming`` is taken over it. ``Fed.positions`` counts the positions fed.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.cache.fed import Fed
from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.types import CacheMode, DiffusionLM

#: the window (tokens) per family when the config gives none: the paper's GSM8K rows of
#: Table 11 (LLaDA-1.5 at 256 / 512 generated tokens, Dream-Base at both)
DEFAULT_WINDOW: Final[dict[str, tuple[int, int]]] = {"llada": (96, 128), "dream": (32, 32)}


def kept_suffix(length: int, block_end: int, window: int, tail: int = 1) -> list[int]:
    """The kept positions past the block (host ints, ascending): the first ``window`` of
    ``[block_end, length)`` and, when more are left, the last ``tail`` of them
    (``deterministic_window_tail_sampler``)."""
    rest = length - block_end
    head = list(range(block_end, block_end + min(window, rest)))
    if rest <= window:
        return head
    keep = min(tail, max(rest - len(head), 0))
    return head + list(range(length - keep, length)) if keep > 0 else head


class StreamingPlan(ForwardPlan):
    """``cache="streaming"`` (one plan per generation; see the module docstring).

    Args:
        model: a bidirectional ``DiffusionLM`` (LLaDA, Dream).
        valid: ``[B', L]`` key validity; positions: ``[B', L]`` RoPE positions.
        window: masks kept right after the block (tokens, >= 0).
        tail: last positions kept when the window does not reach the end (the reference: 1;
            0 is the paper's "no tail" ablation, Table 6).
        cache: a ``BlockKVCache`` to reuse (``None``: a new one).
    """

    def __init__(self, model: DiffusionLM, valid: Tensor, positions: Tensor, *, window: int,
                 tail: int = 1, cache: BlockKVCache | None = None) -> None:
        if model.attention != "bidirectional":
            raise ValueError("cache='streaming' (Streaming-dLLM's suffix pruning) is for "
                             "bidirectional models (LLaDA, Dream); this model's attention is "
                             f"{model.attention!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"cache='streaming': window must be an int >= 0, got {window!r}")
        if isinstance(tail, bool) or not isinstance(tail, int) or tail < 0:
            raise ValueError(f"cache='streaming': tail must be an int >= 0, got {tail!r}")
        super().__init__(model, CacheMode.STREAMING, valid, positions, cache=cache)
        self.window, self.tail = window, tail

    def _block_sets(self, bs: int, be: int) -> tuple[list[int], list[int], Tensor, Tensor,
                                                     Tensor, Tensor | None]:
        """Per block (memoised): the first step's fed positions and the later steps' (host
        lists), the same as tensors, the first step's key mask ``[B', L]`` (kept and valid)
        and, for shifted logits, the later steps' ``[B', L + N]`` (cache ``[0, bs)``, then
        the fed keys from ``bs`` on)."""
        key = ("streaming", bs, be)
        out = self._memo.get(key)
        if out is None:
            device = self.valid.device
            suffix = kept_suffix(self.length, be, self.window, self.tail)
            first = list(range(be)) + suffix
            later = list(range(max(bs - self.shift, 0), be)) + suffix
            first_t = torch.tensor(first, dtype=torch.long, device=device)
            kept = torch.zeros(self.length, dtype=torch.bool, device=device)
            kept[first_t] = True
            later_t = torch.tensor(later, dtype=torch.long, device=device)
            keys = self.valid & kept[None]
            later_keys = None
            if self.shift and later and later[0] < bs:  # the left neighbour: a query only
                prefix = keys & (torch.arange(self.length, device=device) < bs)[None]
                later_keys = torch.cat((prefix, self.valid.index_select(1, later_t)
                                        & (later_t >= bs)[None]), dim=1)
            out = self._memo[key] = (first, later, first_t, later_t, keys, later_keys)
        return out

    def forward(self, canvas: Tensor, block: tuple[int, int], aligned_start: int,
                step_in_block: int, lo: int, full_span: bool,
                host: list[int] | None = None) -> Fed:
        """One step's forward: every kept position at the block's first step, else the block,
        the window and the tail against the stored prefix K/V. Logits for ``[max(lo, bs),
        be)`` (with ``full_span``: every fed position from ``lo`` on; positions that are not
        kept get none). Host integers only, no sync."""
        bs, be = block
        first, later, first_t, later_t, keys, later_keys = self._block_sets(bs, be)
        refresh = step_in_block == 0
        store = refresh or later_keys is None
        if not store:
            keys = later_keys
        fed, idx = (first, first_t) if refresh else (later, later_t)
        start = fed[0] if fed else bs
        lo_eff = lo if refresh else max(lo, bs)
        if full_span:
            k0 = bisect_left(fed, lo_eff)
            hidden, rows, span = self._arange(k0, len(fed)), idx[k0:], None
        else:
            hidden = self._arange(lo_eff - start, be - start)
            rows, span = self._arange(lo_eff, be), (lo_eff, be)
        logits = self.model(canvas.index_select(1, idx), self.positions.index_select(1, idx),
                            cache=self.cache, slots=idx[None].expand(canvas.shape[0], -1),
                            mask=keys, store=store, hidden_rows=hidden)
        n_kept = len(first)
        fed_start, fed_width = (0, n_kept) if refresh else (bs, n_kept - bs)
        return Fed(logits, rows, fed_start, fed_width, refresh=refresh,
                   double_draw=not refresh, span=span, positions=float(len(fed)))

    def extra_forward(self, canvas: Tensor, tokens: Tensor, positions: Tensor,
                      mask: Tensor) -> Tensor:
        """Refused: the cache holds the K/V of the kept positions only, and extra forwards
        (S2D2's verifier, LoPA's branches) attend to the whole canvas."""
        raise ValueError("cache='streaming' keeps the K/V of the prefix, the block and the "
                         "suffix window only; a policy that runs extra forwards needs every "
                         "key: use cache='none', 'prefix' or 'dual'")


def streaming_plan(model: DiffusionLM, mode: CacheMode, valid: Tensor, positions: Tensor,
                   cfg: Any, family: str = "", cache: BlockKVCache | None = None,
                   sub_block: int | None = None) -> StreamingPlan:
    """The ``streaming`` plan from a ``SamplerConfig`` (a ``cache.table.PLANS`` builder):
    ``window_tokens`` is the window, else ``DEFAULT_WINDOW`` of the family (LLaDA's for the
    others), its 512 column from 512 generated tokens on; one tail position."""
    window = cfg.window_tokens
    if window is None:
        pair = DEFAULT_WINDOW.get(family, DEFAULT_WINDOW["llada"])
        window = pair[1] if cfg.gen_length >= 512 else pair[0]
    return StreamingPlan(model, valid, positions, window=window, cache=cache)
