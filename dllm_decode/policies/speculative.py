"""S2D2: self-speculative decoding for block-diffusion LMs.

L. Han, H. Wang, H. Gao, K. Xu, A. Srivastava, "S2D2: Fast Decoding for Diffusion LLMs via
Training-Free Self-Speculation", arXiv 2603.25702 (reference code ``phymhan/S2D2``).

A block-diffusion model with block size 1 is an autoregressive model, so the same weights draft
(block mode, the step's ordinary forward) and verify (block-size-1 mode, one extra forward). Per
step: take the first contiguous run of eligible positions of the block (the *span*); a router
decides whether verifying pays off; if so the "2L" forward yields the AR conditionals
``q_j(. | prefix, draft_<j)`` and the span is accepted left to right with the speculative rule
``r_j = min(1, (q_j(x_j) / p_j(x_j))^gamma)``, the first rejected position being resampled from
``normalise(max(q - p, 0))``; a base rule commits the rest of the scheduled budget.

The routers (``never``, ``always``, ``mask_span_length``, ``score_threshold``,
``score_hysteresis``, ``contextual_bandit_ucb``) are policy objects with per-generation memory;
they live in ``dllm_decode.policies.s2d2`` with SDAR's base rules and the acceptance
estimators that feed them, and are re-exported here.
``s2d2`` below builds the selector from flat parameters (the ``s2d2`` preset).

Shapes: ``B`` batch, ``S`` positions of the current (absolute-aligned) block, ``V`` vocabulary.

Deviations from the paper / released code (``phymhan/S2D2`` ``SDAR/generate_ssd_policy.py``):

* batched, per row (the reference asserts batch 1); one host sync per step (does any row
  verify), where the reference syncs per position;
* ``draft_causal`` (``draft_ver``) recomputes the draft-causal rows every step from the
  current first mask; the reference writes them into its block mask in place, so with
  ``cache_ver`` off its final K/V store of a block also uses them (not reproduced);
* not implemented: ``ssd_ratio_threshold`` / ``ssd_threshold_all_spans`` (ratio-based extra
  commits, off by default in the reference), ``always_check_high_confidence``, the
  ``sequential`` fallback, ``legacy_ssd_span_strategy``, the bandit's ``masked`` entropy
  source, LLaDA2.1 token editing, and the sub-block / right-shifted Fast-dLLM v2 variant;
* acceptance uniforms and the residual resample (an exponential race) come from the step
  generator, so seeded runs are reproducible but do not replay the reference's draws;
* the mask token is never drafted (its logit is -inf in the draft and verifier distributions);
* refused (at bind) on a model that declares ``supports_causal_in_block = False`` unless
  ``router="never"``, ``draft_causal=False`` and ``causal_prefix=False``: the reference assumes
  AR-initialised models (SDAR, LLaDA2.1, Fast-dLLM v2); a block-diffusion model trained only
  in its own blocks (``testbed-llada2``) decodes under 1 % of held-out prompts with the
  defaults or with ``draft_causal=False`` alone (its block-size-1 verifier is untrained).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from dllm_decode.policies.base import init_memory_of
from dllm_decode.policies.capabilities import Capabilities, capabilities_of
from dllm_decode.policies.s2d2 import (  # noqa: F401  (routers, estimators re-exported here)
    ESTIMATORS,
    FALLBACKS,
    AcceptanceEstimator,
    Always,
    BanditMemory,
    ContextualBanditUCB,
    DynamicThreshold,
    MaskSpanLength,
    Never,
    RouteContext,
    ScoreHysteresis,
    ScoreThreshold,
    expected_accepted,
    normalised_entropy,
)
from dllm_decode.types import Selection, StepModel, StepState


def two_l_mask(block: int, cache_len: int, device: torch.device | str = "cpu") -> Tensor:
    """``[2L, cache_len + 2L]`` bool attention of the 2L verifier input (True = visible).

    Keys are ``[cache | first half (draft-filled block) | second half (all MASK)]``. Every query
    sees the cache; first-half queries see the first half causally (diagonal included);
    second-half query ``j`` sees first-half keys ``< j`` and itself only, so its logits are the
    block-size-1 conditional at position ``j`` given the prefix and ``draft_<j``.
    """
    n = block
    mask = torch.zeros(2 * n, cache_len + 2 * n, dtype=torch.bool, device=device)
    mask[:, :cache_len] = True
    ones = torch.ones(n, n, dtype=torch.bool, device=device)
    mask[:n, cache_len:cache_len + n] = torch.tril(ones)
    mask[n:, cache_len:cache_len + n] = torch.tril(ones, diagonal=-1)
    mask[n:, cache_len + n:] = torch.eye(n, dtype=torch.bool, device=device)
    return mask


def verify_logits(model: StepModel, draft_block: Tensor, start: int,
                  active: Tensor | None = None) -> Tensor:
    """One 2L forward: ``draft_block [B, S]`` at canvas ``[start, start + S)`` -> ``q`` logits
    ``[B, S, V]`` (row ``j``: the block-size-1 prediction of position ``start + j``).

    Keys ``< start`` come from ``model`` (the prefix cache); nothing is stored. With the prefix
    cached causally (``causal_prefix``) this equals a true block-size-1 forward.
    """
    b, s = draft_block.shape
    length = model.valid.shape[1]
    device = draft_block.device
    pos = model.positions[:, start:start + s]
    tokens = torch.cat([draft_block, torch.full_like(draft_block, model.mask_token_id)], 1)
    shape = two_l_mask(s, 0, device)  # [2S, 2S]
    first_valid = torch.cat([model.valid[:, start:start + s],
                             torch.ones(b, s, dtype=torch.bool, device=device)], 1)
    fresh = shape[None] & (first_valid[:, None, :] | torch.eye(2 * s, dtype=torch.bool,
                                                               device=device)[None])
    prefix = model.valid & (torch.arange(length, device=device) < start)[None]
    mask = torch.cat([prefix[:, None, :].expand(-1, 2 * s, -1), fresh], dim=2)
    logits = model.forward(tokens, torch.cat([pos, pos], 1), mask, active)
    return logits[:, s:]



class Accepted(NamedTuple):
    """Outcome of ``speculative_accept`` (all ``[B, S]`` except ``accepted [B]``)."""

    commit: Tensor  # accepted prefix of the span plus the first rejected position
    tokens: Tensor  # drafts, with the resampled token at the rejected position
    resampled: Tensor  # the rejected (resampled) position
    accepted: Tensor  # number of drafts accepted per row


def first_span(eligible: Tensor) -> Tensor:
    """``[B, S]`` bool: the first maximal run of ``eligible`` positions in each row."""
    idx = torch.arange(eligible.shape[1], device=eligible.device)
    first = torch.where(eligible.any(1), eligible.long().argmax(1), eligible.shape[1])
    after = idx[None] >= first[:, None]
    return eligible & after & ((~eligible & after).long().cumsum(1) == 0)


def speculative_accept(draft: Tensor, p: Tensor, q: Tensor, span: Tensor, u: Tensor, *,
                       gamma: float = 1.0, generator: torch.Generator | None = None,
                       allow_resample: bool = True) -> Accepted:
    """Speculative acceptance over a contiguous span, left to right.

    Args:
        draft: ``[B, S]`` drafted tokens; p, q: ``[B, S, V]`` draft and verifier distributions.
        span: ``[B, S]`` bool, contiguous per row (empty rows commit nothing).
        u: ``[B, S]`` uniforms in ``[0, 1)``; draft ``j`` is accepted iff ``u_j < r_j`` with
            ``r_j = min(1, (q_j(x_j) / p_j(x_j))^gamma)`` and all earlier ones were.
        generator: for the resample (an exponential race, no host sync).
        allow_resample: draw the first rejected position from ``normalise(max(q - p, 0))``
            (``q`` if that has no mass); otherwise keep its draft.

    With ``gamma = 1`` and ``draft ~ p`` the first committed token is distributed as ``q`` and
    the first draft is accepted with probability ``sum_v min(p(v), q(v))``.
    """
    s = draft.shape[1]
    idx = torch.arange(s, device=draft.device)
    p_x = p.gather(-1, draft[..., None])[..., 0].clamp_min(1e-12)
    q_x = q.gather(-1, draft[..., None])[..., 0].clamp_min(0.0)
    ratio = ((q_x / p_x) ** gamma).clamp(max=1.0)
    rejected = span & ~(u < ratio)
    first_rej = torch.where(rejected.any(1), rejected.long().argmax(1), s)
    accept = span & (idx[None] < first_rej[:, None])
    at_rej = span & (idx[None] == first_rej[:, None])
    tokens = draft
    if allow_resample:
        j = first_rej.clamp(max=s - 1)[:, None, None].expand(-1, 1, q.shape[-1])
        q_j, p_j = q.gather(1, j)[:, 0], p.gather(1, j)[:, 0]  # [B, V]
        resid = (q_j - p_j).clamp_min(0.0)
        weight = torch.where(resid.sum(-1, keepdim=True) > 0, resid, q_j)
        race = weight / torch.empty_like(weight).exponential_(1, generator=generator)
        tokens = torch.where(at_rej, race.argmax(-1)[:, None], draft)
    return Accepted(accept | at_rej, tokens, at_rej, accept.sum(1))



@dataclass
class S2D2Memory:
    """Per-generation S2D2 state: the router's memory, the base rule's, and counters ``[B]``
    (steps verified, drafts accepted, tokens committed by verification)."""

    router: Any
    base: Any
    verified: Tensor
    accepted: Tensor
    committed: Tensor


@dataclass(frozen=True)
class SelfSpeculative:
    """S2D2 selector: route, verify the first span with the 2L forward, accept, fall back.

    Block-diffusion models only (``state.model.block_size``); prefers ``cache="block_causal"``
    (works with ``none``, recomputing the prefix inside the verify forward) and AR-like prefix
    caching (``causal_prefix``, the reference's ``cache_ver``), under which the verifier equals
    a true block-size-1 forward. ``draft_causal`` (the reference's ``draft_ver``, paper Eq. 4;
    both on in Config-A, the default): in the step's draft forward, the already-decoded
    positions of the current block left of its first mask attend causally, as they will in the
    verifier and in the AR-like cache, so the draft of the masked positions is conditioned on
    the same prefix representations (declared as the ``draft_causal`` capability; the sampler
    passes it to the cache plan).
    Fewer than ``min(budget, eligible)`` commits from verification -> ``base`` commits the
    rest of that budget among the remaining positions; on the block's last scheduled step
    every remaining position is committed (an adaptive base may commit fewer than owed).

    Host syncs: one per step (whether any row verifies), besides the sampler's own.
    Stochastic: acceptance draws uniforms from the step generator even when greedy.
    """

    router: Any = field(default_factory=ScoreThreshold)
    estimator: AcceptanceEstimator = field(default_factory=AcceptanceEstimator)
    base: Any = None
    tau: float = 0.85
    gamma: float = 1.0
    allow_resample: bool = True
    causal_prefix: bool = True
    draft_causal: bool = True

    @property
    def capabilities(self) -> Capabilities:
        """Block-causal models only; logits, extra verifier forwards, random acceptance;
        accepted drafts may exceed the step's budget (the base rule's floor). The verifier
        (any router but ``never``), ``draft_causal`` and ``causal_prefix`` run the model
        causally inside a block: refused at bind on a model declaring it was not trained
        for that (``capabilities.check_model_needs``)."""
        return Capabilities(needs_logits=True, preferred_cache="block_causal",
                            at_least_budget=True,
                            preferred_schedule="llada", causal_prefix=self.causal_prefix,
                            draft_causal=self.draft_causal,
                            causal_forwards=not isinstance(self.router, Never),
                            requires_attention="block_causal",
                            extra_forwards=True, stochastic=True,
                            proposal_fields=capabilities_of(self.base).proposal_fields)

    def __post_init__(self) -> None:
        if self.base is None:
            object.__setattr__(self, "base", DynamicThreshold(tau=self.tau))
        if self.gamma <= 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")

    def init_memory(self, batch: int, length: int, device: torch.device) -> S2D2Memory:
        init = getattr(self.router, "init_memory", None)
        z = torch.zeros(batch, dtype=torch.long, device=device)
        return S2D2Memory(router=init(batch, device) if init else None,
                          base=init_memory_of(self.base, batch, length, device),
                          verified=z, accepted=z.clone(), committed=z.clone())

    def select(self, state: StepState) -> Selection:
        model = state.model
        if model is None or not model.block_size or state.logits is None:
            raise ValueError("S2D2 needs a block-diffusion model (attention='block_causal'): "
                             "it verifies with the same weights in block-size-1 mode")
        if state.rows is None or state.rows.dim() != 1:
            raise ValueError("S2D2 needs contiguous logits (cache 'block_causal' or 'none')")
        mem = state.memory
        start, end = (state.block_start // model.block_size) * model.block_size, state.block_end
        s = end - start
        at = (torch.arange(start, end, device=state.rows.device) - state.rows[0])
        draft_logits = state.logits[:, at.clamp(0, state.logits.shape[1] - 1)]
        p = model.probs(draft_logits)  # [B, S, V]
        draft = state.proposal.tokens[:, start:end]
        eligible = state.eligible[:, start:end]
        span = first_span(eligible)
        conf = p.gather(-1, draft[..., None])[..., 0]
        span_len = span.sum(1)
        ent = torch.where(span, normalised_entropy(p), 0.0).sum(1) / span_len.clamp(min=1)
        ctx = RouteContext(
            span_len=span_len,
            expected=expected_accepted(self.estimator(p, conf), span),
            n_high=(eligible & (state.proposal.prob[:, start:end] > self.tau)).sum(1),
            progress=(~state.masked[:, state.block_start:end]).sum(1).double() / s,
            entropy=ent.double(), block_len=s)
        verify = self.router.decide(ctx, mem.router) & (span_len > 0)
        commit = torch.zeros_like(state.eligible)
        tokens, prob = state.proposal.tokens, state.proposal.prob
        # sync: run the verify forward only when some row asks for it
        if bool(verify.any()):
            block = torch.where(state.masked[:, start:end], draft, state.canvas[:, start:end])
            q = model.probs(verify_logits(model, block, start, active=verify))
            u = torch.rand(draft.shape, generator=state.generator, device=draft.device)
            out = speculative_accept(draft, p, q, span & verify[:, None], u, gamma=self.gamma,
                                     generator=state.generator,
                                     allow_resample=self.allow_resample)
            commit[:, start:end] = out.commit
            tokens = tokens.clone()
            tokens[:, start:end] = out.tokens
            q_tok = q.gather(-1, out.tokens[..., None])[..., 0]
            prob = prob.clone()
            prob[:, start:end] = torch.where(out.resampled, q_tok, prob[:, start:end])
            mem.verified += verify.long()
            mem.accepted += out.accepted
            mem.committed += out.commit.sum(1)
        done = commit.sum(1)
        budget = state.budget if state.budget is not None else torch.ones_like(done)
        min_k = torch.minimum(budget, state.eligible.sum(1))
        owed = (min_k - done).clamp(min=0)
        rest = replace(state, eligible=state.eligible & ~commit, budget=owed, memory=mem.base)
        extra = self.base.select(rest)
        extra = extra.commit if isinstance(extra, Selection) else extra
        extra = extra & (owed > 0)[:, None]
        if state.steps_left == 1:  # the block's last scheduled step: nothing may stay masked
            extra = rest.eligible
        commit = commit | extra
        update = getattr(self.router, "update", None)
        if update is not None:
            update(ctx, mem.router, verify, commit.sum(1))
        return Selection(commit, tokens, prob)


def s2d2(
    *,
    router: str = "score_threshold",
    score_type: str | None = None,
    tau_score: float = 0.0,
    c: float = 1.0,
    tau_on: float = 1.0,
    tau_off: float = -5.0,
    tau_span: int = 1,
    ucb_beta: float = 1.0,
    ucb_bins: tuple[int, int, int] = (2, 2, 2),
    estimator: str = "soft_entropy_negexp",
    entropy_temperature: float = 1.0,
    margin_threshold: float = 0.05,
    entropy_threshold: float = 0.5,
    confidence_power: float = 1.0,
    margin_coef: float = 1.0,
    fallback: str = "low_confidence_dynamic",
    tau: float = 0.85,
    eb_gamma: float = 0.1,
    gamma: float = 1.0,
    allow_resample: bool = True,
    causal_prefix: bool = True,
    draft_causal: bool = True,
) -> Any:
    """Build the S2D2 selector (defaults: SDAR Config-A of the paper's README: score threshold
    0, static score, c = 1, soft entropy estimator, dynamic-threshold fallback at 0.85,
    AR-like prefix caching ``causal_prefix`` = ``cache_ver``, partially-causal drafting
    ``draft_causal`` = ``draft_ver``).

    ``router``: ``never`` | ``always`` | ``mask_span_length`` (``tau_span``) |
    ``score_threshold`` (``tau_score``) | ``score_hysteresis`` (``tau_on`` > ``tau_off``) |
    ``contextual_bandit_ucb`` (``ucb_beta``, ``ucb_bins``); ``score_type`` ``static``
    (K̂ − c) or ``dynamic`` (K̂ − c·N_hi), ``None``: the router's default (threshold static,
    hysteresis dynamic, as in the paper's configurations); ``estimator``: see
    ``s2d2.ESTIMATORS``; ``fallback``: see ``FALLBACKS``.
    """
    kind = {} if score_type is None else {"kind": score_type}
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {sorted(FALLBACKS)}, got {fallback!r}")
    routers = {
        "never": lambda: Never(),
        "always": lambda: Always(),
        "mask_span_length": lambda: MaskSpanLength(tau_span),
        "score_threshold": lambda: ScoreThreshold(tau_score, c=c, **kind),
        "score_hysteresis": lambda: ScoreHysteresis(tau_on, tau_off, c=c, **kind),
        "contextual_bandit_ucb": lambda: ContextualBanditUCB(ucb_beta, tuple(ucb_bins)),
    }
    if router not in routers:
        raise ValueError(f"router must be one of {sorted(routers)}, got {router!r}")
    est = AcceptanceEstimator(estimator, beta=entropy_temperature, margin=margin_threshold,
                              entropy_threshold=entropy_threshold, power=confidence_power,
                              coef=margin_coef)
    return SelfSpeculative(router=routers[router](), estimator=est,
                           base=FALLBACKS[fallback](tau, eb_gamma), tau=tau, gamma=gamma,
                           allow_resample=allow_resample, causal_prefix=causal_prefix,
                           draft_causal=draft_causal)
