"""S2D2 (arXiv 2603.25702): verifier, speculative law, routers, NFE accounting, base equality."""

from __future__ import annotations

import importlib

import pytest
import torch

from dllm_decode import Capabilities, DiffusionSampler, make_policy
from dllm_decode.policies.speculative import (
    AcceptanceEstimator,
    ContextualBanditUCB,
    RouteContext,
    ScoreHysteresis,
    SelfSpeculative,
    expected_accepted,
    first_span,
    speculative_accept,
    two_l_mask,
    verify_logits,
)
from dllm_decode.types import ScoreKind, Selection
from tests.helpers import EOS, MASK, tiny_model


@pytest.fixture(autouse=True, scope="module")
def _register_presets() -> None:
    """Register the presets at run time, not at collection: ``test_sampler`` runs every preset
    on every model family, and these ones are family-specific."""
    importlib.import_module("dllm_decode.policies.s2d2")


SDAR = tiny_model("sdar", seed=7)


def _prompt(b: int, p: int, seed: int) -> torch.Tensor:
    return torch.randint(0, EOS, (b, p), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cache", ["block_causal", "none"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_never_router_equals_base_decoder(cache: str, temperature: float) -> None:
    kw = dict(cache=cache, gen_length=16, temperature=temperature, seed=3)
    prompt = _prompt(2, 6, 1)
    # draft_ver changes the draft forward itself (test_draft_causal_*): the identity holds for
    # the plain block-causal draft
    spec = DiffusionSampler(SDAR, "s2d2", router="never", draft_causal=False, debug=True,
                            **kw).generate(prompt)
    base = DiffusionSampler(SDAR, "low_confidence_dynamic", causal_prefix=True,
                            **kw).generate(prompt)
    assert torch.equal(spec.tokens, base.tokens)
    assert spec.forwards == base.forwards and torch.equal(spec.nfe, base.nfe)


def test_two_l_mask_matches_spec() -> None:
    t, f = True, False
    expected = torch.tensor([
        # cache    | first half  | second half
        [t, t, t, t, f, f, f, f, f, f, f],
        [t, t, t, t, t, f, f, f, f, f, f],
        [t, t, t, t, t, t, f, f, f, f, f],
        [t, t, t, t, t, t, t, f, f, f, f],
        [t, t, t, f, f, f, f, t, f, f, f],
        [t, t, t, t, f, f, f, f, t, f, f],
        [t, t, t, t, t, f, f, f, f, t, f],
        [t, t, t, t, t, t, f, f, f, f, t],
    ])
    assert torch.equal(two_l_mask(4, 3), expected)


@pytest.mark.parametrize("cache", ["block_causal", "none"])
def test_verifier_equals_true_block_size_one_forward(cache: str) -> None:
    """Second-half logits == ``with_block_size(1)`` on prefix + draft_<j + [MASK]."""
    records = []

    class Probe:
        capabilities = Capabilities(causal_prefix=True)

        def select(self, state):
            size = state.model.block_size
            start = (state.block_start // size) * size
            block = torch.where(state.masked, state.proposal.tokens, state.canvas)
            block = block[:, start:state.block_end]
            q = verify_logits(state.model, block, start)
            records.append((state.canvas.clone(), block, start, q))
            commit = state.eligible & (state.eligible.long().cumsum(1) == 1)
            return commit

    DiffusionSampler(SDAR, Probe(), cache=cache, gen_length=10).generate(_prompt(2, 7, 2))
    causal = SDAR.with_block_size(1)
    assert len(records) == 10
    for canvas, block, start, q in records:
        for j in range(block.shape[1]):
            tokens = torch.cat([canvas[:, :start], block[:, :j],
                                torch.full((2, 1), MASK)], dim=1)
            pos = torch.arange(tokens.shape[1]).expand(2, -1)
            with torch.no_grad():
                ref = causal(tokens, pos)[:, -1]
            assert (q[:, j] - ref).abs().max().item() <= 1e-5


def test_speculative_law_monte_carlo() -> None:
    """Draft x ~ p, verify with q: the first committed token ~ q; P(accept) = sum min(p, q)."""
    gen = torch.Generator().manual_seed(0)
    v, n = 6, 60000
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.07, 0.03])
    q = torch.tensor([0.10, 0.30, 0.05, 0.25, 0.20, 0.10])
    draft = torch.multinomial(p, n, replacement=True, generator=gen)[:, None]
    pp, qq = p.expand(n, 1, v), q.expand(n, 1, v)
    span = torch.ones(n, 1, dtype=torch.bool)
    u = torch.rand(n, 1, generator=gen)
    out = speculative_accept(draft, pp, qq, span, u, generator=gen)
    assert out.commit.all()
    freq = torch.bincount(out.tokens[:, 0], minlength=v).double() / n
    assert (freq - q.double()).abs().max() < 0.012
    rate = out.accepted.double().mean()
    assert abs(rate - torch.minimum(p, q).sum().double()) < 0.012


