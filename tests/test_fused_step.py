"""The fused step (``samplers.fused``: top-k / threshold of the probability) against the
generic ``post_forward``.

Every case decodes twice, once with the fused step and once with it switched off, and compares
everything a ``Generation`` records: tokens, commit steps, bits, NFE, refresh flags. Each case
also checks that the fused step actually ran (or, for the cases it must leave alone, that it
did not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from dllm_decode import DiffusionSampler
from dllm_decode.policies import Threshold, TopK
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.resolve import compose
from dllm_decode.samplers import mask_run as sampler_module  # the mask loop's step
from dllm_decode.samplers import mask_setup  # builds the fused step's selector
from dllm_decode.samplers.contract import NonFiniteLogitsError
from dllm_decode.types import ScoreKind
from tests.helpers import EOS, MASK, left_pad_rows, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {f: tiny_model(f, seed=11) for f in ("llada", "dream", "sdar")}
# a vocabulary large enough that cache-free steps score the masked rows alone (the widened path)
MODELS["llada-v1024"] = tiny_model("llada", seed=11, vocab_size=1024, embedding_size=1024)


def _prompt(b: int, p: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, EOS, (b, p), generator=g)


def _decode(monkeypatch: pytest.MonkeyPatch, fused: bool, model: Any, policy: Any,
            prompt: Tensor, mask: Tensor | None = None, **kw: Any) -> tuple[Any, int]:
    """One decode with the fused step on or off; returns it and the number of fused steps."""
    calls = [0]
    real = sampler_module.fused_step

    def counted(*a: Any, **k: Any) -> bool:
        done = real(*a, **k)
        calls[0] += done
        return done

    monkeypatch.setattr(sampler_module, "fused_step", counted)
    if not fused:
        monkeypatch.setattr(mask_setup, "span_selector", lambda *a, **k: None)
    try:
        out = DiffusionSampler(model, policy, **kw).generate(prompt, mask)
    finally:
        monkeypatch.undo()
    return out, calls[0]


def _same(a: Any, b: Any) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.commit_step, b.commit_step)
    assert torch.equal(a.bits, b.bits)  # float64, bit for bit
    assert torch.equal(a.nfe, b.nfe) and a.forwards == b.forwards and a.steps == b.steps
    assert torch.equal(a.refreshed, b.refreshed) and a.step_forwards == b.step_forwards


CASES = [
    # family, policy, cache, gen, block, steps, extra settings
    ("llada", "low_confidence", "none", 16, 4, 16, {}),
    ("llada", "low_confidence", "prefix", 16, 8, 8, {}),
    ("llada", "low_confidence", "dual", 16, 4, 8, {}),
    ("llada", "low_confidence", "dual", 24, 8, 6, {"temperature": 0.7, "seed": 3}),
    ("llada", "low_confidence", "dual", 16, 4, 16, {"refresh_every": 2}),
    ("llada", "low_confidence", "none", 16, 8, 16, {"cfg_scale": 1.5}),
    ("llada", "low_confidence", "prefix", 16, 4, 16, {"stop_at_eos": True}),
    ("llada", "low_confidence", "none", 32, 32, 32, {"logits_eos_inf": True}),
    # rng="reference": the threshold fuses (its budgeted top-k twin selects in post_forward,
    # in the references' tie order: tests/test_reference_ties.py)
    ("llada", "threshold", "dual", 16, 8, None, {"temperature": 1.0, "rng": "reference"}),
    ("llada-v1024", "low_confidence", "none", 32, 8, 16, {}),
    ("dream", "maskgit_plus", "none", 16, None, 16, {}),
    ("llada", "threshold", "none", 16, 8, None, {}),
    ("llada", "threshold", "prefix", 16, 4, None, {"tau": 0.5}),
    ("llada", "threshold", "dual", 24, 8, None, {"temperature": 0.7, "seed": 5}),
    ("llada-v1024", "threshold", "none", 32, 16, None, {"tau": 0.3}),
    ("dream", "threshold", "dual", 16, 8, None, {}),
    ("sdar", "threshold", "block_causal", 16, None, None, {}),
    ("dream", "maskgit_plus", "dual", 16, 8, 8, {}),
    ("sdar", "low_confidence", "none", 16, None, 16, {}),
    ("sdar", "low_confidence", "block_causal", 16, None, 8, {}),
]


@pytest.mark.parametrize("family,policy,cache,gen,block,steps,extra", CASES)
def test_fused_step_is_the_generic_step(monkeypatch, family, policy, cache, gen, block, steps,
                                        extra) -> None:
    model = MODELS[family]
    rows = [torch.tensor(r) for r in ([5, 9, 2, 7, 1, 3], [4, 8], [6, 6, 2, 9])]
    prompt, mask = left_pad_rows(rows, EOS)
    kw = dict(cache=cache, gen_length=gen, block_length=block, **extra)
    if steps is not None:
        kw["steps"] = steps
    fused, n_fused = _decode(monkeypatch, True, model, policy, prompt, mask, **kw)
    generic, n_generic = _decode(monkeypatch, False, model, policy, prompt, mask, **kw)
    _same(fused, generic)
    assert n_fused > 0 and n_generic == 0


@pytest.mark.parametrize("seed", range(4))
def test_fused_step_on_random_prompts_and_batches(monkeypatch, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(1, 5, (1,), generator=g))
    prompt = _prompt(b, int(torch.randint(2, 9, (1,), generator=g)), seed)
    block = [4, 8, 16][seed % 3]
    kw = dict(cache=["none", "prefix", "dual", "dual"][seed], gen_length=16, block_length=block,
              steps=[16, 8, 4, 16][seed])
    fused, n = _decode(monkeypatch, True, MODELS["llada"], "low_confidence", prompt, **kw)
    generic, _ = _decode(monkeypatch, False, MODELS["llada"], "low_confidence", prompt, **kw)
    _same(fused, generic)
    # every step but each block's last (forced commits, stall check: the generic step)
    assert n == fused.steps - 16 // block


def _random_setting(seed: int) -> tuple[Any, str, Tensor, Tensor, dict[str, Any]]:
    """A random decode setting: family, policy, cache mode (window included), G, block, steps,
    sampling, RNG mode, CFG, EOS options, exact steps, a masked prompt position, padding."""
    import random

    rng = random.Random(seed)
    fam = rng.choice(["llada", "dream", "sdar", "llada-v1024"])
    policy = rng.choice(["low_confidence", "maskgit_plus", "threshold"])
    cache = rng.choice(["none", "block_causal"] if fam == "sdar" else
                       ["none", "prefix", "dual", "window"])
    g = rng.choice([8, 16, 24])
    kw: dict[str, Any] = dict(cache=cache, gen_length=g)
    blocks = 1
    if fam != "sdar":
        block = rng.choice([d for d in (4, 8) if g % d == 0] + [None])
        kw["block_length"], blocks = block, g // (block or g)
    if policy == "threshold":
        kw["tau"] = rng.choice([0.3, 0.9])
    else:
        kw["steps"] = rng.choice([s for s in (g, g // 2) if s % blocks == 0])
    if rng.random() < 0.3:
        kw.update(temperature=0.7, seed=rng.randrange(100),
                  rng=rng.choice(["compact", "reference"]))
    if cache == "none" and rng.random() < 0.2:
        kw["cfg_scale"] = 1.0
    if cache == "window":
        kw["window_tokens"] = 4
    for flag in ("stop_at_eos", "logits_eos_inf", "exact_steps"):
        if rng.random() < 0.2:
            kw[flag] = True
    rows = [torch.randint(0, EOS, (rng.randint(2, 7),), generator=torch.Generator().manual_seed(
        seed * 10 + i)) for i in range(rng.randint(1, 3))]
    if rng.random() < 0.2:
        kw["allow_prompt_masks"] = True
        rows[0][0] = MASK
    prompt, mask = left_pad_rows(rows, EOS)
    return MODELS[fam], policy, prompt, mask, kw


@pytest.mark.parametrize("seed", range(16))
def test_fused_step_in_random_settings(monkeypatch, seed) -> None:
    model, policy, prompt, mask, kw = _random_setting(seed)
    outs = []
    for fused in (True, False):
        try:
            outs.append(_decode(monkeypatch, fused, model, policy, prompt, mask, **kw)[0])
        except ValueError as err:  # a setting the sampler refuses: refused the same way
            outs.append(str(err))
    if isinstance(outs[0], str) or isinstance(outs[1], str):
        assert outs[0] == outs[1]
        return
    _same(*outs)
    assert torch.equal(outs[0].lengths, outs[1].lengths)


@dataclass(frozen=True)
class TopKCopy(TopK):
    """A subclass may override ``select``: the fused step must not assume it is a top-k."""


@pytest.mark.parametrize("policy,kw", [
    (Policy(TopKCopy()), {}),  # a subclass
    (Policy(TopK(score=ScoreKind.MARGIN)), {}),  # another score
    (Policy(TopK(alg_temp=0.5)), {}),  # sampled positions
    (Policy(Threshold(score=ScoreKind.NEG_ENTROPY, tau=-0.5)), {}),
    (compose("low_confidence", stopper="sched"), {}),  # a stopper
    ("low_confidence", {"cache": "window", "window_tokens": 4}),  # per-row fed rows
])
def test_fused_step_leaves_other_steps_alone(monkeypatch, policy, kw) -> None:
    prompt = _prompt(2, 5, 1)
    settings = dict(dict(gen_length=16, block_length=8, steps=16), **kw)
    fused, n_fused = _decode(monkeypatch, True, MODELS["llada"], policy, prompt, **settings)
    generic, _ = _decode(monkeypatch, False, MODELS["llada"], policy, prompt, **settings)
    _same(fused, generic)
    assert n_fused == 0


def test_fused_step_is_off_with_debug_checks_and_callbacks(monkeypatch) -> None:
    prompt = _prompt(1, 4, 2)
    calls = [0]
    real = sampler_module.fused_step
    monkeypatch.setattr(sampler_module, "fused_step",
                        lambda *a, **k: calls.__setitem__(0, calls[0] + 1) or real(*a, **k))
    model = MODELS["llada"]
    DiffusionSampler(model, "low_confidence", debug=True, gen_length=8, steps=8).generate(prompt)
    DiffusionSampler(model, "low_confidence", gen_length=8, steps=8).generate(
        prompt, on_step=lambda state, commit: None)
    assert calls[0] == 0


class _NaNAfter:
    """Wraps a model: from forward ``after`` on, row ``row`` gets a NaN logit everywhere."""

    def __init__(self, model: Any, row: int, after: int) -> None:
        self._model, self._row, self._after, self.calls = model, row, after, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, tokens: Tensor, positions: Tensor, **kw: Any) -> Tensor:
        logits = self._model(tokens, positions, **kw)
        self.calls += 1
        if self.calls > self._after:
            logits[self._row, :, 3] = math.nan
        return logits

    forward = __call__


@pytest.mark.parametrize("name,cache,gen", [("llada", "dual", 16), ("llada-v1024", "none", 32)])
def test_fused_step_still_raises_on_non_finite_logits(name, cache, gen) -> None:
    # V = 1024 without a cache scores the masked rows alone (the widened path of the fused step)
    model = _NaNAfter(MODELS[name], row=1, after=1)
    sampler = DiffusionSampler(model, "low_confidence", cache=cache, gen_length=gen,
                               block_length=gen // 2, steps=gen)
    with pytest.raises(NonFiniteLogitsError, match=r"at step 1 in rows \[1\]"):
        sampler.generate(_prompt(3, 4, 0))
