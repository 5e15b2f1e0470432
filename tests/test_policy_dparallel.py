"""dParallel's entropy threshold (arXiv 2509.26488): θ per family, float64 entropy."""

from __future__ import annotations

import torch

from dllm_decode import DiffusionSampler, make_policy
from dllm_decode.policies.adaptive import DPARALLEL_THETA, EntropyThreshold
from dllm_decode.types import Proposal, StepState
from tests.helpers import EOS, MASK, tiny_model


def test_theta_defaults_per_family() -> None:
    sel = make_policy("entropy_threshold").selector
    assert sel.theta is None
    assert sel.bind(tiny_model("llada")).theta == 0.5 == DPARALLEL_THETA["llada"]
    assert sel.bind(tiny_model("dream")).theta == 0.45 == DPARALLEL_THETA["dream"]
    assert EntropyThreshold(theta=0.7).bind(tiny_model("dream")).theta == 0.7


def test_entropy_is_float64_of_the_logits() -> None:
    """The rule thresholds -sum p log(p + 1e-12) of the float64 softmax, as the authors do."""
    model = tiny_model("llada", seed=4)
    prompt = torch.randint(0, EOS, (2, 5), generator=torch.Generator().manual_seed(4))
    seen = []

    def grab(state, commit) -> None:
        h = EntropyThreshold.entropy(state)
        assert h.dtype == torch.float64
        z = state.logits.double()  # the mask token is already -inf here
        p = torch.softmax(z, -1)
        want = -(p * torch.log(p + 1e-12)).sum(-1)
        torch.testing.assert_close(h[:, state.rows], want)
        seen.append(commit.sum().item())

    out = DiffusionSampler(model, "entropy_threshold", debug=True).generate(
        prompt, gen_length=8, on_step=grab)
    assert seen and not (out.answer == MASK).any()


def _state(probs: torch.Tensor) -> StepState:
    """A one-row step over ``probs [L, V]`` (every position eligible)."""
    logits = torch.log(probs)[None]
    b, length = 1, probs.shape[0]
    z = torch.zeros(b, length)
    ones = torch.ones(b, length, dtype=torch.bool)
    prop = Proposal(z.long(), z, z, z, z)
    return StepState(proposal=prop, eligible=ones, masked=ones, fresh=ones, canvas=z.long(),
                     step=0, block=0, block_start=0, block_end=length, gen_start=0,
                     steps_left=None, budget=None, progress=0.0, generator=None,
                     forward_start=0, forward_width=length, logits=logits,
                     rows=torch.arange(length))


def test_dream_default_theta_is_stricter() -> None:
    """Entropies 0.10, 0.471, 0.69 nats: LLaDA's 0.5 commits two, Dream's 0.45 one."""
    probs = torch.tensor([[0.98, 0.02, 0.0], [0.82, 0.18, 0.0], [0.5, 0.5, 0.0]])
    state = _state(probs)
    sel = make_policy("entropy_threshold").selector
    llada = sel.bind(tiny_model("llada")).select(state)
    dream = sel.bind(tiny_model("dream")).select(state)
    assert llada.tolist() == [[True, True, False]]
    assert dream.tolist() == [[True, False, False]]
