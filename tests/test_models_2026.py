"""The 2026 families on the conformance checkpoints (LLaDA2, LLaDA-MoE, Fast-dLLM v2): the
reference logits, cached vs uncached decoding, LLaDA-MoE's recorded cases, loading by Hub id."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.models import load_model
from tests.conformance import assert_reference_logits, llada_settings, load_cases, tensors
from tests.helpers import lay_out_cache
from tests.moe_helpers import fixture_mask_id, load_fixture, offline_hub, seeded  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread", "seeded")

#: fixture directory -> (model class name, attention kind)
FIXTURES = {
    "llada2-tiny": ("LLaDA2MoEModel", "block_causal"),
    "fastdllm2-tiny": ("FastDLLMv2Model", "block_causal"),
    "llada-moe-tiny": ("LLaDAMoEModel", "bidirectional"),
}
LLADA_MOE_CASES = load_cases("llada-moe-tiny")


def _fixture_view(model, inp: dict, length: int):
    """The model as the fixture ran it: a fixture input without a block size attended
    bidirectionally (one block over the whole input)."""
    block = inp.get("block_length") or inp.get("block_size")
    if model.attention == "block_causal":
        return model.with_block_size(block or length)
    assert block is None
    return model


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("impl", ["grouped", "reference"])
def test_conformance_logits(name: str, impl: str) -> None:
    """fp32 logits within 1e-4 of the reference's (its own fp32-vs-fp64 error is ~5e-5)."""
    directory, model = load_fixture(name)
    cls, attention = FIXTURES[name]
    assert type(model).__name__ == cls and model.attention == attention

    def forward(inp: dict, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        view = _fixture_view(model, inp, ids.shape[1])
        if hasattr(view, "moe_impl"):
            view.moe_impl = impl
        return view(ids, pos)

    assert_reference_logits(model, directory, forward)


@pytest.mark.parametrize("name", FIXTURES)
def test_cached_decoding_is_token_identical(name: str) -> None:
    """The sampler's exact cache (block-causal; bidirectional: dual refreshed every step)
    gives the tokens of uncached decoding."""
    _, model = load_fixture(name)
    cached: dict = {"cache": "dual", "refresh_every": 1}
    if model.attention == "block_causal":
        model, cached = model.with_block_size(8), {"cache": "block_causal"}
    prompt = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(0))
    runs = [DiffusionSampler(model, "low_confidence", gen_length=16, block_length=8, steps=8,
                             **kw).generate(prompt) for kw in ({"cache": "none"}, cached)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert (runs[0].answer != model.mask_token_id).all()


@pytest.mark.parametrize("case", LLADA_MOE_CASES, ids=[c["name"] for c in LLADA_MOE_CASES])
def test_llada_moe_case(case: dict) -> None:
    """Recorded (machine-independent under the fp32 perturbations of
    ``test_conformance.test_llada_case``): LLaDA-MoE's cases ran ML-GSAI/LLaDA's ``generate``:
    the LLaDA mapping reproduces them
    token for token, NFE included (these newer cases carry their settings in ``args`` only)."""
    _, model = load_fixture("llada-moe-tiny")
    policy, params = llada_settings(dict(case, settings={}), model)
    prompt, mask = tensors(case)
    out = DiffusionSampler(model, policy, debug=True, **params).generate(prompt, mask)
    assert torch.equal(out.tokens, torch.tensor(case["output_ids"])), case["name"]
    assert out.forwards == case["nfe"], case["name"]


@pytest.mark.usefixtures("offline_hub")
@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_checkpoint_loads_by_hub_id(tmp_path: Path, name: str) -> None:
    """The released-format fixture files as a Hub cache entry, with the mask id in
    ``generation_config.json`` (where a config without it is completed from)."""
    directory, model = load_fixture(name)
    src = shutil.copytree(directory, tmp_path / "src")
    (src / "generation_config.json").write_text(json.dumps(
        {"mask_token_id": fixture_mask_id(name)}))
    repo = f"test-org/{name}"
    lay_out_cache(tmp_path / "hub", repo, src)
    hub = load_model(repo)
    assert hub.mask_token_id == model.mask_token_id and type(hub) is type(model)
    tokens = torch.randint(0, 300, (1, 12))
    pos = torch.arange(12)[None]
    with torch.no_grad():
        assert torch.equal(hub(tokens, pos), model(tokens, pos))
