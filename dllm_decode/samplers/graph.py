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

This module is the loop's entry (``graph_run``: does this generation run on static buffers,
and on which); the buffers and graphs and their per-step dispatch are
``samplers.graph_replay`` (``StepGraphs``: a sampler's buffer sets, ``GraphRun``: one
generation's steps on one of them: the key, capture, replay, the carried state); what may run
there is ``samplers.graph_support``; the step function is ``samplers.static_step``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.samplers.graph_replay import GraphRun, StepGraphs
from dllm_decode.samplers.graph_support import runs_eagerly, unsupported, wanted
from dllm_decode.samplers.step import StepParts


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


__all__ = ["StepGraphs", "graph_run"]
