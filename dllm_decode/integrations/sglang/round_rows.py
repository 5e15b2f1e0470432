"""The step values of one SGLang round's rows, built with one host-to-device copy.

Rows of a first-done-first-out round are at different steps of their blocks. ``RoundRows``
packs each row's host integers (batch row, pool slot, step, schedule length, open positions,
fraction row, time-grid row, seeds, ...) into one int64 tensor moved to the device once
(pinned, asynchronous on CUDA), and derives what ``StepState`` shows: host scalars when every
row is at the same step (exactly the library loop's values), else ``[b]`` tensors (for parts
declaring ``Capabilities(row_steps=True)``). LLaDA budgets and the last-step flag are host
integers of the table; ``Tables`` holds what must be computed on the device exactly as the
library's loop computes it (Dream's fractions and time grid), concatenated so a round gathers
its rows' entries in one ``index_select``.
No SGLang import.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.kernels.rng import mix_seeds_int
from dllm_decode.samplers import schedule as sch

#: columns of the packed per-row table (``PROGRESS`` holds float64 bits)
(ROW, SLOT, STEP, STEPS_LEFT, TOTAL, START, REFRESH, LAST, BUDGET, PLAN, TIMES, SEED,
 PROPOSAL_SEED, PROGRESS, RESET) = range(15)
#: the draw counter of the proposal's stream (the policy draws from ``mix_seeds(key, step)``)
PROPOSAL_STREAM = -1


def _f64_bits(x: float) -> int:
    """The int64 whose bits are the float64 ``x`` (read back with ``Tensor.view``)."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


@dataclass(eq=False)
class RequestBlock:
    """One request's block in progress (SGLang's ``dllm_algo_state``; host values).

    Attributes:
        rid: the request id ("" when SGLang gave none).
        open: positions to decode at the block's start; n_commit: its scheduled (commit)
            steps; n_iter: plus the editing post steps.
        seed: the request's seed for this block (``None``: no request ids, nothing may draw).
        slot: its row of the decoder's ``RequestPool`` (memory, truncation length);
            fresh_slot: taken this step, to be reset to fresh memory.
        step: steps taken; has_mask: the block still has a mask (as of the last step);
        post_used: editing post steps taken; done: the block is emitted.
        generator: a ``torch.Generator`` for a user policy without ``row_steps`` that draws
            from ``state.generator`` (made on first use).
    """

    rid: str
    open: int
    n_commit: int
    n_iter: int
    seed: int | None = None
    slot: int = -1
    step: int = 0
    has_mask: bool = True
    post_used: int = 0
    done: bool = False
    generator: torch.Generator | None = None
    fresh_slot: bool = False

    def key(self) -> tuple[int, int, int]:
        """The host integers its ``StepState`` is built from: step, schedule length and open
        positions (the block of a cut first block starts after the prompt tail)."""
        return self.step, self.n_commit, self.open