def test_accept_prefix_then_one_resample() -> None:
    p = torch.full((1, 4, 3), 1 / 3)
    q = p.clone()
    q[0, 2] = torch.tensor([0.0, 0.5, 0.5])  # draft token 0 impossible under q at j = 2
    draft = torch.zeros(1, 4, dtype=torch.long)
    span = torch.tensor([[False, True, True, True]])
    out = speculative_accept(draft, p, q, span, torch.zeros(1, 4))
    assert out.commit.tolist() == [[False, True, True, False]]
    assert out.resampled.tolist() == [[False, False, True, False]]
    assert out.accepted.tolist() == [1] and out.tokens[0, 2] in (1, 2)


def _context_free_model():
    """Attention outputs zeroed: logits depend on the position's own token only, so the
    block-size-1 verifier sees exactly the draft distribution (q == p)."""
    model = tiny_model("sdar", seed=5)
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.o_proj.weight.zero_()
    return model


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("cache", ["block_causal", "none"])
def test_q_equals_p_accepts_the_whole_span(temperature: float, cache: str) -> None:
    model = _context_free_model()
    mems = []
    # a left-padded row (padding of a whole block: prompts of other phases decode apart)
    mask = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [1] * 8])
    out = DiffusionSampler(model, "s2d2", router="always", cache=cache, gen_length=16,
                           temperature=temperature, debug=True).generate(
        _prompt(2, 8, 3), mask, on_step=lambda s, c: mems.append(s.memory))
    assert out.steps == 4  # one step per block: the whole first span (the block) is accepted
    mem = mems[-1]
    assert mem.accepted.tolist() == [16, 16] and mem.verified.tolist() == [4, 4]


def test_expected_accepted_arithmetic() -> None:
    all3 = torch.ones(1, 3, dtype=torch.bool)
    assert expected_accepted(torch.tensor([[1.0, 1.0, 0.5]]), all3).item() == pytest.approx(2.5)
    assert expected_accepted(torch.tensor([[0.0, 1.0]]), all3[:, :2]).item() == 0.0
    shifted = torch.tensor([[False, True, True, False]])  # positions outside the span ignored
    alpha = torch.tensor([[0.0, 0.5, 0.5, 0.0]])
    assert expected_accepted(alpha, shifted).item() == pytest.approx(0.75)


def test_first_span() -> None:
    elig = torch.tensor([[False, True, True, False, True], [False] * 5, [True] * 5])
    assert first_span(elig).tolist() == [[False, True, True, False, False], [False] * 5,
                                         [True] * 5]


def _ctx(expected: list[float], n_high: list[int] | None = None) -> RouteContext:
    x = torch.tensor(expected, dtype=torch.float64)
    return RouteContext(span_len=torch.ones(len(expected), dtype=torch.long), expected=x,
                        n_high=torch.tensor(n_high or [0] * len(expected)),
                        progress=torch.zeros(len(expected), dtype=torch.float64),
                        entropy=torch.zeros(len(expected), dtype=torch.float64), block_len=4)


