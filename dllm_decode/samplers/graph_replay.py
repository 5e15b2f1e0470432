"""The static-buffer step's buffers and graphs (``samplers.graph``): ``StepGraphs``, a
sampler's buffer sets (per ``(B, L)``, reused across generations), and ``GraphRun``, one
generation's steps on one of them.

Per step, the host computes the fed span (``ForwardPlan.feed``) and the ``StepKey``, writes
the step's host values into buffers, and dispatches: a CUDA graph captured for the key is
replayed (the contract's host-side view restored from the capture), a key seen once is
captured (its first run was the warm-up) and its first replay checked against the eager step
(``graph_selfcheck``), anything else runs ``static_step`` eagerly on the buffers (the CPU
path, ``graph_check.ReplayCheck`` when asked, a shape whose capture failed or whose first
replay disagreed). What captures and replays is the owner's ``graph_backend``. Tensors the
policy memory and the contract carry from step to step are bound to static buffers
(``bind_state`` / ``carry``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.samplers import graph_selfcheck
from dllm_decode.samplers.graph_backend import CudaGraphs
from dllm_decode.samplers.graph_check import Recorder, ReplayCheck, storage_of
from dllm_decode.samplers.static_step import (
    Buffers,
    StepKey,
    relative,
    static_step,
    tensor_slots,
)
from dllm_decode.samplers.step import StepParts

logger = logging.getLogger("dllm_decode.graph")


#: how many ``(B, L)`` buffer sets (each with its K/V cache and graphs) a sampler keeps
MAX_SHAPES = 2


@dataclass
class GraphStats:
    """Counters of a sampler's static steps (for tests and benchmarks)."""

    eager: int = 0
    captures: int = 0
    replays: int = 0
    capture_seconds: float = 0.0
    checked: int = 0  # first replays compared with the eager step (``graph_selfcheck``)
    rejected: int = 0  # ... that disagreed (their shapes run eagerly)


