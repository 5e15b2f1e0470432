"""S2D2 presets and routers, and SDAR's base unmasking rules.

* ``low_confidence_dynamic`` (SDAR, Cheng et al., arXiv 2510.06303, ``JetAstra/SDAR
  generate.py``): commit every eligible position whose confidence is *strictly* above ``tau``
  when there are at least ``k`` (the scheduled budget) of them, else the top ``k``.
* S2D2's routers (Han et al., "S2D2: Fast Decoding for Diffusion LLMs via Training-Free
  Self-Speculation", arXiv 2603.25702, ``phymhan/S2D2``): whether verifying the first masked
  span pays off. A router has ``decide(ctx: RouteContext, memory) -> [B] bool`` and optionally
  ``init_memory(batch, device)`` (per-generation, per-row state: hysteresis, bandit) and
  ``update(ctx, memory, verified, committed)`` (the bandit's reward). The routers' acceptance
  guess ``K̂`` (``expected_accepted`` over an ``AcceptanceEstimator``'s per-position ``alpha``)
  is computed here too.
* the ``s2d2`` preset: the self-speculative selector of ``dllm_decode.policies.speculative``
  (``speculative.s2d2``, built from flat parameters) over these routers and fallbacks.

Deviations from the released code: ``low_confidence_dynamic`` ranks with ties to the lower index
and commits everything left at a block's last scheduled step; the score-hysteresis router
switches on with the code's strict ``>`` (the paper writes ``>=``); the EB fallback uses the
full-distribution entropy (the reference's SDAR fallback uses a scalar "entropy" of ``x0_p``).
The S2D2 selector's own list is in ``dllm_decode.policies.speculative``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.policies.adaptive import EntropyBounded
from dllm_decode.policies.base import step_score, topk_mask
from dllm_decode.policies.capabilities import (
    Capabilities,
    capabilities_of,
    score_fields,
    union_fields,
)
from dllm_decode.policies.confidence import TopK
from dllm_decode.policies.rows import last_step, per_row
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import ScoreKind, Selection, StepState


@dataclass(frozen=True)
class DynamicThreshold:
    """SDAR ``low_confidence_dynamic``: all eligible with score ``> tau`` if at least ``budget``
    of them, else the ``budget`` best (ties to the lower index). Uses SDAR's even budget split
    (``preferred_schedule``); the block's last scheduled step commits everything left."""

    tau: float = 0.85
    score: ScoreKind = ScoreKind.PROB

    @property
    def capabilities(self) -> Capabilities:
        """SDAR's even budget split, as a floor; reads the proposal field of ``score`` only;
        per-row steps left (``row_steps``)."""
        return Capabilities(preferred_schedule="llada", proposal_fields=score_fields(self.score),
                            at_least_budget=True,
                            reads_masked_only=True, row_steps=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "DynamicThreshold")
        if self.score in (ScoreKind.PROB, ScoreKind.MARGIN):
            check_range("DynamicThreshold", "tau", self.tau, 0.0, 1.0)

    def select(self, state: StepState) -> Tensor:
        score = step_score(state, self.score)
        rows = per_row(state.steps_left)
        if not rows and state.steps_left == 1:
            return state.eligible
        budget = state.budget
        if budget is None:
            budget = torch.ones(score.shape[0], dtype=torch.long, device=score.device)
        high = state.eligible & (score > self.tau)
        enough = high.sum(1) >= budget
        commit = torch.where(enough[:, None], high, topk_mask(score, state.eligible, budget))
        if rows:  # a row's last scheduled step commits everything left
            commit = torch.where(last_step(state)[:, None], state.eligible, commit)
        return commit


@dataclass(frozen=True)
class BudgetCapped:
    """Run an adaptive selector, then keep at most ``budget`` of its picks (best ``score``).

    S2D2 uses it to cap the EB-sampler fallback at the tokens still owed this step.
    """

    inner: Any
    score: ScoreKind = ScoreKind.NEG_ENTROPY

    @property
    def capabilities(self) -> Capabilities:
        """Budgeted; reads the inner selector's proposal fields and ``score``'s."""
        inner = capabilities_of(self.inner)
        return Capabilities(proposal_fields=union_fields(inner.proposal_fields,
                                                         score_fields(self.score)),
                            reads_masked_only=inner.reads_masked_only,
                            row_steps=inner.row_steps)

    def select(self, state: StepState) -> Tensor:
        chosen = self.inner.select(state)
        chosen = chosen.commit if isinstance(chosen, Selection) else chosen
        if state.budget is None:
            return chosen
        return chosen & topk_mask(step_score(state, self.score), chosen, state.budget)


