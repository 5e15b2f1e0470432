"""DSB (``policies.dsb``) and DSB Cache (``cache="dsb"``, ``cache.dsb``): conformance to the
authors' ``generate_dsb`` / ``generate_dsb_cache`` token for token, with each step's window
(eligible positions), commits, fed span and the NFE; the window rule, the loop-block
independence, batch invariance, the suffix-window quirk and its fix, composition and refusals.

The recorded cases (``tests/fixtures/methods2026/dsb.json``, recorded by
``benchmarks/conformance/record_dsb.py``) run on ``../shared/conformance/llada-tiny`` and skip
when ``../shared`` is absent.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.cache.dsb import DsbPlan, dsb_plan
from dllm_decode.cache.table import PLANS
from dllm_decode.policies.dsb import DynamicSlidingBlock, dsb_bounds
from dllm_decode.policies.resolve import make_policy, resolve_policy
from dllm_decode.types import CacheMode
from tests.helpers import tiny_model
from tests.test_wino import Noisy, _llada

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "methods2026" / "dsb.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


@pytest.fixture
def plan_args():
    """Set the ``dsb`` plan's builder arguments for one test (restored afterwards)."""
    saved = PLANS[CacheMode.DSB]

    def use(**kw: Any) -> None:
        PLANS[CacheMode.DSB] = partial(dsb_plan, **kw)

    yield use
    PLANS[CacheMode.DSB] = saved


def _decode(model: Any, case: dict, **extra: Any) -> tuple[Any, list[list[int]]]:
    """The library's run of ``case``; returns the generation and each step's eligible
    positions inside the window (as the authors' code hands them to its selector)."""
    a = case["args"]
    b, const, cached = a["block_length"], a["max_block_length"] != -1, "prefix_window" in a
    name = "dsb_const" if const else "dsb"
    kw = dict(cache="dsb", refresh_every=b, window_tokens=b if const else None) if cached else {}
    eligible: list[list[int]] = []

    def on_step(state: Any, commit: Any) -> None:
        elig = state.eligible[0]
        if not cached:
            _, e = dsb_bounds(state.masked, state.gen_start, b, b if const else None)
            elig = elig & (torch.arange(elig.shape[0]) < e[0])
        eligible.append(elig.nonzero()[:, 0].tolist())

    sampler = DiffusionSampler(model, name, tau=a["threshold"], block=b, debug=True, **kw,
                               **extra)
    out = sampler.generate(torch.tensor(case["prompt_ids"]), gen_length=a["gen_length"],
                           on_step=on_step)
    return out, eligible


def _check(out: Any, eligible: list[list[int]], case: dict) -> None:
    steps, p = case["steps"], len(case["prompt_ids"][0])
    assert out.answer.tolist() == case["answer_ids"], case["name"]
    assert out.forwards == case["nfe"] == out.steps == len(steps)
    assert int(out.nfe[0]) == case["nfe"]
    commit_step = out.commit_step[0].tolist()
    for i, step in enumerate(steps):
        committed = [p + j for j, s in enumerate(commit_step) if s == i]
        assert committed == step["committed"], (case["name"], i)
        assert eligible[i] == step["eligible"], (case["name"], i)
        start, end = step["fed"]
        assert out.step_positions[i] == end - start, (case["name"], i)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_dsb_case(case: dict, plan_args: Any) -> None:
    a = case["args"]
    if "prefix_window" in a:
        plan_args(prefix_window=a["prefix_window"], suffix_window=a["suffix_window"])
    _check(*_decode(_llada(), case), case)


@pytest.mark.parametrize("case", CASES[1::3], ids=[c["name"] for c in CASES[1::3]])
def test_dsb_case_under_logit_noise(case: dict, plan_args: Any) -> None:
    a = case["args"]
    if "prefix_window" in a:
        plan_args(prefix_window=a["prefix_window"], suffix_window=a["suffix_window"])
    _check(*_decode(Noisy(_llada(), 1e-6, seed=3), case), case)


def test_cases_cover_the_variants() -> None:
    """{greedy, const} x {no cache, cache}, steps committing several tokens, cached steps
    that feed a slice, and suffix-window cases whose code commits past the window's end."""
    kinds = {(c["args"]["max_block_length"] == -1, "prefix_window" in c["args"]) for c in CASES}
    assert kinds == {(True, False), (True, True), (False, False), (False, True)}
    assert all(c["checks"]["steps_committing_several"] for c in CASES)
    cached = [c for c in CASES if "prefix_window" in c["args"]]
    p = {c["name"]: len(c["prompt_ids"][0]) + c["args"]["gen_length"] for c in cached}
    assert all(any(s["fed"][1] - s["fed"][0] < p[c["name"]] for s in c["steps"]) for c in cached)


