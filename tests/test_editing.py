"""Token editing in the one loop (``samplers.editing``, ``policies.editing``): the declared
capability, its contract (edits only where editable, bounded per block, no mask left, prompt
untouched, every forward counted), composition with existing selectors, and the LLaDA2
schedule."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor

from dllm_decode import DiffusionSampler, make_policy
from dllm_decode.policies import Threshold, TopK
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.editing import MinimalTopK, TokenEditing, llada2_schedule
from dllm_decode.samplers.contract import PolicyContractError
from dllm_decode.types import Selection, StepState
from tests.helpers import EOS, MASK, left_pad_rows, prompt_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {f: tiny_model(f, seed=5) for f in ("llada", "dream", "sdar")}


class Flipping:
    """A model whose argmax at every position alternates between two tokens forward by
    forward, with high confidence: editing at any threshold < 1 would never settle."""

    def __init__(self, model: Any) -> None:
        self._model, self.calls = model, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, tokens: Tensor, positions: Tensor, **kw: Any) -> Tensor:
        logits = self._model.forward(tokens, positions, **kw)
        self.calls += 1
        logits[..., 7 + self.calls % 2] = 60.0
        return logits

    __call__ = forward


def _check_contract(out: Any, prompt: Tensor) -> None:
    p = prompt.shape[1]
    assert torch.equal(out.tokens[:, :p], prompt)  # prompt untouched
    assert not (out.answer == MASK).any()  # no mask in the answer
    assert out.edits is not None and out.edits.shape == (prompt.shape[0], out.steps,
                                                         out.answer.shape[1])
    # an edit rewrites a committed position: strictly after its first commit
    steps = torch.arange(out.steps)[None, :, None]
    at = out.edits.nonzero()
    assert (out.commit_step[at[:, 0], at[:, 2]] < steps[0, at[:, 1], 0]).all()


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
@pytest.mark.parametrize("policy,params", [
    ("llada21", {"mode": "speed"}), ("llada21", {}),
    ("edit", {"base": "threshold", "tau": 0.7, "editing_threshold": 0.5}),
    ("edit", {"base": "low_confidence", "editing_threshold": 0.3, "max_post_steps": 3}),
])
def test_editing_decodes_meet_the_contract(family, policy, params) -> None:
    model = MODELS[family]
    kw = {} if family == "sdar" else {"block_length": 4}
    sampler = DiffusionSampler(model, policy, debug=True, gen_length=8, **params, **kw)
    prompt = prompt_ids(3, 5)
    out = sampler.generate(prompt)
    _check_contract(out, prompt)
    # every forward counted; a row's NFE is at most its forwards
    assert out.forwards == sum(out.step_forwards) and (out.nfe <= out.forwards).all()


def test_edits_are_bounded_per_block_even_when_they_oscillate() -> None:
    """LLaDA2.1's edits can oscillate; the post-step bound ends every block."""
    model = Flipping(MODELS["llada"])
    post = 3
    sampler = DiffusionSampler(model, "llada21", editing_threshold=0.5, max_post_steps=post,
                               gen_length=8, block_length=4)
    out = sampler.generate(prompt_ids(1, 5))
    # per block: at most one step per mask (each commits >= 1) plus the post steps
    assert out.forwards <= 2 * (4 + post)
    assert out.edits_per_step().sum() > 0
    # the bound is exact here: every post step edits, so each block runs all of them
    assert out.forwards == model.calls == int(out.nfe[0])


def test_no_edit_threshold_and_no_post_steps_equal_the_base_rule() -> None:
    """Editing at threshold 1 with no post steps is the base selector, token for token."""
    for family in ("llada", "sdar"):
        model = MODELS[family]
        kw = {} if family == "sdar" else {"block_length": 4}
        prompt = prompt_ids(2, 6, seed=1)
        base = DiffusionSampler(model, Threshold(tau=0.6), gen_length=8, **kw).generate(prompt)
        edit = DiffusionSampler(model, TokenEditing(Threshold(tau=0.6), editing_threshold=1.0,
                                                    max_post_steps=0),
                                gen_length=8, **kw).generate(prompt)
        assert torch.equal(base.tokens, edit.tokens) and torch.equal(base.nfe, edit.nfe)
        assert not edit.edits.any()


@pytest.mark.parametrize("policy,params", [("llada21", {"mode": "speed"}),
                                           ("edit", {"base": "eb", "editing_threshold": 0.4})])
