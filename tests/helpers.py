"""Shared test factories: tiny configs of every family built from a seed (no downloads)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from dllm_decode.models import build_model

MASK, EOS = 63, 62


def tiny_config(family: str, **overrides: Any) -> dict[str, Any]:
    """A release-style config.json dict for a tiny model of ``family``."""
    if family == "llada":
        cfg: dict[str, Any] = {
            "model_type": "llada", "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4,
            "mlp_hidden_size": 64, "rope_theta": 10000.0, "vocab_size": 64,
            "embedding_size": 64, "mask_token_id": MASK, "eos_token_id": EOS,
            "pad_token_id": EOS, "max_sequence_length": 256, "rms_norm_eps": 1e-5,
        }
    elif family in ("dream", "sdar"):
        cfg = {
            "model_type": "Dream" if family == "dream" else "sdar", "hidden_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 64, "rope_theta": 10000.0, "vocab_size": 64,
            "mask_token_id": MASK, "eos_token_id": EOS, "pad_token_id": EOS,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
        }
        if family == "sdar":
            cfg.update(block_size=4, qk_norm=True, head_dim=8)
    else:
        raise ValueError(family)
    cfg.update(overrides)
    return cfg


def tiny_model(family: str = "llada", seed: int = 0, init_std: float = 0.5, **overrides: Any):
    """A tiny random model with spread-out confidences (large init, as the fixtures use)."""
    return build_model(tiny_config(family, **overrides), seed=seed, init_std=init_std)


def tiny_gemma_config(**text: Any) -> dict[str, Any]:
    """A release-style DiffusionGemma config.json dict (text part only): 2 sliding + 1 full
    layer (own head dim / KV heads, proportional RoPE), 4 experts top-2, canvas 8, vocab 64."""
    cfg = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "layer_types": ["sliding_attention", "sliding_attention",
                                          "full_attention"],
           "per_layer_config": {"2": {"head_dim": 16, "num_key_value_heads": 1}},
           "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                     "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "proportional",
                                                  "partial_rotary_factor": 0.25,
                                                  "rope_theta": 1e6}},
           "sliding_window": 5, "num_experts": 4, "top_k_experts": 2,
           "moe_intermediate_size": 8, "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
           "pad_token_id": 0, "eos_token_id": EOS, "bos_token_id": 2} | text
    return {"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
            "canvas_length": 8, "text_config": cfg}


def tiny_gemma(seed: int = 0, init_std: float = 0.5, steps: int = 6):
    """A tiny random DiffusionGemma (uniform noise) with a 6-step default budget."""
    from dllm_decode.models.gemma_loading import build_diffusion_gemma

    return build_diffusion_gemma(tiny_gemma_config(), seed=seed, init_std=init_std,
                                 generation={"max_denoising_steps": steps})


def mask_presets(names: Any) -> list[str]:
    """The preset names that decode mask models (uniform-noise presets such as
    ``gemma_renoise`` are refused there; ``tests/test_uniform_decoding.py`` runs them)."""
    from dllm_decode.policies.capabilities import policy_capabilities
    from dllm_decode.policies.resolve import make_policy

    out = []
    for name in sorted(names):
        pol = make_policy(name)
        if "mask" in policy_capabilities(pol.selector, pol.stopper, pol.truncator).noise_kinds:
            out.append(name)
    return out


def lay_out_cache(cache: Path, repo_id: str, source: Path, commit: str = "0" * 39 + "1",
                  ref: str = "main") -> Path:
    """Lay ``source``'s files out as a Hub cache entry, as huggingface_hub writes it:
    ``models--org--name/{blobs, snapshots/<commit>, refs/<ref>}``, snapshot files being
    symlinks to content-addressed blobs. Returns the snapshot directory."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    for i, f in enumerate(sorted(source.iterdir())):
        blob = root / "blobs" / f"{commit[:8]}{i:04d}{f.name.encode().hex()[:16]}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snap


def left_pad_rows(rows: list, pad: int) -> tuple[Any, Any]:
    """Left-pad 1-D id tensors into ``ids [B, P]`` and ``mask [B, P]`` (1 = token)."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def prompt_ids(b: int, p: int, seed: int = 0) -> Any:
    """Seeded random prompt ids ``[B, P]`` below ``EOS`` (no special token)."""
    import torch

    return torch.randint(0, EOS, (b, p), generator=torch.Generator().manual_seed(seed))


def go_offline(monkeypatch: Any, cache: Path) -> Path:
    """Point the Hub cache at ``cache``, turn offline mode on and refuse every socket
    connection (a test that opens one fails)."""
    import socket

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a test tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    return cache
