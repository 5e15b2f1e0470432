"""Helpers mapping the reference decoders' recorded cases onto ``DiffusionSampler`` settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CONFORMANCE = SHARED / "conformance"


def require_shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent (the ../shared fixtures are not in a user's clone)")
    return path


def load_cases(family_dir: str) -> list[dict[str, Any]]:
    path = CONFORMANCE / family_dir / "cases.json"
    if not path.exists():
        return []
    return json.loads(path.read_text())


def llada_settings(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(policy, sampler kwargs) reproducing a LLaDA / Fast-dLLM case."""
    s = case["settings"]
    params: dict[str, Any] = dict(
        gen_length=s["gen_length"], block_length=s["block_length"], steps=s["steps"],
        temperature=s["temperature"], cfg_scale=s.get("cfg_scale") or 0.0,
        seed=case["seed"], rng="reference", allow_prompt_masks=True, sampling="gumbel",
        schedule="llada", exact_steps=True,
    )
    if s.get("cache", "none") != "none":
        params["cache"] = s["cache"]
    if s.get("threshold") is not None:
        return "threshold", params | {"tau": s["threshold"]}
    if s.get("factor") is not None:
        return "factor", params | {"factor": s["factor"], "last_rank_quirk": True}
    return ("random" if s["remasking"] == "random" else "low_confidence"), params


def dream_settings(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(policy, sampler kwargs) reproducing a Dream ``diffusion_generate`` case."""
    e = case["effective_generation_config"]
    params: dict[str, Any] = dict(
        gen_length=e["max_new_tokens"], steps=e["steps"], temperature=e["temperature"] or 0.0,
        top_p=e["top_p"], top_k=e["top_k"], eps=e["eps"], seed=case["seed"], rng="reference",
        sampling="categorical", schedule="dream", exact_steps=True,
    )
    if e["alg"] != "origin" and e.get("alg_temp"):
        params["alg_temp"] = e["alg_temp"]
    return e["alg"], params


def tensors(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    prompt = torch.tensor(case["prompt_ids"], dtype=torch.long)
    mask = case.get("attention_mask")
    return prompt, (torch.tensor(mask, dtype=torch.long) if mask is not None else None)
