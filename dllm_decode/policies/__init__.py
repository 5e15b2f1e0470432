"""Unmask policies (selectors), stoppers, truncators and the name registry."""

from dllm_decode.policies.adaptive import EntropyBounded, EntropyThreshold, Factor, Threshold
from dllm_decode.policies.base import (
    Stopper,
    Truncator,
    UnmaskPolicy,
    check_commit,
    rank_desc,
    topk_mask,
)
from dllm_decode.policies.confidence import Origin, RandomOrder, TopK
from dllm_decode.policies.registry import PRESETS, Policy, make_policy, register

__all__ = [
    "PRESETS", "EntropyBounded", "EntropyThreshold", "Factor", "Origin", "Policy", "RandomOrder",
    "Stopper", "Threshold", "TopK", "Truncator", "UnmaskPolicy", "check_commit", "make_policy",
    "rank_desc", "register", "topk_mask",
]
