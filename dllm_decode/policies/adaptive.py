"""Adaptive selectors: the number committed per step follows the scores, not a schedule.

* Fast-dLLM threshold and factor rules: Wu et al., "Fast-dLLM: Training-free Acceleration of
  Diffusion LLM by Enabling KV Cache and Parallel Decoding", arXiv 2505.22618
  (NVlabs/Fast-dLLM ``get_transfer_index`` / ``get_transfer_index_dynamic``).
* EB-sampler: Ben-Hamu et al., "Accelerated Sampling from Masked Diffusion Models via Entropy
  Bounded Unmasking", arXiv 2505.24857.
* dParallel entropy threshold: Chen et al., "dParallel: Learnable Parallel Decoding for
  dLLMs", arXiv 2509.26488.

Deviations from the papers / released code:

* all rules: the mask token is never a candidate (its logit is -inf before anything is
  scored; the references keep it in the softmax); rows of a batch are independent (Fast-dLLM's
  factor rule and dual cache crash for batch > 1, dParallel / EB code is batch 1); exact ties
  go to the lower index (the references' ``torch.topk`` order on a CPU is not the index order;
  ``rng="reference"`` reproduces it for the budgeted top-k selectors only,
  ``policies.confidence``); no host sync.
* Fast-dLLM ``threshold`` / ``factor``: ``prob`` confidences are the float32 probabilities of
  the proposal (the reference softmax is float64; every conformance case matches); ``factor``
  follows the paper's rule by default, ``last_rank_quirk=True`` reproduces the released
  code's commit-all-when-only-the-last-rank-fails; cached loops follow the later revision
  (f6b35ec), not 24cc59e's wasted forward when the refresh already finished the block.
  ``score="random"`` draws exactly as ``remasking="random"`` (see ``Threshold``).
* EB-sampler: entropy is the proposal's float32 entropy; only the entropy error proxy;
  ``gamma=0.1`` is the default of public re-implementations (no official code).
* dParallel: the entropy is float64 as the authors compute it, but of the logits with the mask
  token removed; ``remasking="random"`` (random "entropies") is not provided; the authors'
  prefix / dual-cache loops are the library's cache modes (any ``cache=``); only the decoding
  rule is here, the certainty-forcing distillation that makes it fast is training
  (``dllm_decode.train``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.base import lowest, rank_desc, step_score, to_canvas, top1_mask
from dllm_decode.policies.capabilities import Capabilities, score_fields
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import ScoreKind, StepState

#: dParallel's entropy threshold per model family (released eval scripts: LLaDA ``eval.sh``
#: 0.5, Dream ``eval_instruct/eval.sh`` 0.45); any other family gets LLaDA's
DPARALLEL_THETA: Final = {"llada": 0.5, "dream": 0.45}
#: dParallel's ``log(p + eps)`` guard in its float64 entropy
DPARALLEL_LOG_EPS: Final = 1e-12


@dataclass(frozen=True)
class Threshold:
    """Commit every eligible position with score >= ``tau``, plus the best one (Fast-dLLM).

    ``tau = 0.9`` is the default of every Fast-dLLM script; ``tau > 1`` degenerates to one
    token per step. Comparison is ``>=`` as in the reference (``score == tau`` is kept).
    ``score`` is any ``ScoreKind``; ``random`` is Fast-dLLM's ``remasking="random"``: the
    confidences are one float32 ``rand([B, fed width])`` per step drawn after the proposal's
    Gumbel noise, so ``rng="reference"`` reproduces the reference's draws.
    ``tau`` must lie in (0, 1] for probability scores (``prob``, ``margin``, ``random``), be
    >= 0 for ``logit_margin`` and <= 0 for ``neg_entropy``.
    ``tie_window`` (parity option, default 0): also commit every eligible position within
    this much of the row's best score, i.e. ``score >= min(tau, best - tie_window)``, as
    dInfer's threshold decoder does with 1e-5 (``get_transfer_index_threshold``; its
    CreditDecoding runs on it).
    """

    tau: float = 0.9
    score: ScoreKind = ScoreKind.PROB
    tie_window: float = 0.0

    @property
    def reference_loop(self) -> str | None:
        """Fast-dLLM's loops (``samplers.proposals.REFERENCE_LOOPS``) for its remasking scores
        (``prob``, ``random``) without dInfer's tie window; else none."""
        return fast_dllm_loop(self.score) if self.tie_window == 0 else None

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; reads the proposal field of ``score`` only, at eligible positions; no
        step value (``row_steps``; ``random`` draws from ``row_seeds`` when set)."""
        return Capabilities(budgeted=False, proposal_fields=score_fields(self.score),
                            reads_masked_only=True, noise_kinds=("mask", "uniform"),
                            row_steps=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "Threshold")
        lo, hi, lo_open = {ScoreKind.PROB: (0.0, 1.0, True), ScoreKind.MARGIN: (0.0, 1.0, True),
                           ScoreKind.RANDOM: (0.0, 1.0, True),
                           ScoreKind.LOGIT_MARGIN: (0.0, None, False),
                           ScoreKind.NEG_ENTROPY: (None, 0.0, False)}[self.score]
        check_range(f"Threshold(score={self.score.value!r})", "tau", self.tau, lo, hi,
                    lo_open=lo_open)
        check_range("Threshold", "tie_window", self.tie_window, 0.0)

    def select(self, state: StepState) -> Tensor:
        score = step_score(state, self.score)  # ``random``: float32 uniforms, one draw per step
        commit = threshold_mask(score, state.eligible, self.tau)
        if self.tie_window > 0:
            best = torch.where(state.eligible, score, lowest(score.dtype)).amax(-1, keepdim=True)
            commit = commit | (state.eligible & (score >= best - self.tie_window))
        return commit


def fast_dllm_loop(score: ScoreKind) -> str | None:
    """``"fast_dllm"`` for Fast-dLLM's remasking scores (``prob``: ``low_confidence``;
    ``random``), else ``None``: the ``reference_loop`` of its rules (``rng="reference"`` then
    draws as ``generate_with_prefix_cache`` does, ``samplers.proposals.PREFIX_DOUBLE_DRAW``)."""
    return "fast_dllm" if score in (ScoreKind.PROB, ScoreKind.RANDOM) else None


def ranked_adaptive(score: ScoreKind) -> Capabilities:
    """The capabilities of an adaptive rule over the ranking by ``score`` (``factor``,
    ``frechet``): open-ended steps, the proposal field of ``score`` only, masked positions,
    no step value (``row_steps``)."""
    return Capabilities(budgeted=False, proposal_fields=score_fields(score),
                        reads_masked_only=True, row_steps=True)


def threshold_mask(score: Tensor, eligible: Tensor, tau: float) -> Tensor:
    """``eligible & (score >= tau | the row's best eligible position)`` ``[B, N]``: ``top1_mask``
    folded in (one argmax, first maximum on ties); a row with an eligible position always
    commits one."""
    best = torch.where(eligible, score, lowest(score.dtype)).argmax(-1, keepdim=True)
    return eligible & (score >= tau).scatter_(-1, best, True)


@dataclass(frozen=True)
class Factor:
    """Fast-dLLM factor rule: with eligible scores sorted ``c_1 >= c_2 >= ...``, commit the
    leading run of ranks with ``c_n >= 1 - f / (n + 1)`` (rank 1 always).

    Rationale (Theorem 1 of the paper): n tokens with confidence > 1 - eps each and
    ``(n + 1) eps <= 1`` decode in parallel exactly as sequentially. ``last_rank_quirk``
    reproduces the released code, which commits *all* ranks when only the last one fails.
    ``score`` is any ``ScoreKind``, ``random`` included (see ``Threshold``); random
    confidences are compared in float32, as the reference compares its ``rand`` values.
    """

    factor: float = 1.0
    score: ScoreKind = ScoreKind.PROB
    last_rank_quirk: bool = False

    @property
    def reference_loop(self) -> str | None:
        """Fast-dLLM's loops for its remasking scores (``fast_dllm_loop``)."""
        return fast_dllm_loop(self.score)

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; reads the proposal field of ``score`` only, at eligible positions."""
        return ranked_adaptive(self.score)

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "Factor")
        check_range("Factor", "factor", self.factor, 0.0, lo_open=True)

    def select(self, state: StepState) -> Tensor:
        score = step_score(state, self.score)
        # the reference compares float64 softmax confidences, but float32 ``rand`` uniforms
        # against thresholds rounded to float32 (tensor-vs-Python-float comparison)
        if self.score is not ScoreKind.RANDOM:
            score = score.double()
        eligible = state.eligible
        length = score.shape[-1]
        ranks = rank_desc(score, eligible)
        n = torch.arange(1, length + 1, device=score.device, dtype=torch.float64)
        # rank 1 always passes (a select: ``thresh[0] = -1`` reads as a host constant made
        # in the step to the CPU replay check, ``samplers.graph_check``)
        thresh = torch.where(n > 1.0, 1.0 - self.factor / (n + 1.0), -1.0).to(score.dtype)
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
    capabilities = Capabilities(budgeted=False, proposal_fields=("neg_entropy",),
                                reads_masked_only=True, noise_kinds=("mask", "uniform"),
                                row_steps=True)

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
    """dParallel: commit the lowest-entropy eligible position plus every one with H < theta.

    ``theta=None`` takes the family default of the released scripts when the sampler binds
    the policy to its model (``DPARALLEL_THETA``: 0.5 LLaDA, 0.45 Dream; 0.5 unbound). The
    entropy is computed as the authors do, ``-sum p log(p + 1e-12)`` of the float64 softmax of
    the step's logits (``needs_logits``), at every scored position; only without logits (a
    caller building ``StepState`` by hand) the proposal's float32 entropy is used.
    """

    theta: float | None = None
    #: its entropy comes from the logits; the proposal's is read only on hand-built states
    capabilities = Capabilities(budgeted=False, needs_logits=True, proposal_fields=(),
                                reads_masked_only=True, noise_kinds=("mask", "uniform"),
                                row_steps=True)

    def bind(self, model: Any, cfg: Any = None) -> EntropyThreshold:
        """With ``theta`` resolved for ``model``'s family (unchanged if given)."""
        if self.theta is not None:
            return self
        family = getattr(model, "family", "")
        return replace(self, theta=DPARALLEL_THETA.get(family, DPARALLEL_THETA["llada"]))

    @staticmethod
    def entropy(state: StepState) -> Tensor:
        """``[B, L]`` float64 entropy at the scored rows (``+inf`` elsewhere). No host sync."""
        if state.logits is None or state.rows is None:
            return (-state.proposal.neg_entropy.double()).masked_fill(~state.fresh, torch.inf)
        p = torch.softmax(state.logits.double(), dim=-1)
        h = -(p * torch.log(p + DPARALLEL_LOG_EPS)).sum(-1)  # [B, R]
        return to_canvas(h, state.rows, state.eligible.shape[1], torch.inf)

    def __post_init__(self) -> None:
        check_fields(self, "EntropyThreshold")
        if self.theta is not None:  # None: the family default, resolved at bind
            check_range("EntropyThreshold", "theta", self.theta, 0.0)

    def select(self, state: StepState) -> Tensor:
        theta = self.theta if self.theta is not None else DPARALLEL_THETA["llada"]
        h = self.entropy(state)
        return (state.eligible & (h < theta)) | top1_mask(-h, state.eligible)
