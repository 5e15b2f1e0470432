"""Window-Diffusion planner: windowed token pruning with phase-level K/V caching.

F. Zuo, Z. Ke, Y. Liu, W. Lou, C. Wang, X. Zhou, "Window-Diffusion: Accelerating Diffusion
Language Model Inference with Windowed Token Pruning and Caching", arXiv 2601.20332.

Per row, masked positions of the generation region play one of three roles:

* **active**: the first ``A`` masked positions inside the row's window, plus the positions
  committed earlier in the phase (and, for one step, those committed by the full step). They
  are fed every step: their K/V are recomputed (RoPE at their absolute positions) and written
  at their slots, and they are the only commit candidates on pruned steps.
* **buffer**: the rest of the window (the first ``W`` masked positions when the phase began);
  attended to through the K/V cached by the phase's full step (LLaDA fixes the window after
  the full step's commits, Dream before them, as the references do).
* **far field**: masked positions beyond the window; neither computed nor attended to.

Decoded positions (prompt, earlier output) are always attended to through cached K/V. Time is
split into phases of ``refresh`` steps: a **full step** first (every position of the canvas, or
with ``truncate`` only decoded + window positions, Dream's canvas truncation) stores K/V and
fixes the window; the following **pruned steps** feed only active positions. A row also gets a
full step when its window has fewer than ``min(A, masked)`` masked positions left, or once its
canvas was cut (EOS early stop), as the Dream reference does after reaching EOS.

The Dream reference feeds the contiguous span from the phase's first masked position to the
A-th masked one; the active set above is that span minus the positions decoded before the
phase and, after its first pruned step, the full step's own commit (LLaDA's rule).
Generation ends cleanly: on a block's last scheduled step a row whose active set does not hold
all its masks gets a full step over the whole canvas.

Rows keep their own phases, so a batch decodes each row as it would alone. Pruned forwards use
per-row position lists ``[B, N]`` (``N`` = the widest row, read in the sampler's one host sync);
shorter rows repeat their first entry, which recomputes identical K/V, so the duplicate cache
write is harmless (``Fed.live`` marks such padding; its logits are ignored). Models with
shifted logits (Dream) also feed each active position's left neighbour, whose hidden state
predicts it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.fed import Fed
from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.types import CacheMode, DiffusionLM


class WindowPlan(ForwardPlan):
    """Full and pruned forwards for ``cache="window"`` (one plan per generation).

    Args:
        model: a bidirectional ``DiffusionLM`` (LLaDA, Dream).
        valid: ``[B', L]`` key validity; positions: ``[B', L]`` RoPE positions.
        window: ``W``, masked positions kept in attention per phase (LLaDA 64, Dream 128).
        active: ``A``, masked positions recomputed and eligible on pruned steps (16).
        refresh: phase length in steps (32).
        truncate: full steps feed only decoded + window positions (Dream) instead of the
            whole canvas (LLaDA).
        mirror: the batch is ``[cond; uncond]`` (CFG): both halves use the first half's sets.

    Per-step attributes (``[B', L]`` bool unless noted), for inspection and tests: ``window``
    (constant within a row's phase), ``active``, ``in_phase`` (committed on pruned steps of the
    phase), ``full`` (``[B']``, this step is the row's full step).
    """

    def __init__(self, model: DiffusionLM, valid: Tensor, positions: Tensor, *, window: int,
                 active: int, refresh: int, truncate: bool, mirror: bool = False) -> None:
        if model.attention != "bidirectional":
            raise ValueError("cache='window' (Window-Diffusion) is for bidirectional models "
                             "(LLaDA, Dream); block-diffusion models use cache='block_causal'")
        if min(window, active, refresh) < 1:
            raise ValueError(f"window ({window}), active ({active}) and refresh ({refresh}) "
                             "must all be >= 1")
        super().__init__(model, CacheMode.WINDOW, valid, positions)
        self.window_tokens, self.active_tokens = window, min(active, window)
        self.refresh_cycle, self.truncate, self.mirror = refresh, truncate, mirror
        b, length = valid.shape
        device = valid.device
        self.base_valid = valid.clone()
        self.window = torch.zeros(b, length, dtype=torch.bool, device=device)
        self.in_phase = torch.zeros_like(self.window)
        self.active = torch.zeros_like(self.window)
        self.full = torch.ones(b, dtype=torch.bool, device=device)
        self.age = torch.zeros(b, dtype=torch.long, device=device)
        self.prev_masked: Tensor | None = None
        self._fed = self._live = self._keys = self._count = self.window

    def prepare(self, canvas: Tensor, step_in_block: int, lo: int, *,
                final: bool = False) -> Tensor:
        """Update the row sets for this step; returns ``[widest fed row, all rows full, full
        steps feed the whole canvas]``.

        ``final`` (the block's last scheduled step): a row whose active set does not hold all
        its masked positions gets a full step over the whole canvas, so the schedule can
        finish (the selectors commit everything eligible on that step).
        """
        length = self.length
        pos = torch.arange(length, device=canvas.device)
        valid = self.valid
        masked = (canvas == self.model.mask_token_id) & (pos >= lo)[None] & valid
        if self.mirror:  # CFG: the unconditional half follows the conditional one
            masked = masked[: masked.shape[0] // 2].repeat(2, 1)
        decoded = valid & ~masked
        last = torch.zeros_like(masked)
        if self.prev_masked is not None:
            last = self.prev_masked & ~masked & valid
            self.in_phase |= last & ~self.full[:, None]
        n_masked = masked.sum(1)
        rank = masked.long().cumsum(1)
        new_window = decoded | (masked & (rank <= self.window_tokens))
        if not self.truncate:  # LLaDA fixes the window after the full step's commits
            self.window = torch.where(self.full[:, None], new_window, self.window)
        in_window = masked & self.window
        n_first = in_window.sum(1).clamp(max=self.active_tokens)  # active masked candidates
        exhausted = n_first < n_masked.clamp(max=self.active_tokens)
        unfinished = final & (n_first < n_masked)  # a pruned last step would leave masks
        cut = (self.base_valid & ~valid).any(1)
        age = self.age + 1
        full = ((age >= self.refresh_cycle) | cut | exhausted | unfinished) & (n_masked > 0)
        if step_in_block == 0:
            full = torch.ones_like(full)
        self.window = torch.where(full[:, None], new_window, self.window)
        self.in_phase &= ~full[:, None]
        self.age = torch.where(full, 0, age)
        in_window = masked & self.window
        first = in_window & (in_window.long().cumsum(1) <= self.active_tokens)
        self.active = (first | self.in_phase | last) & ~full[:, None]
        fed = self.active.clone()
        if self.shift:  # the left neighbour's hidden state predicts a position
            fed[:, :-1] |= self.active[:, 1:]
        if self.truncate and not final:
            keep_end = torch.where(self.window, pos, -1).amax(1) + 1
            full_fed, full_keys = pos[None] < keep_end[:, None], self.window & valid
        else:
            full_fed, full_keys = torch.ones_like(fed), valid
        self._fed = torch.where(full[:, None], full_fed, fed)
        self._live = torch.where(full[:, None], full_fed & (pos >= lo)[None], self.active)
        self._keys = torch.where(full[:, None], full_keys, (self.window | decoded) & valid)
        self._count = self._fed.sum(1)
        self.full = full
        self.prev_masked = masked
        return torch.stack([self._count.max(), full.all().long(),
                            torch.tensor(int(final or not self.truncate), device=full.device)])

    def forward(self, canvas: Tensor, block: tuple[int, int], aligned_start: int,
                step_in_block: int, lo: int, full_span: bool,
                host: list[int] | None = None) -> Fed:
        """One full or pruned forward; ``host`` = ``prepare``'s values (required)."""
        if host is None:
            raise ValueError("WindowPlan.forward needs prepare()'s host values")
        width, all_full, whole = host
        length = self.length
        hi = length if full_span else block[1]
        if all_full and whole:  # every row refreshes the whole canvas
            logits = self._run(canvas, 0, length, lo, hi, use_cache=True)
            return Fed(logits, torch.arange(lo, hi, device=canvas.device), 0, length,
                       refresh=True, positions=length)
        pos = torch.arange(length, device=canvas.device)
        order = torch.sort(torch.where(self._fed, pos, pos + length), dim=1, stable=True)
        idx = order.indices[:, :width]
        real = torch.arange(width, device=canvas.device)[None] < self._count[:, None]
        idx = torch.where(real, idx, idx[:, :1])  # pad with a duplicate of the first entry
        live = self._live.gather(1, idx) & real & (idx < hi)
        # one key set per row, shared by its fed queries: a key mask (the kernel path)
        logits = self.model(canvas.gather(1, idx), self.positions.gather(1, idx),
                            cache=self.cache, slots=idx, mask=self._keys, store=True)
        return Fed(logits, idx, 0, length, refresh=bool(all_full), live=live,
                   refreshed=self.full, positions=width)


def window_plan(model: DiffusionLM, mode: CacheMode, valid: Tensor, positions: Tensor, cfg: Any,
                family: str = "", cache: Any = None, sub_block: int | None = None) -> WindowPlan:
    """The ``window`` plan from a ``SamplerConfig``: Window-Diffusion's sizes per family
    (Dream: window 128 and the EOS truncation; others 64), overridable by the config (a
    ``cache.table.PLANS`` builder; it allocates its own K/V, so ``cache`` is not used)."""
    dream = family == "dream"
    return WindowPlan(
        model, valid, positions,
        window=cfg.window_tokens or (128 if dream else 64),
        active=cfg.active_tokens or 16,
        refresh=cfg.refresh_every or 32,
        truncate=dream if cfg.window_truncate is None else cfg.window_truncate,
        mirror=cfg.cfg_scale > 0,
    )
