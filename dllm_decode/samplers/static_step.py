"""The decode step as a function of static buffers (what ``samplers.graph`` captures).

``static_step`` runs one step between two host syncs, the forward over the fed span
(``ForwardPlan.run``, or ``forward_at`` for a position-free span) and the work after it
(``samplers.step.post_forward``), reading and writing only the ``Buffers`` of its ``(B, L)``
and tensors it makes itself. Every host value it uses is in its ``StepKey`` (or is one of the
``StepState`` fields no graph-safe part reads, see ``samplers.graph``), so two runs with equal
keys run the same tensor program.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.fed import Fed, Feed
from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.samplers.contract import expected_rows
from dllm_decode.samplers.step import post_forward


@dataclass(frozen=True)
class StepKey:
    """Everything that shapes a step's tensor program (equal keys: one captured graph).

    A cached step that feeds one block (``dual``, and ``block_causal`` after a block's first
    step) is position-free: its canvas positions are ``origin + offset`` with ``origin`` a
    buffer, so every block of a generation replays one graph (``relative``)."""

    batch: int
    length: int
    gen_start: int
    feed: Feed  # relative to the buffer ``origin`` when ``relative``
    relative: bool
    dense: bool
    bounds: tuple[int, int]  # the block, relative like ``feed``
    last: bool
    force_end: bool
    budgeted: bool
    timed: bool
    stall_limit: int
    total_steps: int
    setting: str  # the config and the bound policy parts (their reprs)


@dataclass
class Buffers:
    """The static buffers of one ``(B, L)``, and the graphs captured on them."""

    canvas: Tensor
    commit_at: Tensor
    commit_prob: Tensor
    lengths: Tensor
    step: Tensor  # 0-d int64: the global step index
    progress: Tensor  # 0-d float64
    budget: Tensor  # [B] int64
    times: Tensor  # [2] float64 (Dream's time grid: t, s)
    active: Tensor  # [B] bool, rows with an eligible position (NFE)
    origin: Tensor  # 0-d int64: the canvas position of a relative step's fed span
    key_end: Tensor  # 0-d int64: block-causal keys visible to a relative step (< key_end)
    valid: Tensor | None = None
    positions: Tensor | None = None
    cache: Any = None
    statics: dict[str, Tensor] = field(default_factory=dict)
    graphs: dict[StepKey, Any] = field(default_factory=dict)  # samplers.graph_replay._Graph
    seen: set[StepKey] = field(default_factory=set)
    #: shapes whose first replay failed its self-check, and why (``samplers.graph_selfcheck``)
    rejected: dict[StepKey, str] = field(default_factory=dict)
    pool: Any = None
    stream: Any = None  # CUDA: the stream warm-ups and captures run on
    broken: str | None = None


def relative(plan: ForwardPlan, feed: Feed) -> bool:
    """Whether ``feed`` runs position-free: a cached forward of one block (not the full
    canvas; block-causal: inside one block of the model, no causal prefix)."""
    if not feed.use_cache or (feed.start, feed.end) == (0, plan.length):
        return False
    if plan.model.attention == "block_causal":
        size = plan.model.block_size
        return feed.start // size == (feed.end - 1) // size and not plan.causal_prefix
    return True

def forward_at(run: Any, canvas: Tensor, feed: Feed) -> Fed:
    """``ForwardPlan.run`` of a relative feed: the span ``origin + [0, end)`` gathered by
    index, the keys from the validity buffer (block-causal: ``< key_end``)."""
    plan, model, buf = run.plan, run.model, run.buf
    device = canvas.device
    idx = buf.origin + torch.arange(feed.end, device=device)  # [N] canvas positions
    tokens = canvas.index_select(1, idx)
    pos = plan.positions.index_select(1, idx)
    mask = None if plan.dense else plan.valid
    if model.attention == "block_causal":
        keys = torch.arange(plan.length, device=device)
        mask = plan.valid & (keys < buf.key_end)[None]
    rows = None if (feed.lo, feed.hi) == (0, feed.end) else \
        torch.arange(feed.lo, feed.hi, device=device)
    tables = getattr(model, "rope_tables", None)
    rope = {} if tables is None else {"rope": tables(pos)}
    logits = model(tokens, pos, cache=plan.cache, slots=idx[None].expand_as(pos), mask=mask,
                   store=True, hidden_rows=rows, **rope)
    at = buf.origin + torch.arange(feed.lo, feed.hi, device=device)
    return Fed(logits, at, feed.fed_start, feed.fed_width, refresh=feed.refresh,
               double_draw=feed.double_draw, positions=feed.end)

def static_step(run: Any, key: StepKey, host: dict[str, Any]) -> None:
    """The step as a function of the buffers (what a graph captures)."""
    buf, parts = run.buf, run.parts
    feed = key.feed
    canvas = buf.canvas
    b, length = canvas.shape
    masked = canvas == run.mask_id
    pos = torch.arange(length, device=canvas.device)
    if key.relative:  # positions relative to the fed span's origin
        fed = forward_at(run, canvas, feed)
        pos = pos - buf.origin
    else:
        fed = run.plan.run(canvas, feed)
    if run.watch is not None:  # the self-check reads the step's logits
        run.watch.append(fed.logits)
    in_span = (pos >= feed.lo) & (pos < feed.hi)
    fresh = in_span[None].expand(b, -1)
    bs, be = key.bounds
    eligible = masked & ((pos >= feed.lo) & (pos < min(feed.hi, be)))[None]
    active = eligible.any(1)
    budget = buf.budget if key.budgeted else None
    expected = expected_rows(active, budget)
    force = ((pos >= bs) & (pos < be))[None].expand(b, -1) if key.force_end else None
    info = dict(step=buf.step, block=host["block"], block_start=host["bounds"][0],
                block_end=host["bounds"][1],
                gen_start=key.gen_start, steps_left=host["steps_left"],
                progress=buf.progress, generator=parts.maker.generator,
                forward_start=feed.fed_start, forward_width=feed.fed_width,
                times=tuple(buf.times.unbind()) if key.timed else None,
                memory=run.memory,
                extras={"n_masked": host["n_masked"], "lengths": buf.lengths,
                        "refresh": feed.refresh, "total_steps": key.total_steps},
                model=None,
                refreshed=torch.full((b,), feed.refresh, device=canvas.device))
    ctl = dict(n_masked=host["n_masked"], in_rows=None, expected=expected, last=key.last,
               stall_limit=key.stall_limit, force_end=force)
    out = post_forward(parts, fed, fed.logits, fed.rows, None, canvas, masked, fresh,
                       eligible, budget, buf.commit_at, buf.commit_prob, info, ctl)
    canvas.copy_(out.canvas)
    buf.commit_prob.copy_(out.commit_prob)
    if out.commit_at is not buf.commit_at:  # a new tensor under torch.compile
        buf.commit_at.copy_(out.commit_at)
    buf.active.copy_(active)
    run.carry()


def tensor_slots(obj: Any, path: str, depth: int = 3) -> list[tuple[Any, str, str]]:
    """``(holder, attribute, path)`` of the tensors reachable through dataclass fields of
    ``obj`` (a policy's memory: ``PairedMemory``, ``SchEDMemory``, ...)."""
    if obj is None or depth == 0 or not dataclasses.is_dataclass(obj):
        return []
    out: list[tuple[Any, str, str]] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Tensor):
            out.append((obj, f.name, f"{path}.{f.name}"))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += tensor_slots(value, f"{path}.{f.name}", depth - 1)
    return out
