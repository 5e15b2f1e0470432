"""Test-bed students of the 2026 families, in their released config formats.

* ``llada2``: an LLaDA2.x MoE (``LLaDA2MoeModelLM``, ``models/llada2.py``): fused head-major
  QKV with per-head q/k norms, partial RoPE (factor 0.5, theta 600,000 as released), the first
  layer dense and the rest sigmoid-routed MoE layers with group-limited top-k, an expert bias
  for selection, ``routed_scaling_factor`` 2.5 and one shared expert; block-causal attention
  in blocks of 32 (the released block size: a test-bed prompt of at most 16 tokens and its
  16 answer positions are one block). The released widths (2048 hidden, 256 experts of 512,
  top-8 in 4 of 8 groups) shrink to ``--hidden`` and ``--experts`` of ``--moe-intermediate``,
  top-``--top-k`` in half the groups.
* ``gemma``: a DiffusionGemma (``DiffusionGemmaForBlockDiffusion``,
  ``models/diffusion_gemma.py``): sliding-window layers and a last full-attention layer with
  its own head dim, one K/V head and K = V, proportional RoPE, a dense GeGLU MLP beside a
  softmax-routed MoE, self-conditioning, the head tied to the embedding, logit soft-capping;
  one canvas of 16 (the test bed's answer length; released: 256).

Both use the test bed's word-level vocabulary and special ids (``train/testbed.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_decode.models.base import DecoderLM
from dllm_decode.models.diffusion_gemma import DiffusionGemmaModel
from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.train.testbed import TESTBED_GEN_LENGTH

#: LLaDA2's released block size: a test-bed canvas (prompt <= 16, answer 16) is one block
LLADA2_BLOCK = 32
#: DiffusionGemma's sliding window for the test bed: every test-bed prompt stays in view
GEMMA_WINDOW = 32


def llada2_student_config(hidden: int, layers: int, heads: int, intermediate: int,
                          experts: int, top_k: int, moe_intermediate: int,
                          oracle: WaitingLineOracle) -> dict[str, Any]:
    """A release-format LLaDA2.x ``config.json`` over the oracle's vocabulary."""
    groups = 4 if experts % 4 == 0 and experts >= 8 else 1
    return {
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
        "vocab_size": oracle.vocab_size, "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2), "head_dim": hidden // heads,
        "partial_rotary_factor": 0.5, "rope_theta": 600000.0, "rope_scaling": None,
        "rms_norm_eps": 1e-6, "max_position_embeddings": oracle.max_length,
        "first_k_dense_replace": 1, "num_experts": experts, "num_experts_per_tok": top_k,
        "moe_intermediate_size": moe_intermediate, "n_group": groups,
        "topk_group": max(1, groups // 2), "routed_scaling_factor": 2.5,
        "score_function": "sigmoid", "router_dtype": "fp32",
        "moe_router_enable_expert_bias": True, "norm_topk_prob": True, "num_shared_experts": 1,
        "use_qkv_bias": False, "use_bias": False, "use_qk_norm": True, "use_rmsnorm": True,
        "norm_head": False, "tie_word_embeddings": False, "hidden_act": "silu",
        "block_size": LLADA2_BLOCK, "mask_token_id": oracle.mask_token_id,
        "eos_token_id": oracle.eos_token_ids[0], "pad_token_id": oracle.pad_token_id,
        # distilled only in its own blocks: never trained with causal attention inside one
        "supports_causal_in_block": False,
    }


def gemma_student_config(hidden: int, layers: int, heads: int, intermediate: int,
                         experts: int, top_k: int, moe_intermediate: int,
                         oracle: WaitingLineOracle) -> dict[str, Any]:
    """A release-format DiffusionGemma ``config.json`` (text part) over the oracle's
    vocabulary: ``layers - 1`` sliding layers and a full-attention layer last."""
    head_dim = hidden // heads
    text = {
        "model_type": "diffusion_gemma_text", "vocab_size": oracle.vocab_size,
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2),
        "head_dim": head_dim, "global_head_dim": 2 * head_dim, "num_global_key_value_heads": 1,
        "layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"],
        "sliding_window": GEMMA_WINDOW,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0}},
        "num_experts": experts, "top_k_experts": top_k, "moe_intermediate_size": moe_intermediate,
        "rms_norm_eps": 1e-6, "max_position_embeddings": oracle.max_length,
        "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False, "use_bidirectional_attention": "vision",
        "tie_word_embeddings": True, "pad_token_id": oracle.pad_token_id,
        "eos_token_id": oracle.eos_token_ids[0], "bos_token_id": None,
    }
    return {"architectures": ["DiffusionGemmaForBlockDiffusion"],
            "model_type": "diffusion_gemma", "canvas_length": TESTBED_GEN_LENGTH,
            "tie_word_embeddings": True, "eos_token_id": oracle.eos_token_ids[0],
            "text_config": text}


def build_llada2_student(config: dict[str, Any], seed: int) -> DecoderLM:
    """A freshly initialised LLaDA2.x student (N(0, 0.02) matrices), in train mode."""
    from dllm_decode.models.loading import build_model

    return build_model(config, seed=seed).train()


def build_gemma_student(config: dict[str, Any], seed: int) -> DiffusionGemmaModel:
    """A freshly initialised DiffusionGemma student, in train mode. The per-layer scalars
    (``layer_scalar``, the encoder's copy) stay 1 and frozen: the release stores them as
    buffers. Gemma attention has scale 1 after per-head q / k norms, so with unit norm weights
    the initial logits would have a standard deviation of ``sqrt(head_dim)`` (near one-hot
    attention); the q / k norm weights start at ``head_dim^-1/4`` instead (the product scales
    as ``1 / sqrt(head_dim)``), and training moves them as the release's trained ones."""
    from dllm_decode.models.gemma_loading import build_diffusion_gemma

    model = build_diffusion_gemma(config, seed=seed, init_std=0.02)
    with torch.no_grad():
        for layer in model.layers:  # unit-scale attention logits at the start (see above)
            d = layer.spec.head_dim
            layer.self_attn.q_norm.weight.fill_(d ** -0.25)
            layer.self_attn.k_norm.weight.fill_(d ** -0.25)
    for layer in model.layers:
        layer.layer_scalar.requires_grad_(False)
    for scalar in model.encoder_scalars:
        scalar.requires_grad_(False)
    return model.train()


def tie_head(model: Any) -> None:
    """Share the LLaDA2 student's input embedding with its LM head while training (copying a
    name becomes a pass-through); ``train.config.untie`` splits them before export."""
    model.head.weight = model.embed.weight

