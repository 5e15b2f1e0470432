"""The 2026 families built from a config and a seed (LLaDA2, Fast-dLLM v2, LLaDA-MoE, SDAR-MoE):
K/V cache vs full recomputation, checkpoint round trips (per-expert tensors, dtype, tied
embeddings, mask ids), Hub ids, ``architectures`` dispatch, SDAR-MoE against transformers'
Qwen3-MoE, batch vs rows alone, the lm-eval and text front ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm_decode import DiffusionSampler
from dllm_decode.models import build_model, load_model, save_model
from dllm_decode.models.loading import family_key
from tests.helpers import lay_out_cache, tiny_config
from tests.moe_helpers import (  # noqa: F401 (fixtures)
    EOS,
    MASK,
    TINY,
    offline_hub,
    seeded,
    tiny_moe_config,
    tiny_moe_model,
)

pytestmark = pytest.mark.usefixtures("one_thread", "seeded")

def _incremental_logits(model, tokens: torch.Tensor, block: int) -> torch.Tensor:
    """Block by block through a ``BlockKVCache``: each block is fed once, writes its K/V and
    attends to every earlier block's cached K/V (keys ``< end``). A shifted model's first row
    of each block then holds its own raw row (its left neighbour was not fed)."""
    b, length = tokens.shape
    cache = model.new_cache(b, length)
    keys = torch.arange(length)
    rows = []
    for start in range(0, length, block):
        end = min(start + block, length)
        pos = torch.arange(start, end).expand(b, -1)
        mask = (keys < end)[None].expand(b, -1)
        rows.append(model(tokens[:, start:end], pos, cache=cache, slots=pos, mask=mask))
    return torch.cat(rows, dim=1)


@pytest.mark.parametrize("family", [f for f in TINY if f != "lladamoe"])
def test_block_causal_cache_equals_full_recomputation(family: str) -> None:
    """Exact: a block's K/V never change once the block is complete."""
    model = tiny_moe_model(family)
    assert model.attention == "block_causal"
    tokens = torch.randint(0, 60, (2, 13))
    pos = torch.arange(13).expand(2, -1)
    with torch.no_grad():
        full = model(tokens, pos)
        cached = _incremental_logits(model, tokens, model.block_size)
    rows = torch.arange(13)
    if model.logit_shift:
        rows = rows[rows % model.block_size != 0]
    # fp32 rounding only (other summation orders; logits up to ~30 with these weights)
    assert (full[:, rows] - cached[:, rows]).abs().max().item() < 1e-4


@pytest.mark.parametrize("family", ["lladamoe"])
def test_bidirectional_cache_after_a_refresh_equals_full_recomputation(family: str) -> None:
    """A full forward that stores K/V, then a block fed alone against the cache (dual-cache
    style, rewriting its own K/V): both equal the uncached forward."""
    model = tiny_moe_model(family)
    assert model.attention == "bidirectional" and model.block_size is None
    tokens = torch.randint(0, 60, (2, 13))
    pos = torch.arange(13).expand(2, -1)
    cache = model.new_cache(2, 13)
    with torch.no_grad():
        full = model(tokens, pos)
        refreshed = model(tokens, pos, cache=cache, slots=pos)
        block = model(tokens[:, 4:8], pos[:, 4:8], cache=cache, slots=pos[:, 4:8])
    assert (full - refreshed).abs().max().item() < 1e-4
    assert (full[:, 4:8] - block).abs().max().item() < 1e-4


