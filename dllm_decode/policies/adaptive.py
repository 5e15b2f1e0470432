"""Adaptive selectors: the number committed per step follows the scores, not a schedule.

* Fast-dLLM threshold and factor rules: Wu et al., "Fast-dLLM: Training-free Acceleration of
  Diffusion LLM by Enabling KV Cache and Parallel Decoding", arXiv 2505.22618
  (NVlabs/Fast-dLLM ``get_transfer_index`` / ``get_transfer_index_dynamic``).
* EB-sampler: Ben-Hamu et al., "Accelerated Sampling from Masked Diffusion Models via Entropy
  Bounded Unmasking", arXiv 2505.24857.
* dParallel entropy threshold: Chen et al., "dParallel: Learnable Parallel Decoding for
  dLLMs", arXiv 2509.26488.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.policies.base import rank_desc, top1_mask
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import ScoreKind, StepState


@dataclass(frozen=True)
class Threshold:
    """Commit every eligible position with score >= ``tau``, plus the best one (Fast-dLLM).

    ``tau = 0.9`` is the default of every Fast-dLLM script; ``tau > 1`` degenerates to one
    token per step. Comparison is ``>=`` as in the reference (``score == tau`` is kept).
    ``tau`` must lie in (0, 1] for probability scores (``prob``, ``margin``), be >= 0 for
    ``logit_margin`` and <= 0 for ``neg_entropy``.
    """

    tau: float = 0.9
    score: ScoreKind = ScoreKind.PROB
    budgeted: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "Threshold")
        lo, hi, lo_open = {ScoreKind.PROB: (0.0, 1.0, True), ScoreKind.MARGIN: (0.0, 1.0, True),
                           ScoreKind.LOGIT_MARGIN: (0.0, None, False),
                           ScoreKind.NEG_ENTROPY: (None, 0.0, False)}[self.score]
        check_range(f"Threshold(score={self.score.value!r})", "tau", self.tau, lo, hi,
                    lo_open=lo_open)

    def select(self, state: StepState) -> Tensor:
        score = state.proposal.score(self.score)
        return (state.eligible & (score >= self.tau)) | top1_mask(score, state.eligible)


@dataclass(frozen=True)
class Factor:
    """Fast-dLLM factor rule: with eligible scores sorted ``c_1 >= c_2 >= ...``, commit the
    leading run of ranks with ``c_n >= 1 - f / (n + 1)`` (rank 1 always).

    Rationale (Theorem 1 of the paper): n tokens with confidence > 1 - eps each and
    ``(n + 1) eps <= 1`` decode in parallel exactly as sequentially. ``last_rank_quirk``
    reproduces the released code, which commits *all* ranks when only the last one fails.
    """

    factor: float = 1.0
    score: ScoreKind = ScoreKind.PROB
    last_rank_quirk: bool = False
    budgeted: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "Factor")
        check_range("Factor", "factor", self.factor, 0.0, lo_open=True)

    def select(self, state: StepState) -> Tensor:
        score = state.proposal.score(self.score).double()
        eligible = state.eligible
        length = score.shape[-1]
        ranks = rank_desc(score, eligible)
        n = torch.arange(1, length + 1, device=score.device, dtype=torch.float64)
        thresh = 1.0 - self.factor / (n + 1.0)
        thresh[0] = -1.0
        sorted_score = torch.full_like(score, -torch.inf)
        sorted_score.scatter_(-1, ranks.clamp(max=length - 1),
                              torch.where(eligible, score, torch.full_like(score, -torch.inf)))
        n_elig = eligible.sum(-1)
        fails = (sorted_score < thresh) | (torch.arange(length, device=score.device) >=
                                           n_elig[:, None])
        first_fail = torch.where(fails.any(-1), fails.float().argmax(-1), n_elig)
        count = first_fail
        if self.last_rank_quirk:
            count = torch.where(first_fail == n_elig - 1, n_elig, first_fail)
        return eligible & (ranks < count.clamp(min=1)[:, None])


@dataclass(frozen=True)
class EntropyBounded:
    """EB-sampler: sort eligible positions by entropy (ascending) and commit the largest
    prefix U with ``sum_{U} H - max_{U} H <= gamma`` (at least one)."""

    gamma: float = 0.1
    budgeted: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "EntropyBounded")
        check_range("EntropyBounded", "gamma", self.gamma, 0.0)

    def select(self, state: StepState) -> Tensor:
        h = -state.proposal.neg_entropy.double()
        eligible = state.eligible
        ranks = rank_desc(-h, eligible)  # lowest entropy first
        sorted_h = torch.zeros_like(h)
        sorted_h.scatter_(-1, ranks.clamp(max=h.shape[-1] - 1), torch.where(eligible, h, 0.0))
        # with ascending order the max of a prefix is its last element
        ok = (torch.cumsum(sorted_h, -1) - sorted_h) <= self.gamma
        count = ok.cumprod(-1).sum(-1).clamp(min=1)
        return eligible & (ranks < count[:, None])


@dataclass(frozen=True)
class EntropyThreshold:
    """dParallel: commit the lowest-entropy eligible position plus every one with H < theta
    (theta 0.5 for LLaDA, 0.45 for Dream in the released scripts)."""

    theta: float = 0.5
    budgeted: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "EntropyThreshold")
        check_range("EntropyThreshold", "theta", self.theta, 0.0)

    def select(self, state: StepState) -> Tensor:
        neg_h = state.proposal.neg_entropy
        return (state.eligible & (-neg_h < self.theta)) | top1_mask(neg_h, state.eligible)