def test_hysteresis_trace() -> None:
    router = ScoreHysteresis(tau_on=1.0, tau_off=-1.0, kind="static", c=0.0)
    memory = router.init_memory(1, torch.device("cpu"))
    scores = [0.0, 1.0, 1.5, 0.0, -0.5, -1.0, -1.5, 0.5, 1.0, 2.0]
    trace = [bool(router.decide(_ctx([s]), memory)) for s in scores]
    assert trace == [False, False, True, True, True, True, False, False, False, True]


def test_dynamic_score_subtracts_high_confidence_count() -> None:
    ctx = _ctx([3.0, 3.0], n_high=[0, 2])
    assert ctx.score("dynamic", 1.0).tolist() == [3.0, 1.0]
    assert ctx.score("static", 1.0).tolist() == [2.0, 2.0]


def test_bandit_tries_both_actions_then_exploits() -> None:
    router = ContextualBanditUCB()
    memory = router.init_memory(1, torch.device("cpu"))
    ctx = _ctx([0.0])
    choices = []
    for _ in range(6):
        verify = router.decide(ctx, memory)
        choices.append(bool(verify))
        committed = torch.tensor([8 if verify else 1])  # verifying pays: 4 vs 1 per forward
        router.update(ctx, memory, verify, committed)
    assert choices[:2] == [True, False] and all(choices[2:])
    assert memory.count.sum().item() == 6


def test_estimators() -> None:
    p = torch.tensor([[[0.97, 0.01, 0.01, 0.01], [0.25, 0.25, 0.25, 0.25]]])
    conf = torch.tensor([[0.97, 0.25]])
    hard = AcceptanceEstimator("hard_margin_threshold")(p, conf)
    assert hard.tolist() == [[1.0, 0.0]]
    soft = AcceptanceEstimator("soft_entropy_negexp")(p, conf)
    assert soft[0, 1].item() == pytest.approx(torch.exp(torch.tensor(-1.0)).item(), abs=1e-6)
    for kind in ("hard_entropy_threshold", "soft_confidence_power",
                 "soft_clipped_linear_margin", "soft_renyi_2_entropy"):
        a = AcceptanceEstimator(kind)(p, conf)
        assert ((a >= 0) & (a <= 1)).all() and a[0, 0] > a[0, 1]
    with pytest.raises(ValueError, match="estimator must be one of"):
        AcceptanceEstimator("psychic")


def test_nfe_counts_the_verify_forward() -> None:
    seen = []

    def record(state, commit):
        seen.append((state.eligible.any(1).clone(), state.memory.verified.clone()))

    out = DiffusionSampler(SDAR, "s2d2", router="always", gen_length=12, temperature=0.8,
                           seed=1).generate(_prompt(2, 5, 4), on_step=record)
    verified = seen[-1][1]
    steps_with_verify, before = 0, torch.zeros(2, dtype=torch.long)
    for _, now in seen:  # one batched verify forward whenever some row verified
        steps_with_verify += int((now != before).any())
        before = now
    assert steps_with_verify > 0
    assert out.forwards == out.steps + steps_with_verify
    active = torch.stack([e for e, _ in seen]).long().sum(0)
    assert torch.equal(out.nfe, active + verified)


def test_selector_returns_selection_and_resampled_tokens_are_committed() -> None:
    out = DiffusionSampler(SDAR, "s2d2", router="always", gen_length=8, temperature=1.0,
                           debug=True, seed=2).generate(_prompt(1, 4, 5))
    assert (out.answer != MASK).all() and out.forwards > out.steps


