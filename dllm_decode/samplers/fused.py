"""A fused eager step for the commonest preset: the top-k of the proposal probability.

LLaDA ``low_confidence`` / Dream ``maskgit_plus`` (``TopK(score="prob")``, no sampling of
positions) at a step whose scored rows are one contiguous canvas span (every cache mode's
ordinary step) need none of ``post_forward``'s generality: no stopper or truncator, no
canvas-wide ``StepState`` for a policy to read, and two of the contract's three checks hold by
construction (a top-k over ``eligible`` commits nothing outside it, and commits in every row
with an eligible position and a budget > 0). ``topk_step`` therefore proposes, selects and
commits on the span ``[B, R]`` in place (on the canvas where only the masked rows are
scored), with the contract reduced to the finiteness check and the progress record's update:
about 20 torch calls instead of about 30, and none of the per-step Python objects (issue #17:
on a 2-layer model at one token per step the fixed cost per op is the non-model time).
Results are the generic step's, bit for bit
(``tests/test_fused_step.py``); the sampler falls back to ``post_forward`` wherever a
condition does not hold (``fusable``, and per step in ``topk_step``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.plans import Fed
from dllm_decode.policies.base import topk_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.confidence import TopK
from dllm_decode.samplers.contract import StepGuard
from dllm_decode.samplers.proposals import ProposalMaker, widen_at
from dllm_decode.types import ScoreKind


def fusable(selector: Any, stopper: Any, truncator: Any, caps: Capabilities, *,
            on_step: Any, debug: bool, compile: bool | str) -> bool:
    """Whether a generation's steps may run ``topk_step``: a plain ``TopK`` of ``prob``
    (exactly that class: a subclass may override ``select``) and nothing that reads the
    canvas-wide step (stopper, truncator, ``on_step``, logits, debug checks); eager only
    (``compile=True`` captures ``post_forward``)."""
    return (type(selector) is TopK and selector.score is ScoreKind.PROB
            and not selector.alg_temp and stopper is None and truncator is None
            and on_step is None and not debug and not compile and not caps.needs_logits
            and not caps.selector.proposes_after_select)


def topk_step(maker: ProposalMaker, guard: StepGuard, fed: Fed, logits: Tensor,
                   rows: Tensor, masked: Tensor, eligible: Tensor, budget: Tensor,
                   expected: Tensor, canvas: Tensor, commit_at: Tensor, commit_prob: Tensor,
                   step: int, n_masked: int, in_rows: int | None, stall_limit: int) -> bool:
    """One ``fusable`` step, or ``False`` (nothing done) where the generic ``post_forward``
    must run (the fed rows are not one span). Where the proposal scores the masked rows alone
    (``ProposalMaker.masked_rows``) it is widened to the canvas and selected there, as in
    ``post_forward``; otherwise everything stays on the span.

    Args:
        logits: ``[B, R, V]`` for the span's rows (edited in place, as ``propose`` does).
        rows: ``[R]`` the span's canvas positions; masked / eligible ``[B, L]`` bool (eligible
            lies inside the span: the sampler cuts it to the fed span); budget ``[B]`` int64;
            expected ``[B]`` bool (``contract.expected_rows``).
        canvas, commit_at, commit_prob: ``[B, L]``, written in place on the span.
        step: the global step; n_masked / in_rows / stall_limit: as ``post_forward``'s
            ``ctl``. Never called on a block's last step (its forced commits and stall check
            need ``post_forward``).
    """
    if fed.span is None or fed.live is not None:
        return False
    picked = maker.masked_rows(logits, fed, None, masked, in_rows) if maker.masked_only \
        else None
    if picked is not None:  # the masked rows alone, widened to the canvas as post_forward does
        prop = maker.propose_rows(logits, picked[0])  # [K]
        wide = widen_at(prop, canvas, picked[1])  # [B, L]
        commit = topk_mask(wide.prob, eligible, budget)
        guard.observe_topk(step, prop.prob if prop.lse is None else prop.lse, commit, eligible,
                           expected, stall_limit, at=picked[1])
        canvas.copy_(torch.where(commit, wide.tokens, canvas))
        commit_at.masked_fill_(commit, step)
        commit_prob.copy_(torch.where(commit, wide.prob, commit_prob))
        return True
    lo, hi = fed.span
    prop = maker.propose(logits, fed, rows, masked, n_masked)  # [B, R]
    el = eligible[:, lo:hi]
    commit = topk_mask(prop.prob, el, budget)  # [B, R], a subset of el
    guard.observe_topk(step, prop.prob if prop.lse is None else prop.lse, commit, el, expected,
                       stall_limit)
    span = canvas[:, lo:hi]
    span.copy_(torch.where(commit, prop.tokens, span))
    commit_at[:, lo:hi].masked_fill_(commit, step)
    probs = commit_prob[:, lo:hi]
    probs.copy_(torch.where(commit, prop.prob, probs))
    return True