def test_editing_batch_equals_rows_alone(policy, params) -> None:
    model = MODELS["llada"]
    g = torch.Generator().manual_seed(4)
    rows = [torch.randint(0, EOS, (n,), generator=g) for n in (3, 6, 5)]
    ids, mask = left_pad_rows(rows, EOS)
    sampler = DiffusionSampler(model, policy, gen_length=8, block_length=4, **params)
    out = sampler.generate(ids, mask)
    for i, r in enumerate(rows):
        alone = sampler.generate(r[None])
        assert torch.equal(alone.answer[0], out.answer[i])
        assert int(alone.nfe[0]) == int(out.nfe[i])
        assert torch.equal(alone.edits[0].sum(0), out.edits[i].sum(0))


@dataclass(frozen=True)
class _EditsOutside:
    """Edits the prompt (never editable)."""

    capabilities = Capabilities(budgeted=False, edits=True, max_post_steps=2)

    def select(self, state: StepState) -> Selection:
        commit = Threshold(0.5).select(state)
        edit = torch.zeros_like(commit)
        edit[:, 0] = True
        return Selection(commit, edit=edit)


@dataclass(frozen=True)
class _WritesMask:
    """Edits every editable position to the mask token."""

    capabilities = Capabilities(budgeted=False, edits=True, max_post_steps=2)

    def select(self, state: StepState) -> Selection:
        commit = Threshold(0.5).select(state)
        tokens = torch.where(state.editable, MASK, state.proposal.tokens)
        return Selection(commit, tokens, edit=state.editable)


@dataclass(frozen=True)
class _Undeclared:
    def select(self, state: StepState) -> Selection:
        commit = Threshold(0.5).select(state)
        return Selection(commit, edit=torch.zeros_like(commit))


@pytest.mark.parametrize("selector,match", [
    (_EditsOutside(), "edited positions outside state.editable"),
    (_WritesMask(), "wrote the mask token"),
    (_Undeclared(), "without declaring it"),
])
def test_invalid_edits_are_contract_errors(selector, match) -> None:
    sampler = DiffusionSampler(MODELS["llada"], selector, gen_length=8, block_length=4)
    with pytest.raises(PolicyContractError, match=match):
        sampler.generate(prompt_ids(2, 4))


def test_capability_validation() -> None:
    with pytest.raises(ValueError, match="needs edits=True"):
        Capabilities(max_post_steps=2)
    with pytest.raises(ValueError, match="reads_masked_only must be False"):
        Capabilities(edits=True, reads_masked_only=True)
    with pytest.raises(ValueError, match="max_post_steps"):
        Capabilities(edits=True, max_post_steps=-1)
    with pytest.raises(ValueError, match="cannot wrap"):
        TokenEditing(base=make_policy("origin").selector)
    with pytest.raises(ValueError, match="mode"):
        make_policy("llada21", mode="turbo")
    caps = TokenEditing(TopK()).capabilities
    assert caps.edits and caps.max_post_steps == 16 and caps.budgeted


def test_llada2_schedule_matches_the_reference_split() -> None:
    """``_get_num_transfer_tokens``: even split, remainder to the first steps."""
    assert llada2_schedule(8, 8) == [1] * 8
    assert llada2_schedule(8, 3) == [3, 3, 2]
    assert llada2_schedule(4, 8) == [1, 1, 1, 1, 0, 0, 0, 0]
    assert llada2_schedule(32, 0) == []
    # the reference decodes the block's padding too: 8 positions over min(4, 4 // 2) = 2 steps
    rule = MinimalTopK(block_steps=4, minimal_topk=2, block_length=8, gen_length=4,
                       decode_block_padding=True)
    assert [rule.k(i) for i in range(3)] == [4, 4, 0]
    # without it the 4 positions decoded are split: 2 steps of 2
    rule = MinimalTopK(block_steps=4, minimal_topk=2, block_length=8, gen_length=4)
    assert [rule.k(i) for i in range(3)] == [2, 2, 0]
    assert MinimalTopK(min_commit=3).k(7) == 3


def test_a_short_answer_splits_the_positions_it_decodes() -> None:
    """16 tokens in LLaDA2's block of 32 without the padding decoded: one commit a step (the
    reference's two a step split its padded block), bound from the sampler's config."""
    model = SimpleNamespace(block_size=32)
    bound = MinimalTopK().bind(model, SimpleNamespace(block_length=None, steps=None,
                                                      gen_length=16))
    assert bound.schedule() == [1] * 16
    padded = MinimalTopK().bind(model, SimpleNamespace(block_length=None, steps=None,
                                                       gen_length=16, decode_block_padding=True))
    assert padded.schedule() == [2] * 16


