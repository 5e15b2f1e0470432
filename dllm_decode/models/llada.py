"""LLaDA (LLaDA-8B Base/Instruct, LLaDA 1.5) under its released tensor names.

Nie et al., "Large Language Diffusion Models", arXiv 2502.09992. Bidirectional attention,
RoPE, SwiGLU with ``ff_proj`` as the gate, untied ``ff_out`` head, logits position-aligned.
"""

from __future__ import annotations

from typing import Any

from dllm_decode.models.base import DecoderLM, ModelSpec

_L = r"layers\.(\d+)\."
_T = "model.transformer."


class LLaDAModel(DecoderLM):
    names = (
        (r"embed\.weight", _T + "wte.weight"),
        (_L + r"attn_norm\.weight", _T + "blocks.{}.attn_norm.weight"),
        (_L + r"attn\.q_proj\.weight", _T + "blocks.{}.q_proj.weight"),
        (_L + r"attn\.k_proj\.weight", _T + "blocks.{}.k_proj.weight"),
        (_L + r"attn\.v_proj\.weight", _T + "blocks.{}.v_proj.weight"),
        (_L + r"attn\.q_proj\.bias", _T + "blocks.{}.q_proj.bias"),
        (_L + r"attn\.k_proj\.bias", _T + "blocks.{}.k_proj.bias"),
        (_L + r"attn\.v_proj\.bias", _T + "blocks.{}.v_proj.bias"),
        (_L + r"attn\.o_proj\.weight", _T + "blocks.{}.attn_out.weight"),
        (_L + r"mlp_norm\.weight", _T + "blocks.{}.ff_norm.weight"),
        (_L + r"mlp\.gate_proj\.weight", _T + "blocks.{}.ff_proj.weight"),
        (_L + r"mlp\.up_proj\.weight", _T + "blocks.{}.up_proj.weight"),
        (_L + r"mlp\.down_proj\.weight", _T + "blocks.{}.ff_out.weight"),
        (r"norm\.weight", _T + "ln_f.weight"),
        (r"head\.weight", _T + "ff_out.weight"),
    )


def llada_spec(cfg: dict[str, Any]) -> ModelSpec:
    """ModelSpec from a LLaDA ``config.json`` dict (release field names)."""
    unsupported = {
        "alibi": False, "scale_logits": False, "input_emb_norm": False, "weight_tying": False,
        "include_bias": False, "attention_layer_norm": False, "rope": True,
    }
    for key, ok in unsupported.items():
        if key in cfg and bool(cfg[key]) != ok:
            raise ValueError(f"LLaDA config {key}={cfg[key]!r} is not supported (need {ok})")
    if cfg.get("activation_type", "silu") != "silu":
        raise ValueError(f"LLaDA activation_type {cfg['activation_type']!r}: only 'silu'")
    d, heads = int(cfg["d_model"]), int(cfg["n_heads"])
    kv = cfg.get("n_kv_heads") or heads
    if cfg.get("multi_query_attention"):
        kv = 1
    vocab = int(cfg.get("embedding_size") or cfg["vocab_size"])
    eos = int(cfg.get("eos_token_id", 126081))
    return ModelSpec(
        family="llada",
        vocab_size=vocab,
        hidden_size=d,
        num_layers=int(cfg["n_layers"]),
        num_heads=heads,
        num_kv_heads=int(kv),
        head_dim=d // heads,
        intermediate_size=int(cfg.get("mlp_hidden_size") or cfg["mlp_ratio"] * d),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        max_length=int(cfg.get("max_sequence_length", 4096)),
        mask_token_id=int(cfg.get("mask_token_id", 126336)),
        eos_token_ids=(eos,),
        pad_token_id=cfg.get("pad_token_id"),
        qkv_bias=bool(cfg.get("include_qkv_bias", False)),
        eot_token_id=cfg.get("eot_token_id"),
    )


def llada_config(spec: ModelSpec) -> dict[str, Any]:
    """A release-style LLaDA ``config.json`` dict for ``spec``."""
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada", "activation_type": "silu",
        "alibi": False, "block_type": "llama", "d_model": spec.hidden_size,
        "n_layers": spec.num_layers, "n_heads": spec.num_heads, "n_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "mlp_hidden_size": spec.intermediate_size, "mlp_ratio": 4, "layer_norm_type": "rms",
        "rms_norm_eps": spec.norm_eps, "rope": True, "rope_theta": spec.rope_theta,
        "rope_full_precision": True, "include_bias": False,
        "include_qkv_bias": spec.qkv_bias, "weight_tying": False, "scale_logits": False,
        "input_emb_norm": False, "attention_layer_norm": False,
        "vocab_size": spec.vocab_size, "embedding_size": spec.vocab_size,
        "max_sequence_length": spec.max_length, "mask_token_id": spec.mask_token_id,
        "eos_token_id": spec.eos_token_ids[0],
        "pad_token_id": spec.pad_token_id if spec.pad_token_id is not None
        else spec.eos_token_ids[0],
        **({"eot_token_id": spec.eot_token_id} if spec.eot_token_id is not None else {}),
        "use_cache": False,
    }
