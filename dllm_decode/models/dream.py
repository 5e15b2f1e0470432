"""Dream (Dream-v0 7B Base/Instruct; Qwen2.5 layout) under its released tensor names.

Ye et al., "Dream 7B: Diffusion Large Language Models", arXiv 2508.15487. Non-causal Qwen2
decoder with q/k/v biases and GQA. Dream keeps the AR convention of its Qwen2.5 init (the
output at position i-1 predicts token i); the shift is undone here so ``logits[:, i]`` predicts
``tokens[:, i]``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.models.base import DecoderLM, ModelSpec

_L = r"layers\.(\d+)\."
_M = "model.layers.{}."

QWEN_NAMES = (
    (r"embed\.weight", "model.embed_tokens.weight"),
    (_L + r"attn_norm\.weight", _M + "input_layernorm.weight"),
    (_L + r"attn\.(q|k|v|o)_proj\.(weight|bias)", _M + "self_attn.{}_proj.{}"),
    (_L + r"attn\.(q|k)_norm\.weight", _M + "self_attn.{}_norm.weight"),
    (_L + r"mlp_norm\.weight", _M + "post_attention_layernorm.weight"),
    (_L + r"mlp\.(gate|up|down)_proj\.weight", _M + "mlp.{}_proj.weight"),
    (r"norm\.weight", "model.norm.weight"),
    (r"head\.weight", "lm_head.weight"),
)


class DreamModel(DecoderLM):
    names = QWEN_NAMES

    def rope_positions(self, valid: Tensor) -> Tensor:
        """Dream's ``tok_idx``: ``cumsum(valid) - 1`` with pads at 1 (arange when unpadded)."""
        pos = valid.long().cumsum(dim=1) - 1
        return torch.where(valid, pos, torch.ones_like(pos))


def qwen_spec(cfg: dict[str, Any], family: str, **overrides: Any) -> ModelSpec:
    """ModelSpec from a Qwen2/Qwen3-style ``config.json`` dict."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{family} hidden_act {cfg['hidden_act']!r}: only 'silu' is supported")
    if cfg.get("tie_word_embeddings"):
        raise ValueError(f"{family}: tied embeddings are not supported (lm_head must be saved)")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])) if eos is not None \
        else ()
    fields: dict[str, Any] = dict(
        family=family,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_length=int(cfg.get("max_position_embeddings", 2048)),
        mask_token_id=int(cfg["mask_token_id"]),
        eos_token_ids=eos_ids,
        pad_token_id=cfg.get("pad_token_id"),
    )
    fields.update(overrides)
    return ModelSpec(**fields)


def dream_spec(cfg: dict[str, Any]) -> ModelSpec:
    if "mask_token_id" not in cfg:
        raise ValueError("Dream config.json has no mask_token_id")
    return qwen_spec(cfg, "dream", qkv_bias=True, logit_shift=1)


def qwen_config(spec: ModelSpec, model_type: str, architecture: str) -> dict[str, Any]:
    return {
        "architectures": [architecture], "model_type": model_type, "hidden_act": "silu",
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size, "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta, "max_position_embeddings": spec.max_length,
        "mask_token_id": spec.mask_token_id,
        "eos_token_id": spec.eos_token_ids[0] if len(spec.eos_token_ids) == 1
        else list(spec.eos_token_ids),
        "pad_token_id": spec.pad_token_id, "bos_token_id": spec.eos_token_ids[0],
        "tie_word_embeddings": False, "use_cache": False,
    }


def dream_config(spec: ModelSpec) -> dict[str, Any]:
    return qwen_config(spec, "Dream", "DreamModel")
