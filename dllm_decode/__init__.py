"""dllm-decode: fast parallel decoding for masked diffusion language models.

Public API: ``DiffusionSampler``, ``SamplerConfig``, ``Generation``, ``load_model``,
``load_tokenizer``, ``generate_text`` (+ ``TextGeneration``), ``make_policy``.
"""

from dllm_decode.config import SamplerConfig
from dllm_decode.models.loading import load_model
from dllm_decode.policies.registry import make_policy
from dllm_decode.samplers.sampler import DiffusionSampler
from dllm_decode.text import TextGeneration, generate_text
from dllm_decode.tokenizer import load_tokenizer
from dllm_decode.types import Generation

__version__ = "0.1.0"

__all__ = ["DiffusionSampler", "Generation", "SamplerConfig", "TextGeneration", "generate_text",
           "load_model", "load_tokenizer", "make_policy"]
