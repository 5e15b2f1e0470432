"""DUS: the dilated unmasking scheduler, a fixed coarse-to-fine order of positions per block.

Paper: Luxembourg, Permuter, Nachmani, "Plan for Speed: Dilated Scheduling for Masked
Diffusion Language Models", arXiv 2506.19037; code ``omerlux/DUS`` @ c917168, ``generate.py``
(``generate_scheduled(scheduler="dilated")``, ``dilated_unmask_levels``, ``merge_last_level``;
the "Conf. increasing-k" ablation is ``generate(n_transfer="inc_dilated")``).

Inside each block of K positions the levels are: stride ``K // a^k``; each level takes the
block positions at multiples of the stride not taken yet, then the stride is divided by
``a``; leftovers form a last level, which is merged into the one before when smaller. A block
then takes one forward per level (``log_a K`` for powers of two): NFE is fixed in advance,
and every position of a level is written at its argmax whatever its confidence.

Deviations from the released code (flagged in ``DilatedSchedule``):

* the optional confidence skip (``remasking="low_confidence"`` with ``confidence_threshold``):
  in the code a skipped position belongs to no later level and is never revisited, so the
  output keeps a MASK id there. Here a skipped position is deferred to the next level (the
  paper-notes' "delay to the next round"; the block's last level commits everything). The
  code's behaviour cannot be reproduced in a loop whose blocks always end fully committed;
  with the skip off (``threshold=0``, the lm-eval wrapper's default) both agree;
* a level whose positions are all committed already (a block that overlaps the prompt, on
  block-aligned models) is skipped instead of costing a forward;
* ``order="confidence"`` takes the level sizes with the configured base (the code hard-codes
  base 2 and skip 1 there); the code's batch is 1, rows here are independent; the skip
  compares the proposal's float32 probability (the code: float64, mask token kept); no host
  sync in ``select``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import torch
from torch import Tensor

from dllm_decode.policies.base import topk_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.rows import as_rows, per_row
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import StepState

_ORDERS: Final = ("dilated", "confidence")
#: level of a position outside the current block (ranks after every real level)
_OUTSIDE: Final = 1 << 30


def _build_levels(length: int, base: int, skip_exp: int,
                  merge_last: bool) -> tuple[tuple[int, ...], ...]:
    if length < 1 or base < 1 or skip_exp < 1:
        raise ValueError(f"dilated_levels: length, base and skip_exp must be >= 1, got "
                         f"{length}, {base}, {skip_exp}")
    if base == 1:
        return (tuple(range(length)),)
    stride = length // base ** skip_exp
    levels: list[list[int]] = []
    taken: set[int] = set()
    while stride >= 1:
        level = [i for i in range(0, length, stride) if i not in taken]
        if level:
            levels.append(level)
            taken.update(level)
        stride //= base
    rest = [i for i in range(length) if i not in taken]
    if rest:
        levels.append(rest)
    if merge_last and len(levels) >= 2 and len(levels[-1]) < len(levels[-2]):
        levels[-2].extend(levels.pop())
    return tuple(tuple(level) for level in levels)


@lru_cache(maxsize=256)
def dilated_levels(length: int, base: int = 2, skip_exp: int = 1,
                   merge_last: bool = True) -> tuple[tuple[int, ...], ...]:
    """The DUS levels of a block of ``length`` positions, as block offsets (host only).

    Args:
        length: K, the block's positions.
        base: a, the dilation base (>= 1; 1: one level, the whole block).
        skip_exp: k, the first stride is ``K // a^k`` (>= 1).
        merge_last: merge a last level smaller than the one before into it
            (``merge_last_level``, applied by ``generate_scheduled``).

    Example: ``dilated_levels(8)`` is ``((0, 4), (2, 6), (1, 3, 5, 7))``.
    """
    return _build_levels(length, base, skip_exp, merge_last)


#: ``(L, start, end, base, skip_exp, merge_last, device)`` -> ``_level_row``'s result
_LEVEL_ROWS: dict[tuple, tuple[Tensor, int]] = {}


def _level_row(length: int, start: int, end: int, base: int, skip_exp: int, merge_last: bool,
               device: torch.device) -> tuple[Tensor, int]:
    """``([L] int64 level of each canvas position, number of levels)`` for the block
    ``[start, end)`` (``_OUTSIDE`` elsewhere): a read-only constant per block, cached in eager
    mode and built in place under ``torch.compile`` (which folds it)."""
    key = (length, start, end, base, skip_exp, merge_last, device)
    compiling = torch.compiler.is_compiling()
    if not compiling and key in _LEVEL_ROWS:
        return _LEVEL_ROWS[key]
    levels = _build_levels(end - start, base, skip_exp, merge_last)
    row = torch.full((length,), _OUTSIDE, dtype=torch.long)
    for depth, level in enumerate(levels):
        row[[start + j for j in level]] = depth
    out = row.to(device), len(levels)
    if not compiling:
        if len(_LEVEL_ROWS) > 256:
            _LEVEL_ROWS.clear()
        _LEVEL_ROWS[key] = out
    return out


@dataclass(frozen=True)
class DilatedSchedule:
    """DUS (arXiv 2506.19037): commit the block's positions level by level, coarse to fine.

    At step i of a block (``state.block_step``) the level in force is
    ``max(i, lowest level with an eligible position)``; every eligible position of that level
    or an earlier one is committed at its proposed token (``order="dilated"``, the paper's
    DUS), or, with ``order="confidence"`` (the "Conf. increasing-k" ablation), as many
    positions as level i holds, chosen by confidence (top-k by ``prob``, k = the block's
    positions in levels <= i less those committed). A block of K takes ``len(dilated_levels(K))``
    forwards: ``log_a K`` for powers of two (K = 32, a = 2: 5).

    ``threshold > 0`` turns on the confidence skip: on every level but the block's last,
    positions with ``prob < threshold`` are left masked and wait for the next level (the code
    never revisits them and leaves a MASK id in the output; see the module docstring). A step
    may then commit nothing (``may_commit_nothing``); the last level commits everything, so a
    block still ends after its levels. The README's DUS command uses 0.3; the default 0 is the
    paper's deterministic schedule (and the code's lm-eval default).

    Args:
        base: a, the dilation base (paper default 2; >= 2).
        skip_exp: k, first stride ``K // a^k`` (paper default 1).
        threshold: the skip's confidence threshold in [0, 1] (0: never skip).
        order: ``dilated`` (DUS) or ``confidence`` (level sizes, confidence order).
        merge_last: merge a small last level into the one before (as the code).

    Adaptive in the loop's sense (the block runs until nothing is masked, ``steps`` is not
    read): the schedule fixes the forwards. Ties (``confidence``) go to the lower index.
    No host sync in ``select``.
    """

    base: int = 2
    skip_exp: int = 1
    threshold: float = 0.0
    order: str = "dilated"
    merge_last: bool = True

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; reads ``prob`` only for the skip or the confidence order, at eligible
        positions; may commit nothing on a skipped level."""
        return Capabilities(budgeted=False, proposal_fields=(), reads_masked_only=True,
                            may_commit_nothing=self.threshold > 0, row_steps=True)

    def __post_init__(self) -> None:
        check_fields(self, "DilatedSchedule")
        if self.base < 2 or self.skip_exp < 1:
            raise ValueError(f"DilatedSchedule: base must be >= 2 and skip_exp >= 1, got "
                             f"base={self.base}, skip_exp={self.skip_exp}")
        check_range("DilatedSchedule", "threshold", self.threshold, 0.0, 1.0)
        if self.order not in _ORDERS:
            raise ValueError(f"DilatedSchedule: order must be one of {_ORDERS}, got "
                             f"{self.order!r}")

    def select(self, state: StepState) -> Tensor:
        """Commit mask ``[B, L]`` of the level in force (see the class docstring)."""
        eligible = state.eligible
        rows = per_row(state.block_start) or per_row(state.block_step)
        if rows:  # [B, L] levels, [B, 1] level counts (made only when read) and steps
            level, counts, start = _level_rows(state, self.base, self.skip_exp,
                                               self.merge_last)
            if self.order == "confidence" or self.threshold > 0:
                n_levels = counts.index_select(0, start)[:, None]
            step = as_rows(state.block_step, eligible.shape[0], eligible.device)[:, None]
        else:
            level, n_levels = _level_row(eligible.shape[-1], state.block_start,
                                         state.block_end, self.base, self.skip_exp,
                                         self.merge_last, eligible.device)
            step = state.block_step
        if self.order == "confidence":
            # step i commits |level i| positions: the block's positions of levels <= i less
            # those committed already (at least one, so a block always moves on)
            if rows:
                current = torch.minimum(step, n_levels - 1)
            else:
                current = torch.full_like(eligible[:, :1], min(step, n_levels - 1),
                                          dtype=torch.long)
            block = level < _OUTSIDE
            done = (block & ~state.masked).sum(-1)
            k = ((block & (level <= current)).sum(-1) - done).clamp(min=1)
            due = topk_mask(state.proposal.prob, eligible, k)
        else:
            lowest = torch.where(eligible, level, _OUTSIDE).min(-1, keepdim=True).values  # [B, 1]
            current = torch.maximum(lowest, step) if rows else lowest.clamp(min=step)
            due = eligible & (level <= current)
        if self.threshold > 0:
            skip = due & (state.proposal.prob < self.threshold) & (current < n_levels - 1)
            due = due & ~skip
        return due


