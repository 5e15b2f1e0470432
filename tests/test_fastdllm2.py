"""Fast-dLLM v2's sub-block threshold rule (``policies.fastdllm2``) on hand-built steps and on a
tiny block-diffusion model (its recorded cases: ``test_conformance_2026.py``)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.policies.fastdllm2 import SubBlockThreshold
from dllm_decode.types import Proposal, StepState
from tests.helpers import EOS, MASK, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _state(prob: list[float], eligible: list[bool], block_start: int, block_step: int
           ) -> StepState:
    p = torch.tensor([prob])
    e = torch.tensor([eligible])
    tokens = torch.zeros_like(p, dtype=torch.long)
    return StepState(proposal=Proposal(tokens, p), eligible=e, masked=e, fresh=e, canvas=tokens,
                     step=0, block=0, block_start=block_start, block_end=8, gen_start=0,
                     steps_left=None, budget=None, progress=0.0, generator=None,
                     forward_start=0, forward_width=8, block_step=block_step)


def test_sub_block_rule() -> None:
    rule = SubBlockThreshold(threshold=0.9, small_block_size=4, block_size=8)
    # mid-block step: only the first sub-block with a mask; > 0.9 (strict) plus the best
    prob = [0.0, 0.0, 0.9, 0.5, 0.99, 0.95, 0.1, 0.2]
    elig = [False, False, True, True, True, True, True, True]
    assert rule.select(_state(prob, elig, 1, 2)).tolist()[0] == [False, False, True] + [False] * 5
    elig = [False] * 4 + [True] * 4  # the second sub-block
    assert rule.select(_state(prob, elig, 1, 3)).tolist()[0] == [False] * 4 + [
        True, True, False, False]
    # a block's first step starting after the prompt: the AR token alone
    elig = [True] * 8
    assert rule.select(_state(prob, elig, 0, 0)).tolist()[0] == [True] + [False] * 7


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_fastdllm_v2_decodes_tiny_block_model(temperature: float) -> None:
    model = tiny_model("sdar", seed=5)  # blocks of 4; sub-blocks of 8 are one per block
    prompt = torch.randint(0, EOS, (2, 6), generator=torch.Generator().manual_seed(0))
    sampler = DiffusionSampler(model, "fastdllm_v2", small_block_size=2, threshold=0.8,
                               gen_length=11, temperature=temperature, debug=True)
    assert sampler.config.cache.value == "block_causal"  # its block-level cache
    out = sampler.generate(prompt, seed=[1, 2])
    assert not (out.answer == MASK).any() and torch.equal(out.tokens[:, :6], prompt)
    alone = sampler.generate(prompt[1:], seed=[2])  # rows draw their own tokens
    assert torch.equal(alone.answer[0], out.answer[1])
    default = DiffusionSampler(model, "fastdllm_v2", gen_length=11).generate(prompt)
    assert not (default.answer == MASK).any()