@pytest.mark.parametrize("impl", ["grouped", "reference"])
def test_sdar_moe_matches_transformers_qwen3_moe(tmp_path, impl: str) -> None:
    """SDAR-MoE has no recorded fixture: its checkpoint, loaded by transformers' own
    Qwen3-MoE (per-expert tensors, its loader's names) and run with SDAR's block-causal mask
    as an additive 4-D mask, gives our logits (the spec: SDAR = Qwen3-MoE + block-causal)."""
    qwen3 = pytest.importorskip("transformers").Qwen3MoeForCausalLM
    model = tiny_moe_model("sdarmoe")
    model.moe_impl = impl
    out = save_model(model, tmp_path / "m")
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
               torch_dtype="float32")
    (out / "config.json").write_text(json.dumps(cfg))
    ref, info = qwen3.from_pretrained(out, output_loading_info=True,
                                      attn_implementation="eager")
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    tokens = torch.randint(0, 60, (2, 13))
    pos = torch.arange(13).expand(2, -1)
    allowed = (pos[:, None, :] // 4) <= (pos[:, :, None] // 4)
    additive = torch.zeros(2, 1, 13, 13).masked_fill(~allowed[:, None], float("-inf"))
    with torch.no_grad():
        want = ref.eval()(input_ids=tokens, position_ids=pos, attention_mask=additive).logits
        got = model(tokens, pos)
    assert (want - got).abs().max().item() < 1e-4
    assert model.layers[0].mlp.__class__.__name__ == "DenseMLP"  # mlp_only_layers


def test_llada_moe_dispatches_on_architectures() -> None:
    moe_cfg = tiny_moe_config("lladamoe")
    assert moe_cfg["model_type"] == "llada"
    assert type(build_model(moe_cfg)).__name__ == "LLaDAMoEModel"
    dense = {k: v for k, v in tiny_config("llada").items()}
    assert type(build_model(dense)).__name__ == "LLaDAModel"
    assert type(build_model(dense | {"architectures": ["LLaDAModelLM"]})).__name__ == \
        "LLaDAModel"


@pytest.mark.parametrize("family", TINY)
def test_save_load_round_trip(tmp_path, family: str) -> None:
    model = tiny_moe_model(family)
    save_model(model, tmp_path / "m", max_shard_bytes=30_000)
    again = load_model(tmp_path / "m")
    tokens = torch.randint(0, 60, (2, 12))
    pos = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        assert torch.equal(model(tokens, pos), again(tokens, pos))
    names = set()
    for f in (tmp_path / "m").glob("*.safetensors"):
        names |= set(load_file(str(f)))
    if family != "fastdllm2":
        assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
        assert not any(n.endswith("experts.gate_proj") for n in names)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert family_key(cfg) == model.spec.family


def test_llada2_tensor_names_and_dtype_auto(tmp_path) -> None:
    model = tiny_moe_model("llada2")
    save_model(model, tmp_path / "m", config_extra={"torch_dtype": "bfloat16"})
    names = set(load_file(str(tmp_path / "m" / "model.safetensors")))
    for n in ("model.word_embeddings.weight", "model.layers.0.mlp.gate_proj.weight",
              "model.layers.1.attention.query_key_value.weight",
              "model.layers.1.attention.query_layernorm.weight",
              "model.layers.1.attention.dense.weight", "model.layers.1.mlp.gate.expert_bias",
              "model.layers.2.mlp.shared_experts.up_proj.weight", "lm_head.weight"):
        assert n in names, n
    assert not any("layers.0.mlp.experts" in n for n in names)  # first_k_dense_replace
    bf16 = load_model(tmp_path / "m")
    assert bf16.dtype == torch.bfloat16
    assert bf16.layers[1].mlp.gate.expert_bias.dtype == torch.float32  # selection in fp32
    assert bf16.layers[1].mlp.experts.gate_proj.dtype == torch.bfloat16


def test_mask_id_from_generation_config_or_argument(tmp_path) -> None:
    cfg = tiny_moe_config("llada2")
    del cfg["mask_token_id"]
    model = build_model(cfg | {"mask_token_id": MASK}, seed=1)
    out = save_model(model, tmp_path / "m")
    written = json.loads((out / "config.json").read_text())
    del written["mask_token_id"]
    (out / "config.json").write_text(json.dumps(written))
    with pytest.raises(ValueError, match=r"mask_token_id 156895 is outside.*mask_token_id="):
        load_model(out)  # the released id does not fit this vocabulary
    assert load_model(out, mask_token_id=61).mask_token_id == 61
    (out / "generation_config.json").write_text(json.dumps({"mask_token_id": 60}))
    assert load_model(out).mask_token_id == 60


def test_block_size_views_share_weights() -> None:
    model = tiny_moe_model("llada2")
    view = model.with_block_size(2)
    assert view.block_size == 2 and model.block_size == 4
    assert view.head.weight is model.head.weight
    with pytest.raises(ValueError, match="block_size"):
        model.with_block_size(0)


@pytest.mark.usefixtures("offline_hub")
@pytest.mark.parametrize("family", TINY)
def test_loads_by_hub_id_from_the_cache(tmp_path: Path, family: str) -> None:
    model = tiny_moe_model(family)
    ckpt = save_model(model, tmp_path / "ckpt", max_shard_bytes=30_000,
                      config_extra={"torch_dtype": "float32"})
    repo = f"test-org/tiny-{family}"
    lay_out_cache(tmp_path / "hub", repo, ckpt)
    hub = load_model(repo)
    tokens = torch.randint(0, 60, (1, 9))
    pos = torch.arange(9)[None]
    with torch.no_grad():
        assert torch.equal(hub(tokens, pos), model(tokens, pos))
    pytest.importorskip("accelerate")
    mapped = load_model(repo, device_map="sequential")
    with torch.no_grad():
        assert torch.equal(mapped(tokens, pos), model(tokens, pos))


@pytest.mark.parametrize("family", ["llada2", "lladamoe", "sdarmoe"])
def test_grouped_experts_equal_the_per_expert_loop_in_the_model(family: str) -> None:
    model = tiny_moe_model(family)
    tokens = torch.randint(0, 60, (2, 13))
    pos = torch.arange(13).expand(2, -1)
    with torch.no_grad():
        model.moe_impl = "reference"
        want = model(tokens, pos)
        model.moe_impl = "grouped"
        got = model(tokens, pos)
    assert (want - got).abs().max().item() < 1e-4


@pytest.mark.parametrize("family", TINY)
def test_cached_decoding_of_built_models(family: str) -> None:
    """Block-causal families: cache="block_causal" is exact; bidirectional: dual cache
    refreshed every step. Tokens equal uncached decoding, no mask is left."""
    model = tiny_moe_model(family)
    cached: dict = {"cache": "dual", "refresh_every": 1}
    block = 4
    if model.attention == "block_causal":
        cached, block = {"cache": "block_causal"}, model.block_size
    prompt = torch.randint(0, 60, (2, 7))
    runs = [DiffusionSampler(model, "low_confidence", gen_length=12, block_length=block,
                             steps=12, **kw).generate(prompt)
            for kw in ({"cache": "none"}, cached)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert (runs[0].answer != MASK).all()


def test_lm_eval_adapter_defaults_to_the_models_block_size() -> None:
    pytest.importorskip("lm_eval", reason="lm-eval is not installed")
    from types import SimpleNamespace

    from dllm_decode.eval.lm_eval import DllmDecodeLM

    model = tiny_moe_model("llada2")
    lm = DllmDecodeLM(model=model, tokenizer=SimpleNamespace(eos_token_id=EOS), device="cpu")
    _, generate = lm.decode_settings({"max_gen_toks": 10})
    # the model's own block; gen_length exactly as asked (whole blocks decoded inside)
    assert generate["block_length"] == model.block_size == 4 and generate["gen_length"] == 10
    assert lm.eos_ids == model.eos_token_ids


@pytest.mark.parametrize("overrides", [
    {"use_qkv_bias": True, "use_bias": True, "num_shared_experts": None},
    {"n_group": 1, "topk_group": 1, "num_experts_per_tok": 1, "first_k_dense_replace": 0},
    {"partial_rotary_factor": 1.0, "num_key_value_heads": 0, "num_shared_experts": 2},
], ids=["biases_no_shared", "one_group_top1_all_moe", "full_rope_mha_two_shared"])
def test_llada2_config_variants_round_trip(tmp_path, overrides: dict) -> None:
    """Other released switches: q/k/v and output biases, no or two shared experts, plain top-k,
    every layer sparse, full RoPE, ``num_key_value_heads == 0`` (= heads, as LLaDA2.1's config
    class maps it)."""
    model = tiny_moe_model("llada2", **overrides)
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m")
    tokens = torch.randint(0, 60, (1, 10))
    pos = torch.arange(10)[None]
    with torch.no_grad():
        want = model(tokens, pos)
        assert torch.equal(want, again(tokens, pos))
        again.moe_impl = "reference"
        assert (want - again(tokens, pos)).abs().max().item() < 1e-4


@pytest.mark.parametrize("family", TINY)
def test_generate_text_with_a_real_tokenizer(family: str) -> None:
    """Text in, text out through the bundled tokenizer (its ids: mask 2, EOS 1); block-causal
    families decode in their own block size by default."""
    from dllm_decode import generate_text, load_tokenizer

    tok = load_tokenizer()
    model = tiny_moe_model(family, vocab_size=len(tok), mask_token_id=2, eos_token_id=1,
                           pad_token_id=1)
    sampler = DiffusionSampler(model, "low_confidence", gen_length=8, steps=8)
    out = generate_text(sampler, tok, ["Maya Doyle", "the cat"], chat=False)
    assert len(out.texts) == 2 and all(isinstance(t, str) for t in out.texts)
    assert 1 in out.stop_token_ids and (out.generation.answer != 2).all()


def test_fastdllm2_tied_embeddings(tmp_path) -> None:
    model = tiny_moe_model("fastdllm2", tie_word_embeddings=True)
    assert model.head.weight is model.embed.weight
    save_model(model, tmp_path / "m")
    assert "lm_head.weight" not in load_file(str(tmp_path / "m" / "model.safetensors"))
    again = load_model(tmp_path / "m")
    assert again.head.weight.data_ptr() == again.embed.weight.data_ptr()
    tokens = torch.randint(0, 60, (1, 9))
    pos = torch.arange(9)[None]
    with torch.no_grad():
        assert torch.equal(model(tokens, pos), again(tokens, pos))


@pytest.mark.parametrize("family", TINY)
def test_batch_equals_rows_alone(family: str) -> None:
    model = tiny_moe_model(family)
    prompt = torch.randint(0, 60, (3, 6))
    kw = dict(gen_length=8, steps=8, block_length=model.block_size or 4)
    batch = DiffusionSampler(model, "threshold", tau=0.7, **kw).generate(prompt)
    for i in range(3):
        alone = DiffusionSampler(model, "threshold", tau=0.7, **kw).generate(prompt[i:i + 1])
        assert torch.equal(batch.tokens[i:i + 1], alone.tokens), i
