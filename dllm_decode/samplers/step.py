"""The work of one decode step after the model forward, as one function a compiler can capture.

``post_forward`` runs: propose (one pass over V for the fed rows) -> widen to the canvas ->
``StepState`` -> select -> stop -> commit -> the per-generation records. It makes no host sync
and branches only on host values fixed before it is called (the step's integers, the parts'
declared capabilities), so ``torch.compile(post_forward, fullgraph=True)`` captures it whole
for the common presets (``DiffusionSampler(compile=True)``; on a GPU with
``mode="reduce-overhead"``, i.e. a CUDA graph per shape). The sampler keeps the forward, the
one host sync per step and the optional truncation / EOS fill / callbacks around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.plans import Fed
from dllm_decode.samplers.proposals import ProposalMaker, widen
from dllm_decode.types import Selection, StepState


@dataclass(frozen=True)
class StepParts:
    """What ``post_forward`` needs that is fixed for a generation.

    Args:
        maker: the ``ProposalMaker``.
        selector, stopper: the bound policy parts (``stopper`` may be ``None``).
        needs_logits: hand the step's logits to the policy (``StepState.logits``).
        after_select: tokens of committed positions are drawn after selection (Dream origin).
    """

    maker: ProposalMaker
    selector: Any
    stopper: Any
    needs_logits: bool
    after_select: bool


@dataclass
class StepOut:
    """``post_forward``'s result: the new canvas ``[B, L]``, the commit mask ``[B, L]`` (with
    the stopper's greedy commits), the selector's own mask ``selected [B, L]``, the updated
    ``commit_prob [B, L]`` and the step's ``StepState``."""

    canvas: Tensor
    commit: Tensor
    selected: Tensor
    commit_prob: Tensor
    state: StepState


def post_forward(parts: StepParts, fed: Fed, logits: Tensor, rows: Tensor, live: Tensor | None,
                 canvas: Tensor, masked: Tensor, fresh: Tensor, eligible: Tensor,
                 budget: Tensor | None, commit_at: Tensor, commit_prob: Tensor,
                 info: dict[str, Any]) -> StepOut:
    """One step after the forward. No host sync (except in ``rng="reference"`` modes that
    draw data-dependent shapes, which the compiled path refuses).

    Args:
        parts: the generation's ``StepParts``.
        fed: the plan's ``Fed`` (for the reference RNG shapes); ``logits [B, R, V]`` its
            logits after CFG (edited in place: the mask token becomes -inf).
        rows, live: the scored canvas positions ``[R]`` / ``[B, R]`` and their live flags.
        canvas, masked, fresh, eligible: ``[B, L]`` this step's tensors.
        budget: ``[B]`` int64 scheduled commits or ``None``.
        commit_at: ``[B, L]`` int64 step of each commit (-1: none), written in place.
        commit_prob: ``[B, L]`` float64 probability each position was committed with.
        info: the remaining ``StepState`` fields (``step``, ``block``, ... ``model``) and
            ``n_masked``.
    """
    maker = parts.maker
    prop = maker.propose(logits, fed, rows, masked, info["n_masked"])
    full_prop = widen(prop, canvas, rows, live, span=fed.span)
    state = StepState(proposal=full_prop, eligible=eligible, masked=masked, fresh=fresh,
                      canvas=canvas, budget=budget, rows=rows,
                      logits=logits if parts.needs_logits else None,
                      **{k: v for k, v in info.items() if k != "n_masked"})
    chosen = parts.selector.select(state)
    sel = chosen if isinstance(chosen, Selection) else Selection(chosen)
    commit = selected = sel.commit
    tokens, prob = full_prop.tokens, full_prop.prob
    if sel.tokens is not None:
        tokens = torch.where(commit, sel.tokens, tokens)
    if sel.prob is not None:
        prob = torch.where(commit, sel.prob.to(prob.dtype), prob)
    if parts.after_select:
        tokens = maker.resample_committed(logits, rows, commit, tokens)
    if parts.stopper is not None:
        stop = parts.stopper.should_stop(state)
        greedy = stop[:, None] & masked & fresh
        if full_prop.argmax is not None:  # sampled proposals: stops take the argmax
            tokens = torch.where(greedy & ~commit, full_prop.argmax, tokens)
        commit = commit | greedy
    canvas = torch.where(commit, tokens, canvas)
    commit_at.masked_fill_(commit, info["step"])
    commit_prob = torch.where(commit, prob, commit_prob)
    return StepOut(canvas, commit, selected, commit_prob, state)


def compile_step(device: torch.device, backend: str = "inductor") -> Any:
    """``torch.compile(post_forward, fullgraph=True)``; on CUDA with Inductor
    ``mode="reduce-overhead"`` (CUDA graphs). ``backend``: any ``torch.compile`` backend
    (``"eager"`` checks the capture without code generation)."""
    mode = "reduce-overhead" if device.type == "cuda" and backend == "inductor" else None
    return torch.compile(post_forward, fullgraph=True, backend=backend, mode=mode)
