"""The runner's decoding function: one ``DiffusionSampler`` per composed config, with the
model family's defaults for ``policy: default`` and the block-length rule of the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from dllm_decode.eval.parallelbench.grid import DecodeConfig

#: ``decode(prompt_ids [B,P], attention_mask [B,P], config)`` -> ``Generation``
DecodeFn = Callable[[torch.Tensor, torch.Tensor, "DecodeConfig"], Any]


def check_block_length(model: Any, config: DecodeConfig) -> None:
    """``ValueError`` naming the fix when ``config``'s block length cannot run on ``model``:
    block-diffusion models decode in their own block size and uniform-noise models in
    canvases of their own length (a grid's ``block_length: model``), not in ``full``."""
    own, what = None, ""
    if getattr(model, "noise_kind", "mask") == "uniform":
        own, what = getattr(model, "canvas_length", None), "canvases of"
    elif getattr(model, "attention", None) == "block_causal":
        own, what = model.block_size, "blocks of"
    if own is not None and config.block_length not in (None, own):
        raise ValueError(f"{config.model} decodes in {what} {own} tokens; its grid sweeps need "
                         f"block_length: model (or {own}), got {config.block_length}")


def sampler_decode_fn(model: Any) -> DecodeFn:
    """A :data:`DecodeFn` over ``dllm_decode.DiffusionSampler`` (one sampler per composed
    policy / params / cache). ``policy: default`` is the model family's preset with its
    parameters (the sweep's ``params`` win) and, where the sweep's cache is ``none``, its
    cache (``policies.defaults``)."""
    from dllm_decode.policies.defaults import DEFAULT_POLICY, apply_family_default
    from dllm_decode.samplers.build import build_sampler

    samplers: dict[tuple[Any, ...], Any] = {}
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    device = parameter.device if parameter is not None else torch.device("cpu")

    def decode(prompt_ids: torch.Tensor, attention_mask: torch.Tensor, config: DecodeConfig) -> Any:
        check_block_length(model, config)
        key = (config.policy, config.stopper, config.truncator, config.params, config.cache)
        if key not in samplers:
            policy, params, cache = config.policy, dict(config.params), config.cache
            if policy == DEFAULT_POLICY:
                policy, params, family_cache = apply_family_default(model, policy, params)
                cache = family_cache if cache == "none" and family_cache else cache
            samplers[key] = build_sampler(
                model, policy, stopper=config.stopper, truncator=config.truncator,
                cache=cache, params=params,
            )  # fmt: skip
        return samplers[key].generate(
            prompt_ids.to(device), attention_mask.to(device), gen_length=config.gen_length,
            block_length=config.block_length, steps=config.steps,
            temperature=config.temperature, seed=config.seed,
        )  # fmt: skip

    return decode
