"""The decode loop and its schedules."""

from dllm_decode.samplers.sampler import DiffusionSampler

__all__ = ["DiffusionSampler"]
