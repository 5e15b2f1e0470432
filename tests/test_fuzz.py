"""Property suite: families x presets and compositions x caches x batch / padding x adversarial
models. Every decode terminates, leaves no mask in the answer, keeps the prompt, and a batch
decodes like its rows alone; adversarial models end in the documented error class.

The default profile keeps to CI time on one thread; ``-m slow`` runs many more examples. Both
draw the same examples on every run (``tests/conftest.py``: the ``deterministic`` hypothesis
profile); ``--hypothesis-profile=explore --hypothesis-seed=N`` draws new ones. Falsifying
examples found that way are replayed by ``test_fuzz_regressions``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from dllm_decode import DiffusionSampler
from dllm_decode.policies.capabilities import capabilities_of
from dllm_decode.policies.resolve import PRESETS, make_policy
from dllm_decode.samplers.contract import NonFiniteLogitsError
from tests.helpers import EOS, MASK, left_pad_rows, mask_presets, tiny_gemma, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {f: tiny_model(f, seed=3) for f in ("llada", "dream", "sdar")}
#: presets, plus compositions (a stopper / truncator over another base)
POLICIES: list[tuple[str, dict[str, Any]]] = [(name, {}) for name in mask_presets(PRESETS)] + [
    ("sched", {"base": "threshold", "tau": 0.7}), ("sched", {"base": "eb"}),
    ("prophet", {"base": "entropy"}), ("sched", {"base": "low_confidence_dynamic"}),
    # token editing over other selectors (edits bounded per block: ``samplers.editing``)
    ("edit", {"base": "low_confidence", "editing_threshold": 0.3, "max_post_steps": 2}),
    ("edit", {"base": "eb", "editing_threshold": 0.0}), ("llada21", {"mode": "speed"}),
    # sub-blocks smaller than the block (cache="sub_block" refreshes per row)
    ("fastdllm_v2", {"small_block_size": 2, "threshold": 0.5}),
]
CACHES = {"llada": ["none", "prefix", "dual", "window"], "dream": ["none", "prefix", "dual"],
          "sdar": ["none", "block_causal", "sub_block"]}
#: greedy decodes whose tokens are not exactly batch-invariant by design
RANDOM_ORDER = {"random", "origin", "s2d2"}


class Adversary:
    """A model whose logits are replaced after the real forward (caches keep working)."""

    def __init__(self, model: Any, kind: str) -> None:
        self._model, self.kind = model, kind

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, tokens: Tensor, positions: Tensor, **kw: Any) -> Tensor:
        logits = self._model.forward(tokens, positions, **kw)
        if self.kind == "nan":
            logits[:, :, 5] = math.nan
        elif self.kind == "neg_inf_half":  # every logit -inf in the batch's first half
            logits[: max(1, logits.shape[0] // 2)] = -math.inf
        elif self.kind == "constant":
            logits = torch.zeros_like(logits)
        elif self.kind == "always_eos":
            logits[..., EOS] = 50.0
        elif self.kind == "always_mask":
            logits[..., MASK] = 50.0
        return logits

    __call__ = forward


def _batch(lengths: list[int], seed: int) -> tuple[Tensor, Tensor, list[Tensor]]:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, EOS, (n,), generator=g) for n in lengths]
    ids, mask = left_pad_rows(rows, EOS)
    return ids, mask, rows


def _sampler(model: Any, family: str, policy: str, params: dict, cache: str, g: int,
             temperature: float) -> DiffusionSampler | None:
    """The sampler, or ``None`` for combinations refused up front with a clear ValueError."""
    kwargs = dict(gen_length=g, steps=g, temperature=temperature)
    if family != "sdar":
        kwargs["block_length"] = min(4, g)
    if policy == "origin":
        kwargs.update(schedule="dream", block_length=None)
    try:
        return DiffusionSampler(model, policy, cache=cache, **params, **kwargs)
    except ValueError as err:  # policy/model/cache mismatches are refused, never decoded wrong
        assert any(w in str(err) for w in ("needs", "cache", "attention", "block")), err
        return None


def _check(out, ids: Tensor, g: int) -> None:
    p = ids.shape[1]
    assert out.tokens.shape == (ids.shape[0], p + g)
    assert torch.equal(out.tokens[:, :p], ids)  # prompt (and its padding) untouched
    assert not (out.answer == MASK).any()  # no mask left in any answer
    assert (out.nfe >= 1).all() and out.steps >= 1


def _decode_and_check(family: str, choice: int, cache_pick: int, lengths: list[int],
                      g: int, temperature: float, seed: int) -> None:
    policy, params = POLICIES[choice % len(POLICIES)]
    cache = CACHES[family][cache_pick % len(CACHES[family])]
    model = MODELS[family]
    sampler = _sampler(model, family, policy, params, cache, g, temperature)
    if sampler is None:
        return
    ids, mask, rows = _batch(lengths, seed)
    try:
        out = sampler.generate(ids, mask)
    except ValueError as err:  # e.g. a cache mode the policy cannot drive: a clear refusal
        assert "cache" in str(err) or "rng" in str(err) or "block" in str(err), err
        return
    _check(out, ids, g)
    selector = make_policy(policy, **params).selector
    if temperature == 0 and policy not in RANDOM_ORDER and not capabilities_of(
            selector).stochastic:
        for i, r in enumerate(rows):
            alone = sampler.generate(r[None])
            assert torch.equal(alone.answer[0], out.answer[i]), (policy, cache, i)
            assert int(alone.nfe[0]) == int(out.nfe[i]), (policy, cache, i)
    if temperature > 0:  # per-row seeds: batch == rows alone even when sampling
        seeds = [seed + i for i in range(len(rows))]
        batch = sampler.generate(ids, mask, seed=seeds)
        _check(batch, ids, g)
        i = len(rows) - 1
        alone = sampler.generate(rows[i][None], seed=seeds[i])
        assert torch.equal(alone.answer[0], batch.answer[i]), (policy, cache)


DECODES = dict(
    family=st.sampled_from(sorted(MODELS)),
    choice=st.integers(0, len(POLICIES) - 1),
    cache_pick=st.integers(0, 3),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    g=st.sampled_from([4, 8]),
    temperature=st.sampled_from([0.0, 0.0, 0.8]),
    seed=st.integers(0, 100),
)
# derandomize / database come from the loaded profile (tests/conftest.py: deterministic)
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(**DECODES)
def test_fuzz_decodes(**kw) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # learn2pd without a trained filter warns
        _decode_and_check(**kw)


@pytest.mark.slow
@SLOW
@given(**DECODES)
def test_fuzz_decodes_slow(**kw) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _decode_and_check(**kw)


#: falsifying examples of the slow run, replayed on every run: (policy, the other arguments
#: of ``_decode_and_check``). ETE (cross-block lookahead) used to keep committing in a row
#: whose block was done while its neighbours finished theirs: past the block, against the
#: batch's prefix / dual / window cache of the current block, so the row differed from the
#: same row decoded alone (which moves on to its next block and refreshes the cache).
REGRESSIONS: list[tuple[str, dict[str, Any]]] = [
    ("ete", dict(family="dream", cache_pick=1, lengths=[4, 4, 6], g=8, temperature=0.0,
                 seed=51)),  # prefix
    ("ete", dict(family="dream", cache_pick=2, lengths=[7, 7], g=8, temperature=0.0,
                 seed=79)),  # dual
    ("ete", dict(family="llada", cache_pick=1, lengths=[7, 3], g=8, temperature=0.0,
                 seed=3)),  # prefix
    ("ete", dict(family="llada", cache_pick=3, lengths=[7, 7], g=8, temperature=0.0,
                 seed=12)),  # window
]


@pytest.mark.parametrize("policy,kw", REGRESSIONS)
def test_fuzz_regressions(policy: str, kw: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _decode_and_check(choice=[name for name, _ in POLICIES].index(policy), **kw)


@pytest.mark.parametrize("lengths, temperature, seed", [
    ([5, 5, 5], 0.0, 1), ([3, 6, 7], 0.0, 2), ([4, 4], 0.8, 3), ([7], 0.0, 4)])
def test_fuzz_sub_block_cache(lengths: list[int], temperature: float, seed: int) -> None:
    """``cache="sub_block"`` under sub-blocks smaller than the block (the last policy)."""
    _decode_and_check(family="sdar", choice=len(POLICIES) - 1, cache_pick=2, lengths=lengths,
                      g=8, temperature=temperature, seed=seed)


ADVERSARIES = ["nan", "neg_inf_half", "constant", "always_eos", "always_mask"]


def _adversarial(kind: str, family: str, choice: int, cache_pick: int, lengths: list[int],
                 temperature: float) -> None:
    policy, params = POLICIES[choice % len(POLICIES)]
    cache = CACHES[family][cache_pick % len(CACHES[family])]
    model = Adversary(MODELS[family], kind)
    sampler = _sampler(model, family, policy, params, cache, 4, temperature)
    if sampler is None:
        return
    ids, mask, _ = _batch(lengths, 0)
    if kind in ("nan", "neg_inf_half"):
        with pytest.raises(NonFiniteLogitsError, match=r"non-finite logits.* at step \d+ in rows"):
            sampler.generate(ids, mask)
        return
    try:
        out = sampler.generate(ids, mask)
    except ValueError as err:
        assert "cache" in str(err) or "rng" in str(err) or "block" in str(err), err
        return
    _check(out, ids, 4)
    if kind == "always_eos":
        assert (out.answer == EOS).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(ADVERSARIES), family=st.sampled_from(sorted(MODELS)),
       choice=st.integers(0, len(POLICIES) - 1), cache_pick=st.integers(0, 3),
       lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       temperature=st.sampled_from([0.0, 0.7]))
def test_fuzz_adversarial_models(**kw) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _adversarial(**kw)


@pytest.mark.parametrize("kind", ADVERSARIES)
@pytest.mark.parametrize("policy", ["low_confidence", "threshold", "sched", "eb", "klass"])
def test_every_adversary_meets_every_common_policy(kind: str, policy: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        choice = [name for name, _ in POLICIES].index(policy)
        _adversarial(kind, "llada", choice, 2, [3, 5], 0.0)


# ---- the uniform noise kind (DiffusionGemma-style: random-token canvases, re-noising) ----------
UNIFORM = tiny_gemma(seed=3)
#: the uniform-noise presets and the mask-model acceptance rules that work on a random canvas
UNIFORM_POLICIES: list[tuple[str, dict[str, Any]]] = [
    ("gemma_renoise", {}), ("gemma_renoise", {"early_stop": False}),
    ("gemma_renoise", {"sticky": True, "entropy_bound": 1.0}),
    ("gemma_renoise", {"stability_threshold": 0, "confidence_threshold": 5.0}),
    ("eb", {"gamma": 0.5}), ("threshold", {"tau": 0.3}), ("entropy_threshold", {}),
]


class UniformAdversary:
    """A uniform-noise model whose decoder logits are replaced (encoder untouched)."""

    def __init__(self, model: Any, kind: str) -> None:
        self._model, self.kind = model, kind

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def decode(self, canvas: Tensor, cache: Any, sc: Tensor | None = None) -> Tensor:
        logits = self._model.decode(canvas, cache, sc)
        if self.kind == "nan":
            logits[:, :, 5] = math.nan
        elif self.kind == "neg_inf_half":
            logits[: max(1, logits.shape[0] // 2)] = -math.inf
        elif self.kind == "constant":
            logits = torch.zeros_like(logits)
        elif self.kind == "always_eos":
            logits[..., EOS] = 50.0
        return logits


def _uniform_check(out, ids: Tensor, g: int, budget: int) -> None:
    p = ids.shape[1]
    pad = UNIFORM.pad_token_id
    assert out.tokens.shape == (ids.shape[0], p + g)
    assert torch.equal(out.tokens[:, :p], ids)  # prompt (and its padding) untouched
    ans = out.answer
    assert ((ans >= 0) & (ans < UNIFORM.vocab_size)).all()
    canvases = -(-g // UNIFORM.canvas_length)
    assert (out.nfe >= 1).all() and (out.nfe <= budget * canvases).all()  # terminates
    eos = (ans == EOS).long().cumsum(1)
    assert (ans[(eos > 1) | ((eos == 1) & (ans != EOS))] == pad).all()  # pad after the EOS


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(choice=st.integers(0, len(UNIFORM_POLICIES) - 1),
       lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
       g=st.sampled_from([8, 12, 16]), seed=st.integers(0, 100))
def test_fuzz_uniform_decodes(choice: int, lengths: list[int], g: int, seed: int) -> None:
    """Every uniform-noise decode terminates within its step budget, keeps the prompt, pads
    after a row's EOS, and with per-row seeds a batch decodes like its rows alone."""
    policy, params = UNIFORM_POLICIES[choice]
    sampler = DiffusionSampler(UNIFORM, policy, **params)
    budget = sampler.policy.selector.bind(UNIFORM).max_denoising_steps
    ids, mask, rows = _batch(lengths, seed)
    _uniform_check(sampler.generate(ids, mask, gen_length=g, seed=seed), ids, g, budget)
    seeds = [seed + i for i in range(len(rows))]
    batch = sampler.generate(ids, mask, gen_length=g, seed=seeds)
    _uniform_check(batch, ids, g, budget)
    i = len(rows) - 1
    alone = sampler.generate(rows[i][None], gen_length=g, seed=seeds[i])
    assert torch.equal(alone.answer[0], batch.answer[i]), (policy, params)
    assert int(alone.nfe[0]) == int(batch.nfe[i])


@pytest.mark.parametrize("kind", ["nan", "neg_inf_half", "constant", "always_eos"])
@pytest.mark.parametrize("choice", range(len(UNIFORM_POLICIES)))
def test_uniform_adversarial_models(kind: str, choice: int) -> None:
    policy, params = UNIFORM_POLICIES[choice]
    sampler = DiffusionSampler(UniformAdversary(UNIFORM, kind), policy, **params)
    ids, mask, _ = _batch([3, 5], 0)
    if kind in ("nan", "neg_inf_half"):
        with pytest.raises(NonFiniteLogitsError, match=r"non-finite logits.* step \d+ in rows"):
            sampler.generate(ids, mask, gen_length=16)
        return
    out = sampler.generate(ids, mask, gen_length=16)
    _uniform_check(out, ids, 16, sampler.policy.selector.bind(UNIFORM).max_denoising_steps)
    if kind == "always_eos":  # the first canvas ends every row: EOS, then pad
        assert (out.answer[:, 0] == EOS).all() and (out.answer[:, 1:] == 0).all()
