"""The decode loop, its schedules and its contract errors."""

from dllm_decode.samplers.contract import (
    DecodeContractError,
    IncompleteDecodeError,
    NonFiniteLogitsError,
    PolicyContractError,
    StalledPolicyError,
)
from dllm_decode.samplers.sampler import DiffusionSampler

__all__ = ["DecodeContractError", "DiffusionSampler", "IncompleteDecodeError",
           "NonFiniteLogitsError", "PolicyContractError", "StalledPolicyError"]