def _level_rows(state: StepState, base: int, skip_exp: int,
                merge_last: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``_level_row`` per row for per-row block starts: ``([B, L] int64 levels, [n] int64
    number of levels per start, [B] int64 starts)`` (a row's count is
    ``counts[starts]``), looked up in a table over every start ``0 .. block_end`` (a
    read-only constant per canvas, cached). No host sync."""
    eligible = state.eligible
    b, length = eligible.shape
    end, device = state.block_end, eligible.device
    key = ("rows", length, end, base, skip_exp, merge_last, device)
    tables = _LEVEL_ROWS.get(key)
    if tables is None:
        built = [_level_row(length, start, end, base, skip_exp, merge_last, device)
                 for start in range(end)]
        # an empty block (start = end) has nothing eligible: a row of _OUTSIDE, one level
        empty = torch.full((length,), _OUTSIDE, dtype=torch.long, device=device)
        tables = (torch.stack([row for row, _ in built] + [empty]),
                  torch.tensor([n for _, n in built] + [1], dtype=torch.long, device=device))
        _LEVEL_ROWS[key] = tables  # type: ignore[assignment]
    levels, counts = tables
    start = as_rows(state.block_start, b, device)  # in [0, block_end]: every start is a row
    return levels.index_select(0, start), counts, start


def dus_policy(base: int = 2, skip_exp: int = 1, threshold: float = 0.0,
               order: str = "dilated", merge_last: bool = True) -> DilatedSchedule:
    """The ``dus`` preset: the paper's dilated schedule, a = 2, k = 1, no skip."""
    return DilatedSchedule(base=base, skip_exp=skip_exp, threshold=threshold, order=order,
                           merge_last=merge_last)

