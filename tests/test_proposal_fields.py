"""Lazy proposal fields: only what the policy's parts declare is computed (issue #17)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import pytest
import torch

from dllm_decode import Capabilities, DiffusionSampler, Policy, make_policy
from dllm_decode.kernels import reference
from dllm_decode.policies import TopK
from dllm_decode.policies.base import init_memory_of, topk_mask
from dllm_decode.policies.capabilities import (
    capabilities_of,
    policy_capabilities,
    score_fields,
    union_fields,
)
from dllm_decode.types import OPTIONAL_FIELDS, Proposal, ProposalFieldError, ScoreKind
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
LLADA = tiny_model("llada", seed=3)
DREAM = tiny_model("dream", seed=3)
PROMPT = torch.tensor([[5, 9, 17, 2], [33, 4, 8, 21]])


@dataclass(frozen=True)
class Spy:
    """Top-k by probability that records which optional fields it was given."""

    seen: list
    capabilities = Capabilities(proposal_fields=("margin",))

    def select(self, state):
        prop = state.proposal
        self.seen.append({f for f in OPTIONAL_FIELDS if prop.has(f)})
        with pytest.raises(ProposalFieldError, match=r"proposal_fields=\('neg_entropy',\)"):
            _ = prop.neg_entropy
        assert prop.get("neg_entropy") is None and prop.margin.shape == prop.prob.shape
        return topk_mask(prop.prob, state.eligible, state.budget)


class NegEntropyTopK:
    """A user policy as a README would write it: no capabilities declared."""

    def select(self, state):
        return topk_mask(state.proposal.neg_entropy, state.eligible, state.budget)


def test_capability_is_validated_and_normalised() -> None:
    caps = Capabilities(proposal_fields=(ScoreKind.NEG_ENTROPY, "prob", "margin", "margin"))
    assert caps.proposal_fields == ("margin", "neg_entropy")
    assert Capabilities().proposal_fields is None  # undeclared: every field
    with pytest.raises(ValueError, match="unknown field"):
        Capabilities(proposal_fields=("entropy",))
    with pytest.raises(TypeError, match="tuple of field names"):
        Capabilities(proposal_fields="margin")
    assert score_fields(ScoreKind.PROB, ScoreKind.RANDOM, None) == ()
    assert score_fields("logit_margin", ScoreKind.MARGIN) == ("logit_margin", "margin")
    assert union_fields(("margin",), ()) == ("margin",)
    assert union_fields(("margin",), None) is None


@pytest.mark.parametrize("name,fields", [
    ("low_confidence", ()), ("random", ()), ("threshold", ()), ("factor", ()),
    ("entropy", ("neg_entropy",)), ("topk_margin", ("margin",)), ("eb", ("neg_entropy",)),
    ("entropy_threshold", ()), ("klass", ()), ("ccd", ("neg_entropy",)),
    ("ete", ("neg_entropy",)), ("eotp", ()), ("origin", ()), ("s2d2", ()),
    ("window_dream", ("neg_entropy",)), ("sched", ("logit_margin", "neg_entropy")),
])
def test_presets_declare_what_they_read(name, fields) -> None:
    policy = make_policy(name)
    caps = policy_capabilities(policy.selector, policy.stopper, policy.truncator)
    assert caps.proposal_fields == fields


def test_undeclared_parts_get_every_field() -> None:
    declared = policy_capabilities(TopK(), None, None)
    assert declared.proposal_fields == ()
    assert policy_capabilities(NegEntropyTopK()).proposal_fields is None
    stopper = type("Never", (), {"should_stop": lambda self, s: s.eligible.any(1) & False})()
    assert policy_capabilities(TopK(), stopper).proposal_fields is None
    # the user policy reads the entropy unchanged: the same tokens as the preset
    want = DiffusionSampler(LLADA, "entropy", gen_length=8).generate(PROMPT).tokens
    got = DiffusionSampler(LLADA, NegEntropyTopK(), gen_length=8).generate(PROMPT).tokens
    assert torch.equal(got, want)


@pytest.mark.parametrize("model", [LLADA, DREAM], ids=["gumbel", "categorical"])
def test_only_declared_fields_are_computed(model) -> None:
    seen: list = []
    out = DiffusionSampler(model, Spy(seen), gen_length=8).generate(PROMPT)
    assert seen and all(s == {"margin"} for s in seen)
    want = DiffusionSampler(model, "low_confidence", gen_length=8).generate(PROMPT)
    assert torch.equal(out.tokens, want.tokens) and torch.equal(out.bits, want.bits)


def test_on_step_callbacks_see_every_field() -> None:
    seen: list = []
    DiffusionSampler(LLADA, "low_confidence", gen_length=8).generate(
        PROMPT, on_step=lambda s, c: seen.append(float(s.proposal.neg_entropy.sum())))
    assert len(seen) == 8 and all(math.isfinite(v) for v in seen)


def test_reading_an_absent_field_names_the_capability() -> None:
    z = torch.zeros(1, 3)
    prop = Proposal(z.long(), z)
    assert prop.has("prob") and not prop.has("margin") and prop.get("margin") is None
    assert torch.equal(prop.score(ScoreKind.PROB), z)
    for name in OPTIONAL_FIELDS:
        with pytest.raises(ProposalFieldError, match="Capabilities"):
            getattr(prop, name)
    with pytest.raises(ProposalFieldError):
        prop.score(ScoreKind.MARGIN)
    with pytest.raises(ValueError, match="unknown Proposal field"):
        prop.has("entropy")


def _logits(kind: int, gen: torch.Generator) -> torch.Tensor:
    r, v = int(torch.randint(1, 12, (1,), generator=gen)), int(torch.randint(1, 40, (1,),
                                                                              generator=gen))
    if kind == 1:  # many exact ties
        return torch.randint(-2, 2, (2, r, v), generator=gen).float()
    z = torch.randn(2, r, v, generator=gen) * 3
    if kind == 2:
        z[torch.rand(z.shape, generator=gen) < 0.3] = -math.inf
    if kind == 3:
        z[0, 0], z[0, -1, 0] = -math.inf, math.nan
        z[1, 0, v // 2] = math.inf
    return z


def test_subsets_of_fields_are_bit_identical_to_all() -> None:
    gen = torch.Generator().manual_seed(0)
    for trial in range(80):
        z = _logits(trial % 4, gen)
        full = reference.confidence_stats(z)
        for n in range(4):
            for fields in itertools.combinations(OPTIONAL_FIELDS, n):
                part = reference.confidence_stats(z, fields)
                assert set(part) == {"token", "p_max", "lse", *fields}
                for key, value in part.items():  # NaN == NaN here: same bits or both NaN
                    torch.testing.assert_close(value, full[key], rtol=0, atol=0,
                                               equal_nan=True)


def test_categorical_logit_margin_is_of_the_raw_logits_and_only_if_asked() -> None:
    z = torch.randn(2, 5, 30, generator=torch.Generator().manual_seed(1))
    lean = reference.propose(z, sampling="categorical", temperature=0.0, fields=())
    assert not any(lean.has(f) for f in OPTIONAL_FIELDS)
    full = reference.propose(z, sampling="categorical", temperature=0.5, top_k=4,
                             noise=torch.ones_like(z), fields=("logit_margin",))
    assert torch.equal(full.logit_margin, reference.confidence_stats(z)["logit_margin"])
    assert not full.has("margin") and full.lse is not None


def test_policy_object_declares_fields_through_wrappers() -> None:
    policy = Policy(TopK(score=ScoreKind.MARGIN), truncator=make_policy("eotp").truncator)
    caps = policy_capabilities(policy.selector, policy.stopper, policy.truncator)
    assert caps.proposal_fields == ("margin",)
    s2d2 = make_policy("s2d2", fallback="entropy_bounded")
    assert policy_capabilities(s2d2.selector).proposal_fields == ("neg_entropy",)


# ---- masked-only scoring -------------------------------------------------------------------
@dataclass(frozen=True)
class EveryRow:
    """A selector scoring every fed row: the wrapped one, declared not masked-only."""

    inner: object

    @property
    def capabilities(self):
        return replace(capabilities_of(self.inner), reads_masked_only=False)

    def init_memory(self, batch, length, device):
        return init_memory_of(self.inner, batch, length, device)

    def select(self, state):
        return self.inner.select(state)


@dataclass(frozen=True)
class FreshSpy:
    """Records what the masked-only path hands the selector."""

    seen: list
    capabilities = Capabilities(proposal_fields=(), reads_masked_only=True)

    def select(self, state):
        scored = state.proposal.prob > 0
        self.seen.append((torch.equal(state.fresh, state.masked & state.fresh),
                          bool((scored & ~state.masked).any())))
        return topk_mask(state.proposal.prob, state.eligible, state.budget)


@pytest.fixture
def always_compact(monkeypatch):
    from dllm_decode.samplers import proposals

    monkeypatch.setattr(proposals, "MASKED_ROWS_MIN_SAVED", 1)


def test_masked_only_is_declared_by_every_part() -> None:
    assert policy_capabilities(TopK()).masked_only
    assert not policy_capabilities(EveryRow(TopK())).masked_only
    assert not policy_capabilities(NegEntropyTopK()).masked_only
    eotp = make_policy("eotp")
    assert policy_capabilities(eotp.selector, None, eotp.truncator).masked_only
    sched = make_policy("sched")
    assert not policy_capabilities(sched.selector, sched.stopper).masked_only


@pytest.mark.usefixtures("always_compact")
@pytest.mark.parametrize("model", [LLADA, DREAM], ids=["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_masked_rows_alone_give_the_same_decode(model, cache) -> None:
    kw = dict(gen_length=12, block_length=4, steps=12, cache=cache)
    for name in ("entropy", "threshold", "ete", "klass", "ccd", "eotp"):
        policy = make_policy(name)
        want = DiffusionSampler(model, Policy(EveryRow(policy.selector),
                                              truncator=policy.truncator), **kw).generate(PROMPT)
        got = DiffusionSampler(model, name, **kw).generate(PROMPT)
        for field in ("tokens", "nfe", "commit_step", "bits", "lengths"):
            assert torch.equal(getattr(got, field), getattr(want, field)), (name, field)


@pytest.mark.usefixtures("always_compact")
def test_masked_rows_mark_fresh_and_leave_the_rest_unscored() -> None:
    seen: list = []
    DiffusionSampler(LLADA, FreshSpy(seen), gen_length=8, block_length=4).generate(PROMPT)
    assert seen and all(narrow and not outside for narrow, outside in seen)


@pytest.mark.usefixtures("always_compact")
def test_masked_rows_still_check_finite_logits() -> None:
    from dllm_decode.samplers.contract import NonFiniteLogitsError

    class Poisoned:
        def __init__(self, model):
            self.model = model

        def __getattr__(self, name):
            return getattr(self.model, name)

        def __call__(self, tokens, positions, **kw):
            logits = self.model(tokens, positions, **kw)
            logits[1, -1, 3] = math.nan  # the last fed row of batch row 1: still masked
            return logits

    with pytest.raises(NonFiniteLogitsError, match=r"at step 0 in rows \[1\]"):
        DiffusionSampler(Poisoned(LLADA), "low_confidence", gen_length=8).generate(PROMPT)