class StepGraphs:
    """A sampler's static-buffer steps: buffers per ``(B, L)``, graphs per ``StepKey``.

    Args:
        capture: capture CUDA graphs (CUDA only); ``False`` runs the same step function
            eagerly on the same buffers (the CPU path).
        check: with ``capture=False``, check that every step could be a replay of its key's
            capture (``samplers.graph_check``; slow, for tests).
        compile_backend: with ``capture=False``, run the step through
            ``torch.compile(fullgraph=True, backend=...)`` (one graph per key, no break).
        backend: what captures and replays (``graph_backend``): CUDA graphs by default, the
            CPU stand-in for tests and ``doctor``.
    """

    def __init__(self, capture: bool, check: bool = False,
                 compile_backend: str | None = None, backend: Any = None) -> None:
        self.capture = capture
        self.backend = backend if backend is not None else CudaGraphs()
        #: CPU only: run the step through ``torch.compile(fullgraph=True)`` with this backend
        self.compiled = None
        if compile_backend is not None and not capture:
            fn = types.FunctionType(static_step.__code__.replace(), static_step.__globals__,
                                    "static_step")
            self.compiled = torch.compile(fn, fullgraph=True, backend=compile_backend)
        #: CPU only: check every run of a key against its first checked run
        #: (``graph_check.ReplayCheck``: what a CUDA graph replay needs)
        self.check = ReplayCheck() if check and not capture else None
        self.stats = GraphStats()
        self.device: str | None = None  # the device type of its buffers (first ``begin``)
        self._sets: dict[tuple[Any, ...], Buffers] = {}

    def cache_for(self, mode: Any, shape: tuple[int, ...], device: torch.device) -> Any:
        """The K/V cache of the buffer set for ``mode`` and ``[B, L]`` ``shape`` on
        ``device`` (``None``: none yet), for the next generation's plan to reuse instead of
        allocating its own (``begin`` would swap it in anyway)."""
        buf = self._sets.get((*shape, torch.device(device), mode))
        return None if buf is None else buf.cache

    def begin(self, *, model: Any, plan: ForwardPlan, parts: StepParts, memory: Any,
              canvas: Tensor, gen_start: int, gen_length: int, total_steps: int,
              setting: str) -> GraphRun:
        """Bind a generation to its buffers (created on first use of ``(B, L)``): the
        initial canvas and records are copied in, and the plan, the contract's progress
        record and the policy memory are pointed at the static tensors."""
        b, length = canvas.shape
        device = canvas.device
        self.device = device.type
        key = (b, length, device, plan.mode)
        buf = self._sets.pop(key, None)
        if buf is not None and buf.cache is not None and (
                buf.cache.k.dtype != plan.cache.k.dtype or buf.cache.k.shape != plan.cache.k.shape):
            buf = None  # the model changed dtype or shape: new buffers
        if buf is None:
            while len(self._sets) >= MAX_SHAPES:  # the oldest shape goes (its cache too)
                self._sets.pop(next(iter(self._sets)))
            f64 = torch.float64
            buf = Buffers(
                canvas=torch.empty_like(canvas),
                commit_at=torch.empty(b, length, dtype=torch.long, device=device),
                commit_prob=torch.empty(b, length, dtype=f64, device=device),
                lengths=torch.empty(b, dtype=torch.long, device=device),
                step=torch.zeros((), dtype=torch.long, device=device),
                progress=torch.zeros((), dtype=f64, device=device),
                budget=torch.zeros(b, dtype=torch.long, device=device),
                times=torch.zeros(2, dtype=f64, device=device),
                active=torch.zeros(b, dtype=torch.bool, device=device),
                origin=torch.zeros((), dtype=torch.long, device=device),
                key_end=torch.zeros((), dtype=torch.long, device=device),
                valid=plan.valid.clone(), positions=plan.positions.clone(), cache=plan.cache)
            if self.capture:
                buf.pool = self.backend.pool()
                # warm-ups run on the capture's stream (torch.cuda.graph's recipe: per-stream
                # lazy initialisation, e.g. cuBLAS workspaces, happens before the capture)
                buf.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._sets[key] = buf  # most recently used last
        buf.canvas.copy_(canvas)
        buf.commit_at.fill_(-1)
        buf.commit_prob.fill_(1.0)
        buf.lengths.fill_(gen_length)
        buf.valid.copy_(plan.valid)
        buf.positions.copy_(plan.positions)
        plan.valid, plan.positions = buf.valid, buf.positions
        if buf.cache is not None:
            plan.cache = buf.cache
        run = GraphRun(self, buf, model, plan, parts, memory, gen_start, total_steps, setting)
        run.bind_state()
        return run


@dataclass
class _Graph:
    """One captured step: the graph, the host-side results its capture left behind (the
    contract's flags and kept tensors), and the objects whose tensors it reads."""

    graph: Any
    guard_state: tuple[Any, ...]
    keep: tuple[Any, ...]


