"""Streaming-dLLM (``policies.streaming``, ``cache.streaming``): conformance to the authors'
``generate_with_prefix_cache``, token for token with the NFE, each step's commits and tau, and
each block's kept positions; composition with other parts; refusals; batch invariance.

The recorded cases (``tests/fixtures/methods2026/streaming_dllm.json``, recorded by
``benchmarks/conformance/record_streaming_dllm.py``) run on ``../shared/conformance/llada-tiny``;
the Dream cases (``streaming_dllm_dream.json``, the authors' Dream loop, ``--family dream``) on
``dream-tiny``; they skip when ``../shared`` is absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.cache.streaming import (
    DEFAULT_WINDOW,
    StreamingPlan,
    kept_suffix,
    streaming_plan,
)
from dllm_decode.policies.resolve import compose
from dllm_decode.policies.streaming import (
    FAMILY_TABLE,
    FIRST_RULE,
    STREAMING_TASKS,
    BlockEosExit,
    StreamingThreshold,
)
from dllm_decode.types import CacheMode
from tests.conformance import GaussianNoise as Noisy
from tests.conformance import conformance_model
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "methods2026" / "streaming_dllm.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
DREAM_CASES = json.loads(FIXTURE.with_name("streaming_dllm_dream.json").read_text())["cases"]
ALL_CASES = [("llada", c) for c in CASES] + [("dream", c) for c in DREAM_CASES]
ALL_IDS = [c["name"] for _, c in ALL_CASES]


def _llada() -> Any:
    return conformance_model("llada-tiny")


def _dream() -> Any:
    return conformance_model("dream-tiny")


def _family(name: str) -> Any:
    return _dream() if name == "dream" else _llada()


def _window(monkeypatch: pytest.MonkeyPatch, window: int) -> dict[str, Any]:
    """``window_tokens`` for the sampler (0 = the tail alone, valid with the streaming
    cache)."""
    return {"window_tokens": window}


def _decode(model: Any, case: dict, monkeypatch: pytest.MonkeyPatch,
            **extra: Any) -> tuple[Any, list[list[int]], list[float]]:
    args = case["args"]
    p = len(case["prompt_ids"][0])
    commits: list[list[int]] = []
    taus: list[float | None] = []
    sampler = DiffusionSampler(model, "streaming_dllm", tau=args["threshold"],
                               alpha=args["confidence_alpha"], debug=True,
                               **_window(monkeypatch, args["window_size"]), **extra)
    selector = sampler.policy.selector
    first = selector.first or FIRST_RULE.get(model.family, "threshold")  # as bound

    def on_step(state: Any, commit: torch.Tensor) -> None:
        commits.append(torch.nonzero(commit[0, p:]).flatten().tolist())
        if first == "position" and state.block_step == 0:
            taus.append(None)  # Dream's first step: the block's first position, no tau
            return
        ratio = selector.mask_ratio(state)
        taus.append(selector.tau if ratio is None else float(
            selector.tau * (1.0 - selector.alpha * (1.0 - ratio[0]))))

    out = sampler.generate(torch.tensor(case["prompt_ids"]), gen_length=args["gen_length"],
                           block_length=args["block_length"], on_step=on_step)
    return out, commits, taus


@pytest.mark.parametrize(("family", "case"), ALL_CASES, ids=ALL_IDS)
def test_streaming_case(family: str, case: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens (the early exit's EOS fill included), NFE (one forward per step, as the
    reference counts), every step's commits and tau (bit-equal). Dream: the authors' Dream
    loop (the block's first step commits its first position alone)."""
    out, commits, taus = _decode(_family(family), case, monkeypatch)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert int(out.nfe[0]) == out.forwards == case["nfe"]
    assert commits == [s["committed"] for s in case["steps"]]
    assert taus == [s["tau"] for s in case["steps"]]


