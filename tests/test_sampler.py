"""The decode loop: invariants over random small configs and every policy, and bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_decode import DiffusionSampler, SamplerConfig, make_policy
from dllm_decode.policies import PRESETS
from dllm_decode.policies.capabilities import capabilities_of
from tests.helpers import EOS, MASK, mask_presets, tiny_model

MODELS = {f: tiny_model(f, seed=11) for f in ("llada", "dream", "sdar")}
POLICIES = mask_presets(PRESETS)
#: presets that refuse ``temperature > 0`` (their authors' code is greedy), with the refusal
GREEDY_ONLY = {"lopa": "decodes greedily", "said": "is greedy"}


def _prompt(b: int, p: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, EOS, (b, p), generator=g)


# learn2pd without a trained filter on random models warns, as it should; expected here
@pytest.mark.filterwarnings("ignore:learn2pd. no trained filter:UserWarning")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(["llada", "dream", "sdar"]),
    policy=st.sampled_from(POLICIES),
    blocks=st.sampled_from([1, 2, 4]),
    block_len=st.sampled_from([2, 4]),
    per_step=st.sampled_from([1, 2]),
    temperature=st.sampled_from([0.0, 0.8]),
    p=st.integers(1, 6),
    seed=st.integers(0, 1000),
)
def test_invariants(family, policy, blocks, block_len, per_step, temperature, p, seed) -> None:
    model = MODELS[family]
    g = blocks * block_len
    steps = g // per_step
    kwargs = dict(gen_length=g, block_length=None if family == "sdar" else block_len,
                  steps=steps, temperature=temperature, seed=seed)
    if policy == "origin":
        kwargs["schedule"] = "dream"
        kwargs["block_length"] = None
    prompt = _prompt(2, p, seed)
    if policy in GREEDY_ONLY and temperature > 0:  # the authors' greedy runs: one line
        with pytest.raises(ValueError, match=GREEDY_ONLY[policy]):
            DiffusionSampler(model, policy, **kwargs).generate(prompt)
        return
    caps = capabilities_of(make_policy(policy).selector)
    need = caps.requires_attention
    if need is not None and model.attention != need:  # family-specific presets refuse clearly
        with pytest.raises(ValueError, match="needs a model with attention"):
            DiffusionSampler(model, policy, **kwargs)
        return
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(state, commit):
        allowed = state.eligible
        if sampler.policy.stopper is not None:  # a stop commits every fresh mask at its argmax
            allowed = allowed | (state.masked & state.fresh)
        seen.append((allowed.clone(), commit.clone()))

    sampler = DiffusionSampler(model, policy, debug=True, **kwargs)
    out = sampler.generate(prompt, on_step=record)
    assert torch.equal(out.tokens[:, :p], prompt)  # the prompt is never changed
    assert (out.answer != MASK).all()  # every generated position ends committed
    assert ((out.commit_step >= 0) | (out.answer != MASK)).all()
    # S2D2's verifier adds forwards; token editing adds at most max_post_steps per block
    bound = g + (blocks + 1) * caps.max_post_steps  # (+1: a prompt-aligned partial block)
    if not caps.extra_forwards:
        assert out.forwards <= bound and (out.nfe <= bound).all()
    for eligible, commit in seen:
        assert not (commit & ~eligible).any()
    again = sampler.generate(prompt)  # seeded runs repeat
    assert torch.equal(again.tokens, out.tokens) and again.forwards == out.forwards
    if temperature == 0 and policy not in ("origin", "random") and not caps.stochastic:
        # batch of rows == rows decoded alone (budgets and thresholds are per row)
        for r in range(2):
            alone = sampler.generate(prompt[r:r + 1])
            assert torch.equal(alone.tokens[0], out.tokens[r])
            assert alone.nfe[0] == out.nfe[r]


def test_llada_budget_matches_reference_table() -> None:
    from dllm_decode.samplers.schedule import llada_budget

    for n in range(0, 40):
        for steps in range(1, 12):
            base, rem = n // steps, n % steps
            table = [base + (i < rem) for i in range(steps)]
            got = [int(llada_budget(torch.tensor([n]), i, steps)) for i in range(steps)]
            assert got == table


@pytest.mark.parametrize("n,steps,expected", [
    (16, 16, [0] + [1] * 14 + [2]),
    (32, 8, [3, 4, 4, 4, 4, 4, 4, 5]),
])
def test_dream_schedule_facts(n, steps, expected) -> None:
    from dllm_decode.samplers.schedule import dream_budget, dream_times

    times = dream_times(steps, 1e-3)
    masked = torch.ones(1, n, dtype=torch.bool)
    got = []
    for i in range(steps):
        k = int(dream_budget(masked, times, i, steps)[0])
        got.append(k)
        masked[0, :k] = False
        masked = masked[:, torch.argsort(masked[0].long(), descending=True)]
    assert got == expected


def test_left_padded_batch_equals_rows_alone() -> None:
    for family in ("llada", "dream"):
        model = MODELS[family]
        a, b = _prompt(1, 3, 1), _prompt(1, 6, 2)
        batch = torch.cat([torch.cat([torch.full((1, 3), EOS), a], 1), b])
        mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1] * 6])
        s = DiffusionSampler(model, "low_confidence", gen_length=8, steps=8)
        out = s.generate(batch, mask)
        assert torch.equal(out.answer[0], s.generate(a).answer[0])
        assert torch.equal(out.answer[1], s.generate(b).answer[0])


def test_threshold_one_is_one_token_per_step() -> None:
    out = DiffusionSampler(MODELS["llada"], "threshold", tau=1.0, gen_length=8,
                           block_length=4).generate(_prompt(1, 4, 0))
    assert out.forwards == 8 and out.steps == 8
    with pytest.raises(ValueError, match=r"tau must be a finite number in \(0, 1\]"):
        DiffusionSampler(MODELS["llada"], "threshold", tau=1.01)


def test_cfg_and_eos_options_run() -> None:
    model = MODELS["llada"]
    prompt = _prompt(2, 4, 3)
    base = DiffusionSampler(model, "low_confidence", gen_length=8, steps=8)
    guided = base.generate(prompt, cfg_scale=1.5)
    assert guided.forwards == 8 and (guided.answer != MASK).all()
    no_eos = base.generate(prompt, logits_eos_inf=True)
    assert not (no_eos.answer == EOS).any()
    demoted = base.generate(prompt, confidence_eos_eot_inf=True)
    assert (demoted.answer != MASK).all()


def test_stop_at_eos_fills_the_tail() -> None:
    model = tiny_model("llada", seed=5)
    with torch.no_grad():  # make EOS overwhelmingly likely everywhere
        model.head.weight[EOS] += 50.0
    out = DiffusionSampler(model, "threshold", gen_length=16, block_length=4,
                           stop_at_eos=True).generate(_prompt(1, 3, 1))
    assert (out.answer == EOS).all()
    assert out.forwards < 16


def test_bits_sum_to_committed_nll() -> None:
    out = DiffusionSampler(MODELS["llada"], "low_confidence", gen_length=8,
                           steps=4).generate(_prompt(2, 3, 4))
    assert out.bits.shape == (2, out.steps)
    assert (out.bits >= 0).all() and torch.isfinite(out.nll).all()
    assert torch.all(out.rounds_lower_bound(1e9) <= out.steps)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gen_length=10, block_length=4), "divisible by block_length"),
    (dict(gen_length=8, block_length=4, steps=3), "divisible by the number of blocks"),
    (dict(temperature=-1.0), "temperature"),
    (dict(gen_length=300), "max length"),
    (dict(cache="sideways"), "cache must be one of"),
    (dict(sampling="beam"), "sampling must be one of"),
])
def test_bad_config(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        DiffusionSampler(MODELS["llada"], "low_confidence", **kwargs).generate(_prompt(1, 4, 0))


def test_bad_inputs() -> None:
    s = DiffusionSampler(MODELS["llada"], "low_confidence", gen_length=4)
    with pytest.raises(ValueError, match="mask token"):
        s.generate(torch.tensor([[1, MASK, 2]]))
    with pytest.raises(ValueError, match="all padding"):
        s.generate(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 1], [0, 0]]))
    with pytest.raises(ValueError, match="left padding"):
        s.generate(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="2-D"):
        s.generate(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"in \[0, 64\)"):
        s.generate(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="unknown policy"):
        DiffusionSampler(MODELS["llada"], "greedy-ish")
    with pytest.raises(ValueError, match="did you mean 'tau'"):
        DiffusionSampler(MODELS["llada"], "threshold", tauu=0.3)
    assert SamplerConfig(gen_length=8).num_blocks == 1
