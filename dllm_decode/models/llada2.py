"""LLaDA2.0 / LLaDA2.1 (inclusionAI ``LLaDA2MoeModelLM``: mini 16B-A1.4B, flash 100B-A6.1B).

Bie et al., "LLaDA2.0: Scaling Up Diffusion Language Models to 100B", arXiv 2512.15745;
LLaDA2.1, arXiv 2602.08676. A Ling-2.0 / BailingMoeV2 stack under its released tensor names
(``model.word_embeddings``, ``attention.query_key_value`` fused head-major, per-head
``query_layernorm`` / ``key_layernorm``, output ``attention.dense``), partial RoPE
(``partial_rotary_factor`` 0.5), the first ``first_k_dense_replace`` layers dense, the rest a
sigmoid router with group-limited top-k, an fp32 ``expert_bias`` used for selection only,
renormalised weights times ``routed_scaling_factor``, and one shared expert (reference: the
Hugging Face remote code ``modeling_llada2_moe.py``, as copied in ZHZisZZ/dllm). As that
reference does, the top-k weights are renormalised whenever top-k > 1, whatever
``norm_topk_prob`` says, and the q/k norms are built and applied whatever ``use_qk_norm`` says.

Decoded in blocks (block-causal attention over the whole canvas, the prompt included, blocks
aligned to position 0; ``block_size`` 32 as SGLang's ``DLLM_PARAMS`` and the reference
``generate`` use; ``with_block_size`` for other block lengths). No logit shift. Mask id: the
config's ``mask_token_id`` if it has one, else the released tokenizer's ``<|mask|>`` 156895.
"""

from __future__ import annotations

from typing import Any

from dllm_decode.models.base import ModelSpec
from dllm_decode.models.moe_decoder import (
    ArchSpec,
    MoEDecoderLM,
    arch_of,
    layer_count,
    moe_spec,
    token_config,
)
from dllm_decode.models.sparse_moe import MoESpec

#: the mask id of the released LLaDA2.x tokenizer (``<|mask|>``; SGLang DLLM_PARAMS)
RELEASED_MASK_ID = 156895
#: the block length the released models decode with
DEFAULT_BLOCK = 32

_L = r"layers\.(\d+)\."
_M = "model.layers.{}."


class LLaDA2MoEModel(MoEDecoderLM):
    names = (
        (r"embed\.weight", "model.word_embeddings.weight"),
        (_L + r"attn_norm\.weight", _M + "input_layernorm.weight"),
        (_L + r"attn\.qkv_proj\.(weight|bias)", _M + "attention.query_key_value.{}"),
        (_L + r"attn\.q_norm\.weight", _M + "attention.query_layernorm.weight"),
        (_L + r"attn\.k_norm\.weight", _M + "attention.key_layernorm.weight"),
        (_L + r"attn\.o_proj\.(weight|bias)", _M + "attention.dense.{}"),
        (_L + r"mlp_norm\.weight", _M + "post_attention_layernorm.weight"),
        (_L + r"mlp\.(gate|up|down)_proj\.weight", _M + "mlp.{}_proj.weight"),
        (_L + r"mlp\.gate\.(weight|expert_bias)", _M + "mlp.gate.{}"),
        (_L + r"mlp\.shared\.(gate|up|down)_proj\.weight",
         _M + "mlp.shared_experts.{}_proj.weight"),
        (r"norm\.weight", "model.norm.weight"),
        (r"head\.weight", "lm_head.weight"),
    )
    expert_names = (
        (_L + r"mlp\.experts\.(gate|up|down)_proj",
         "model.layers.{0}.mlp.experts.{2}.{1}_proj.weight"),
    )


def llada2_spec(cfg: dict[str, Any]) -> ModelSpec:
    """ModelSpec from a LLaDA2.x ``config.json`` dict (release field names)."""
    fam = "LLaDA2"
    checks = {"hidden_act": "silu", "score_function": "sigmoid", "norm_head": False,
              "tie_word_embeddings": False, "use_rmsnorm": True}
    for key, ok in checks.items():
        if key in cfg and cfg[key] is not None and cfg[key] != ok:
            raise ValueError(f"{fam} config {key}={cfg[key]!r} is not supported (need {ok!r})")
    if cfg.get("rope_scaling"):
        raise ValueError(f"{fam} rope_scaling {cfg['rope_scaling']!r} is not supported")
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    rotary = int(head_dim * float(cfg.get("partial_rotary_factor", 1.0)))
    if cfg.get("rotary_dim") is not None and int(cfg["rotary_dim"]) != rotary:
        raise ValueError(f"{fam} rotary_dim {cfg['rotary_dim']} contradicts head_dim {head_dim} "
                         f"x partial_rotary_factor {cfg.get('partial_rotary_factor')}")
    layers = layer_count(cfg, fam)
    dense = int(cfg.get("first_k_dense_replace", 0))
    experts = cfg.get("num_experts")
    shared = int(cfg.get("num_shared_experts") or 0)
    moe = MoESpec(
        num_experts=int(experts or 1), top_k=int(cfg.get("num_experts_per_tok", 1)),
        intermediate_size=int(cfg.get("moe_intermediate_size") or 1), score="sigmoid",
        norm_topk_prob=True, routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
        n_group=int(cfg.get("n_group") or 1), topk_group=int(cfg.get("topk_group") or 1),
        expert_bias=bool(cfg.get("moe_router_enable_expert_bias", False)),
        shared_intermediate_size=int(cfg["moe_intermediate_size"]) * shared if shared else None,
    )
    arch = ArchSpec(moe=moe, moe_layers=tuple(experts is not None and i >= dense
                                              for i in range(layers)),
                    rotary_dim=rotary, fused_qkv=True, out_bias=bool(cfg.get("use_bias", False)))
    return moe_spec(
        cfg, fam, RELEASED_MASK_ID, arch, family="llada2_moe", head_dim=head_dim,
        intermediate_size=int(cfg["intermediate_size"]),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=bool(cfg.get("use_qkv_bias", False)), qk_norm=True, attention="block_causal",
        block_size=int(cfg.get("block_size", DEFAULT_BLOCK)),
    )


def llada2_config(spec: ModelSpec) -> dict[str, Any]:
    """A release-style LLaDA2 ``config.json`` dict for ``spec``."""
    arch = arch_of(spec)
    moe = arch.moe
    dense = arch.moe_layers.index(True) if True in arch.moe_layers else spec.num_layers
    return {
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe", "hidden_act": "silu",
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "partial_rotary_factor": arch.rotary_dim / spec.head_dim, "rotary_dim": arch.rotary_dim,
        "rope_theta": spec.rope_theta, "rope_scaling": None, "rms_norm_eps": spec.norm_eps,
        "max_position_embeddings": spec.max_length, "vocab_size": spec.vocab_size,
        "first_k_dense_replace": dense, "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.intermediate_size,
        "n_group": moe.n_group, "topk_group": moe.topk_group,
        "routed_scaling_factor": moe.routed_scaling_factor, "score_function": "sigmoid",
        "router_dtype": "fp32", "moe_router_enable_expert_bias": moe.expert_bias,
        "norm_topk_prob": True, "norm_softmax": False,
        "num_shared_experts": (moe.shared_intermediate_size or 0) // moe.intermediate_size,
        "use_qkv_bias": spec.qkv_bias, "use_bias": arch.out_bias, "use_qk_norm": spec.qk_norm,
        "use_rmsnorm": True, "norm_head": False, "tie_word_embeddings": False,
        "block_size": spec.block_size, **token_config(spec),
    }
