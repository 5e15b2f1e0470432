"""SDAR-style block-diffusion LM (Qwen3-style decoder with block-causal attention).

Cheng et al., "SDAR: A Synergistic Diffusion-AutoRegression Paradigm", arXiv 2510.06303.
Attention is bidirectional inside a block of ``block_size`` positions and causal across
blocks (blocks aligned to absolute positions); logits are position-aligned. With
``block_size=1`` the same weights run as a plain causal LM (the S2D2 verifier).
"""

from __future__ import annotations

from typing import Any

from dllm_decode.models.base import DecoderLM, ModelSpec
from dllm_decode.models.dream import QWEN_NAMES, qwen_config, qwen_spec


class BlockDiffusionModel(DecoderLM):
    names = QWEN_NAMES

    def with_block_size(self, block_size: int) -> BlockDiffusionModel:
        """A view of the same weights decoding with another block size (1 = causal LM)."""
        return self._block_size_view(block_size)


def sdar_spec(cfg: dict[str, Any]) -> ModelSpec:
    return qwen_spec(
        cfg, "sdar",
        qkv_bias=bool(cfg.get("attention_bias", False)),
        qk_norm=bool(cfg.get("qk_norm", True)),
        attention="block_causal",
        block_size=int(cfg.get("block_size", 4)),
    )


def sdar_config(spec: ModelSpec) -> dict[str, Any]:
    cfg = qwen_config(spec, "sdar", "SDARForCausalLM")
    cfg.update(attention_bias=spec.qkv_bias, qk_norm=spec.qk_norm, block_size=spec.block_size)
    return cfg