def test_minimal_topk_rule() -> None:
    """> threshold when at least k pass, else the k most probable (strict comparison)."""
    prob = torch.tensor([[0.9, 0.5, 0.95, 0.2], [0.5, 0.4, 0.3, 0.96]])
    eligible = torch.ones(2, 4, dtype=torch.bool)
    rule = MinimalTopK(threshold=0.9, min_commit=1)
    state = _state(prob, eligible)
    assert rule.select(state).tolist() == [[False, False, True, False],
                                           [False, False, False, True]]
    rule = MinimalTopK(threshold=0.9, min_commit=2)
    assert rule.select(state).tolist() == [[True, False, True, False],
                                           [True, False, False, True]]


def _state(prob: Tensor, eligible: Tensor) -> StepState:
    from dllm_decode.types import Proposal

    tokens = torch.zeros_like(prob, dtype=torch.long)
    return StepState(proposal=Proposal(tokens, prob), eligible=eligible, masked=eligible,
                     fresh=eligible, canvas=tokens, step=0, block=0, block_start=0,
                     block_end=4, gen_start=0, steps_left=None, budget=None, progress=0.0,
                     generator=None, forward_start=0, forward_width=4)


def test_decode_block_padding_is_an_explicit_option() -> None:
    """LLaDA2's padding-block quirk: off by default (exactly G positions decoded); on, the
    last block is decoded in full and cut back to P + G."""
    model = MODELS["sdar"]  # block-causal, blocks of 4
    prompt = prompt_ids(2, 5)  # P + G = 13: the last block [12, 16) holds 3 padding positions
    plain = DiffusionSampler(model, "llada2", gen_length=8, steps=4).generate(prompt)
    padded = DiffusionSampler(model, "llada2", gen_length=8, steps=4,
                              decode_block_padding=True).generate(prompt)
    for out in (plain, padded):
        assert out.tokens.shape == (2, 13) and out.commit_step.shape == (2, 8)
        assert not (out.answer == MASK).any()
    # the padded run decodes 3 more positions in its last block: the first 7 agree
    assert torch.equal(plain.answer[:, :7], padded.answer[:, :7])


class _AlwaysEos(Flipping):
    def forward(self, tokens: Tensor, positions: Tensor, **kw: Any) -> Tensor:
        logits = self._model.forward(tokens, positions, **kw)
        logits[..., EOS] = 60.0
        return logits

    __call__ = forward


def test_block_eos_stop_ends_rows_after_the_block() -> None:
    model = _AlwaysEos(MODELS["llada"])
    out = DiffusionSampler(model, "threshold", gen_length=8, block_length=4,
                           block_eos_stop=True).generate(prompt_ids(1, 3))
    assert (out.answer == EOS).all() and out.forwards == 1  # the second block is never run


def test_eos_stop_on_commit_checks_only_steps_that_commit_an_eos() -> None:
    from dllm_decode.samplers.step import fill_after_eos

    canvas = torch.tensor([[1, 2, MASK, EOS, MASK]])
    commit_at = torch.tensor([[-1, 1, -1, 0, -1]])
    canvas[0, 2] = 5  # step 1 committed the position before the EOS (committed at step 0)
    commit_at[0, 2] = 1
    default = fill_after_eos(canvas, MASK, (EOS,), 1, EOS)
    strict = fill_after_eos(canvas, MASK, (EOS,), 1, EOS, committed_at=1, commit_at=commit_at)
    assert default[0, 4] == EOS and strict[0, 4] == MASK


def test_editing_step_compiles_whole() -> None:
    """``post_forward`` with edits is captured by ``torch.compile(fullgraph=True)`` (the
    ``eager`` backend checks the capture) and decodes the same tokens, edits and NFE."""
    prompt = prompt_ids(2, 5)
    kw = dict(mode="speed", gen_length=8, block_length=4)
    eager = DiffusionSampler(MODELS["llada"], "llada21", **kw).generate(prompt)
    compiled = DiffusionSampler(MODELS["llada"], "llada21", compile="eager", **kw).generate(prompt)
    assert torch.equal(eager.tokens, compiled.tokens) and torch.equal(eager.edits, compiled.edits)
    assert torch.equal(eager.nfe, compiled.nfe)
