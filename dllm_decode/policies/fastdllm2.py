"""Fast-dLLM v2 decoding: sub-block threshold commits with the block-level cache.

Wu et al., "Fast-dLLM v2: Efficient Block-Diffusion LLM", arXiv 2509.26328; reference
NVlabs/Fast-dLLM ``v2/generation_functions.py`` ``batch_sample`` (upstream d259b48) and the
Hugging Face ``modeling.py`` ``generate`` of ``Efficient-Large-Model/Fast_dLLM_v2_7B``.

The reference decodes each block of ``block_size`` (the model's ``bd_size``) in sub-blocks of
``small_block_size``, left to right: every forward runs the whole block against the prefix
K/V cache, and commits the current sub-block's masked positions whose probability is
``> threshold`` plus always its most probable one. A completed block is forwarded once more
to write its K/V, and the argmax of its last output (the model predicts shifted, like an AR
LM) becomes the next block's first token. In the one loop, with ``cache="block_causal"``
(the block-level cache: committed blocks' K/V are written by the next forward), that cache
forward is the next block's first step: ``SubBlockThreshold`` commits a block's first
position alone at its argmax when it is still masked (the AR token), then the sub-blocks.

Deviations: rows of a batch are independent (the reference moves its batch sub-block by
sub-block together, and its top-p sampling draws for row 0 only, a bug: batched sampling is
not reproduced); the reference runs the prompt's full blocks in a separate prefill forward
(one more forward when the prompt is longer than a block and not block-aligned) where the
block-causal plan computes them in the first step's forward; ``use_block_cache`` (sub-block-
only forwards reusing the block's K/V) is not provided. The mask token is never a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dllm_decode.policies.base import lowest
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.registry import register
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import StepState


@dataclass(frozen=True)
class SubBlockThreshold:
    """Fast-dLLM v2's rule: a block's masked first position alone at its argmax (the AR token
    of the previous block's cache forward); else, in each row's first sub-block of
    ``small_block_size`` (aligned inside the block) that has a mask, every masked position
    with probability ``> threshold`` (strict) plus the most probable one.

    ``block_size``: the model's block size, resolved at bind.
    """

    threshold: float = 0.9
    small_block_size: int = 8
    block_size: int | None = None
    capabilities = Capabilities(budgeted=False, preferred_cache="block_causal",
                                requires_attention="block_causal", proposal_fields=(),
                                reads_masked_only=True)

    def __post_init__(self) -> None:
        check_fields(self, "SubBlockThreshold")
        check_range("SubBlockThreshold", "threshold", self.threshold, 0.0, 1.0)
        check_range("SubBlockThreshold", "small_block_size", self.small_block_size, 1)

    def bind(self, model: Any, cfg: Any = None) -> SubBlockThreshold:
        """With ``block_size`` = the model's; ``small_block_size`` must divide it."""
        block = getattr(model, "block_size", None) or self.block_size
        if block is None or block % self.small_block_size:
            raise ValueError(f"fastdllm_v2: small_block_size ({self.small_block_size}) must "
                             f"divide the model's block size ({block})")
        return replace(self, block_size=block)

    def select(self, state: StepState) -> Tensor:
        eligible, prob = state.eligible, state.proposal.prob
        block = self.block_size or (state.block_end - state.block_start)
        start = (state.block_start // block) * block  # the aligned block's first position
        pos = torch.arange(eligible.shape[1], device=eligible.device)
        # each row's current sub-block: the one holding its first eligible position
        first = torch.where(eligible, pos, eligible.shape[1]).min(1, keepdim=True).values
        sub = self.small_block_size
        current = eligible & ((pos - start) // sub == (first - start) // sub)
        best = torch.where(current, prob, lowest(prob.dtype)).argmax(-1, keepdim=True)
        commit = current & (prob > self.threshold).scatter(-1, best, True)
        # the AR token: a block whose first position is still masked commits it alone
        ar = eligible[:, start:start + 1]
        only = torch.zeros_like(eligible)
        only[:, start] = True
        return torch.where(ar, eligible & only, commit)


def fastdllm_v2_policy(threshold: float = 0.9, small_block_size: int = 8) -> SubBlockThreshold:
    """The ``fastdllm_v2`` preset (``v2/eval.py`` defaults: threshold 0.9, sub-blocks of 8;
    the model's block size, 32 released), with its block-level cache (``block_causal``)."""
    return SubBlockThreshold(threshold=threshold, small_block_size=small_block_size)


register("fastdllm_v2", fastdllm_v2_policy)
