"""Model layer: conformance logits, checkpoint round trips, structure and error paths."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm_decode.models import (
    CheckpointError,
    build_model,
    load_model,
    register_auto_config,
    save_model,
)
from dllm_decode.models.base import block_causal_mask
from dllm_decode.models.block import BlockDiffusionModel
from tests.conformance import CONFORMANCE, assert_reference_logits, require_shared
from tests.helpers import tiny_config

FAMILIES = ["llada", "dream", "sdar"]


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_conformance_logits(name: str) -> None:
    directory = require_shared(CONFORMANCE / name)
    assert_reference_logits(load_model(directory), directory)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trip(tmp_path, family: str) -> None:
    model = build_model(tiny_config(family), seed=3)
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m")
    tokens = torch.randint(0, 60, (2, 12))
    pos = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        assert torch.equal(model(tokens, pos), again(tokens, pos))
    names = set(load_file(str(tmp_path / "m" / "model.safetensors")))
    expected = {"llada": "model.transformer.blocks.0.ff_proj.weight",
                "dream": "model.layers.0.self_attn.q_proj.bias",
                "sdar": "model.layers.0.self_attn.q_norm.weight"}[family]
    assert expected in names


def test_sharded_loading(tmp_path) -> None:
    model = build_model(tiny_config("dream"), seed=1)
    save_model(model, tmp_path / "sharded", max_shard_bytes=20_000)
    files = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert "model.safetensors.index.json" in files
    assert sum(f.endswith(".safetensors") for f in files) > 1
    again = load_model(tmp_path / "sharded")
    tokens = torch.randint(0, 60, (1, 9))
    pos = torch.arange(9)[None]
    with torch.no_grad():
        assert torch.equal(model(tokens, pos), again(tokens, pos))


def test_gqa_equals_mha_with_repeated_kv() -> None:
    gqa = build_model(tiny_config("dream", num_key_value_heads=2), seed=5)
    mha = build_model(tiny_config("dream", num_key_value_heads=4), seed=6)
    state = gqa.state_dict()
    rep = 2  # 4 query heads over 2 kv heads
    hd = gqa.spec.head_dim
    for name, t in state.items():
        if ".attn.k_proj" in name or ".attn.v_proj" in name:
            heads = t.reshape(2, hd, *t.shape[1:])
            state[name] = heads.repeat_interleave(rep, dim=0).reshape(4 * hd, *t.shape[1:])
    mha.load_state_dict(state)
    tokens = torch.randint(0, 60, (2, 10))
    pos = torch.arange(10).expand(2, 10)
    with torch.no_grad():
        assert torch.allclose(gqa(tokens, pos), mha(tokens, pos), atol=1e-5)


def test_dream_alignment_undoes_the_shift() -> None:
    from dataclasses import replace

    from dllm_decode.models.dream import DreamModel

    model = build_model(tiny_config("dream"), seed=2)
    raw_model = DreamModel(replace(model.spec, logit_shift=0)).eval()  # AR-convention rows
    raw_model.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 60, (1, 8))
    pos = torch.arange(8)[None]
    with torch.no_grad():
        aligned, raw = model(tokens, pos), raw_model(tokens, pos)
    assert torch.equal(aligned[:, 1:], raw[:, :-1])
    assert torch.equal(aligned[:, 0], raw[:, 0])


@pytest.mark.parametrize("block", [1, 4, 32])
def test_block_causal_mask_structure(block: int) -> None:
    pos = torch.arange(40)[None]
    m = block_causal_mask(pos, pos, block)[0]
    for i in range(40):
        for j in range(40):
            assert bool(m[i, j]) == (j // block <= i // block)
    if block == 1:
        assert torch.equal(m, torch.tril(torch.ones(40, 40, dtype=torch.bool)))


def test_block_size_one_is_a_causal_lm() -> None:
    model = build_model(tiny_config("sdar"), seed=4)
    assert isinstance(model, BlockDiffusionModel)
    causal = model.with_block_size(1)
    tokens = torch.randint(0, 60, (2, 11))
    pos = torch.arange(11).expand(2, 11)
    full_mask = torch.tril(torch.ones(11, 11, dtype=torch.bool)).expand(2, 11, 11)
    with torch.no_grad():
        a = causal(tokens, pos)
        b = model(tokens, pos, mask=full_mask)
        # a causal LM's prediction at i does not depend on later tokens
        changed = tokens.clone()
        changed[:, 7:] = 3
        c = causal(changed, pos)
    assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(a[:, :7], c[:, :7], atol=1e-6)
    assert model.block_size == 4  # the original view is untouched


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_padding_invariance(family: str) -> None:
    model = build_model(tiny_config(family), seed=7)
    tokens = torch.randint(0, 60, (1, 9))
    pad = 4
    padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), tokens], 1)
    valid = torch.cat([torch.zeros(1, pad, dtype=torch.bool), torch.ones(1, 9, dtype=torch.bool)],
                      1)
    with torch.no_grad():
        alone = model(tokens, model.rope_positions(torch.ones(1, 9, dtype=torch.bool)))
        both = model(padded, model.rope_positions(valid), mask=valid)
    skip = model.logit_shift  # a shifted model's first real row reads its (pad) left neighbour
    assert torch.allclose(alone[:, skip:], both[:, pad + skip:], atol=1e-5)


def test_error_paths(tmp_path) -> None:
    model = build_model(tiny_config("llada"), seed=0)
    good = save_model(model, tmp_path / "good")
    with pytest.raises(FileNotFoundError, match="no model directory"):
        load_model(tmp_path / "nope")
    missing_weights = tmp_path / "noweights"
    missing_weights.mkdir()
    shutil.copy(good / "config.json", missing_weights / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(missing_weights)
    no_cfg = tmp_path / "nocfg"
    no_cfg.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(no_cfg)

    def variant(name: str, edit) -> object:
        d = tmp_path / name
        shutil.copytree(good, d)
        tensors = load_file(str(d / "model.safetensors"))
        cfg = json.loads((d / "config.json").read_text())
        edit(tensors, cfg)
        save_file(tensors, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    d = variant("badtype", lambda t, c: c.update(model_type="gpt9"))
    with pytest.raises(CheckpointError, match="unknown model_type"):
        load_model(d)
    d = variant("missing", lambda t, c: t.pop("model.transformer.ln_f.weight"))
    with pytest.raises(CheckpointError, match="ln_f"):
        load_model(d)
    d = variant("extra", lambda t, c: t.update({"model.transformer.bogus": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="bogus"):
        load_model(d)
    d = variant("shape", lambda t, c: t.update(
        {"model.transformer.ln_f.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"ln_f.weight.*shape"):
        load_model(d)


def test_auto_config_registration(tmp_path) -> None:
    from transformers import AutoConfig

    register_auto_config()
    model = build_model(tiny_config("sdar"), seed=0)
    save_model(model, tmp_path / "m")
    cfg = AutoConfig.from_pretrained(tmp_path / "m")
    assert cfg.model_type == "sdar"
    assert cfg.block_size == model.block_size


def test_hf_masked_lm_wrapper() -> None:
    from transformers import BertConfig, BertForMaskedLM

    from dllm_decode import DiffusionSampler
    from dllm_decode.models.hf import HFMaskedLM

    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64)).eval()
    model = HFMaskedLM(bert, mask_token_id=49, eos_token_ids=(2,))
    out = DiffusionSampler(model, "low_confidence").generate(torch.randint(3, 40, (2, 5)),
                                                             gen_length=6)
    assert out.forwards == 6 and (out.answer != 49).all()
    with pytest.raises(ValueError, match="no KV cache"):
        DiffusionSampler(model, "low_confidence", cache="dual").generate(
            torch.randint(3, 40, (1, 5)), gen_length=4)