def test_error_on_bidirectional_model() -> None:
    llada = tiny_model("llada", seed=1)
    with pytest.raises(ValueError, match="block-diffusion"):
        DiffusionSampler(llada, "s2d2", gen_length=4).generate(_prompt(1, 3, 0))
    with pytest.raises(ValueError, match="block-diffusion"):
        DiffusionSampler(llada, "s2d2", cache="none", gen_length=4).generate(_prompt(1, 3, 0))


def test_presets_and_parameters() -> None:
    policy = make_policy("s2d2", router="score_hysteresis", fallback="entropy_bounded",
                         estimator="hard_margin_threshold")
    assert isinstance(policy.selector, SelfSpeculative)
    assert policy.selector.capabilities.preferred_cache == "block_causal"
    assert DiffusionSampler(SDAR, "s2d2").config.cache.value == "block_causal"
    for bad, match in [(dict(router="sometimes"), "router must be one of"),
                       (dict(fallback="greedy"), "fallback must be one of"),
                       (dict(router="score_hysteresis", tau_on=-9.0), "tau_on")]:
        with pytest.raises(ValueError, match=match):
            make_policy("s2d2", **bad)
    for fallback in ("low_confidence_static", "entropy_bounded"):
        out = DiffusionSampler(SDAR, "s2d2", fallback=fallback, gen_length=8, steps=4,
                               debug=True).generate(_prompt(2, 3, 6))
        assert (out.answer != MASK).all()
    assert isinstance(Selection(torch.zeros(1, 1, dtype=torch.bool)).commit, torch.Tensor)
    assert ScoreKind.PROB.value == "prob"


@pytest.mark.parametrize("cache", ["block_causal", "none"])
def test_draft_causal_rows_attend_causally(cache: str) -> None:
    """S2D2 ``draft_ver`` (Eq. 4): in the draft forward the decoded positions of the current
    block left of its first mask attend causally; the masked positions' drafts then equal a
    full forward under that mask, and differ from the plain block-causal draft."""
    from dllm_decode.models.base import block_causal_mask

    prompt = _prompt(2, 6, 4)  # blocks of 4: block [4, 8) holds prompt 4, 5 and masks 6, 7
    seen: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}
    for draft in (True, False):
        def grab(state, commit, draft=draft) -> None:
            if state.step == 0:
                seen[draft] = (state.logits.clone(), state.rows.clone())

        DiffusionSampler(SDAR, "s2d2", router="never", draft_causal=draft, cache=cache,
                         debug=True).generate(prompt, gen_length=8, on_step=grab)
    canvas = torch.cat([prompt, torch.full((2, 8), MASK)], 1)
    pos = torch.arange(14)
    allowed = block_causal_mask(pos[None], pos[None], 4)[0]
    causal_rows = pos < 6  # earlier blocks (AR-like cache) and the block's decoded prefix
    allowed = torch.where(causal_rows[:, None], pos[None, :] <= pos[:, None], allowed)
    want = SDAR.forward(canvas, pos.expand(2, -1), mask=allowed.expand(2, -1, -1))
    logits, rows = seen[True]
    at = [int((rows == q).nonzero()) for q in (6, 7)]
    got = logits[:, at]
    ref = want[:, 6:8].clone()
    ref[..., MASK] = -torch.inf
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    plain, plain_rows = seen[False]
    other = plain[:, [int((plain_rows == q).nonzero()) for q in (6, 7)]]
    finite = torch.isfinite(got)
    assert (got[finite] - other[finite]).abs().max() > 1e-3, "draft_ver did not change the draft"


def test_draft_causal_is_a_declared_capability() -> None:
    """``draft_ver`` reaches the cache plan through the declared capabilities (no probe)."""
    for draft in (True, False):
        sampler = DiffusionSampler(SDAR, "s2d2", draft_causal=draft)
        assert sampler.capabilities.selector.draft_causal is draft
    assert not Capabilities().draft_causal
    assert not DiffusionSampler(SDAR, "threshold").capabilities.selector.draft_causal