class GraphRun:
    """One generation's use of a ``StepGraphs`` buffer set (``StepGraphs.begin``)."""

    def __init__(self, owner: StepGraphs, buf: Buffers, model: Any, plan: ForwardPlan,
                 parts: StepParts, memory: Any, gen_start: int, total_steps: int,
                 setting: str) -> None:
        self.owner, self.buf, self.model, self.plan = owner, buf, model, plan
        self.parts, self.memory = parts, memory
        self.gen_start, self.total_steps, self.setting = gen_start, total_steps, setting
        self.mask_id = model.mask_token_id
        # (holder, attribute, path): tensors carried from step to step outside the buffers
        self._slots = [(parts.guard, "_track", "guard._track")]
        self._slots += tensor_slots(memory, "memory")
        self._seen: set[StepKey] = set()  # keys run in this generation
        #: the step's logits are appended here when a list (``graph_selfcheck``)
        self.watch: list[Tensor] | None = None
        #: told why a step shape failed its self-check (``graph_run``: the sampler's reason)
        self.on_reject: Callable[[str], None] | None = None

    def _static_storages(self) -> set[int]:
        """Storage addresses a replay may read and write: the buffers and the weights."""
        buf = self.buf
        tensors = [buf.canvas, buf.commit_at, buf.commit_prob, buf.lengths, buf.step,
                   buf.progress, buf.budget, buf.times, buf.active, buf.origin, buf.key_end,
                   buf.valid, buf.positions,
                   *buf.statics.values(), *self.model.parameters(), *self.model.buffers()]
        if buf.cache is not None:
            c = buf.cache
            tensors += [c.k, c.v, c.kv_start, c.kv_end]
        return {storage_of(t) for t in tensors if t is not None}

    @property
    def canvas(self) -> Tensor:
        return self.buf.canvas

    @property
    def commit_at(self) -> Tensor:
        return self.buf.commit_at

    @property
    def commit_prob(self) -> Tensor:
        return self.buf.commit_prob

    @property
    def lengths(self) -> Tensor:
        return self.buf.lengths

    def bind_state(self) -> None:
        """Point every carried tensor at its static buffer (copying its value in)."""
        statics = self.buf.statics
        for holder, name, path in self._slots:
            value = getattr(holder, name)
            static = statics.get(path)
            if static is None or static.shape != value.shape or static.dtype != value.dtype:
                static = statics[path] = value.clone()
                self.buf.graphs.clear()  # graphs read the old buffer
                self.buf.seen.clear()
            elif value is not static:
                static.copy_(value)
            setattr(holder, name, static)

    def carry(self) -> None:
        """Inside the step: carried tensors that were replaced are copied into their buffers."""
        statics = self.buf.statics
        for holder, name, path in self._slots:
            value, static = getattr(holder, name), statics[path]
            if value is static:
                continue
            if value.shape != static.shape or value.dtype != static.dtype:
                raise _Unsupported(f"{path} changed shape ({tuple(static.shape)} -> "
                                   f"{tuple(value.shape)})")
            static.copy_(value)
            setattr(holder, name, static)

    def step(self, canvas: Tensor, commit_prob: Tensor, *, block: int, bounds: tuple[int, int],
             aligned: int, step_in_block: int, lo: int, full_span: bool, step: int,
             progress: float, budget: Tensor | None, times: tuple[Tensor, Tensor] | None,
             n_masked: int, steps_left: int | None, last: bool, force_end: bool,
             stall_limit: int) -> tuple[Tensor, Tensor, Tensor, bool]:
        """One decode step on the buffers (replayed where captured).

        Args:
            canvas, commit_prob: the loop's current tensors (copied in if they are not the
                buffers, e.g. after the EOS fill).
            block, bounds, aligned, step_in_block, lo, full_span: as the loop's (block index,
                ``(start, end)``, the aligned start, ...); ``ForwardPlan.feed`` reads them.
            step, progress, budget ``[B]`` (or ``None``), times: written into buffers.
            n_masked, steps_left: host values handed to ``StepState`` (baked in a graph).
            last, force_end, stall_limit: the contract's per-step controls.

        Returns: the canvas and commit_prob buffers, the ``[B]`` active rows (a copy), and
        whether the forward was a full refresh.
        """
        buf = self.buf
        bs, be = bounds
        feed = self.plan.feed((bs, be), aligned, step_in_block, lo, full_span)
        self.positions = feed.end - feed.start  # token positions per row (``Generation``)
        if canvas is not buf.canvas:
            buf.canvas.copy_(canvas)
        if commit_prob is not buf.commit_prob:
            buf.commit_prob.copy_(commit_prob)
        buf.step.fill_(step)
        buf.progress.fill_(progress)
        if budget is not None:
            buf.budget.copy_(budget)
        if times is not None:
            buf.times.copy_(torch.stack(times))
        self.bind_state()
        b, length = buf.canvas.shape
        rel = relative(self.plan, feed)
        o = feed.start if rel else 0
        if rel:
            buf.origin.fill_(o)
            size = getattr(self.model, "block_size", None)
            if self.model.attention == "block_causal":
                buf.key_end.fill_((feed.start // size + 1) * size)
            feed = dataclasses.replace(feed, start=0, end=feed.end - o, lo=feed.lo - o,
                                       hi=feed.hi - o, fed_start=feed.fed_start - o)
        key = StepKey(b, length, self.gen_start, feed, rel, self.plan.dense, (bs - o, be - o),
                      last, force_end, budget is not None, times is not None, stall_limit,
                      self.total_steps, self.setting)
        host = dict(block=block, bounds=bounds, n_masked=n_masked, steps_left=steps_left)
        # (``host``: values a graph bakes in; no allowed part reads them, see the module doc)
        self._dispatch(key, host, step)
        return buf.canvas, buf.commit_prob, buf.active.clone(), feed.refresh

    def _dispatch(self, key: StepKey, host: dict[str, Any], step: int) -> None:
        owner, buf = self.owner, self.buf
        graph = buf.graphs.get(key)
        if graph is not None:
            graph.graph.replay()
            self._restore(graph, step)
            owner.stats.replays += 1
            return
        if owner.check is not None and key in self._seen:  # CPU: as a replay would run
            self.plan._memo = {}
            owner.check.run(key, self._static_storages(), lambda: static_step(self, key, host))
            owner.stats.eager += 1
            return
        self._seen.add(key)
        if owner.compiled is not None:
            owner.compiled(self, key, host)
            owner.stats.eager += 1
            return
        if key in buf.rejected and self.on_reject is not None:  # failed its self-check
            self.on_reject(buf.rejected[key])
        if not owner.capture or buf.broken or key in buf.rejected or key not in buf.seen:
            buf.seen.add(key)  # the first run of a key is the warm-up of its capture
            with _on_stream(None if buf.broken else buf.stream):
                static_step(self, key, host)
            owner.stats.eager += 1
            return
        t0 = time.perf_counter()
        self.watch = []  # the capture's logits tensor, for the self-check
        try:
            graph = self._capture(key, host)
        except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager
            buf.broken = f"{type(err).__name__}: {err}"
            logger.warning("CUDA graph capture failed, this shape runs eagerly from now on: %s",
                           buf.broken)
            self.watch = None
            self.plan._memo = {}
            self.bind_state()
            static_step(self, key, host)
            owner.stats.eager += 1
            return
        owner.stats.capture_seconds += time.perf_counter() - t0
        owner.stats.captures += 1
        # the first replay, against the eager step (whose result the buffers keep)
        why = graph_selfcheck.first_replay(self, graph, key, host, step)
        owner.stats.checked += 1
        if why is None:
            buf.graphs[key] = graph
        else:
            graph_selfcheck.reject(self, key, why)

    def _capture(self, key: StepKey, host: dict[str, Any]) -> _Graph:
        plan = self.plan
        # tensors the plan memoised outside a capture would be constants of the graph (the
        # RoPE tables and masks of the previous generation's positions): rebuilt inside it
        plan._memo = {}
        backend = self.owner.backend
        graph = backend.new_graph()
        # the recorder lists the outside tensors the graph reads (kept alive with it) and
        # refuses host syncs and writes outside the buffers (``graph_check``)
        rec = Recorder(self._static_storages())
        with backend.capture(graph, self.buf.pool, self.buf.stream), rec:
            static_step(self, key, host)
        if rec.problems:
            raise _Unsupported(rec.problems[0])
        guard = self.parts.guard
        state = (guard._flags, guard._limits, guard._last_step)
        plan._memo = {}
        return _Graph(graph, state, (self.parts, plan, self.memory, self.model, rec.consts))

    def _restore(self, graph: _Graph, step: int) -> None:
        """After a replay: the contract's host-side view of the step (its 0-d flags and kept
        tensors are the graph's), and the carried tensors' attributes."""
        guard = self.parts.guard
        flags, limits, last = graph.guard_state
        guard._flags, guard._limits = flags, limits
        guard._last_step = (step, *last[1:])
        self.bind_state()


@contextlib.contextmanager
def _on_stream(stream: Any) -> Iterator[None]:
    """Run on ``stream`` (``None``: the current one), ordered after and before the current
    stream's work."""
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(stream.device).wait_stream(stream)


class _Unsupported(RuntimeError):
    """A step that cannot be a static tensor program (raised while capturing)."""
