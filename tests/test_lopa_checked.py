"""LoPA's ``checked=True`` guards (``policies/lopa.py``, issue 52 item 1): their rule on a
constructed ``StepState``, the default left as the paper (the recorded conformance cases), the
parameter through every front end, and an accuracy floor on held-out prompts of the trained
``testbed-llada`` (``benchmarks/bench_lopa_checked.py`` measures the full table)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.cli import _policy_params
from dllm_decode.policies.lopa import Lopa, LopaMemory
from dllm_decode.policies.resolve import make_policy
from dllm_decode.train.testbed import waiting_line_oracle
from dllm_decode.train.testbed_eval import decode_tasks
from dllm_decode.types import Proposal, StepState
from tests.test_lopa import CASES, _decode, _setup

pytestmark = pytest.mark.usefixtures("one_thread")

V, MASK = 6, 5  # vocabulary of the constructed steps; the mask id is never an argmax there


def peaked(tokens: list[int], p: float | list[float]) -> Tensor:
    """Logits ``[N, V]`` whose softmax puts ``p`` (or ``p[i]``) on each ``tokens[i]`` and the
    rest evenly."""
    ps = [p] * len(tokens) if isinstance(p, float) else p
    out = torch.stack([torch.full((V,), math.log((1 - q) / (V - 1))) for q in ps])
    out[torch.arange(len(tokens)), torch.tensor(tokens)] = torch.tensor(ps).log()
    return out


class BranchModel:
    """A ``StepModel`` whose extra forward returns ``branch`` logits ``[n, V]`` for every
    lookahead's fed span (the canvas from the block start) and records its ``active`` rows."""

    mask_token_id, eos_token_ids, block_size = MASK, (4,), None

    def __init__(self, length: int, branch: Tensor) -> None:
        self.positions = torch.arange(length)[None]
        self.valid = torch.ones(1, length, dtype=torch.bool)
        self.branch, self.active = branch, []

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor,
                active: Tensor | None = None) -> Tensor:
        self.active.append(active)
        reps = tokens.shape[1] // self.branch.shape[0]
        return self.branch.repeat(reps, 1)[None]

    def probs(self, logits: Tensor) -> Tensor:
        return logits.softmax(-1)


def step(canvas: list[int], anchor: Tensor, spawn: tuple[int, int] | None,
         branch: Tensor) -> tuple[StepState, BranchModel]:
    """A step after the first (one row, one block = the canvas): ``anchor`` logits ``[L, V]``
    at every position, one lookahead ``spawn = (position, token)`` from the previous step (or
    none), the branch forward returning ``branch``."""
    c = torch.tensor([canvas])
    length = c.shape[1]
    masked = c == MASK
    model = BranchModel(length, branch)
    pos, tok = spawn if spawn is not None else (-1, 0)
    memory = LopaMemory(torch.tensor([[pos]]), torch.tensor([[tok]]),
                        torch.tensor([[0.6]], dtype=torch.float64))
    probs = anchor.softmax(-1)[None]
    state = StepState(proposal=Proposal(probs.argmax(-1), probs.amax(-1)), eligible=masked,
                      masked=masked, fresh=torch.ones_like(masked), canvas=c, step=3, block=0,
                      block_start=0, block_end=length, gen_start=2, steps_left=None,
                      budget=None, progress=0.5, generator=None, forward_start=0,
                      forward_width=length, memory=memory, logits=anchor[None],
                      rows=torch.arange(length), model=model)
    return state, model


def commits(policy: Lopa, state: StepState) -> dict[int, int]:
    """The selection as ``{position: token}``."""
    sel = policy.select(state)
    return {p: int(sel.tokens[0, p]) for p in sel.commit[0].nonzero().flatten().tolist()}


# ---- (a) the last masked position: an empty window --------------------------------------------

def _last_position(spawned: int) -> tuple[StepState, BranchModel]:
    """Canvas ``0 1 2 M``: one masked position (3) left; the anchor reads token 1 there at
    0.6 (below the threshold: the fallback commits it); the previous step's lookahead holds
    ``spawned`` at 3, so its window is empty and its ``future`` is 1."""
    anchor = peaked([0, 1, 2, 1], 0.6)
    return step([0, 1, 2, MASK], anchor, (3, spawned), peaked([0, 1, 2, 3], 0.9))


def test_empty_window_lookahead_wins_by_default_with_an_unchecked_token() -> None:
    """The authors' rule: the empty-window lookahead scores 1 and beats the anchor, so its
    token (3, not the anchor's 1) is committed."""
    state, _ = _last_position(spawned=3)
    assert commits(Lopa(branches=1), state) == {3: 3}


def test_checked_empty_window_lookahead_cannot_win() -> None:
    """Disagreeing: dropped, the anchor's token is committed. Agreeing (guard (a) alone): the
    branch is not run for the row (the forward's ``active`` is False), the anchor commits."""
    state, _ = _last_position(spawned=3)
    assert commits(Lopa(branches=1, checked=True), state) == {3: 1}
    state, model = _last_position(spawned=1)
    assert commits(Lopa(branches=1, checked=True), state) == {3: 1}
    assert model.active[-1].tolist() == [False]
    state, model = _last_position(spawned=1)
    assert commits(Lopa(branches=1), state) == {3: 1}  # the default wins with the same token
    assert model.active[-1].tolist() == [True]