@dataclass(frozen=True)
class RouteContext:
    """What a router sees (all ``[B]``): ``span_len``; ``expected`` = ``K̂``; ``n_high``
    eligible positions of the block with confidence above the fallback's ``tau``; ``progress``
    decoded fraction of the block; ``entropy`` mean normalised entropy over the span;
    ``block_len`` (int)."""

    span_len: Tensor
    expected: Tensor
    n_high: Tensor
    progress: Tensor
    entropy: Tensor
    block_len: int

    def score(self, kind: str, c: float) -> Tensor:
        """``static``: ``K̂ - c``; ``dynamic``: ``K̂ - c * N_hi``; ``-inf`` without a span."""
        s = self.expected - (c if kind == "static" else c * self.n_high)
        return torch.where(self.span_len > 0, s, -torch.inf)


def expected_accepted(alpha: Tensor, span: Tensor) -> Tensor:
    """``K̂ = sum_k prod_{j <= k} alpha_j`` over each row's span (``[B, S]`` -> ``[B]``):
    the expected accepted prefix if acceptances were independent with probabilities alpha."""
    before = (span.long().cumsum(1) == 0)  # positions left of the span do not stop the product
    factors = torch.where(span, alpha.clamp(0.0, 1.0), before.to(alpha.dtype))
    return (torch.cumprod(factors, dim=1) * span).sum(1)


ESTIMATORS = ("soft_entropy_negexp", "hard_margin_threshold", "hard_entropy_threshold",
              "soft_confidence_power", "soft_clipped_linear_margin", "soft_renyi_2_entropy")


@dataclass(frozen=True)
class AcceptanceEstimator:
    """Per-position acceptance guess ``alpha`` from the draft distribution (paper §routing).

    ``soft_entropy_negexp``: ``exp(-beta * H / log V)``; ``hard_margin_threshold``:
    ``p1 - p2 > margin``; ``hard_entropy_threshold``: ``H / log V < entropy_threshold``;
    ``soft_confidence_power``: ``conf ** power``; ``soft_clipped_linear_margin``:
    ``clip(coef * (p1 - p2), 0, 1)``; ``soft_renyi_2_entropy``: ``sum p^2``.
    """

    kind: str = "soft_entropy_negexp"
    beta: float = 1.0
    margin: float = 0.05
    entropy_threshold: float = 0.5
    power: float = 1.0
    coef: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {list(ESTIMATORS)}, got {self.kind!r}")

    def __call__(self, p: Tensor, conf: Tensor) -> Tensor:
        """``p [B, S, V]`` draft distribution, ``conf [B, S]`` prob of the draft -> ``[B, S]``."""
        kind = self.kind
        if kind == "soft_confidence_power":
            return conf.clamp(0.0, 1.0) ** self.power
        if kind == "soft_renyi_2_entropy":
            return (p * p).sum(-1).clamp(0.0, 1.0)
        if kind in ("hard_margin_threshold", "soft_clipped_linear_margin"):
            top2 = p.topk(2, dim=-1).values
            margin = top2[..., 0] - top2[..., 1]
            if kind == "hard_margin_threshold":
                return (margin > self.margin).to(p.dtype)
            return (self.coef * margin).clamp(0.0, 1.0)
        h = normalised_entropy(p)
        if kind == "hard_entropy_threshold":
            return (h < self.entropy_threshold).to(p.dtype)
        return torch.exp(-self.beta * h)


def normalised_entropy(p: Tensor) -> Tensor:
    """``H(p) / log V`` in ``[0, 1]`` (``[..., V]`` -> ``[...]``)."""
    return -(p * p.clamp_min(1e-12).log()).sum(-1) / math.log(p.shape[-1])


def _check_kind(kind: str) -> None:
    if kind not in ("static", "dynamic"):
        raise ValueError(f"score_type must be 'static' or 'dynamic', got {kind!r}")


@dataclass(frozen=True)
class Never:
    """Never verify: the base rule alone (equals decoding with the fallback policy)."""

    def decide(self, ctx: RouteContext, memory: Any) -> Tensor:
        return torch.zeros_like(ctx.span_len, dtype=torch.bool)


@dataclass(frozen=True)
class Always:
    """Verify whenever there is a span."""

    def decide(self, ctx: RouteContext, memory: Any) -> Tensor:
        return ctx.span_len > 0


@dataclass(frozen=True)
class MaskSpanLength:
    """Verify iff the span has at least ``tau_span`` positions."""

    tau_span: int = 1

    def decide(self, ctx: RouteContext, memory: Any) -> Tensor:
        return (ctx.span_len >= self.tau_span) & (ctx.span_len > 0)


@dataclass(frozen=True)
class ScoreThreshold:
    """Verify iff the score ``>= tau_score``."""

    tau_score: float = 0.0
    kind: str = "static"
    c: float = 1.0

    def __post_init__(self) -> None:
        _check_kind(self.kind)

    def decide(self, ctx: RouteContext, memory: Any) -> Tensor:
        return ctx.score(self.kind, self.c) >= self.tau_score


