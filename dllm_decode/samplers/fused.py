"""A fused eager step for the commonest presets: top-k or threshold of the probability.

LLaDA ``low_confidence`` / Dream ``maskgit_plus`` (``TopK(score="prob")``, no sampling of
positions) and Fast-dLLM's ``threshold`` (``Threshold(score="prob")``) at a step whose scored
rows are one contiguous canvas span (every cache mode's ordinary step) need none of
``post_forward``'s generality: no stopper or truncator, no canvas-wide ``StepState`` for a
policy to read, and two of the contract's three checks hold by construction (both commit a
subset of ``eligible``, and commit in every row with an eligible position, and a budget > 0
for the top-k). ``fused_step`` therefore proposes, selects and commits on the span ``[B, R]``
in place (on the canvas where only the masked rows are scored), with the contract reduced to
the finiteness check and the progress record's update: about 20 torch calls instead of about
30, and none of the per-step Python objects (issue #17: on a 2-layer model at one token per
step the fixed cost per op is the non-model time). Results are the generic step's, bit for bit
(``tests/test_fused_step.py``); the sampler falls back to ``post_forward`` wherever a
condition does not hold (``span_selector``, and per step in ``fused_step``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.fed import Fed
from dllm_decode.policies.adaptive import Threshold, threshold_mask
from dllm_decode.policies.base import topk_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.confidence import TopK
from dllm_decode.samplers.contract import StepGuard
from dllm_decode.samplers.proposals import ProposalMaker, widen_at
from dllm_decode.types import ScoreKind


@dataclass(frozen=True)
class SpanSelect:
    """A fused selection: ``select(prob [B, N], eligible [B, N], budget [B] | None)`` -> the
    commit mask ``[B, N]``, a subset of ``eligible`` with a commit in every row that has an
    eligible position (and, if ``needs_budget``, a budget > 0)."""

    select: Callable[[Tensor, Tensor, Tensor | None], Tensor]
    needs_budget: bool


def span_selector(selector: Any, stopper: Any, truncator: Any, caps: Capabilities, *,
                  on_step: Any, debug: bool, compile: bool | str,
                  reference_order: bool = False) -> SpanSelect | None:
    """The ``SpanSelect`` of a generation whose steps may run ``fused_step`` (``None``: they
    may not). Only exactly ``TopK(prob)`` without ``alg_temp`` (not in the references' tie
    order, ``reference_order``: that top-k runs in ``post_forward``) and
    ``Threshold(prob)`` (a subclass may override ``select``), and nothing that reads the
    canvas-wide step (stopper, truncator, ``on_step``, logits, debug checks); eager only
    (``compile=True`` captures ``post_forward``)."""
    if (stopper is not None or truncator is not None or on_step is not None or debug
            or compile or caps.needs_logits or caps.selector.proposes_after_select):
        return None
    if type(selector) is TopK and selector.score is ScoreKind.PROB and not selector.alg_temp \
            and not reference_order:
        return SpanSelect(topk_mask, needs_budget=True)
    if (type(selector) is Threshold and selector.score is ScoreKind.PROB
            and not selector.tie_window):
        tau = selector.tau
        return SpanSelect(lambda prob, eligible, _: threshold_mask(prob, eligible, tau),
                          needs_budget=False)
    return None


def fused_step(fuse: SpanSelect, maker: ProposalMaker, guard: StepGuard, fed: Fed,
               logits: Tensor, rows: Tensor, masked: Tensor, eligible: Tensor,
               budget: Tensor | None, expected: Tensor, canvas: Tensor, commit_at: Tensor,
               commit_prob: Tensor, step: int, n_masked: int, in_rows: int | None,
               stall_limit: int) -> bool:
    """One step selected by ``fuse`` (``span_selector``), or ``False`` (nothing done) where
    the generic ``post_forward`` must run (the fed rows are not one span, or a top-k has no
    budget). Where the proposal scores the masked rows alone
    (``ProposalMaker.masked_rows``) it is widened to the canvas and selected there, as in
    ``post_forward``; otherwise everything stays on the span.

    Args:
        logits: ``[B, R, V]`` for the span's rows (edited in place, as ``propose`` does).
        rows: ``[R]`` the span's canvas positions; masked / eligible ``[B, L]`` bool (eligible
            lies inside the span: the sampler cuts it to the fed span); budget ``[B]`` int64
            or ``None``; expected ``[B]`` bool (``contract.expected_rows``).
        canvas, commit_at, commit_prob: ``[B, L]``, written in place on the span.
        step: the global step; n_masked / in_rows / stall_limit: as ``post_forward``'s
            ``ctl``. Never called on a block's last step (its forced commits and stall check
            need ``post_forward``).
    """
    if fed.span is None or fed.live is not None or (fuse.needs_budget and budget is None):
        return False
    picked = maker.masked_rows(logits, fed, None, masked, in_rows) if maker.masked_only \
        else None
    if picked is not None:  # the masked rows alone, widened to the canvas as post_forward does
        prop = maker.propose_rows(logits, picked[0])  # [K]
        wide = widen_at(prop, canvas, picked[1])  # [B, L]
        commit = fuse.select(wide.prob, eligible, budget)
        guard.observe_fused(step, prop.prob if prop.lse is None else prop.lse, commit, eligible,
                            expected, stall_limit, at=picked[1])
        torch.where(commit, wide.tokens, canvas, out=canvas)
        commit_at.masked_fill_(commit, step)
        torch.where(commit, wide.prob, commit_prob, out=commit_prob)
        return True
    lo, hi = fed.span
    prop = maker.propose(logits, fed, rows, masked, n_masked)  # [B, R]
    el = eligible[:, lo:hi]
    commit = fuse.select(prop.prob, el, budget)  # [B, R], a subset of el
    guard.observe_fused(step, prop.prob if prop.lse is None else prop.lse, commit, el,
                        expected, stall_limit)
    span = canvas[:, lo:hi]
    torch.where(commit, prop.tokens, span, out=span)  # in place (full overlap is allowed)
    commit_at[:, lo:hi].masked_fill_(commit, step)
    probs = commit_prob[:, lo:hi]
    torch.where(commit, prop.prob, probs, out=probs)
    return True
