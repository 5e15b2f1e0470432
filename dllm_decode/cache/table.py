"""Cache mode -> the plan that runs it: one table beside the plans (``PLANS``) and
``make_plan``, which the sampler calls once per generation.

Each plan module (``plans``, ``sub_block``, ``window``, ``dllm_cache``) defines its plan and a
builder ``(model, mode, valid, positions, cfg, family, cache, sub_block) -> plan`` from a
``SamplerConfig``; this module imports them all, and nothing below it knows the others. A new
plan adds its ``CacheMode`` (``types``) and its builder here (``register_plan`` for a plugin).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from dllm_decode.cache.dllm_cache import dllm_cache_plan
from dllm_decode.cache.dsb import dsb_plan
from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.cache.plans import ForwardPlan, forward_plan
from dllm_decode.cache.streaming import streaming_plan
from dllm_decode.cache.sub_block import sub_block_plan
from dllm_decode.cache.window import window_plan
from dllm_decode.types import CacheMode, DiffusionLM

#: cache mode -> builder of its plan
PLANS: dict[CacheMode, Callable[..., ForwardPlan]] = {
    CacheMode.NONE: forward_plan,
    CacheMode.PREFIX: forward_plan,
    CacheMode.DUAL: forward_plan,
    CacheMode.BLOCK_CAUSAL: forward_plan,
    CacheMode.SUB_BLOCK: sub_block_plan,
    CacheMode.WINDOW: window_plan,
    CacheMode.DLLM_CACHE: dllm_cache_plan,
    CacheMode.DSB: dsb_plan,
    CacheMode.STREAMING: streaming_plan,
}


def register_plan(mode: CacheMode, builder: Callable[..., ForwardPlan]) -> None:
    """Run ``mode`` with ``builder`` (a plugin's plan; the built-in modes are in ``PLANS``)."""
    PLANS[CacheMode(mode)] = builder


def make_plan(model: DiffusionLM, mode: CacheMode, valid: Tensor, positions: Tensor,
              cfg: Any, family: str = "", cache: BlockKVCache | None = None,
              sub_block: int | None = None) -> ForwardPlan:
    """The plan for ``mode`` built from a ``SamplerConfig`` (window sizes, refresh, prefix);
    ``cache``: a K/V cache to reuse (not for ``window``); ``sub_block``: the selector's
    sub-block size (``Capabilities.sub_block_size``; ``cache="sub_block"``)."""
    mode = CacheMode(mode)
    if mode not in PLANS:
        raise ValueError(f"no plan runs cache mode {mode.value!r}; modes with a plan: "
                         f"{sorted(m.value for m in PLANS)}")
    return PLANS[mode](model, mode, valid, positions, cfg, family=family, cache=cache,
                       sub_block=sub_block)
