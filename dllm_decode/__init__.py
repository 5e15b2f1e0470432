"""dllm-decode: fast parallel decoding for masked diffusion language models.

Public API: ``DiffusionSampler``, ``SamplerConfig``, ``Generation``, ``load_model``,
``load_tokenizer``, ``generate_text`` (+ ``TextGeneration``), ``make_policy``; for writing
and composing policies ``Policy``, ``Capabilities``, ``StepState``, ``check_policy``; for
pictures of a decode ``plot_decoding``.
"""

from dllm_decode.config import SamplerConfig
from dllm_decode.models.loading import load_model
from dllm_decode.plot import plot_decoding
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.resolve import make_policy
from dllm_decode.samplers.check import check_policy
from dllm_decode.samplers.sampler import DiffusionSampler
from dllm_decode.text import TextGeneration, generate_text
from dllm_decode.tokenizer import load_tokenizer
from dllm_decode.types import Generation, StepState
from dllm_decode.version import __version__

__all__ = ["Capabilities", "DiffusionSampler", "Generation", "Policy", "SamplerConfig",
           "StepState", "TextGeneration", "__version__", "check_policy", "generate_text",
           "load_model", "load_tokenizer", "make_policy", "plot_decoding"]
