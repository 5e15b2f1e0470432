"""``cache="dllm_cache"`` (dLLM-Cache, ``cache.dllm_cache`` + ``models.feature_cache``):
conformance to the authors' hooks token for token, its reduction to the uncached forward, every
mask preset under it, batch invariance and the positions it recomputes.

The recorded cases (``tests/fixtures/methods2026/dllm_cache.json``, recorded by
``benchmarks/conformance/record_dllm_cache.py``) run on ``../shared/conformance/llada-tiny`` and
skip when ``../shared`` is absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.cache.dllm_cache import FeatureStore
from dllm_decode.config import SamplerConfig
from dllm_decode.policies.capabilities import capabilities_of
from dllm_decode.policies.presets import DREAM_NAMES
from dllm_decode.policies.resolve import PRESETS, make_policy
from tests.helpers import mask_presets, tiny_model
from tests.test_wino import Noisy, _llada

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "methods2026" / "dllm_cache.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def _cache_args(args: dict) -> dict[str, Any]:
    if not args["prompt_interval_steps"]:
        return {}
    return dict(cache="dllm_cache", prompt_refresh_every=args["prompt_interval_steps"],
                refresh_every=args["gen_interval_steps"], refresh_ratio=args["transfer_ratio"])


def _decode(model: Any, case: dict) -> Any:
    a = case["args"]
    sampler = DiffusionSampler(model, "low_confidence", debug=True, **_cache_args(a))
    return sampler.generate(torch.tensor(case["prompt_ids"]), gen_length=a["gen_length"],
                            block_length=a["block_length"], steps=a["steps"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_dllm_cache_case(case: dict) -> None:
    out = _decode(_llada(), case)
    assert out.answer.tolist() == case["answer_ids"], case["name"]
    assert out.forwards == case["nfe"] == out.steps


@pytest.mark.parametrize("case", CASES[2:6], ids=[c["name"] for c in CASES[2:6]])
def test_dllm_cache_case_under_logit_noise(case: dict) -> None:
    out = _decode(Noisy(_llada(), 1e-6, seed=3), case)
    assert out.answer.tolist() == case["answer_ids"]


def test_cases_cover_partial_refreshes() -> None:
    """Cached runs whose answers differ from the uncached one, with partial refreshes."""
    partial = [c for c in CASES if c["checks"]["partial_refreshes"]]
    assert len(partial) >= 4
    assert all(c["checks"]["min_cut_margin"] >= 1e-5 for c in partial)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_full_refresh_is_the_uncached_forward_bit_for_bit(family: str) -> None:
    """Both refreshed at every layer: the logits of ``model.forward``, exactly."""
    model = tiny_model(family, seed=3)
    tokens = torch.randint(0, 60, (2, 11), generator=torch.Generator().manual_seed(1))
    pos = model.rope_positions(torch.ones_like(tokens, dtype=torch.bool))
    store = FeatureStore(len(model.layers), 5, 0.25)
    with torch.inference_mode():
        plain = model(tokens, pos)
        cached = model.feature_forward(tokens, pos, store, refresh_prompt=True,
                                       refresh_gen=True, full_mask=None, key_mask=None)
    assert torch.equal(plain, cached)
    assert store.recomputed == 11


def test_refresh_every_step_equals_no_cache() -> None:
    """``K_p = K_r = 1``: the tokens, NFE and positions of ``cache="none"``."""
    model = tiny_model("llada", seed=4)
    prompt = torch.randint(0, 60, (2, 6), generator=torch.Generator().manual_seed(2))
    common = dict(gen_length=16, block_length=8, steps=8)
    base = DiffusionSampler(model, "threshold").generate(prompt, **common)
    every = DiffusionSampler(model, "threshold", cache="dllm_cache", prompt_refresh_every=1,
                             refresh_every=1, refresh_ratio=0.5).generate(prompt, **common)
    assert torch.equal(base.tokens, every.tokens) and torch.equal(base.nfe, every.nfe)
    assert base.positions == every.positions
    assert all(every.refreshed.flatten().tolist())


BIDIRECTIONAL = [n for n in mask_presets(PRESETS)
                 if capabilities_of(make_policy(n).selector).requires_attention is None
                 and not capabilities_of(make_policy(n).selector).attention_maps
                 # ReMix: soft inputs at every masked position, new each step (no feature reuse)
                 and not capabilities_of(make_policy(n).selector).soft_inputs]


@pytest.mark.filterwarnings("ignore:learn2pd")
@pytest.mark.parametrize("name", BIDIRECTIONAL)
def test_every_selector_runs_under_dllm_cache(name: str) -> None:
    """Each mask preset: with ``K_p = K_r = 1`` the uncached tokens, NFE and positions; with
    sparse refreshes a complete answer and fewer positions recomputed."""
    family = "dream" if name in DREAM_NAMES or name == "window_dream" else "llada"
    model = tiny_model(family, seed=2)
    prompt = torch.randint(3, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    common = dict(gen_length=8, block_length=4, steps=8, seed=3)
    if name == "wino" and model.logit_shift:
        return
    # a preset preferring a pruning plan (streaming_dllm) is compared on full forwards
    own = capabilities_of(make_policy(name).selector).preferred_cache
    plain = {"cache": "none"} if own == "streaming" else {}
    base = DiffusionSampler(model, name, debug=True, **plain).generate(prompt, **common)
    every = DiffusionSampler(model, name, cache="dllm_cache", prompt_refresh_every=1,
                             refresh_every=1, debug=True).generate(prompt, **common)
    assert torch.equal(base.tokens, every.tokens) and torch.equal(base.nfe, every.nfe)
    sparse = DiffusionSampler(model, name, cache="dllm_cache", prompt_refresh_every=4,
                              refresh_every=3, debug=True).generate(prompt, **common)
    assert not (sparse.answer == model.mask_token_id).any()
    assert sparse.positions < every.positions


def test_batch_rows_decode_as_alone() -> None:
    model = tiny_model("llada", seed=5)
    prompts = torch.randint(0, 60, (3, 7), generator=torch.Generator().manual_seed(6))
    sampler = DiffusionSampler(model, "low_confidence", cache="dllm_cache",
                               prompt_refresh_every=5, refresh_every=3)
    both = sampler.generate(prompts, gen_length=16, block_length=8, steps=16)
    for row in range(3):
        alone = sampler.generate(prompts[row:row + 1], gen_length=16, block_length=8, steps=16)
        assert torch.equal(both.tokens[row], alone.tokens[0])
    assert both.step_positions == alone.step_positions


def test_sampled_run_repeats_with_its_seed() -> None:
    model = tiny_model("llada", seed=7)
    prompt = torch.randint(0, 60, (2, 5), generator=torch.Generator().manual_seed(8))
    sampler = DiffusionSampler(model, "threshold", cache="dllm_cache", refresh_every=3)
    runs = [sampler.generate(prompt, gen_length=16, block_length=8, temperature=0.7, seed=5)
            for _ in range(2)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert runs[0].step_positions == runs[1].step_positions


def test_positions_recomputed_per_step() -> None:
    """Forward s (0-based): both refreshed when ``s % K_p == s % K_r == 0`` (every position,
    every layer); the first layer always refreshes, so a step that refreshes nothing recomputes
    ``(L + (n - 1) * int(rho * G)) / n`` positions per layer on average (``n`` layers)."""
    model = tiny_model("llada", seed=6)
    p, g, n = 6, 16, len(model.layers)
    out = DiffusionSampler(model, "low_confidence", cache="dllm_cache", prompt_refresh_every=4,
                           refresh_every=3, refresh_ratio=0.25).generate(
        torch.randint(0, 60, (1, p), generator=torch.Generator().manual_seed(7)),
        gen_length=g, block_length=8, steps=16)
    length, k = p + g, int(0.25 * g)
    for s, got in enumerate(out.step_positions):
        prompt, gen = s % 4 == 0, s % 3 == 0
        rest = length if prompt and gen else (g if gen else 0) + (p if prompt else 0) + (
            0 if gen else k)
        assert got == (length + (n - 1) * rest) / n, s
    assert out.positions == sum(out.step_positions) < out.steps * length


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="configures cache='dllm_cache'"):
        SamplerConfig(refresh_ratio=0.5)
    with pytest.raises(ValueError, match="refresh_ratio must be in"):
        SamplerConfig(cache="dllm_cache", refresh_ratio=1.5)
    with pytest.raises(ValueError, match="bidirectional"):
        DiffusionSampler(load_model("tiny-sdar"), "threshold", cache="dllm_cache").generate(
            torch.tensor([[5, 6, 7]]), gen_length=4)