@pytest.mark.parametrize(("family", "case"), ALL_CASES, ids=ALL_IDS)
def test_streaming_case_under_noise(family: str, case: dict,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The same tokens and NFE with N(0, 1e-6) noise on every logit (the recorded robustness)."""
    out, _, _ = _decode(Noisy(_family(family), 1e-6, 3), case, monkeypatch)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert int(out.nfe[0]) == case["nfe"]


@pytest.mark.parametrize("case", CASES + DREAM_CASES, ids=ALL_IDS)
def test_kept_positions(case: dict) -> None:
    """Each block's kept positions are the reference's position ids of its first forward."""
    args = case["args"]
    p = len(case["prompt_ids"][0])
    length = p + args["gen_length"]
    for n, kept in enumerate(case["kept_positions"]):
        be = p + (n + 1) * args["block_length"]
        assert list(range(be)) + kept_suffix(length, be, args["window_size"]) == kept


def test_exits_and_tail_cases_recorded() -> None:
    """The fixture holds early exits and blocks whose window reaches the end (no tail)."""
    for cases in (CASES, DREAM_CASES):
        assert sum(c["early_exit"] for c in cases) >= 2
        assert any(len(k) == len(c["prompt_ids"][0]) + c["args"]["gen_length"]
                   for c in cases for k in c["kept_positions"][:-1])


def test_plan_computes_fewer_positions_than_prefix() -> None:
    """The pruned suffix: the same first-step refresh, fewer positions per cached step than
    Fast-dLLM's prefix cache (``Generation.step_positions``), and every forward counted."""
    case = CASES[0]
    args = case["args"]
    prompt = torch.tensor(case["prompt_ids"])
    common = {"tau": args["threshold"], "alpha": args["confidence_alpha"],
              "gen_length": args["gen_length"], "block_length": args["block_length"]}
    stream = DiffusionSampler(_llada(), "streaming_dllm", window_tokens=args["window_size"],
                              **common).generate(prompt)
    prefix = DiffusionSampler(_llada(), "streaming_dllm", cache="prefix", **common)
    pre = prefix.generate(prompt)
    p, length = prompt.shape[1], prompt.shape[1] + args["gen_length"]
    assert stream.step_positions[0] == len(case["kept_positions"][0]) < pre.step_positions[0]
    per_stream = sum(stream.step_positions) / len(stream.step_positions)
    per_prefix = sum(pre.step_positions) / len(pre.step_positions)
    assert per_stream < per_prefix
    block = args["block_length"]
    assert stream.step_positions[1] == block + args["window_size"] + 1  # block + W + tail
    assert pre.step_positions[1] == length - p  # prefix: the whole suffix from the block


def test_window_reaching_the_end_equals_prefix_cache() -> None:
    """A window that covers the whole suffix prunes nothing: the prefix cache's tokens."""
    prompt = torch.tensor(CASES[0]["prompt_ids"])
    kw = {"tau": 0.6, "alpha": 0.4, "gen_length": 64, "block_length": 16}
    a = DiffusionSampler(_llada(), "streaming_dllm", window_tokens=64, **kw).generate(prompt)
    b = DiffusionSampler(_llada(), "streaming_dllm", cache="prefix", **kw).generate(prompt)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.nfe, b.nfe)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_tiny_families_against_prefix(family: str) -> None:
    """LLaDA: a window that reaches the end gives the prefix cache's tokens. Dream (shifted
    logits: the position left of the block is fed as a query only, its K/V those of the
    block's first forward, as the authors' Dream cache; the prefix plan recomputes them, so
    the two differ there): under both first-step rules a short window prunes and still ends
    with nothing masked."""
    model = tiny_model(family, seed=3)
    prompt = torch.tensor([[5, 9, 11, 3, 7]])
    kw = {"tau": 0.5, "gen_length": 24, "block_length": 6}
    b = DiffusionSampler(model, "streaming_dllm", cache="prefix", **kw).generate(prompt)
    if family == "llada":
        a = DiffusionSampler(model, "streaming_dllm", window_tokens=24, **kw).generate(prompt)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.nfe, b.nfe)
    for first in ("threshold", "position"):
        c = DiffusionSampler(model, "streaming_dllm", window_tokens=2, debug=True, first=first,
                             **kw).generate(prompt)
        assert not (c.tokens == model.mask_token_id).any()
        assert sum(c.step_positions) / len(c.step_positions) < sum(b.step_positions) / len(
            b.step_positions)


def test_dream_left_neighbour_is_a_query_only() -> None:
    """Dream's later steps: the block's rows equal the authors' layout (the block, window and
    tail against the first step's ``[0, bs)`` K/V, the left neighbour's included), and the
    block's first position reads the left neighbour's output (the authors' layout: its own)."""
    model = tiny_model("dream", seed=5)
    p, g, bs, be, window = 5, 24, 11, 17, 3
    canvas = torch.full((1, p + g), model.mask_token_id)
    canvas[0, :bs] = torch.arange(2, 2 + bs)
    positions = torch.arange(p + g)[None]
    plan = StreamingPlan(model, torch.ones_like(canvas, dtype=torch.bool), positions,
                         window=window)
    plan.forward(canvas, (bs, be), bs, 0, bs, False)
    canvas[0, bs + 2] = 7  # a commit between the two forwards
    got = plan.forward(canvas, (bs, be), bs, 1, bs, False).logits  # rows [bs, be)
    first = list(range(be)) + kept_suffix(p + g, be, window)
    later = torch.tensor([i for i in first if i >= bs])
    kept = torch.zeros(p + g, dtype=torch.bool)
    kept[first] = True
    cache = model.new_cache(1, p + g)
    idx = torch.tensor(first)
    with torch.no_grad():
        before = canvas.clone()
        before[0, bs + 2] = model.mask_token_id
        model(before[:, idx], positions[:, idx], cache=cache, slots=idx[None], mask=kept[None],
              store=True)
        authors = model(canvas[:, later], positions[:, later], cache=cache, slots=later[None],
                        mask=kept[None], store=True)
    torch.testing.assert_close(got[:, 1:], authors[:, 1:be - bs], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[:, 0], authors[:, 0], atol=1e-3)  # not its own output
    assert got.shape[1] == be - bs


