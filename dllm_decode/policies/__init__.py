"""Unmask policies (selectors), stoppers, truncators, their capabilities and composition.

``resolve_policy`` (``policies.resolve``) turns a spec into a ``Policy``; ``make_policy`` and
``compose`` are its older spellings. Importing this package fills the name tables
(``policies.presets``).
"""

from dllm_decode.policies import presets as _presets  # noqa: F401 (fills the name tables)
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
from dllm_decode.policies.confidence import Origin, RandomOrder, TopK
from dllm_decode.policies.learn2pd import EoTP
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.resolve import (
    PRESETS,
    STOPPERS,
    TRUNCATORS,
    compose,
    make_policy,
    register,
    register_stopper,
    register_truncator,
    resolve_policy,
)
from dllm_decode.policies.sched import SchED

__all__ = [
    "PRESETS", "STOPPERS", "TRUNCATORS", "Capabilities", "EntropyBounded", "EntropyThreshold",
    "EoTP", "Factor", "Origin", "Policy", "RandomOrder", "SchED", "Stopper", "Threshold", "TopK",
    "Truncator", "UnmaskPolicy", "budget_mask", "capabilities_of", "check_commit", "compose",
    "make_policy", "rank_desc", "register", "register_stopper", "register_truncator",
    "resolve_policy", "top1_mask", "topk_mask",
]
