"""The decode step as a function of static buffers, replayed as a CUDA graph per shape.

Between two host syncs a decode step is: the forward over the fed span (``ForwardPlan.run``)
and the work after it (``samplers.step.post_forward``: propose, select, the contract, stop,
commit). ``StepGraphs`` runs that step on preallocated tensors that outlive the generation
(ARCHITECTURE.md, "The step is a function of static buffers"):

* the canvas ``[B, L]``, the commit records, the K/V cache, the key validity and RoPE
  positions, and every tensor the policy's memory and the contract's progress record carry
  from step to step, are one set of buffers per ``(B, L)``, reused across blocks and
  generations;
* what changes from step to step is written into buffers before the step (the global step
  index, the schedule's progress and the budget ``[B]``); the masks of the step (masked,
  eligible, fresh, the forced block end) are computed inside it from the canvas;
* what the step produces is copied back into those buffers at its end (the new canvas, the
  commit probabilities, a reassigned memory tensor), so nothing outside the buffers is read
  by a later step, and no input of the step is mutated except the buffers themselves.

The host keeps what decides the step's shape, ``ForwardPlan.feed`` (which span is fed and
scored, the plan's per-block bookkeeping), and the one "is anything still masked" sync. Two
steps with the same ``StepKey`` (batch, canvas length, fed span, cache mode, last step of a
block or not, ...) run the same tensor program: on CUDA it is captured once as a
``torch.cuda.CUDAGraph`` (after one eager run of that key, the warm-up: lazy initialisation
and Triton compilation must not happen inside a capture) and replayed, so a step costs one
graph launch instead of ~50 kernel launches per decoder layer. On the CPU the same function
runs eagerly on the same buffers (``DiffusionSampler(graphs=True)``), which is what the
CPU tests compare, token for token, with the ordinary loop.

What a graph bakes in (it cannot change between replays): every host value in the key, and
the host fields of ``StepState`` that are not buffers (``block``, ``block_start``,
``block_end``, ``steps_left``, ``extras["n_masked"]``). The parts allowed here
(``graph_support.GRAPH_SAFE``) read none of them. Anything else falls back to the eager
loop, with the reason logged (``graph_support.unsupported``).

This module holds a sampler's buffer sets (``StepGraphs``) and the loop's entry
(``graph_run``); one generation's dispatch per step (the key, capture, replay, the carried
state) is ``samplers.graph_replay.GraphRun``; the step function is ``samplers.static_step``.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.samplers.graph_backend import CudaGraphs
from dllm_decode.samplers.graph_check import ReplayCheck
from dllm_decode.samplers.graph_replay import GraphRun
from dllm_decode.samplers.graph_support import runs_eagerly, unsupported, wanted
from dllm_decode.samplers.static_step import Buffers, static_step
from dllm_decode.samplers.step import StepParts

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


def graph_run(sampler: Any, plan: ForwardPlan, parts: StepParts, memory: Any, canvas: Tensor,
              caps: Any, cfg: Any, bound: tuple[Any, Any, Any], on_step: Any, p: int,
              total_steps: int) -> GraphRun | None:
    """A generation's static-buffer step for ``sampler`` (a ``DiffusionSampler``: its
    ``graphs`` setting, ``step_graphs`` and ``graph_reason`` are read and set here), or
    ``None`` (the eager loop; the reason logged and kept in ``graph_reason``, as is the
    reason of a step shape that failed its self-check, ``samplers.graph_selfcheck``)."""
    sampler.graph_reason = None
    if not wanted(sampler.graphs, canvas.device):
        return None
    why = unsupported(plan=plan, cfg=cfg, caps=caps, parts=bound, on_step=on_step,
                      debug=sampler.debug, compile=sampler.compile)
    if why is not None:
        runs_eagerly(sampler, cfg, why)
        return None
    kind = canvas.device.type
    if sampler.step_graphs is None or sampler.step_graphs.device not in (None, kind):
        sampler.step_graphs = StepGraphs(capture=kind == "cuda")  # (one per device type)
    setting = repr((dataclasses.replace(cfg, seed=None), bound))
    run = sampler.step_graphs.begin(model=sampler.model, plan=plan, parts=parts,
                                    memory=memory, canvas=canvas, gen_start=p,
                                    gen_length=cfg.gen_length, total_steps=total_steps,
                                    setting=setting)

    def on_reject(why: str) -> None:  # a step shape failed its self-check: eager from now on
        sampler.graph_reason = why

    run.on_reject = on_reject
    return run