def test_window_crosses_loop_blocks() -> None:
    """One loop block (``block_length=None`` or G) is DSB; with loop blocks of K the window still
    commits past the loop block (``lookahead``), unlike the plain threshold rule in blocks."""
    model = tiny_model("llada", seed=2)
    prompt = torch.randint(3, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    for name in ("dsb", "dsb_const"):
        one = DiffusionSampler(model, name, tau=0.6, block=8, debug=True).generate(
            prompt, gen_length=32)
        whole = DiffusionSampler(model, name, tau=0.6, block=8, debug=True).generate(
            prompt, gen_length=32, block_length=32)
        assert torch.equal(whole.tokens, one.tokens) and torch.equal(whole.nfe, one.nfe)
        blocks = DiffusionSampler(model, name, tau=0.6, block=8, debug=True).generate(
            prompt, gen_length=32, block_length=8)
        assert not (blocks.answer == model.mask_token_id).any()
        first = blocks.commit_step[:, :8].amax(1)  # the step that completed loop block 0
        assert (blocks.commit_step[:, 8:] < first[:, None]).any(), name


def test_window_rule() -> None:
    """Greedy keeps exactly B masked positions in ``[s, e)``; const spans B from the first mask."""
    g = torch.Generator().manual_seed(0)
    masked = torch.ones(3, 40, dtype=torch.bool)
    masked[:, :6] = False  # the prompt
    masked[:, 6:14] = torch.rand(3, 8, generator=g) < 0.5  # commits lie left of any window end
    s, e = dsb_bounds(masked, 6, 8, None)
    pos = torch.arange(40)
    assert ((masked & (pos >= s) & (pos < e)).sum(1) == 8).all()
    assert torch.equal(s[:, 0], torch.where(masked, pos, 40).amin(1))
    s_c, e_c = dsb_bounds(masked, 6, 8, 8)
    assert torch.equal(e_c, torch.minimum(e, s_c + 8)) and torch.equal(s_c, s)


def test_batch_rows_decode_as_alone() -> None:
    model = tiny_model("llada", seed=5)
    prompts = torch.randint(0, 60, (3, 7), generator=torch.Generator().manual_seed(6))
    for kw in ({}, {"cache": "dsb", "refresh_every": 8},
               {"cache": "dsb", "refresh_every": 8, "window_tokens": 8}):
        name = "dsb_const" if "window_tokens" in kw else "dsb"
        sampler = DiffusionSampler(model, name, tau=0.7, block=8, **kw)
        both = sampler.generate(prompts, gen_length=32)
        for row in range(3):
            alone = sampler.generate(prompts[row:row + 1], gen_length=32)
            assert torch.equal(both.tokens[row], alone.tokens[0]), (kw, row)
            assert int(both.nfe[row]) == int(alone.nfe[0])


def test_suffix_quirk_and_fix(plan_args: Any) -> None:
    """The code's suffix exclusion is a no-op (positions past ``e`` commit); ``fix_suffix``
    keeps every commit inside the window."""
    model = tiny_model("llada", seed=3)
    prompt = torch.randint(0, 60, (1, 24), generator=torch.Generator().manual_seed(2))
    past: dict[bool, int] = {}
    for fix in (False, True):
        plan_args(prefix_window=2, suffix_window=4, fix_suffix=fix)
        seen = [0]

        def on_step(state: Any, commit: Any, _seen: list[int] = seen) -> None:
            _, e = dsb_bounds(state.masked, state.gen_start, 8, None)
            _seen[0] += int((commit & (torch.arange(commit.shape[1]) >= e)).sum())

        DiffusionSampler(model, "dsb", tau=0.3, block=8, cache="dsb", refresh_every=8).generate(
            prompt, gen_length=32, on_step=on_step)
        past[fix] = seen[0]
    assert past[False] > 0 and past[True] == 0


def test_cached_positions_and_refreshes() -> None:
    """Refresh steps feed the canvas; the others a slice at least ``l_pm`` wide before the
    window; a refresh follows every B commits."""
    model = tiny_model("llada", seed=4)
    prompt = torch.randint(0, 60, (1, 30), generator=torch.Generator().manual_seed(3))
    out = DiffusionSampler(model, "dsb", tau=0.5, block=8, cache="dsb",
                           refresh_every=8).generate(prompt, gen_length=64)
    length = 94
    full = out.refreshed[0].tolist()
    assert full[0] and not all(full)
    assert all((w == length) == f for w, f in zip(out.step_positions, full, strict=True))
    per_step = out.commits_per_step()[0].tolist()
    acc = 0
    for i, f in enumerate(full):
        if i and f:
            assert acc >= 8
        acc = per_step[i] if f else acc + per_step[i]
        if not f:
            assert acc - per_step[i] < 8


def test_composition() -> None:
    model = tiny_model("llada", seed=6)
    prompt = torch.randint(0, 60, (2, 6), generator=torch.Generator().manual_seed(4))
    for base in ("eb", "factor", "credit", "frechet"):
        out = DiffusionSampler(model, "dsb", base=base, block=8, debug=True).generate(
            prompt, gen_length=32)
        assert not (out.answer == model.mask_token_id).any(), base
    policy = resolve_policy("dsb", {"block": 8}, stopper="sched")
    stop = DiffusionSampler(model, policy, stop_at_eos=True).generate(prompt, gen_length=32)
    assert not (stop.answer == model.mask_token_id).any()
    pol = make_policy("dsb", base="credit")
    assert pol.selector.capabilities.fuses_logits


def test_refusals_and_bind() -> None:
    with pytest.raises(ValueError, match="budgeted"):
        make_policy("dsb", base="low_confidence")
    with pytest.raises(ValueError, match="max_block_length"):
        DynamicSlidingBlock(make_policy("threshold").selector, max_block_length=0)
    model = tiny_model("llada", seed=1)
    prompt = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="window_tokens=8"):
        DiffusionSampler(model, "dsb_const", block=8, cache="dsb", refresh_every=8).generate(
            prompt, gen_length=16)
    with pytest.raises(ValueError, match="refresh_every=4"):
        DiffusionSampler(model, "dsb", block=4, cache="dsb").generate(prompt, gen_length=16)
    sel = make_policy("dsb").selector
    cfg = DiffusionSampler(model, "dsb").config
    bound = sel.bind(model, cfg.__class__(gen_length=64, block_length=16))
    assert bound.block == 32 and bound.capabilities.lookahead == 48 and not bound.plan_window
    with pytest.raises(ValueError, match="bidirectional"):
        DsbPlan(tiny_model("sdar"), torch.ones(1, 8, dtype=torch.bool),
                torch.arange(8)[None], gen_length=4, block=4, max_block=None, prefix_window=2)
