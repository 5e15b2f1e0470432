"""Model families behind the ``DiffusionLM`` contract, and checkpoint loading."""

from dllm_decode.models.base import DecoderLM, DiffusionLM, ModelSpec
from dllm_decode.models.block import BlockDiffusionModel
from dllm_decode.models.dream import DreamModel
from dllm_decode.models.fastdllm2 import FastDLLMv2Model
from dllm_decode.models.hub import HubError
from dllm_decode.models.llada import LLaDAModel
from dllm_decode.models.llada2 import LLaDA2MoEModel
from dllm_decode.models.llada_moe import LLaDAMoEModel
from dllm_decode.models.loading import (
    CheckpointError,
    build_model,
    bundled_models,
    load_model,
    register_auto_config,
    save_model,
)
from dllm_decode.models.sdar_moe import SDARMoEModel

__all__ = [
    "BlockDiffusionModel", "CheckpointError", "DecoderLM", "DiffusionLM", "DreamModel",
    "FastDLLMv2Model", "HubError", "LLaDA2MoEModel", "LLaDAMoEModel", "LLaDAModel", "ModelSpec",
    "SDARMoEModel", "build_model", "bundled_models", "load_model", "register_auto_config",
    "save_model",
]
