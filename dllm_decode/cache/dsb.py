"""``cache="dsb"``: DSB Cache, the K/V cache that follows DSB's sliding window.

Paper: "DSB: Dynamic Sliding Block Scheduling for Diffusion LLMs", arXiv 2602.05992; code
``lizhuo-luo/DSB`` @ 114c121, ``llada/generate.py::generate_dsb_cache`` (Fast-dLLM's
``replace_position`` dual cache). Per row, with the window ``[s, e)`` of ``policies.dsb``
(``B`` = ``refresh_every`` or 32, span cap ``window_tokens``: ``None`` greedy; the selector's
``block`` and ``max_block_length`` must agree, ``DynamicSlidingBlock.bind`` checks):

* **refresh**: the first forward, and any forward after ``B`` tokens were committed since the
  last refresh, recomputes the whole canvas and stores every position's K/V; the positions
  left of ``e`` may commit;
* otherwise, with ``d`` the distance the window start slid (``s += d``: the first masked
  position of the old window, else its end), ``w_p = min(max(d, l_pm), s)`` and the suffix
  window ``w_s <- min(L - e, w_s)`` (a persistent shrink), only ``[s - w_p, e + w_s)`` is fed,
  against the cached K/V of everything else; its fresh K/V replace their slots.

Both forwards count one NFE; ``Generation.step_positions`` records the fed width. Defaults (the
authors' scripts): ``l_pm`` 24 (LLaDA) / 4 (Dream), ``w_s`` 0.

Quirk (spec 2.7), reproduced by default: with ``w_s > 0`` the code means to keep the suffix
window's masks from being committed but zeroes the slice's mask from the *absolute* index ``e``
on a slice that starts at ``s - w_p``, so only positions ``>= e + s - w_p`` are excluded (none,
as a rule). ``fix_suffix=True`` excludes every position ``>= e``. The plan marks the committable
positions (``Fed.live``); the ``dsb`` selector trusts them under this cache.

Deviations: rows of a batch keep their own windows and refreshes (the code is batch 1): rows
are fed per-row position lists padded to the widest (``cache.window``'s padding; a refreshing
row beside a sliding one feeds its whole canvas in the same call); K is cached after RoPE (the
code caches it before and rotates the whole cache every forward: equal up to rounding); models
with shifted logits (Dream) also feed the slice's left neighbour, not committable. The Dream
code's refresh commits only the first masked position (spec 2.7) - not reproduced (the selector
decides). ``prefix_window`` / ``suffix_window`` / ``fix_suffix`` are builder arguments
(``cache.table.register_plan(CacheMode.DSB, functools.partial(dsb_plan, prefix_window=8))``).
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.cache.fed import Fed
from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.types import CacheMode, DiffusionLM

#: ``l_pm`` per family (the authors' LLaDA / Dream scripts); other families get LLaDA's
DSB_PREFIX_WINDOW: Final[dict[str, int]] = {"llada": 24, "dream": 4}
#: ``B`` when the config gives no ``refresh_every`` (``policies.dsb.DSB_BLOCK``)
DSB_PLAN_BLOCK: Final = 32


class DsbPlan(ForwardPlan):
    """The ``dsb`` plan (see the module docstring); one per generation.

    Args:
        model: a bidirectional ``DiffusionLM``.
        valid, positions: ``[B', L]`` as ``ForwardPlan``.
        gen_length: G (the generation starts at ``P = L - G``).
        block: B; max_block: the window's span cap (``None``: greedy).
        prefix_window: ``l_pm``; suffix_window: ``w_s`` (>= 0).
        fix_suffix: exclude the suffix window from commits (the code's exclusion is a no-op).
        mirror: the batch is ``[cond; uncond]`` (CFG): both halves follow the first half.
        cache: a ``BlockKVCache`` to reuse (``ForwardPlan``).

    Per-row state (``[B]`` int64, after ``prepare``): ``s``, ``e``, ``acc`` (committed since the
    last refresh), ``suffix``; ``full`` (``[B]`` bool) this step refreshes; ``start`` /
    ``stop`` the fed span, ``live_end`` the end of the committable positions.
    """

    def __init__(self, model: DiffusionLM, valid: Tensor, positions: Tensor, *, gen_length: int,
                 block: int, max_block: int | None, prefix_window: int, suffix_window: int = 0,
                 fix_suffix: bool = False, mirror: bool = False, cache: Any = None) -> None:
        if model.attention != "bidirectional":
            raise ValueError("cache='dsb' (DSB Cache) slides a window over a bidirectional "
                             "canvas (LLaDA, Dream); block-diffusion models use "
                             "cache='block_causal'")
        if min(block, prefix_window + 1, suffix_window + 1) < 1 or (
                max_block is not None and max_block < 1):
            raise ValueError(f"cache='dsb': block ({block}) and max_block ({max_block}) must be "
                             f">= 1, prefix_window ({prefix_window}) and suffix_window "
                             f"({suffix_window}) >= 0")
        super().__init__(model, CacheMode.DSB, valid, positions, cache=cache)
        self.block, self.max_block = block, max_block
        self.prefix_window, self.fix_suffix, self.mirror = prefix_window, fix_suffix, mirror
        b = valid.shape[0] // 2 if mirror else valid.shape[0]
        device = valid.device
        self.gen_start = self.length - gen_length
        self.s = torch.full((b,), self.gen_start, dtype=torch.long, device=device)
        self.e = self.s + block
        self.acc = torch.zeros(b, dtype=torch.long, device=device)
        self.n = torch.zeros(b, dtype=torch.long, device=device)
        self.suffix = torch.full((b,), suffix_window, dtype=torch.long, device=device)
        self.full = torch.ones(b, dtype=torch.bool, device=device)
        self.start = self.stop = self.live_end = self.s
        self.first = True

    def prepare(self, canvas: Tensor, step_in_block: int, lo: int, *,
                final: bool = False) -> Tensor:
        """Slide each row's window after the last step's commits and choose its forward;
        returns ``[widest fed row, all rows refresh]`` for the host."""
        length, p = self.length, self.gen_start
        b = self.s.shape[0]
        masked = (canvas[:b] == self.model.mask_token_id) & self.valid[:b]
        pos = self._arange(0, length)[None]
        n = (~masked[:, p:]).sum(1)
        if self.first:  # the first forward is a refresh over the initial window
            self.first = False
            self.n, self.acc, d = n, n * 0, torch.zeros_like(n)
            full = torch.ones_like(self.full)
        else:
            # commits since the last refresh (a refresh's own commits start the count)
            self.acc = torch.where(self.full, 0, self.acc) + (n - self.n)
            self.n = n
            s, e = self.s[:, None], self.e[:, None]
            in_window = masked & (pos >= s) & (pos < e)
            first = torch.where(in_window, pos, length).amin(1)
            self.s = torch.where(first < length, first, self.e)  # none left: the old end
            d = self.s - s[:, 0]
            self.e = (p + self.block + n).clamp(max=length)
            if self.max_block is not None:  # the code's const end is not clamped to L
                self.e = torch.minimum(p + self.block + n, self.s + self.max_block)
            self.suffix = torch.minimum(length - self.e, self.suffix)
            full = (self.acc >= self.block) & (n < length - p)
        self.full = full
        pre = torch.minimum(torch.clamp(d, min=self.prefix_window), self.s)
        lo_fed = self.s - pre
        stop = (self.e + self.suffix).clamp(max=length)
        if self.fix_suffix:
            live_end = torch.minimum(stop, self.e)
        else:  # the code's exclusion: slice index >= e, i.e. canvas position >= e + (s - w_p)
            live_end = torch.where(self.suffix > 0, torch.minimum(stop, self.e + lo_fed), stop)
        self.live_lo = torch.where(full, 0, lo_fed)
        self.live_end = torch.where(full, self.e.clamp(max=length), live_end)
        # a finished row (batch neighbours still decoding) feeds one harmless position
        start = (lo_fed - self.shift).clamp(min=0, max=length - 1)
        self.start = torch.where(full, 0, start)
        self.stop = torch.where(full, length, torch.maximum(stop, start + 1))
        width = (self.stop - self.start).amax()
        return torch.stack([width, full.all().long()])

    def _rows(self, x: Tensor) -> Tensor:
        """A ``[B]`` row state for the model's batch (repeated under CFG)."""
        return x.repeat(2) if self.mirror else x

    def forward(self, canvas: Tensor, block: tuple[int, int], aligned_start: int,
                step_in_block: int, lo: int, full_span: bool,
                host: list[int] | None = None) -> Fed:
        """One refresh or slice forward; ``host`` = ``prepare``'s values (required)."""
        if host is None:
            raise ValueError("DsbPlan.forward needs prepare()'s host values")
        width, all_full = host
        length = self.length
        live_lo, live_end = self._rows(self.live_lo)[:, None], self._rows(self.live_end)[:, None]
        if all_full:  # every row refreshes: the whole canvas, stored
            logits = self._run(canvas, 0, length, lo, length, use_cache=True)
            rows = self._arange(lo, length)
            live = (rows[None] >= live_lo) & (rows[None] < live_end)
            return Fed(logits, rows, 0, length, refresh=True, live=live, positions=length)
        start, stop = self._rows(self.start)[:, None], self._rows(self.stop)[:, None]
        j = self._arange(0, width)[None]
        real = j < stop - start
        idx = torch.where(real, start + j, start)  # pad with a duplicate of the first entry
        live = real & (idx >= live_lo) & (idx < live_end) & (idx >= lo)
        logits = self.model(canvas.gather(1, idx), self.positions.gather(1, idx),
                            cache=self.cache, slots=idx, mask=None if self.dense else self.valid,
                            store=True)
        return Fed(logits, idx, 0, length, refresh=False, live=live,
                   refreshed=self._rows(self.full), positions=width)


def dsb_plan(model: DiffusionLM, mode: CacheMode, valid: Tensor, positions: Tensor, cfg: Any,
             family: str = "", cache: Any = None, sub_block: int | None = None, *,
             prefix_window: int | None = None, suffix_window: int = 0,
             fix_suffix: bool = False) -> DsbPlan:
    """The ``dsb`` plan from a ``SamplerConfig`` (a ``cache.table.PLANS`` builder): ``B`` from
    ``refresh_every`` (``None``: 32), the span cap from ``window_tokens`` (``None``: greedy),
    ``l_pm`` per family (``DSB_PREFIX_WINDOW``) unless given."""
    pre = DSB_PREFIX_WINDOW.get(family, DSB_PREFIX_WINDOW["llada"]) if prefix_window is None \
        else prefix_window
    return DsbPlan(model, valid, positions, gen_length=cfg.gen_length,
                   block=cfg.refresh_every or DSB_PLAN_BLOCK, max_block=cfg.window_tokens,
                   prefix_window=pre, suffix_window=suffix_window, fix_suffix=fix_suffix,
                   mirror=cfg.cfg_scale > 0, cache=cache)