# ---- (b) the lookahead's token against the anchor's argmax --------------------------------------

#: the anchor's top probability per position of ``_open_block``'s canvas
ANCHOR_P = [0.9, 0.9, 0.5, 0.4, 0.7, 0.45]

def _open_block(spawned: int) -> tuple[StepState, BranchModel]:
    """Canvas ``0 1 M M M M``: the anchor is unsure everywhere (argmax 2 3 4 0 at 0.5, 0.4,
    0.7, 0.45: the fallback commits position 4); the lookahead holds ``spawned`` at 3 and its
    branch is sure of ``2 _ 4 0`` at 0.99 (a higher ``future``: it wins when it may)."""
    anchor = peaked([0, 1, 2, 3, 4, 0], ANCHOR_P)
    branch = peaked([0, 1, 2, 3, 4, 0], 0.99)
    return step([0, 1, MASK, MASK, MASK, MASK], anchor, (3, spawned), branch)


def test_agreeing_lookahead_wins_under_both() -> None:
    state, _ = _open_block(spawned=3)  # the anchor's argmax at 3
    want = {2: 2, 3: 3, 4: 4, 5: 0}  # its fill above 0.9 plus its spawned token
    assert commits(Lopa(branches=1), state) == want
    state, _ = _open_block(spawned=3)
    assert commits(Lopa(branches=1, checked=True), state) == want


def test_disagreeing_lookahead_is_rescored_without_its_token() -> None:
    """Token 1 at 3 (the anchor reads 3): the default commits it with the branch's fill;
    checked re-scores the branch without it, i.e. as the anchor: exactly the anchor-only
    step's selection (one fallback commit: the anchor's most confident position)."""
    state, _ = _open_block(spawned=1)
    assert commits(Lopa(branches=1), state) == {2: 2, 3: 1, 4: 4, 5: 0}
    state, _ = _open_block(spawned=1)
    checked = commits(Lopa(branches=1, checked=True), state)
    alone, _ = step([0, 1, MASK, MASK, MASK, MASK], peaked([0, 1, 2, 3, 4, 0], ANCHOR_P),
                    None, peaked([0, 1, 2, 3, 4, 0], 0.99))
    assert checked == commits(Lopa(branches=1), alone) == {4: 4}


def test_checked_spawns_like_the_anchor_when_it_drops_the_lookahead() -> None:
    """The next step's lookaheads come from the anchor's logits once its lookahead is dropped:
    its most confident positions left (2 at 0.5, 5 at 0.45) and its tokens there."""
    state, _ = _open_block(spawned=1)
    Lopa(branches=2, checked=True).select(state)
    assert state.memory.pos.tolist() == [[2, 5]] and state.memory.tok.tolist() == [[2, 0]]


# ---- the default is the paper; the parameter through the front ends ------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_default_is_the_recorded_reference(case: dict) -> None:
    """``checked=False`` (the default) decodes each recorded case of the authors' code."""
    model, policy = _setup(case)
    assert policy.checked is False
    out = _decode(model, policy, case)
    assert out.answer[0].tolist() == case["answer_ids"]
    assert out.steps == case["forward_rounds"]


def test_checked_reaches_the_preset_the_sampler_and_the_cli() -> None:
    assert make_policy("lopa").selector == Lopa(threshold=0.9, branches=14, checked=False)
    assert make_policy("lopa", checked=True).selector == Lopa(threshold=0.9, branches=14,
                                                              checked=True)
    assert make_policy("lopa", **_policy_params(["checked=true"])).selector.checked is True
    sampler = DiffusionSampler(load_model("testbed-llada"), "lopa", checked=True)
    assert sampler.policy.selector.checked is True
    with pytest.raises(ValueError, match="checked must be a bool"):
        Lopa(checked="yes")  # type: ignore[arg-type]


# ---- held-out prompts of the trained test bed ---------------------------------------------------

TASKS = ("copy", "shuffle", "replace_random", "insert_random")


def _held_out(policy: str, **kw: Any) -> tuple[float, float]:
    """Valid share and mean rounds on 3 held-out prompts per task of ``TASKS`` (12)."""
    rows = decode_tasks(load_model("testbed-llada"), waiting_line_oracle(), 3, tasks=TASKS,
                        policy=policy, **kw)
    flat = [r for t in TASKS for r in rows[t]]
    return (sum(r["valid"] for r in flat) / len(flat),
            sum(r["steps"] for r in flat) / len(flat))


def test_checked_accuracy_floor_on_testbed_llada() -> None:
    """Measured 12 / 12 in 2.83 rounds (threshold 0.9: 12 / 12 in 4.25; the default ``lopa``
    9 / 12 in 2.75); the floor is 9 / 12 in under 3.5 rounds, and fewer than threshold's."""
    acc, rounds = _held_out("lopa", checked=True)
    base_acc, base_rounds = _held_out("threshold", tau=0.9)
    assert acc >= 0.75 and acc >= 0.9 * base_acc - 0.1
    assert rounds < 3.5 and rounds < base_rounds