class Tables:
    """Per-shape schedules of the served blocks (Dream's grid), on the device.

    ``fractions``: ``[T]`` float64, the share of the masked positions each step commits (1 at
    the last scheduled step, 0 in post steps), one run of ``n_iter`` rows per ``(n_commit,
    n_iter)``; ``times``: ``[T']`` float32, Dream's grid ``linspace(1, eps, n + 1)`` per ``n``;
    ``after``: ``[K + 1, K]`` bool, row ``s`` the positions ``>= s``. Grown (a ``cat``) the
    first time a shape is seen. LLaDA budgets and the last-step flag are host integers
    (``llada_budget``), packed with the round's other values.
    """

    def __init__(self, k: int, schedule: str, eps: float, device: torch.device) -> None:
        self.k, self.schedule, self.eps, self.device = k, schedule, eps, device
        #: ``[K + 1, K]`` bool: row ``s`` marks the positions ``>= s`` (a block starting at s)
        self.after = torch.arange(k, device=device)[None] >= torch.arange(k + 1,
                                                                          device=device)[:, None]
        self.fractions = torch.zeros(0, dtype=torch.float64, device=device)
        self.times = torch.zeros(0, dtype=torch.float32, device=device)
        self._plan_at: dict[tuple[int, int], int] = {}
        self._times_at: dict[int, int] = {}

    @staticmethod
    def llada_budget(n_commit: int, n_open: int, step: int) -> int:
        """``schedule.llada_budgets``' entry ``step`` (0 past the schedule), on the host."""
        if step >= n_commit:
            return 0
        return n_open // n_commit + (step < n_open % n_commit)

    def fraction_row(self, n_commit: int, n_iter: int, step: int) -> int:
        """The row of ``step`` in ``fractions`` (Dream's grid; clamped to the block's last row:
        a step past the schedule finishes the block) for blocks of ``n_commit`` steps."""
        key = (n_commit, n_iter)
        at = self._plan_at.get(key)
        if at is None:
            at = self._plan_at[key] = self.fractions.shape[0]
            row = torch.zeros(n_iter, dtype=torch.float64, device=self.device)  # post steps: 0
            times = sch.dream_times(n_commit, self.eps, self.device)
            row[:n_commit] = sch.dream_fractions(times).double()
            row[n_commit - 1] = 1.0  # the last scheduled step commits what is left
            self.fractions = torch.cat([self.fractions, row])
        return at + min(step, n_iter - 1)

    def times_row(self, n_commit: int, step: int) -> int:
        """Row of ``t`` at ``step`` in ``times`` (``s`` is the next row); -1 off the grid."""
        if self.schedule != "dream" or step >= n_commit:
            return -1
        at = self._times_at.get(n_commit)
        if at is None:
            at = self._times_at[n_commit] = self.times.shape[0]
            self.times = torch.cat([self.times, sch.dream_times(n_commit, self.eps,
                                                                self.device)])
        return at + step


