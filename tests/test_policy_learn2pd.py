"""Learn2PD selector, filter I/O and the EoTP truncator (arXiv 2509.25188, methods.md §2(f))."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor, nn

from dllm_decode import DiffusionSampler, make_policy
from dllm_decode.policies.confidence import TopK
from dllm_decode.policies.learn2pd import (
    ACCEPTED,
    EoTP,
    FilterCard,
    FilterMismatchError,
    FullSpan,
    L2PFilter,
    Learn2PD,
    ModelFingerprint,
    block_features,
    load_filter,
    save_filter,
    with_eotp,
)
from dllm_decode.types import Proposal, StepState
from tests.helpers import EOS, MASK, tiny_model

LLADA = tiny_model("llada", seed=3)


pytestmark = pytest.mark.usefixtures("one_thread")


def _prompt(b: int, p: int, seed: int = 0) -> Tensor:
    return torch.randint(0, EOS, (b, p), generator=torch.Generator().manual_seed(seed))


class ConstFilter(nn.Module):
    """Outputs ``value`` everywhere, or only at window indices ``where`` (-inf elsewhere)."""

    def __init__(self, block_length: int, value: float, where: list[int] | None = None) -> None:
        super().__init__()
        self.block_length, self.value, self.where = block_length, value, where

    def forward(self, x: Tensor) -> Tensor:
        if self.where is None:
            return torch.full_like(x, self.value)
        out = torch.full_like(x, -torch.inf)
        out[:, self.where] = self.value
        return out


class ScriptedLM(nn.Module):
    """Bidirectional mock: position i proposes ``table[i]`` with logit ``strength[i]`` (others 0)
    whatever the canvas; vocab 8, mask 7, EOS 6."""

    mask_token_id, eos_token_ids, vocab_size, max_length = 7, (6,), 8, 64
    attention, block_size, logit_shift, family = "bidirectional", None, 0, "mock"

    def __init__(self, table: list[int], strength: list[float]) -> None:
        super().__init__()
        self.table = torch.tensor(table)
        self.strength = torch.tensor(strength)

    def rope_positions(self, valid: Tensor) -> Tensor:
        return torch.arange(valid.shape[1]).expand_as(valid)

    def forward(self, tokens: Tensor, positions: Tensor, *, mask: Tensor | None = None,
                hidden_rows: Tensor | None = None, **_: object) -> Tensor:
        logits = torch.zeros(*tokens.shape, self.vocab_size)
        logits.scatter_(-1, self.table[positions][..., None], self.strength[positions][..., None])
        return logits if hidden_rows is None else logits[:, hidden_rows]


def _eos_from(p: int, q: int, length: int, eos_strength: list[float] | None = None) -> ScriptedLM:
    """EOS proposed at gen positions >= q (canvas >= p + q); other tokens more confident."""
    table = [i % 5 for i in range(length)]
    strength = [8.0] * length
    for j, i in enumerate(range(p + q, length)):
        table[i] = 6
        strength[i] = eos_strength[j] if eos_strength else 4.0 - 0.1 * j
    return ScriptedLM(table, strength)


# ---- filter ------------------------------------------------------------------------------
def test_filter_shapes_and_parameter_count() -> None:
    f = L2PFilter(32)
    assert sum(p.numel() for p in f.parameters()) == 2112
    assert f(torch.rand(5, 32)).shape == (5, 32)
    assert f(torch.rand(2, 3, 32)).shape == (2, 3, 32)
    assert isinstance(f.act, nn.ReLU) and isinstance(L2PFilter(32, "gelu").act, nn.GELU)
    with pytest.raises(ValueError, match="activation"):
        L2PFilter(32, "swish2")


def test_save_load_roundtrip_and_sidecar(tmp_path) -> None:
    f = L2PFilter(8)
    card = FilterCard(8, "llada_prob_all", ModelFingerprint.of(LLADA), 0.9,
                      training={"iters": 3})
    path = save_filter(f, card, tmp_path)
    assert path.name == "learn2pd_k8.safetensors"
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["block_length"] == 8 and side["feature"] == "llada_prob_all"
    assert set(side["fingerprint"]) >= {"family", "vocab_size", "hidden_size", "num_layers",
                                        "lm_head_sha256"}
    loaded = load_filter(tmp_path, model=LLADA, block_length=8)
    assert loaded.card == card and loaded.card.training == {"iters": 3}
    x = torch.rand(4, 8)
    assert torch.equal(loaded.module(x), f(x))
    # bfloat16 copy of the same weights has the same fingerprint
    assert ModelFingerprint.of(tiny_model("llada", seed=3).to(torch.bfloat16)) == card.fingerprint


def test_mismatch_errors(tmp_path) -> None:
    card = FilterCard(8, "llada_prob_all", ModelFingerprint.of(LLADA))
    save_filter(L2PFilter(8), card, tmp_path)
    with pytest.raises(FilterMismatchError, match="lm_head_sha256"):
        load_filter(tmp_path, model=tiny_model("llada", seed=4))
    other = tiny_model("llada", seed=3, vocab_size=80, embedding_size=80)
    with pytest.raises(FilterMismatchError, match="vocab_size"):
        make_policy("learn2pd", filter=str(tmp_path), for_model=other)
    with pytest.raises(FilterMismatchError, match="block length"):
        load_filter(tmp_path / "learn2pd_k8.safetensors", block_length=16)
    with pytest.raises(FilterMismatchError, match="block_length"):
        Learn2PD(L2PFilter(8), block_length=16)
    sel = Learn2PD.from_pretrained(tmp_path, model=LLADA)
    with pytest.raises(FilterMismatchError, match="block[ _]length 16"):
        DiffusionSampler(LLADA, sel, gen_length=32, block_length=16).generate(_prompt(1, 3))
    cfg = DiffusionSampler(LLADA, "low_confidence", gen_length=32, block_length=16).config
    with pytest.raises(FilterMismatchError, match="block_length 16"):
        sel.bind(LLADA, cfg)
    with pytest.raises(FilterMismatchError, match="lm_head_sha256"):
        sel.bind(tiny_model("llada", seed=5))


# ---- selector ----------------------------------------------------------------------------
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_threshold_above_one_equals_low_confidence(cache) -> None:
    prompt = _prompt(2, 5, 1)
    kw = dict(gen_length=32, block_length=8, cache=cache)
    base = DiffusionSampler(LLADA, "low_confidence", **kw).generate(prompt)
    sel = Learn2PD(L2PFilter(8), accept_thres=1.01)
    out = DiffusionSampler(LLADA, sel, debug=True, **kw).generate(prompt)
    assert torch.equal(out.tokens, base.tokens) and torch.equal(out.nfe, base.nfe)
    assert out.forwards == base.forwards == 32


def test_infinite_filter_commits_each_block_in_one_step() -> None:
    out = DiffusionSampler(LLADA, Learn2PD(ConstFilter(8, torch.inf)), debug=True,
                           gen_length=32, block_length=8).generate(_prompt(2, 4))
    assert out.forwards == 4 and (out.nfe == 4).all()
    expected = torch.arange(32) // 8
    assert torch.equal(out.commit_step, expected.expand(2, -1))


def test_features_llada_include_decoded_and_dream_zero_at_decoded() -> None:
    seen: list[tuple[StepState, Tensor]] = []

    class Recording(nn.Module):
        block_length = 8

        def forward(self, x: Tensor) -> Tensor:
            seen.append(x.clone())
            return torch.full_like(x, -torch.inf)

    for family, feature in (("llada", "llada_prob_all"), ("dream", "dream_negent_masked")):
        seen.clear()
        states: list[StepState] = []
        model = LLADA if family == "llada" else tiny_model("dream", seed=2)
        sel = Learn2PD(Recording(), feature=feature)
        DiffusionSampler(model, sel, gen_length=16, block_length=8, schedule="llada").generate(
            _prompt(2, 3), on_step=lambda s, c, states=states: states.append(s))
        assert len(seen) == len(states) == 16
        for x, state in zip(seen, states, strict=True):
            bs, be = state.block_start, state.block_end
            decoded = ~state.masked[:, bs:be]
            assert torch.equal(block_features(state, feature, 8)[0], x)
            if family == "llada":
                assert torch.equal(x, state.proposal.prob[:, bs:be])
                assert (x[decoded] > 0).all()  # decoded positions keep the model's confidence
            else:
                assert (x[decoded] == 0).all()
                neg = state.proposal.neg_entropy[:, bs:be]
                assert torch.equal(x[~decoded], neg[~decoded]) and (x[~decoded] < 0).all()
        assert any((~s.masked[:, s.block_start:s.block_end]).any() for s in states)


def test_dream_and_block_diffusion_run() -> None:
    dream = tiny_model("dream", seed=1)
    out = DiffusionSampler(dream, Learn2PD(L2PFilter(8), feature="dream_negent_masked",
                                           accept_thres=0.5), debug=True,
                           gen_length=16, block_length=8).generate(_prompt(2, 3))
    assert (out.answer != MASK).all()
    sdar = tiny_model("sdar", seed=1)  # block size 4; prompt 3 -> partial first/last blocks
    out = DiffusionSampler(sdar, Learn2PD(ConstFilter(4, torch.inf)), debug=True,
                           gen_length=10).generate(_prompt(2, 3))
    assert (out.answer != MASK).all() and out.forwards == 4  # blocks [3,4) [4,8) [8,12) [12,13)


# ---- EoTP --------------------------------------------------------------------------------
def _state(tokens: Tensor, prob: Tensor, masked: Tensor, gen_start: int, **extras) -> StepState:
    z = torch.zeros_like(prob)
    b, length = tokens.shape
    return StepState(Proposal(tokens, prob, z, z, z), eligible=masked, masked=masked,
                     fresh=torch.ones_like(masked), canvas=tokens, step=0, block=0,
                     block_start=gen_start, block_end=length, gen_start=gen_start,
                     steps_left=None, budget=None, progress=0.0, generator=None,
                     forward_start=0, forward_width=length, extras=dict(extras))


def test_eotp_rules_per_row() -> None:
    g0, length = 2, 14
    tokens = torch.zeros(5, length, dtype=torch.long)
    prob = torch.full((5, length), 0.1)
    masked = torch.ones(5, length, dtype=torch.bool)
    masked[:, :g0] = False
    accepted = torch.zeros_like(masked)

    def eos(row: int, pos: int, p: float, acc: bool = False) -> None:
        tokens[row, pos], prob[row, pos], accepted[row, pos] = EOS, p, acc

    eos(0, 7, 0.3, True)
    eos(0, 4, 0.9)  # more confident, not accepted, to the left
    eos(1, 5, 0.2, True)
    eos(1, 11, 0.95)  # more confident, not accepted, to the right
    eos(2, 6, 0.5)
    eos(2, 9, 0.8)  # no filter EOS: the most confident masked EOS wins
    eos(2, 12, 0.99)
    masked[2, 12] = False  # ... among masked positions only
    eos(4, 10, 0.4, True)
    eos(4, 3, 0.1, True)  # first accepted EOS, not the most confident
    lengths = torch.full((5,), 12)
    lengths[3] = 9  # row 3 has no EOS: keeps its (already truncated) length
    state = _state(tokens, prob, masked, g0, lengths=lengths, **{ACCEPTED: accepted})
    got = EoTP((EOS,)).truncate(state, torch.zeros_like(masked))
    assert got.tolist() == [7 + 1 - g0, 5 + 1 - g0, 9 + 1 - g0, 9, 3 + 1 - g0]
    tied = _state(tokens[2:3], torch.full((1, length), 0.5), masked[2:3], g0)
    assert EoTP((EOS,)).truncate(tied, masked[2:3]).tolist() == [6 + 1 - g0]  # leftmost tie
    with pytest.warns(UserWarning, match="no EOS"):
        assert EoTP().truncate(state, masked).tolist() == lengths.tolist()


@pytest.mark.parametrize("tied", [False, True])
def test_eotp_truncates_after_first_step(tied) -> None:
    p, q, g = 4, 5, 16
    model = _eos_from(p, q, p + g, [3.0] * (g - q) if tied else None)
    cuts: list[list[int]] = []

    def check(state: StepState, commit: Tensor) -> None:
        cuts.append(EoTP((6,)).truncate(state, commit).tolist())

    pol = make_policy("eotp", for_model=model)
    prompt = torch.zeros(2, p, dtype=torch.long)
    out = DiffusionSampler(model, pol, debug=True, gen_length=g, block_length=8).generate(
        prompt, on_step=check)
    assert cuts[0] == [q + 1, q + 1]  # truncated to p + q + 1 after the first step
    assert (out.lengths == q + 1).all()
    assert (out.answer[:, q + 1:] == 6).all() and (out.commit_step[:, q + 1:] == -1).all()
    assert out.forwards == q + 1  # the rest of block 0, block 1 never runs
    assert (out.answer[:, q] == 6).all()


def test_filter_accepted_eos_takes_precedence_end_to_end() -> None:
    p, g = 3, 16
    table = [i % 5 for i in range(p + g)]
    strength = [8.0] * (p + g)
    table[p + 2], strength[p + 2] = 6, 1.0  # accepted by the filter, low confidence
    table[p + 6], strength[p + 6] = 6, 6.0  # not accepted, higher confidence, to the right
    model = ScriptedLM(table, strength)
    prompt = torch.zeros(1, p, dtype=torch.long)
    kw = dict(gen_length=g, block_length=8, debug=True)
    for policy, first_cut in (
        (make_policy("eotp", for_model=model), 7),
        (make_policy("learn2pd_eot", filter=ConstFilter(8, torch.inf, where=[2]),
                     for_model=model), 3),
    ):
        cuts: list[int] = []
        out = DiffusionSampler(model, policy, **kw).generate(
            prompt, on_step=lambda s, c, pol=policy, cuts=cuts: cuts.append(
                int(pol.truncator.truncate(s, c)[0])))
        assert cuts[0] == first_cut
        assert out.lengths.tolist() == [3] and out.answer[0, 2] == 6  # p + 2 is EOS in the end
    assert out.forwards == 2  # step 0: p + 2 (filter) and p + 0 (top-1); step 1: p + 1


# ---- presets and composition -------------------------------------------------------------
def test_presets(tmp_path) -> None:
    card = FilterCard(8, "llada_prob_all", ModelFingerprint.of(LLADA), accept_threshold=0.8)
    save_filter(L2PFilter(8), card, tmp_path)
    pol = make_policy("learn2pd", filter=str(tmp_path))
    assert isinstance(pol.selector, Learn2PD) and pol.truncator is None
    assert pol.selector.accept_thres == 0.8 and pol.selector.fingerprint == card.fingerprint
    pol = make_policy("learn2pd_eot", filter=str(tmp_path), accept_thres=0.5)
    assert pol.selector.accept_thres == 0.5 and pol.selector.full_span
    assert pol.truncator == EoTP((EOS,))  # EOS id from the card's fingerprint
    pol = make_policy("eotp", for_model=LLADA)
    assert isinstance(pol.selector, FullSpan) and isinstance(pol.selector.inner, TopK)
    assert pol.selector.capabilities.budgeted and pol.truncator == EoTP((EOS,))
    composed = with_eotp("threshold", eos_token_ids=(EOS,))
    caps = composed.selector.capabilities
    assert caps.full_span and caps.budgeted is False
    out = DiffusionSampler(LLADA, composed, gen_length=16, block_length=8, debug=True).generate(
        _prompt(1, 3))
    assert (out.answer != MASK).all()
    bare = make_policy("learn2pd")
    prompt = _prompt(1, 3)
    kw = dict(gen_length=16, block_length=8)
    with pytest.warns(UserWarning, match="no trained filter"):  # bound to a model: none found
        out = DiffusionSampler(LLADA, bare, **kw).generate(prompt)
    assert torch.equal(out.tokens,
                       DiffusionSampler(LLADA, "low_confidence", **kw).generate(prompt).tokens)
    assert EoTP().bind(LLADA) == EoTP((EOS,))


def test_bundled_filter_is_found_by_fingerprint(tmp_path, monkeypatch) -> None:
    import dllm_decode.policies.learn2pd_filter as l2p

    monkeypatch.setattr(l2p, "ASSETS", tmp_path)
    other = tiny_model("llada", seed=9)
    save_filter(L2PFilter(8), FilterCard(8, "llada_prob_all", ModelFingerprint.of(other)),
                tmp_path / "tiny-other")
    save_filter(L2PFilter(8), FilterCard(8, "llada_prob_all", ModelFingerprint.of(LLADA), 0.7),
                tmp_path / "tiny-llada")
    pol = make_policy("learn2pd_eot", for_model=LLADA)
    assert pol.selector.accept_thres == 0.7 and pol.selector.fingerprint.family == "llada"
    assert pol.selector.fingerprint == ModelFingerprint.of(LLADA)
    assert l2p.find_bundled_filter(tiny_model("llada", seed=10)) is None


def test_bundled_checkpoint_binds_its_shipped_filter() -> None:
    from dllm_decode.models.loading import bundled_models, load_model

    if "tiny-llada" not in bundled_models():
        pytest.skip("no bundled tiny-llada checkpoint")
    model = load_model("tiny-llada")
    pol = make_policy("learn2pd")  # no filter given: the sampler's bind finds the shipped one
    bound = pol.selector.bind(model, DiffusionSampler(model, pol, gen_length=32).config)
    assert bound.filter is not None and bound.fingerprint is not None
    assert bound.block_length == 32 and bound.feature == "llada_prob_all"
