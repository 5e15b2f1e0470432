"""One ``SchED`` check per decode step with few ops (the stopper of ``policies.sched``).

SchED: Mohamed, Zhang, Vazirgiannis, Shang, "Fast-Decoding Diffusion Language Models via
Progress-Aware Confidence Schedules", arXiv 2512.02892 (released Dream code
``amr-mohamedd/SchED`` ``dream_sampling/sched.py``).

``decide`` computes exactly what ``SchED``'s docstring specifies (the same floating-point
operations on the values that decide), with the per-step work cut down:

* what depends only on host integers and the ``lengths`` tensor (the region R, ``|R| > 0``, the
  focus ``R ∩ generation`` and its size) is built once per generation (``RegionMemo``, kept in
  the stopper's memory; rebuilt when truncation replaces ``lengths``), not every step;
* parts of the gate that cannot block are skipped on host values: ``max_change_ratio = 1``
  never compares argmaxes, ``patience_steps = 0`` makes ``patience > 0`` the step's own
  steadiness, ``min_progress <= 0`` never reads progress; ``max_change_ratio = 0`` tests "no
  argmax changed" instead of forming the ratio;
* masks are fused on booleans (``a > b`` is ``a & ~b``), and values that cannot matter are not
  guarded: with the statistic over ``R ∩ M``, a row with nothing open stops whatever its
  statistic, so its empty mean / order statistic is not replaced by -inf;
* memory holds what a later step reads: the previous argmax only when the change ratio is
  tested (-1 before a row's first check: everything open has moved, no ``has_prev`` flag),
  the patience counter only when ``patience_steps > 0``, the newest margins only with
  ``stale="use"``. Under ``torch.compile`` nothing is memoised (the compiler fuses the masks);
* with per-row step values (a serving engine's rows, ``policies.rows``) nothing is memoised
  either: region ``all`` without truncation is no mask at all (``RegionMemo.region`` is
  ``None``), an explicit window is one table lookup per call (``window_rows``).

The default ``sched`` preset runs 19 top-level aten ops per step here (the direct
implementation ran 57; ``benchmarks/README.md``, "Loop overhead per step").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.policies.rows import per_row
from dllm_decode.types import StepState


@dataclass(frozen=True)
class RegionMemo:
    """What a SchED check needs that depends only on host integers and ``lengths``.

    region ``[B, L]`` bool: R (``None``: every position, region ``all`` without truncation).
    size_ok ``[B]`` bool: ``|R| > 0`` (``None``: every row's). size ``[B]`` int64:
    ``max(|R|, 1)`` (``None`` unless ``min_progress > 0``; an int, L, for every position).
    focus ``[B, L]`` bool / focus_n ``[B]`` int64 / focus_ok ``[B]`` bool: ``R ∩ generation``,
    ``max(|.|, 1)`` and ``|.| > 0`` (``None`` unless ``average_over_masked=False``). key: what
    it was built for (``lengths`` tensor or None, generation start, canvas shape).
    """

    key: tuple[Any, ...]
    region: Tensor | None
    size_ok: Tensor | None
    size: Tensor | int | None
    focus: Tensor | None = None
    focus_n: Tensor | None = None
    focus_ok: Tensor | None = None


def region_memo(stopper: Any, state: StepState, mem: Any) -> RegionMemo:
    """The ``RegionMemo`` of ``state`` for the ``sched.SchED`` ``stopper`` (from
    ``mem.regions`` when it is still valid)."""
    lengths = state.extras.get("lengths")
    key = (lengths, state.gen_start, tuple(state.masked.shape))
    # per-row generation starts (``row_steps``): rows come and go between calls, nothing is
    # memoised (the memory keeps tensors with the request as leading dim only)
    compiling = torch.compiler.is_compiling() or per_row(state.gen_start)
    memo = None if mem is None or compiling else mem.regions
    # ``lengths`` is compared by identity: the sampler replaces it (never edits it in place)
    if memo is not None and memo.key[0] is lengths and memo.key[1:] == key[1:]:
        return memo
    region = stopper.region_of(state)
    size_ok = size = None
    if region is None:  # every position (the canvas is never empty)
        size = state.masked.shape[1] if stopper.min_progress > 0 else None
    else:
        size_ok = region.any(1)
        if stopper.min_progress > 0:
            size = region.sum(1).clamp(min=1)
    focus = focus_n = focus_ok = None
    if not stopper.average_over_masked:
        gen = stopper._gen(state)
        focus = gen.expand_as(state.masked) if region is None else region & gen
        n = focus.sum(1)
        focus_n, focus_ok = n.clamp(min=1), n > 0
    memo = RegionMemo(key, region, size_ok, size, focus, focus_n, focus_ok)
    if mem is not None and not compiling:
        mem.regions = memo
    return memo


_WINDOWS: dict[tuple[Any, ...], Tensor] = {}


def window_rows(p: Tensor, start: int, end: int, length: int, device: torch.device) -> Tensor:
    """``[B, L]`` bool ``p + start <= position < p + end`` for ``p [B]`` int64, looked up in
    a table over ``p = -end .. L`` (a ``p`` outside has an empty window, as the table's end
    rows: it is clamped), cached per window, canvas length and device. One lookup instead of
    five ops per call."""
    key = (start, end, length, device)
    rows = _WINDOWS.get(key)
    if rows is None or torch.compiler.is_compiling():
        rel = torch.arange(length, device=device)[None] - \
            torch.arange(-end, length + 1, device=device)[:, None]
        rows = (rel >= start) & (rel < end)  # row j: p = j - end
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not (torch.compiler.is_compiling() or capturing):
            if len(_WINDOWS) > 64:
                _WINDOWS.clear()
            _WINDOWS[key] = rows
    return rows.index_select(0, (p + end).clamp(0, length + end))


def order_stat(values: Tensor, focus: Tensor, n: Tensor, stat: str, q: float) -> Tensor:
    """Lower median or linearly interpolated ``q``-quantile of ``values [B, L]`` over
    ``focus [B, L]`` (``n [B]`` = its row sizes) -> ``[B]`` (empty rows: +inf)."""
    key = torch.where(focus, values, torch.inf)
    ordered = torch.sort(key, dim=1).values
    top = (n - 1).clamp(min=0)
    if stat == "median":
        return ordered.gather(1, (top // 2)[:, None])[:, 0]
    at = q * top.to(values.dtype)
    lo_i = at.floor().long()
    hi_i = torch.minimum(lo_i + 1, top)
    v_lo = ordered.gather(1, lo_i[:, None])[:, 0]
    v_hi = ordered.gather(1, hi_i[:, None])[:, 0]
    frac = at - lo_i.to(values.dtype)
    return torch.where(frac > 0, v_lo + (v_hi - v_lo) * frac, v_lo)


def _and_not(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """``a & ~b`` on ``[B]`` bools, a missing operand being always True / always False."""
    if b is None:
        return a
    return ~b if a is None else a > b


def _and(a: Tensor | None, b: Tensor) -> Tensor:
    """``a & b`` on ``[B]`` bools, a missing ``a`` being always True."""
    return b if a is None else a & b


def decide(stopper: Any, state: StepState, mem: Any) -> Tensor:
    """``[B]`` bool ``SchED.should_stop`` of the ``sched.SchED`` ``stopper`` (``mem``: its
    ``SchEDMemory`` or None; updated in place). No host sync."""
    s = stopper
    prop, fresh, masked = state.proposal, state.fresh, state.masked
    margin, greedy = prop.logit_margin, prop.greedy
    if margin.dtype != torch.float32:
        margin = margin.float()
    if s.stale == "use":  # newest fresh values per position (one op each)
        torch.where(fresh, margin, mem.last_margin, out=mem.last_margin)
        torch.where(fresh, greedy, mem.last_argmax, out=mem.last_argmax)
        margin, greedy = mem.last_margin, mem.last_argmax
    reg = region_memo(s, state, mem)
    open_r = masked if reg.region is None else reg.region & masked  # [B, L] R ∩ M
    n_open = open_r.sum(1)
    checkable: Tensor | None  # None: every row
    if s.stale == "use":
        checkable = reg.size_ok
    else:  # every position the statistic reads is fresh, and the region is not empty
        watched = open_r if s.average_over_masked else reg.focus | open_r
        if reg.size_ok is None:
            checkable = (watched <= fresh).all(1)  # no watched position is stale
        else:
            checkable = reg.size_ok > (watched > fresh).any(1)
    # the statistic; over R ∩ M an empty row stops anyway, so its value is not guarded
    if s.average_over_masked:
        focus, n = open_r, n_open
    else:
        focus, n = reg.focus, reg.focus_n
    if s.stat == "mean":
        gbar = torch.where(focus, margin, 0.0).sum(1) / n
    else:
        gbar = order_stat(margin, focus, n, s.stat, s.q)
    if not s.average_over_masked:
        gbar = torch.where(reg.focus_ok, gbar, -torch.inf)
    tau = s.threshold(s.clock(state))
    if per_row(tau) and tau.dtype != gbar.dtype:  # compared in float32, as a host threshold
        tau = tau.to(gbar.dtype)
    fire = gbar >= tau
    progressed = None
    if s.min_progress > 0:  # progress_R = 1 - |R ∩ M| / |R| >= 0 always
        progressed = (1.0 - n_open / reg.size) >= s.min_progress
    if mem is None:  # stateless (gate off): patience is 1 iff progressed
        if progressed is not None:
            fire = fire & progressed
        return _and(checkable, (n_open == 0) | fire)
    # the gate: the share of R ∩ M whose argmax moved since the row's last check (prev_argmax
    # is -1 before the first one, so everything open has moved, as the code's ratio 1.0 there;
    # with nothing open the row stops whatever the gate says)
    unsettled = None
    if s.max_change_ratio < 1.0:
        moved = (greedy != mem.prev_argmax) & open_r
        if s.max_change_ratio == 0.0:
            unsettled = moved.any(1)
        else:
            unsettled = moved.sum(1) / n_open.clamp(min=1) > s.max_change_ratio
        if checkable is None:
            mem.prev_argmax.copy_(greedy)
        else:
            torch.where(checkable.unsqueeze(1), greedy, mem.prev_argmax, out=mem.prev_argmax)
    if s.patience_steps > 0:
        steady = _and_not(progressed, unsettled)  # None: always
        patience = mem.patience + 1
        if steady is not None:
            patience = torch.where(steady, patience, 0)
        fire = fire & (patience > s.patience_steps)  # (implies progressed)
        if checkable is None:
            mem.patience.copy_(patience)
        else:
            torch.where(checkable, patience, mem.patience, out=mem.patience)
        if reg.size_ok is not None:
            mem.patience.mul_(reg.size_ok)
    else:  # patience > 0 is this step's steadiness
        if progressed is not None:
            fire = fire & progressed
        if unsettled is not None:
            fire = fire > unsettled  # fire & ~unsettled
    stopped = mem.stopped | _and(checkable, (n_open == 0) | fire)  # sticky
    if torch.compiler.is_compiling():
        mem.stopped.copy_(stopped)
    else:  # a new tensor each step: the returned flags are never edited afterwards
        mem.stopped = stopped
    return stopped
