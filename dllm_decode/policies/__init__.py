"""Unmask policies (selectors), stoppers, truncators, their capabilities and composition."""

from dllm_decode.policies.adaptive import EntropyBounded, EntropyThreshold, Factor, Threshold
from dllm_decode.policies.base import (
    Stopper,
    Truncator,
    UnmaskPolicy,
    budget_mask,
    check_commit,
    rank_desc,
    top1_mask,
    topk_mask,
)
from dllm_decode.policies.capabilities import Capabilities, capabilities_of
from dllm_decode.policies.compose import STOPPERS, TRUNCATORS, compose
from dllm_decode.policies.confidence import Origin, RandomOrder, TopK
from dllm_decode.policies.learn2pd import EoTP
from dllm_decode.policies.registry import PRESETS, Policy, make_policy, register
from dllm_decode.policies.sched import SchED

__all__ = [
    "PRESETS", "STOPPERS", "TRUNCATORS", "Capabilities", "EntropyBounded", "EntropyThreshold",
    "EoTP", "Factor", "Origin", "Policy", "RandomOrder", "SchED", "Stopper", "Threshold", "TopK",
    "Truncator", "UnmaskPolicy", "budget_mask", "capabilities_of", "check_commit", "compose",
    "make_policy", "rank_desc", "register", "top1_mask", "topk_mask",
]