class RoundRows:
    """The rows of one policy call: their packed host values on the device and the
    ``StepState`` step fields (host scalars when the rows agree, ``[b]`` columns of the packed
    table when ``per_row``).

    Args:
        states: the rows' ``RequestBlock``s; rows: their batch rows; batch: the batch size.
        tables: the decoder's ``Tables``; timed: a budgeted policy; k: the block size.
        per_row: the policy declares ``row_steps`` (rows may be at different steps).
        scratch: the pool slot of inert rows; always: per-row values even when the rows
            agree (pooled memory has no valid host counters).
    """

    def __init__(self, states: list[Any], rows: list[int], batch: int, tables: Tables,
                 timed: bool, k: int, device: torch.device, *, per_row: bool,
                 scratch: int, always: bool = False) -> None:
        self.timed, self.k, self.tables = timed, k, tables
        live = [st for st in states if not st.done]
        self.st0 = st0 = live[0]
        inert = len(live) < len(states)  # rows whose block was emitted ride along, inert
        self.uniform = not inert and all(st.key() == st0.key() for st in live)
        self.per_row = per_row and (always or not self.uniform)
        seeded = all(st.seed is not None for st in live)
        dream = tables.schedule == "dream"
        host = []
        for r, st in zip(rows, states, strict=True):
            src = st0 if st.done else st  # an inert row: st0's values, nothing to decode
            total = src.n_commit if timed else src.open
            key = mix_seeds_int(src.seed, src.step) if seeded else 0
            host.append([r, scratch if st.done else src.slot, src.step,
                         max(src.n_commit - src.step, 1), total,
                         k if st.done else k - src.open, src.step == 0,
                         src.step >= src.n_commit - 1,
                         tables.llada_budget(src.n_commit, src.open, src.step),
                         tables.fraction_row(src.n_commit, src.n_iter, src.step)
                         if dream else 0,
                         max(tables.times_row(src.n_commit, src.step), 0), key,
                         mix_seeds_int(key, PROPOSAL_STREAM) if seeded else 0,
                         _f64_bits(src.step / max(total - 1, 1)),
                         st.slot if st.fresh_slot and not st.done else scratch])
        for st in states:
            st.fresh_slot = False
        meta = torch.tensor(host, dtype=torch.long, pin_memory=device.type == "cuda")
        self.meta = meta.to(device, non_blocking=True)
        self.cols = self.meta.unbind(1)
        self.idx = None if rows == list(range(batch)) else self.cols[ROW]
        self.slots = self.cols[SLOT]
        #: ``[b]``: the slot of a block at its first step, else the scratch slot (reset both)
        self.reset = self.cols[RESET]
        #: ``[b]`` bool: the block's last scheduled step (commit whatever is left)
        self.last = self.cols[LAST].bool()
        #: ``[b]`` float64 Dream fraction of the masked positions this step commits, else None
        self.fraction = tables.fractions.index_select(0, self.cols[PLAN]) if dream else None
        #: ``[b]`` int64 per-request stream keys of this step: the policy's
        #: (``mix_seeds(seed, step)``) and the proposal's (that key mixed once more)
        self.row_seeds = self.cols[SEED] if seeded else None
        self.proposal_seeds = self.cols[PROPOSAL_SEED] if seeded else None
        self.block_start: int | Tensor = self.cols[START] if self.per_row else k - st0.open

    def fresh(self) -> Tensor:
        """``[b, K]`` bool: the block positions after each row's prompt tail (the positions
        the block decodes; none for an inert row)."""
        return self.tables.after.index_select(0, self.cols[START])

    def take(self, t: Tensor | None) -> Tensor | None:
        """The call's rows of a batch tensor (itself when the call has every row)."""
        return t if t is None or self.idx is None else t.index_select(0, self.idx)

    @staticmethod
    def groups(active: list[int], states: list[Any], tables: Tables) -> list[list[int]]:
        """One call for every row, except that rows on Dream's time grid and rows past it
        (editing post steps, where ``times`` is ``None``) cannot share one."""
        if tables.schedule != "dream":
            return [active]
        on = [r for r in active if states[r].step < states[r].n_commit]
        off = [r for r in active if states[r].step >= states[r].n_commit]
        return [g for g in (on, off) if g]

    def fields(self, masked: Tensor, proposal: Any, canvas: Tensor, fresh: Tensor,
               generator: torch.Generator, memory: Any, lengths: Tensor | None
               ) -> dict[str, Any]:
        """``StepState`` keyword arguments of the call (those ``block`` fills in left out),
        plus ``lazy``: the per-row fields few parts read, made on first read
        (``views.RowsState``; empty for host values)."""
        cols, st0, tables = self.cols, self.st0, self.tables
        budget = None
        if self.timed:
            budget = self.cols[BUDGET] if self.fraction is None else (
                masked.sum(1, dtype=torch.float32) * self.fraction.float()).long()
        on_grid = tables.schedule == "dream" and st0.step < st0.n_commit  # see groups
        times, lazy = None, {}
        if self.per_row:
            step, total = cols[STEP], cols[TOTAL]
            steps_left = cols[STEPS_LEFT] if self.timed else None
            if on_grid:
                at = cols[TIMES]
                times = (tables.times.index_select(0, at), tables.times.index_select(0, at + 1))
            progress = refreshed = None  # made on first read
            lazy = {"progress": lambda: cols[PROGRESS].view(torch.float64),
                    "refreshed": lambda: cols[REFRESH].bool()}
            extras = {"lengths": lengths, "total_steps": total}
        else:
            step = st0.step
            total = st0.n_commit if self.timed else st0.open
            steps_left = max(st0.n_commit - step, 1) if self.timed else None
            progress = step / max(total - 1, 1)
            if on_grid:
                at = tables.times_row(st0.n_commit, step)
                times = (tables.times[at], tables.times[at + 1])
            refreshed = torch.full((masked.shape[0],), step == 0, device=masked.device)
            extras = {"lengths": lengths, "refresh": step == 0, "total_steps": total}
        start = self.block_start
        return dict(
            proposal=proposal, eligible=masked, masked=masked, fresh=fresh, canvas=canvas,
            step=step, block=0, block_start=start, block_end=self.k, gen_start=start,
            block_step=step, steps_left=steps_left, budget=budget, progress=progress,
            generator=generator, forward_start=0, forward_width=self.k, times=times,
            memory=memory, extras=extras, refreshed=refreshed, row_seeds=self.row_seeds,
            lazy=lazy)
