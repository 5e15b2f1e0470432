"""Tiny release-style configs of the 2026 families, and the conformance fixtures' mask ids."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from dllm_decode.models import build_model, load_model
from tests.conformance import CONFORMANCE, require_shared
from tests.helpers import go_offline

MASK, EOS = 63, 62


def tiny_moe_config(family: str, **overrides: Any) -> dict[str, Any]:
    """A release-style config.json dict for a tiny model of ``family`` (vocab 64)."""
    common: dict[str, Any] = {
        "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256, "mask_token_id": MASK, "eos_token_id": EOS,
        "pad_token_id": EOS, "hidden_act": "silu", "tie_word_embeddings": False,
    }
    if family == "llada2":
        cfg = common | {
            "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
            "intermediate_size": 64, "moe_intermediate_size": 16, "num_experts": 8,
            "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "num_shared_experts": 1,
            "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
            "moe_router_enable_expert_bias": True, "partial_rotary_factor": 0.5,
            "rope_theta": 600000.0, "use_qk_norm": True, "use_qkv_bias": False,
            "use_bias": False, "score_function": "sigmoid", "block_size": 4,
        }
    elif family == "fastdllm2":
        cfg = common | {
            "architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen",
            "intermediate_size": 64, "bd_size": 4, "rope_theta": 1e6,
            "num_hidden_layers": 2, "use_sliding_window": False,
        }
    elif family == "lladamoe":
        cfg = common | {
            "architectures": ["LLaDAMoEModelLM"], "model_type": "llada",
            "dense_intermediate_size": 64, "expert_intermediate_size": 16, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_layer_freq": [0, 1, 1], "qk_layernorm": True,
            "rope_theta": 50000.0, "partial_rotary_factor": 1.0, "attention_bias": False,
            "norm_topk_prob": False, "moe_router_enable_expert_bias": False,
            "shared_expert_intermediate_size": None, "num_key_value_heads": 4,
        }
        del cfg["head_dim"]
    elif family == "sdarmoe":
        cfg = common | {
            "architectures": ["SDARMoeForCausalLM"], "model_type": "sdar_moe",
            "intermediate_size": 64, "moe_intermediate_size": 16, "num_experts": 8,
            "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [0],
            "norm_topk_prob": True, "block_size": 4, "rope_theta": 1e6,
            "attention_bias": False,
        }
    else:
        raise ValueError(family)
    cfg.update(overrides)
    return cfg


def fixture_mask_id(name: str) -> int:
    """The mask id the fixture's reference calls were made with (its cases' ``mask_id``)."""
    cases = json.loads((require_shared(CONFORMANCE / name) / "cases.json").read_text())
    ids = {c["args"]["mask_id"] for c in cases}
    assert len(ids) == 1, ids
    return ids.pop()


def randomize_buffers(model: torch.nn.Module, seed: int = 0) -> None:
    """Give the router expert biases non-zero values (``build_model`` leaves buffers at 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("expert_bias"):
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.3)


#: the built families (``tiny_moe_config`` names)
TINY = ["llada2", "fastdllm2", "lladamoe", "sdarmoe"]


def tiny_moe_model(family: str, seed: int = 3, **overrides):
    """A tiny random model of ``family`` (large init: spread-out confidences; expert biases
    randomised)."""
    model = build_model(tiny_moe_config(family, **overrides), seed=seed, init_std=0.5)
    randomize_buffers(model, seed)
    return model


def load_fixture(name: str):
    """``(directory, model)`` of a conformance checkpoint (skips without ../shared)."""
    directory = require_shared(CONFORMANCE / name)
    return directory, load_model(directory, mask_token_id=fixture_mask_id(name))


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """An empty Hub cache at ``tmp_path / "hub"``, offline mode on, sockets refused."""
    return go_offline(monkeypatch, tmp_path / "hub")


@pytest.fixture
def seeded() -> None:
    """Seed torch's global generator (the tests' random token ids)."""
    torch.manual_seed(0)