def test_batch_invariance() -> None:
    """Rows decode as alone (the reference couples rows: batch-summed ratio, shared exit)."""
    picks = [c for c in CASES if c["args"]["block_length"] == 16
             and c["args"]["window_size"] == 8]
    assert len(picks) == 2  # one with the early exit, one without
    a, b = picks
    assert a["args"]["gen_length"] == b["args"]["gen_length"]
    p = max(len(c["prompt_ids"][0]) for c in picks)
    rows, mask = [], []
    for c in picks:
        ids = c["prompt_ids"][0]
        rows.append([0] * (p - len(ids)) + ids)
        mask.append([0] * (p - len(ids)) + [1] * len(ids))
    sampler = DiffusionSampler(_llada(), "streaming_dllm", tau=0.7, alpha=0.4, window_tokens=8,
                               gen_length=64, block_length=16)
    both = sampler.generate(torch.tensor(rows), torch.tensor(mask))
    for i, c in enumerate(picks):
        alone = sampler.generate(torch.tensor(c["prompt_ids"]))
        assert both.tokens[i, p - len(c["prompt_ids"][0]):].tolist() == alone.tokens[0].tolist()
        assert int(both.nfe[i]) == int(alone.nfe[0])


def test_composes_with_threshold_and_stopper() -> None:
    """``block_eos_exit`` beside another selector; the streaming plan under another selector
    and a full-span stopper (it scores the kept positions only)."""
    case = next(c for c in CASES if c["early_exit"])
    args = case["args"]
    prompt = torch.tensor(case["prompt_ids"])
    g, k = args["gen_length"], args["block_length"]
    policy = compose("threshold", truncator="block_eos_exit", params={"tau": 0.9})
    out = DiffusionSampler(_llada(), policy, gen_length=g, block_length=k).generate(prompt)
    gen = out.tokens[0, prompt.shape[1]:]
    first = int(torch.nonzero(gen == 499)[0]) if (gen == 499).any() else g
    end = (first // k + 1) * k
    assert (gen[end:] == 499).all()
    sched = compose("threshold", stopper="sched", params={"tau": 0.9})
    out = DiffusionSampler(_llada(), sched, cache="streaming", window_tokens=8, gen_length=g,
                           block_length=k, debug=True).generate(prompt)
    assert not (out.tokens == 500).any()


def test_refusals() -> None:
    """One-line refusals: block-diffusion models, extra forwards, a task whose window the
    plan does not use."""
    sdar = tiny_model("sdar")
    with pytest.raises(ValueError, match="bidirectional"):
        DiffusionSampler(sdar, "streaming_dllm", gen_length=8).generate(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="extra forwards"):
        DiffusionSampler(tiny_model(), "lopa", cache="streaming", window_tokens=4,
                         gen_length=16, block_length=8).generate(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="window_tokens=32"):
        DiffusionSampler(tiny_model(), "streaming_dllm", task="mbpp",
                         table="llada-instruct").generate(torch.tensor([[1, 2]]))


def test_defaults_and_tables() -> None:
    """Preset defaults: tau0 0.9, the GSM8K row (LLaDA-1.5: window 96, alpha 0.4; Dream-Base:
    32, 0.3); the plan's default window is that row's."""
    sel = StreamingThreshold()
    assert (sel.tau, sel.task, sel.ratio) == (0.9, "gsm8k", "query")
    for family, pair in DEFAULT_WINDOW.items():
        name = FAMILY_TABLE.get(family, "llada-1.5")
        assert pair == tuple(s[0] for s in STREAMING_TASKS[name]["gsm8k"])
    bound = sel.bind(tiny_model(), None)
    assert bound.alpha == 0.4 and bound.table == "llada-1.5"
    assert StreamingThreshold().bind(tiny_model("dream"), None).alpha == 0.3
    assert StreamingThreshold().bind(tiny_model("dream"), None).first == "position"
    assert bound.first == "threshold"
    assert StreamingThreshold(first="threshold").bind(tiny_model("dream"), None).first == (
        "threshold")
    assert BlockEosExit().bind(tiny_model(), None).eos_ids[:1] == tiny_model().eos_token_ids[:1]
    with pytest.raises(ValueError):
        StreamingThreshold(ratio="window")
    with pytest.raises(ValueError):
        StreamingThreshold(task="sudoku")
    with pytest.raises(ValueError):
        StreamingThreshold(first="block")
    plan = streaming_plan(tiny_model(), CacheMode.STREAMING, torch.ones(1, 40, dtype=torch.bool),
                          torch.arange(40)[None], DiffusionSampler(tiny_model()).config)
    assert plan.window == 96 and plan.tail == 1
