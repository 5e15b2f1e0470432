"""Each model family's default decoding: the preset its reference decoder corresponds to.

One table (``FAMILY_DEFAULTS``, keyed by ``model.family``) read by every front end when the
user names no policy: ``dllm-decode generate`` without ``--policy``, the lm-eval adapter
without ``policy=`` and a grid sweep with ``policy: default`` (``eval.runner``). A family's
entry is a preset name, the ``SamplerConfig`` fields / policy parameters that go with it
(the user's own parameters win) and the cache mode (``None``: the preset's preferred one).
Block size needs no entry: block-diffusion models decode in their own block size when
``block_length`` is ``None`` (LLaDA2, Fast-dLLM v2: 32; SDAR: 4), uniform-noise models in
canvases of their ``canvas_length``, and LLaDA / Dream in one block of ``gen_length``.

The README's "Supported model families" table lists the same defaults with what each
reference decoder does; ``tests/test_family_frontends.py`` keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

#: the policy name that means "the model family's default" (grids, lm-eval ``policy=``)
DEFAULT_POLICY: Final = "default"


@dataclass(frozen=True)
class FamilyDefaults:
    """A family's default decoding.

    Attributes:
        policy: preset name (``policies.resolve.PRESETS``).
        params: ``SamplerConfig`` fields and preset parameters applied with it.
        cache: cache mode (``None``: the preset's ``preferred_cache``, else ``"none"``).
        reference: the reference decoder the preset reproduces (for messages and docs).
    """

    policy: str
    params: Mapping[str, Any] = field(default_factory=dict)
    cache: str | None = None
    reference: str = ""


#: ``model.family`` -> its default decoding (mask models not listed: ``low_confidence``)
FAMILY_DEFAULTS: Final[dict[str, FamilyDefaults]] = {
    "llada": FamilyDefaults("low_confidence", reference="ML-GSAI/LLaDA generate"),
    "lladamoe": FamilyDefaults("low_confidence", reference="ML-GSAI/LLaDA generate"),
    "dream": FamilyDefaults("entropy", reference="Dream diffusion_generate (alg entropy)"),
    "sdar": FamilyDefaults("low_confidence_dynamic", cache="block_causal",
                           reference="SDAR generate (dynamic threshold, block KV cache)"),
    "sdar_moe": FamilyDefaults("low_confidence_dynamic", cache="block_causal",
                               reference="SDAR generate (dynamic threshold, block KV cache)"),
    # LLaDA2.0 and 2.1 share the architecture (and ``family``); ``llada21`` is LLaDA2.1's
    # preset. ``block_eos_stop``: LLaDA2.0's generate ends a row after a block holding an EOS
    "llada2_moe": FamilyDefaults("llada2", {"block_eos_stop": True},
                                 reference="LLaDA2.0 remote-code generate"),
    # the modeling ``generate``'s stop: the stop token with nothing masked before it
    "fast_dllm_qwen": FamilyDefaults("fastdllm_v2", {"stop_at_eos": True}, "block_causal",
                                     reference="Fast-dLLM v2 generate (sub-block threshold)"),
    "diffusion_gemma": FamilyDefaults("gemma_renoise",
                                      reference="transformers DiffusionGemma generate"),
}

_MASK_FALLBACK: Final = FamilyDefaults("low_confidence", reference="LLaDA-style generate")
_UNIFORM_FALLBACK: Final = FamilyDefaults("gemma_renoise",
                                          reference="transformers DiffusionGemma generate")


def family_defaults(model: Any) -> FamilyDefaults:
    """The default decoding of ``model``'s family (by ``model.family``; a family not in the
    table gets ``low_confidence``, or ``gemma_renoise`` for a uniform-noise model)."""
    found = FAMILY_DEFAULTS.get(str(getattr(model, "family", "")))
    if found is not None:
        return found
    uniform = getattr(model, "noise_kind", "mask") == "uniform"
    return _UNIFORM_FALLBACK if uniform else _MASK_FALLBACK


def apply_family_default(model: Any, policy: Any, params: Mapping[str, Any] | None = None,
                         cache: str | None = None) -> tuple[Any, dict[str, Any], str | None]:
    """``(policy, params, cache)`` with ``policy`` ``None`` / ``"default"`` replaced by the
    family's preset, its parameters under ``params`` (the caller's win) and its cache when
    ``cache`` is ``None``; any other policy passes through unchanged. (The spec itself is
    resolved afterwards by ``policies.resolve.resolve_policy``.)"""
    params = dict(params or {})
    if policy is not None and policy != DEFAULT_POLICY:
        return policy, params, cache
    found = family_defaults(model)
    return found.policy, {**found.params, **params}, cache if cache is not None else found.cache

