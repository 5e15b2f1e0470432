"""The decode contract and parameter validation: one test per probe of the hardening table.

Each test is a bad input (or a hostile model / policy) that once decoded silently or failed deep
inside torch, and now gets a clear error, or an invariant that now holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from dllm_decode import DiffusionSampler, SamplerConfig, make_policy
from dllm_decode.policies import Threshold, TopK
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.samplers.contract import (
    NonFiniteLogitsError,
    PolicyContractError,
    StalledPolicyError,
)
from dllm_decode.types import StepState
from tests.helpers import EOS, MASK, left_pad_rows, prompt_ids, tiny_gemma, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {f: tiny_model(f, seed=5) for f in ("llada", "dream", "sdar")}


class Poisoned:
    """Wraps a model: after ``after`` forwards, rows ``rows`` of every forward get ``value``
    logits (``value`` -inf: every logit of the row; NaN / +inf: one entry per position)."""

    def __init__(self, model: Any, value: float, rows: list[int] | None = None,
                 after: int = 0) -> None:
        self._model, self._value, self._rows, self._after = model, value, rows, after
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, tokens: Tensor, positions: Tensor, **kw: Any) -> Tensor:
        logits = self._model.forward(tokens, positions, **kw)
        self.calls += 1
        if self.calls > self._after:
            rows = self._rows if self._rows is not None else list(range(logits.shape[0]))
            rows = [r for r in rows if r < logits.shape[0]]
            if self._value == -math.inf:
                logits[rows] = -math.inf
            else:
                logits[rows, :, 3] = self._value
        return logits

    __call__ = forward


# ---- 1. non-finite logits -------------------------------------------------------------------
@pytest.mark.parametrize("policy,cache,temperature", [
    ("low_confidence", "none", 0.0), ("threshold", "dual", 0.7), ("sched", "none", 0.0),
    ("eb", "prefix", 0.0), ("entropy", "none", 0.7), ("factor", "dual", 0.0),
    ("llada21", "dual", 0.0), ("edit", "prefix", 0.7),  # token editing (post steps too)
])
@pytest.mark.parametrize("value", [math.nan, -math.inf, math.inf])
def test_non_finite_logits_raise_naming_step_and_rows(policy, cache, temperature,
                                                      value) -> None:
    model = Poisoned(MODELS["llada"], value, rows=[1], after=2)
    sampler = DiffusionSampler(model, policy, cache=cache, gen_length=8, block_length=4,
                               steps=8, temperature=temperature)
    with pytest.raises(NonFiniteLogitsError, match=r"at step 2 in rows \[1\]"):
        sampler.generate(prompt_ids(3, 4))


NINE = ["low_confidence", "random", "threshold", "factor", "eb", "entropy_threshold", "sched",
        "klass", "ete"]


@pytest.mark.parametrize("policy", NINE)
@pytest.mark.parametrize("rows,named", [(None, r"\[0, 1, 2, 3\]"), ([0, 2], r"\[0, 2\]")])
@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_non_finite_logits_nine_policies_dual_cache_sampling(policy, rows, named, value) -> None:
    model = Poisoned(MODELS["llada"], value, rows=rows)  # all rows, or half of them
    sampler = DiffusionSampler(model, policy, cache="dual", gen_length=8, block_length=4,
                               steps=8, temperature=0.7)
    with pytest.raises(NonFiniteLogitsError, match=f"at step 0 in rows {named}"):
        sampler.generate(prompt_ids(4, 3))


def test_non_finite_logits_at_the_last_step_still_raise() -> None:
    model = Poisoned(MODELS["dream"], math.nan, after=7)
    with pytest.raises(NonFiniteLogitsError, match=r"step 7 in rows \[0, 1\]"):
        DiffusionSampler(model, "low_confidence", gen_length=8, steps=8).generate(prompt_ids(2, 3))


# ---- 2. the commit contract -----------------------------------------------------------------
@dataclass(frozen=True)
class TopOneOnly:
    """A budgeted policy that ignores its budget: one commit per step."""

    capabilities = Capabilities(budgeted=True)

    def select(self, state: StepState) -> Tensor:
        return TopK().select(StepState(**{**state.__dict__,
                                          "budget": torch.ones_like(state.budget)}))


@dataclass(frozen=True)
class Nothing:
    uses_budget: bool = False

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(budgeted=self.uses_budget)

    def select(self, state: StepState) -> Tensor:
        return torch.zeros_like(state.eligible)


@dataclass(frozen=True)
class Cheater:
    capabilities = Capabilities(budgeted=False)

    def select(self, state: StepState) -> Tensor:
        return state.eligible | (torch.arange(state.eligible.shape[1]) == 0)[None]


def test_under_committing_policy_is_forced_at_block_end() -> None:
    sampler = DiffusionSampler(MODELS["llada"], TopOneOnly(), gen_length=8, block_length=4,
                               steps=4)  # budget 2 per step, the policy commits 1
    out = sampler.generate(prompt_ids(2, 3))
    assert (out.answer != MASK).all()
    # steps 0, 1 commit one position each; the block's last step (1, 3) commits the rest
    assert (out.commit_step[:, :4] == 1).sum(1).tolist() == [3, 3]
    assert (out.commit_step[:, 4:] == 3).sum(1).tolist() == [3, 3]


@pytest.mark.parametrize("budgeted", [True, False])
def test_policy_committing_nothing_is_named(budgeted) -> None:
    policy = Nothing(uses_budget=budgeted)
    sampler = DiffusionSampler(MODELS["llada"], policy, gen_length=8, block_length=4, steps=8)
    with pytest.raises(StalledPolicyError, match=r"policy 'Nothing' committed nothing"):
        sampler.generate(prompt_ids(2, 3))


def test_ineligible_or_malformed_commits_raise() -> None:
    with pytest.raises(PolicyContractError, match="not eligible"):
        DiffusionSampler(MODELS["llada"], Cheater(), gen_length=4).generate(prompt_ids(1, 3))

    @dataclass(frozen=True)
    class Floats:
        capabilities = Capabilities(budgeted=False)

        def select(self, state: StepState) -> Tensor:
            return state.eligible.float()

    with pytest.raises(PolicyContractError, match="bool commit mask"):
        DiffusionSampler(MODELS["llada"], Floats(), gen_length=4).generate(prompt_ids(1, 3))


# ---- 3. parameters validated where they are given -------------------------------------------
def test_kwargs_beside_a_policy_object_are_an_error() -> None:
    with pytest.raises(ValueError, match="beside a policy object"):
        DiffusionSampler(MODELS["llada"], Threshold(), tau=0.9)
    with pytest.raises(ValueError, match="cannot be applied to a policy object"):
        make_policy(Threshold(), tau=0.9)


@pytest.mark.parametrize("tau", [1.5, -1, 0, math.nan, math.inf, "high", None, True])
def test_threshold_tau_validated_at_construction(tau) -> None:
    with pytest.raises(ValueError, match="tau must be"):
        DiffusionSampler(MODELS["llada"], "threshold", tau=tau)


@pytest.mark.parametrize("policy,params,match", [
    ("eb", {"gamma": -0.1}, "gamma must be a finite number in"),
    ("eb", {"gamma": math.nan}, "gamma must be a number, got NaN"),
    ("entropy_threshold", {"theta": -1.0}, r"theta must be a finite number in \[0, inf\)"),
    ("entropy_threshold", {"theta": "0.5"}, "theta must be a number"),
    ("factor", {"factor": 0}, "factor must be"),
    ("entropy", {"alg_temp": -1.0}, "alg_temp must be"),
    ("klass", {"history": 1.5}, "history must be an integer"),
    ("ete", {"lookahead": "far"}, "lookahead must be a number"),
    ("sched", {"tau_high": "7.5"}, "tau_high must be a number"),
    ("sched", {"q": math.nan}, "q must be a number, got NaN"),
    ("ete", {"tau": 2.0}, r"tau must be a finite number in \(0, 1\]"),
    ("klass", {"conf_threshold": -0.5}, "conf_threshold must be"),
    ("klass", {"kl_threshold": "low"}, "kl_threshold must be a number"),
    ("s2d2", {"tau": math.nan}, "tau must be a number, got NaN"),
    ("low_confidence_dynamic", {"tau": 1.5}, "tau must be"),
])
def test_presets_validate_types_and_ranges(policy, params, match) -> None:
    with pytest.raises(ValueError, match=match):
        make_policy(policy, **params)


def test_composed_preset_names_its_own_parameters() -> None:
    with pytest.raises(ValueError, match=r"policy 'sched'.*tau_high.*did you mean 'tau_high'"):
        DiffusionSampler(MODELS["llada"], "sched", tua_high=6.0)
    with pytest.raises(ValueError, match=r"policy 'prophet'.*answer_length"):
        make_policy("prophet", answer_lenght=3)
    make_policy("sched", base="threshold", tau=0.8, tau_high=8.0)  # base params pass on


def test_unknown_sampler_field_suggests_the_closest() -> None:
    with pytest.raises(ValueError, match="did you mean 'gen_length'"):
        DiffusionSampler(MODELS["llada"], "low_confidence", gen_lenght=8)
    sampler = DiffusionSampler(MODELS["llada"], "low_confidence", gen_length=4)
    with pytest.raises(ValueError, match="did you mean 'block_length'"):
        sampler.generate(prompt_ids(1, 3), blok_length=2)


@pytest.mark.parametrize("seed", ["abc", 1.5, True, [], [1, "2"], 2**70])
def test_seed_must_be_an_int(seed) -> None:
    with pytest.raises(ValueError, match="seed must (be an int|fit in 64 bits)"):
        SamplerConfig(seed=seed)


@pytest.mark.parametrize("field,value", [("temperature", "hot"), ("gen_length", 8.5),
                                         ("steps", math.nan), ("stop_at_eos", "yes"),
                                         ("temperature", math.inf), ("cfg_scale", math.inf)])
def test_sampler_fields_reject_wrong_types(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        SamplerConfig(**{field: value})


# ---- 5. batch invariance --------------------------------------------------------------------
def _ragged(lengths: list[int], seed: int = 0) -> tuple[Tensor, Tensor, list[Tensor]]:
    rows = [prompt_ids(1, n, seed + i)[0] for i, n in enumerate(lengths)]
    ids, mask = left_pad_rows(rows, EOS)
    return ids, mask, rows


@pytest.mark.parametrize("policy,cache", [("low_confidence", "none"), ("threshold", "none"),
                                          ("threshold", "block_causal"), ("eb", "none"),
                                          ("low_confidence", "block_causal")])
def test_block_causal_batch_equals_rows_alone(policy, cache) -> None:
    ids, mask, rows = _ragged([5, 7, 10, 13, 8, 6])
    sampler = DiffusionSampler(MODELS["sdar"], policy, cache=cache, gen_length=12)
    out = sampler.generate(ids, mask)
    for i, r in enumerate(rows):
        alone = sampler.generate(r[None])
        assert torch.equal(out.answer[i], alone.answer[0]), i
        assert int(out.nfe[i]) == int(alone.nfe[0]), i
        assert torch.equal(out.tokens[i, :ids.shape[1]], ids[i])  # prompt (and pads) kept


def test_tiny_sdar_eval_nfe_is_batch_invariant() -> None:
    from dllm_decode import load_model
    from dllm_decode.eval.parallelbench.grid import DecodeConfig
    from dllm_decode.eval.runner import left_pad, sampler_decode_fn

    decode = sampler_decode_fn(load_model("tiny-sdar"))
    config = DecodeConfig(model="tiny-sdar", policy="threshold", params=(("tau", 0.9),),
                          cache="none", gen_length=16, block_length=None, steps=None,
                          temperature=0.0, seed=0)
    prompts = [prompt_ids(1, n, i)[0].tolist() for i, n in enumerate([5, 7, 10, 13, 8, 6])]
    batch = decode(*left_pad(prompts, 0), config)
    for i, p in enumerate(prompts):
        one = decode(*left_pad([p], 0), config)
        assert torch.equal(batch.answer[i], one.answer[0])
        assert int(batch.nfe[i]) == int(one.nfe[0])


def test_sampling_with_per_row_seeds_is_batch_invariant() -> None:
    for family in ("llada", "sdar"):
        ids, mask, rows = _ragged([4, 6, 3])
        sampler = DiffusionSampler(MODELS[family], "low_confidence", gen_length=8, steps=8,
                                   temperature=0.9)
        out = sampler.generate(ids, mask, seed=[11, 12, 13])
        for i, r in enumerate(rows):
            alone = sampler.generate(r[None], seed=11 + i)
            assert torch.equal(out.answer[i], alone.answer[0]), (family, i)
        with pytest.raises(ValueError, match="one int per row"):
            sampler.generate(ids, mask, seed=[1, 2])


# ---- the uniform noise kind (``samplers.uniform``): the same contract, its own eligibility ----
def test_uniform_non_finite_logits_are_named() -> None:
    """NaN decoder logits never reach torch's sampler: the rows are named at the next sync."""
    model = tiny_gemma(seed=5)
    decode = model.decode

    def broken(canvas, cache, sc=None):
        logits = decode(canvas, cache, sc)
        logits[1:, :, 4] = math.nan
        return logits

    model.decode = broken
    with pytest.raises(NonFiniteLogitsError, match=r"in rows \[1\]"):
        DiffusionSampler(model, "gemma_renoise").generate(prompt_ids(2, 3), gen_length=8)


@dataclass(frozen=True)
class GreedyAll:
    """Accepts the whole canvas, prompt included: outside eligible on a uniform canvas."""

    capabilities = Capabilities(budgeted=False, noise_kinds=("mask", "uniform"))

    def select(self, state: StepState) -> Tensor:
        return torch.ones_like(state.eligible)


def test_uniform_acceptance_outside_eligible_is_a_contract_error() -> None:
    with pytest.raises(PolicyContractError, match="not eligible"):
        DiffusionSampler(tiny_gemma(seed=5), GreedyAll()).generate(prompt_ids(1, 3), gen_length=8)


def test_noise_kind_mismatches_are_refused() -> None:
    """A mask-token policy on a uniform-noise model, a uniform-only preset on a mask model."""
    with pytest.raises(ValueError, match="uniform-noise model without a mask token"):
        DiffusionSampler(tiny_gemma(seed=5), "low_confidence")
    with pytest.raises(ValueError, match="noise_kind 'mask'"):
        DiffusionSampler(MODELS["llada"], "gemma_renoise")
    with pytest.raises(ValueError, match="noise_kinds"):
        Capabilities(noise_kinds=("gaussian",))
