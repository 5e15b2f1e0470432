"""LLaDA-MoE-7B-A1B (inclusionAI ``LLaDAMoEModelLM``: Base / Instruct / Instruct-TD).

Zhu et al., "LLaDA-MoE: A Sparse MoE Diffusion Language Model", arXiv 2509.24389. An
OLMoE-style stack with bidirectional attention like LLaDA: separate q/k/v/o projections
(bias = ``attention_bias``), per-head q/k RMSNorm before RoPE (``qk_layernorm``), RoPE
(``partial_rotary_factor``), SwiGLU experts (``expert_intermediate_size``) behind a softmax
router computed in fp32, top-k (``num_experts_per_tok``) **without renormalisation** — the
reference (the Hugging Face remote code ``modeling_lladamoe.py``, as copied in ZHZisZZ/dllm,
and inclusionAI/dInfer's fused version) hard-codes ``norm_topk_prob = False`` whatever the config
says, and so does this model. Dense layers where ``moe_layer_freq[i] == 0``
(``dense_intermediate_size``); a shared expert on the layer when
``shared_expert_intermediate_size`` is set. No logit shift.

The released config says ``model_type: "llada"`` like dense LLaDA: ``load_model`` dispatches on
``architectures`` (``LLaDAMoEModelLM``). Mask id: the config's ``mask_token_id`` if present,
else the released tokenizer's 156895 (dInfer); EOS: the config's ``eos_token_id`` (156892).
Not supported (a clear error): ``moe_router_enable_expert_bias`` (absent from inclusionAI's
inference code), ``clip_qkv``, ``rope_scaling``.
"""

from __future__ import annotations

from typing import Any

from dllm_decode.models.base import ModelSpec
from dllm_decode.models.moe_decoder import (
    QWEN_MOE_EXPERT_NAMES,
    QWEN_MOE_NAMES,
    ArchSpec,
    MoEDecoderLM,
    arch_of,
    check_config,
    layer_count,
    moe_spec,
    token_config,
)
from dllm_decode.models.sparse_moe import MoESpec

#: the mask id of the released LLaDA-MoE tokenizer (same tokenizer family as LLaDA2)
RELEASED_MASK_ID = 156895


class LLaDAMoEModel(MoEDecoderLM):
    names = QWEN_MOE_NAMES
    expert_names = QWEN_MOE_EXPERT_NAMES


def llada_moe_spec(cfg: dict[str, Any]) -> ModelSpec:
    """ModelSpec from a LLaDA-MoE ``config.json`` dict (release field names)."""
    fam = "LLaDA-MoE"
    check_config(cfg, fam, ("moe_router_enable_expert_bias", "clip_qkv", "rope_scaling",
                            "tie_word_embeddings"))
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    head_dim = hidden // heads
    layers = layer_count(cfg, fam)
    freq = cfg.get("moe_layer_freq")
    freq = [1] * layers if freq is None else ([freq] * layers if isinstance(freq, int) else freq)
    if len(freq) != layers:
        raise ValueError(f"{fam} moe_layer_freq lists {len(freq)} layers, the model has {layers}")
    shared = cfg.get("shared_expert_intermediate_size")
    if shared and not all(freq):
        raise ValueError(f"{fam}: a shared expert with dense layers is not supported")
    moe = MoESpec(
        num_experts=int(cfg["num_experts"]), top_k=int(cfg["num_experts_per_tok"]),
        intermediate_size=int(cfg["expert_intermediate_size"]), score="softmax",
        norm_topk_prob=False, shared_intermediate_size=int(shared) if shared else None,
    )
    bias = bool(cfg.get("attention_bias", False))
    arch = ArchSpec(moe=moe, moe_layers=tuple(bool(f) for f in freq),
                    rotary_dim=int(head_dim * float(cfg.get("partial_rotary_factor") or 1.0)),
                    out_bias=bias)
    return moe_spec(
        cfg, fam, RELEASED_MASK_ID, arch, family="lladamoe", head_dim=head_dim,
        intermediate_size=int(cfg.get("dense_intermediate_size") or 1),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        qk_norm=bool(cfg.get("qk_layernorm", True)), attention="bidirectional",
    )


def llada_moe_config(spec: ModelSpec) -> dict[str, Any]:
    """A release-style LLaDA-MoE ``config.json`` dict for ``spec`` (``model_type`` "llada")."""
    arch = arch_of(spec)
    moe = arch.moe
    return {
        "architectures": ["LLaDAMoEModelLM"], "model_type": "llada", "hidden_act": "silu",
        "hidden_size": spec.hidden_size, "dense_intermediate_size": spec.intermediate_size,
        "expert_intermediate_size": moe.intermediate_size,
        "shared_expert_intermediate_size": moe.shared_intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k, "moe_layer_freq": [int(f) for f in arch.moe_layers],
        "norm_topk_prob": False, "moe_router_enable_expert_bias": False,
        "moe_router_score_function": "softmax", "routed_scaling_factor": 1,
        "partial_rotary_factor": arch.rotary_dim / spec.head_dim, "rope_theta": spec.rope_theta,
        "rope_scaling": None, "rms_norm_eps": spec.norm_eps, "qk_layernorm": spec.qk_norm,
        "attention_bias": spec.qkv_bias, "clip_qkv": None,
        "max_position_embeddings": spec.max_length, "vocab_size": spec.vocab_size,
        "tie_word_embeddings": False, **token_config(spec),
    }
