"""``build_sampler``: a ``DiffusionSampler`` from the flat spelling the CLI and grids use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dllm_decode.policies.defaults import apply_family_default
from dllm_decode.samplers.params import build_policy
from dllm_decode.samplers.sampler import DiffusionSampler


def build_sampler(model: Any, policy: Any = None, *, stopper: Any = None,
                  truncator: Any = None, cache: str | None = None,
                  params: Mapping[str, Any] | None = None, debug: bool = False) -> DiffusionSampler:
    """``DiffusionSampler(model, compose(policy, stopper, truncator, ...), cache, ...)``.

    Args:
        model: any ``DiffusionLM``.
        policy: preset name, import path ``module:Class``, ``Policy`` or selector object
            (``None`` / ``"default"``: the model family's default, ``policies.defaults``).
        stopper, truncator: ``None``, a name, an import path or an object (see
            ``policies.resolve``).
        cache: cache mode (``None``: the policy's preferred one, else ``"none"``).
        params: flat parameters: ``SamplerConfig`` fields (``steps``, ``window_tokens``, ...)
            and policy parameters (``tau``, ``stopper.tau_low``, ``truncator.eos_token_ids``),
            split and checked by ``samplers.params.build_policy`` (as ``DiffusionSampler`` does).
    """
    policy, params, cache = apply_family_default(model, policy, params, cache)
    config, built = build_policy(policy, params, stopper=stopper, truncator=truncator)
    return DiffusionSampler(model, built, cache=cache, debug=debug, **config)
