"""Composition as a tested property: every registered preset, plain and wrapped by SchED
(stability gate on), by EoTP, and by both, with and without a cache.

Per cell: decoding terminates, no mask is left in the answer, and the degenerate wrappers
(SchED that never fires, EoTP whose EOS is never proposed) reproduce the plain preset token for
token, NFE included. Bidirectional presets run on the bundled ``tiny-llada`` (Dream presets on
``tiny-dream``) with cache ``none`` / ``dual``; presets that need a block-diffusion model run on
``tiny-sdar`` with ``none`` / ``block_causal`` (its exact cache; ``dual`` is refused there).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.policies.capabilities import capabilities_of
from dllm_decode.policies.learn2pd import with_eotp
from dllm_decode.policies.presets import DREAM_NAMES
from dllm_decode.policies.resolve import PRESETS
from dllm_decode.policies.resolve import make_policy as build
from dllm_decode.policies.sched import Supervised, sched_policy
from tests.helpers import mask_presets, tiny_model

NAMES = mask_presets(PRESETS)
WRAPS = ("plain", "sched", "eotp", "both")
_MODELS: dict[str, Any] = {}


#: presets also run on the block-diffusion model although they do not require one
ALSO_BLOCK_CAUSAL = ("threshold", "ete", "entropy_threshold", "low_confidence_dynamic", "eotp")


def _model(name: str) -> Any:
    """``tiny-sdar`` is the bundled checkpoint; the bidirectional models are the smaller
    seeded test models (tiny LLaDA / Dream layouts), to keep the matrix fast."""
    if name not in _MODELS:
        _MODELS[name] = (load_model(name) if name == "tiny-sdar" else
                         tiny_model(name.removeprefix("tiny-"), seed=2))
    return _MODELS[name]


def _homes(name: str) -> list[tuple[str, str]]:
    """(model, cache) pairs a preset runs on."""
    caps = capabilities_of(build(name).selector)
    sdar = [("tiny-sdar", "none"), ("tiny-sdar", "block_causal")]
    if caps.requires_attention == "block_causal":
        return sdar
    own = "tiny-dream" if name in DREAM_NAMES or name == "window_dream" else "tiny-llada"
    if caps.attention_maps:  # DAWN reads the L x L maps of an uncached forward
        return [(own, "none")]
    if caps.soft_inputs:  # ReMix feeds new input embeddings to every masked position per step
        return [(own, "none")]
    return [(own, "none"), (own, "dual")] + (sdar if name in ALSO_BLOCK_CAUSAL else [])


def _wrap(name: str, wrap: str, *, degenerate: bool, mask_id: int) -> Any:
    policy = build(name)
    if wrap in ("sched", "both"):
        tau = math.inf if degenerate else 2.5  # +inf: never fires; the gate stays on
        policy = sched_policy(base=policy, tau_high=max(tau, 7.5), tau_low=tau)
    if wrap in ("eotp", "both"):
        # the mask token is never proposed, so a degenerate EoTP never truncates
        policy = with_eotp(policy, eos_token_ids=(mask_id,) if degenerate else None)
    return policy


def _run(model: Any, policy: Any, cache: str) -> Any:
    prompt = torch.randint(3, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    block = None if model.attention == "block_causal" else 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # learn2pd without a K=4 filter: top-k fallback only
        sampler = DiffusionSampler(model, policy, cache=cache, debug=True)
        return sampler.generate(prompt, gen_length=8, block_length=block, steps=8, seed=3)


CELLS = [(n, w, m, c) for n in NAMES for m, c in _homes(n) for w in WRAPS]
_BASE: dict[tuple[str, str, str], Any] = {}


@pytest.mark.parametrize("name, wrap, model_name, cache", CELLS)
def test_preset_composes(name: str, wrap: str, model_name: str, cache: str) -> None:
    model = _model(model_name)
    policy = build(name)
    clash = ((wrap in ("sched", "both") and policy.stopper is not None, "stopper"),
             (wrap in ("eotp", "both") and policy.truncator is not None, "truncator"))
    for refused, what in clash:
        if refused:  # the preset already is SchED / EoTP: stacking a second one is an error
            with pytest.raises(ValueError, match=f"already has a {what}"):
                _wrap(name, wrap, degenerate=False, mask_id=model.mask_token_id)
            return
    live = _run(model, _wrap(name, wrap, degenerate=False, mask_id=model.mask_token_id), cache)
    assert not (live.answer == model.mask_token_id).any(), "masks left"
    assert live.steps <= 8 * 8 and live.forwards >= 1
    if wrap == "plain":
        _BASE[name, model_name, cache] = live
        return
    key = (name, model_name, cache)
    base = _BASE[key] if key in _BASE else _run(model, policy, cache)
    same = _run(model, _wrap(name, wrap, degenerate=True, mask_id=model.mask_token_id), cache)
    assert torch.equal(same.tokens, base.tokens), "degenerate wrapper changed the tokens"
    assert torch.equal(same.nfe, base.nfe) and same.forwards == base.forwards


@pytest.mark.filterwarnings("ignore:learn2pd")
@pytest.mark.parametrize("name", ["learn2pd", "learn2pd_eot", "eotp", "entropy_threshold"])
def test_sched_keeps_its_memory_over_binding_bases(name: str) -> None:
    """SchED's gate needs its memory; bases that bind (Learn2PD, EoTP, dParallel) used to make
    the sampler replace the wrapper by the bound base. With tau = -inf the released gate exits
    at the first step whose argmax repeats: never at step 0."""
    model = _model("tiny-llada")
    policy = sched_policy(base=name, tau_high=-math.inf, tau_low=-math.inf)
    bound = policy.selector.bind(model, None)
    assert isinstance(bound, Supervised)
    out = _run(model, policy, "none")
    assert out.forwards >= 2
    assert not (out.answer == model.mask_token_id).any()
    if policy.truncator is None:
        both = with_eotp(policy)
        assert isinstance(both.selector.bind(model, None).inner, Supervised)
        assert not (_run(model, both, "dual").answer == model.mask_token_id).any()