@dataclass(frozen=True)
class ScoreHysteresis:
    """On/off per row: when on, stay on unless the score ``< tau_off``; when off, switch on iff
    the score ``> tau_on`` (the reference code's strict ``>``). Memory: ``[B]`` bool."""

    tau_on: float = 1.0
    tau_off: float = -5.0
    kind: str = "dynamic"
    c: float = 1.0

    def __post_init__(self) -> None:
        _check_kind(self.kind)
        if not self.tau_on > self.tau_off:
            raise ValueError(f"tau_on ({self.tau_on}) must be > tau_off ({self.tau_off})")

    def init_memory(self, batch: int, device: torch.device) -> Tensor:
        return torch.zeros(batch, dtype=torch.bool, device=device)

    def decide(self, ctx: RouteContext, memory: Tensor) -> Tensor:
        s = ctx.score(self.kind, self.c)
        on = torch.where(memory, ~(s < self.tau_off), s > self.tau_on)
        memory.copy_(torch.where(ctx.span_len > 0, on, memory))
        return on & (ctx.span_len > 0)


@dataclass
class BanditMemory:
    """Per-row UCB statistics: ``count`` / ``reward`` ``[B, 2, buckets]``, ``t [B]``."""

    count: Tensor
    reward: Tensor
    t: Tensor


@dataclass(frozen=True)
class ContextualBanditUCB:
    """UCB over actions {skip, verify} per context bucket (span length x block progress x span
    entropy bins, 2 each = 8 buckets); score ``mu + beta * sqrt(log t / n)``, untried actions
    first, ties to verify; reward = tokens committed / forwards spent this step."""

    beta: float = 1.0
    bins: tuple[int, int, int] = (2, 2, 2)

    def init_memory(self, batch: int, device: torch.device) -> BanditMemory:
        n = self.bins[0] * self.bins[1] * self.bins[2]
        z = torch.zeros(batch, 2, n, dtype=torch.float64, device=device)
        return BanditMemory(z, z.clone(), torch.zeros(batch, dtype=torch.long, device=device))

    def bucket(self, ctx: RouteContext) -> Tensor:
        def bin_of(x: Tensor, lo: float, hi: float, n: int) -> Tensor:
            if n <= 1 or hi <= lo:
                return torch.zeros_like(x, dtype=torch.long)
            ratio = (x.double().clamp(lo, hi) - lo) / (hi - lo)
            return (ratio * n).long().clamp(0, n - 1)

        ns, npr, ne = self.bins
        span = bin_of(ctx.span_len.clamp(min=1), 1.0, float(max(1, ctx.block_len)), ns)
        prog = bin_of(ctx.progress, 0.0, 1.0, npr)
        ent = bin_of(ctx.entropy, 0.0, 1.0, ne)
        return (span * npr + prog) * ne + ent

    def decide(self, ctx: RouteContext, memory: BanditMemory) -> Tensor:
        live = ctx.span_len > 0
        memory.t += live.long()
        at = self.bucket(ctx)[:, None, None].expand(-1, 2, 1)
        n = memory.count.gather(2, at)[..., 0]  # [B, 2]
        mu = memory.reward.gather(2, at)[..., 0] / n.clamp(min=1)
        log_t = memory.t.clamp(min=1).double().log()[:, None]
        bonus = torch.where(log_t > 0, self.beta * (log_t / n.clamp(min=1)).sqrt(), 0.0)
        ucb = torch.where(n == 0, torch.inf, mu + bonus)
        return live & (ucb[:, 1] >= ucb[:, 0])

    def update(self, ctx: RouteContext, memory: BanditMemory, verified: Tensor,
               committed: Tensor) -> None:
        live = (ctx.span_len > 0).double()
        at = (self.bucket(ctx) + verified.long() * memory.count.shape[2])[:, None]
        flat_n = memory.count.view(memory.count.shape[0], -1)
        flat_r = memory.reward.view(memory.reward.shape[0], -1)
        reward = committed.double() / (1.0 + verified.double())
        flat_n.scatter_add_(1, at, live[:, None])
        flat_r.scatter_add_(1, at, (reward * live)[:, None])


#: S2D2's fallback rules, by the names the reference script uses
FALLBACKS = {
    "low_confidence_dynamic": lambda tau, eb_gamma: DynamicThreshold(tau=tau),
    "low_confidence_static": lambda tau, eb_gamma: TopK(score=ScoreKind.PROB),
    "entropy_bounded": lambda tau, eb_gamma: BudgetCapped(EntropyBounded(gamma=eb_gamma)),
}
