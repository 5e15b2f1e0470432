"""SDAR-MoE / TraDo (``SDARMoeForCausalLM``: JetLM SDAR-30B-A3B, Gen-Verse TraDo MoE variants).

Cheng et al., "SDAR: A Synergistic Diffusion-AutoRegression Paradigm", arXiv 2510.06303. The
SDAR block-diffusion model (block-causal attention over the whole canvas, blocks of
``block_size`` aligned to position 0, logits position-aligned) on a Qwen3-MoE stack: Qwen3
attention (separate q/k/v/o, bias = ``attention_bias``, per-head q/k RMSNorm before RoPE, full
RoPE), SwiGLU experts behind a softmax top-k router with ``norm_topk_prob`` renormalisation and
no shared expert; a layer is sparse when ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not
in ``mlp_only_layers``, dense (``intermediate_size``) otherwise. Router numerics as Qwen3-MoE /
SGLang ``srt/models/sdar_moe.py`` do them: gate logits in the model dtype, softmax in fp32.
Tensor names: the Qwen3-MoE ones (``mlp.gate.weight``, ``mlp.experts.{j}.{gate,up,down}_proj``).

No public fixture: built from the spec and tested against an independent per-expert
transcription of that spec and config + seed checkpoint round trips
(``tests/test_models_2026.py``). Mask id: the config's ``mask_token_id``, else the released
SDAR tokenizer's 151669 (SGLang ``DLLM_PARAMS``).
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

#: the mask id of the released SDAR tokenizers (SGLang DLLM_PARAMS)
RELEASED_MASK_ID = 151669
#: SGLang's block size for SDAR models when the config does not state one
DEFAULT_BLOCK = 4


class SDARMoEModel(MoEDecoderLM):
    names = QWEN_MOE_NAMES
    expert_names = QWEN_MOE_EXPERT_NAMES


def sdar_moe_spec(cfg: dict[str, Any]) -> ModelSpec:
    """ModelSpec from an SDAR-MoE ``config.json`` dict (Qwen3-MoE field names + SDAR's)."""
    fam = "SDAR-MoE"
    check_config(cfg, fam, ("rope_scaling", "tie_word_embeddings", "use_sliding_window"))
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = layer_count(cfg, fam)
    experts = int(cfg.get("num_experts") or 0)
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    sparse = tuple(experts > 0 and (i + 1) % step == 0 and i not in dense_only
                   for i in range(layers))
    moe = MoESpec(
        num_experts=max(experts, 1), top_k=int(cfg.get("num_experts_per_tok") or 1),
        intermediate_size=int(cfg.get("moe_intermediate_size") or 1), score="softmax",
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)), fp32_logits=False,
    )
    bias = bool(cfg.get("attention_bias", False))
    arch = ArchSpec(moe=moe, moe_layers=sparse, rotary_dim=head_dim, out_bias=bias)
    return moe_spec(
        cfg, fam, RELEASED_MASK_ID, arch, family="sdar_moe", head_dim=head_dim,
        intermediate_size=int(cfg.get("intermediate_size") or 1),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), qk_norm=True, attention="block_causal",
        block_size=int(cfg.get("block_size") or DEFAULT_BLOCK),
    )


def sdar_moe_config(spec: ModelSpec) -> dict[str, Any]:
    """A release-style SDAR-MoE ``config.json`` dict for ``spec``."""
    arch = arch_of(spec)
    moe = arch.moe
    return {
        "architectures": ["SDARMoeForCausalLM"], "model_type": "sdar_moe", "hidden_act": "silu",
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "moe_intermediate_size": moe.intermediate_size, "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k, "norm_topk_prob": moe.norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i, s in enumerate(arch.moe_layers) if not s],
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "attention_bias": spec.qkv_bias, "rope_theta": spec.rope_theta, "rope_scaling": None,
        "rms_norm_eps": spec.norm_eps, "max_position_embeddings": spec.max_length,
        "vocab_size": spec.vocab_size, "tie_word_embeddings": False,
        "block_size": spec.block_size, **token_config(spec),
    }
