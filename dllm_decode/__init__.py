"""dllm-decode: fast parallel decoding for masked diffusion language models.

Public API: ``DiffusionSampler``, ``SamplerConfig``, ``Generation``, ``load_model``,
``load_tokenizer``, ``generate_text`` (+ ``TextGeneration``), ``stream_text`` (+ ``TextEvent``),
``make_policy``; for writing and composing policies ``Policy``, ``Capabilities``, ``StepState``,
``check_policy``; for pictures of a decode ``plot_decoding``.

The names load on first use (PEP 562 ``__getattr__``): importing a light submodule, such as
SGLang's plugin entry point ``dllm_decode.integrations.sglang:register`` in every SGLang
process, does not import the decoding stack (torch models, policies, samplers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dllm_decode.version import __version__

if TYPE_CHECKING:
    from dllm_decode.config import SamplerConfig
    from dllm_decode.models.loading import load_model
    from dllm_decode.plot import plot_decoding
    from dllm_decode.policies.capabilities import Capabilities
    from dllm_decode.policies.policy import Policy
    from dllm_decode.policies.resolve import make_policy
    from dllm_decode.samplers.check import check_policy
    from dllm_decode.samplers.sampler import DiffusionSampler
    from dllm_decode.text import TextEvent, TextGeneration, generate_text, stream_text
    from dllm_decode.tokenizer import load_tokenizer
    from dllm_decode.types import Generation, StepState

#: public name -> the module that defines it
_WHERE = {
    "SamplerConfig": "config", "load_model": "models.loading", "plot_decoding": "plot",
    "Capabilities": "policies.capabilities", "Policy": "policies.policy",
    "make_policy": "policies.resolve", "check_policy": "samplers.check",
    "DiffusionSampler": "samplers.sampler", "TextGeneration": "text",
    "generate_text": "text", "stream_text": "text", "TextEvent": "text",
    "load_tokenizer": "tokenizer", "Generation": "types",
    "StepState": "types"}

__all__ = ["Capabilities", "DiffusionSampler", "Generation", "Policy", "SamplerConfig",
           "StepState", "TextEvent", "TextGeneration", "__version__", "check_policy",
           "generate_text", "load_model", "load_tokenizer", "make_policy", "plot_decoding",
           "stream_text"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'dllm_decode' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dllm_decode.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
