"""Self-checking graphs (``samplers.graph_selfcheck``) on the CPU, through the stand-in graph.

The CUDA path (warm-up, capture, first replay, later replays) runs with
``graph_backend.StandInGraphs``: a capture records the step's ops and a replay reruns them on
the same tensors. A corrupted replay (one that runs nothing, one whose intermediate is off,
one that damages the K/V cache) must fail the first-replay comparison: that shape falls back to
the eager step (logged on ``dllm_decode.graph``, kept in ``graph_reason``), and the tokens
equal the eager loop's. A correct replay passes, keeps replaying, and is never compared again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.samplers import graph_selfcheck
from dllm_decode.samplers.graph import StepGraphs
from dllm_decode.samplers.graph_backend import StandInGraph, StandInGraphs

pytestmark = pytest.mark.usefixtures("one_thread")

KW = dict(gen_length=16, block_length=8, steps=16)


class _Corrupting(StandInGraphs):
    """Stand-in graphs whose replays (of the captures numbered in ``which``; all by default)
    run ``corrupt(graph, replay)`` instead of ``replay()``."""

    def __init__(self, corrupt: Callable[[StandInGraph, Callable[[], None]], None],
                 which: set[int] | None = None) -> None:
        self.corrupt, self.which, self.made = corrupt, which, 0

    def new_graph(self) -> StandInGraph:
        graph = super().new_graph()
        n, self.made = self.made, self.made + 1
        if self.which is None or n in self.which:
            replay = graph.replay
            graph.replay = lambda: self.corrupt(graph, replay)  # type: ignore[method-assign]
        return graph


def _runs_nothing(graph: StandInGraph, replay: Callable[[], None]) -> None:
    """A replay that launches nothing (e.g. work captured on another stream)."""


def _shifted(graph: StandInGraph, replay: Callable[[], None]) -> None:
    """A replay whose first floating-point intermediate is off by one (a kernel that
    misbehaves under capture): the logits and what follows from them differ."""
    for i, (func, args, kwargs, out) in enumerate(graph.ops):
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() > 1:
            graph.ops[i] = (lambda f: lambda *a, **k: f(*a, **k) + 1.0)(func), args, kwargs, out
            break
    replay()


def _sampler(backend: Any, cache: str = "dual", model: str = "tiny-llada") -> DiffusionSampler:
    s = DiffusionSampler(load_model(model), "low_confidence", cache, graphs=True, **KW)
    s.step_graphs = StepGraphs(capture=True, backend=backend)
    return s


def _prompt(seed: int) -> torch.Tensor:
    return torch.randint(3, 1000, (2, 9), generator=torch.Generator().manual_seed(seed))


def _eager(s: DiffusionSampler, prompt: torch.Tensor) -> torch.Tensor:
    ref = DiffusionSampler(s.model, "low_confidence", s.config.cache, graphs=False, **KW)
    return ref.generate(prompt).tokens


def test_correct_replays_pass_and_keep_replaying(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _sampler(StandInGraphs())
    for seed in range(2):  # every shape captured (a shape seen once per generation: in the 2nd)
        prompt = _prompt(seed)
        assert torch.equal(s.generate(prompt).tokens, _eager(s, prompt))
        assert s.graph_reason is None
    stats = s.step_graphs.stats
    assert stats.captures > 0 and stats.checked == stats.captures and stats.rejected == 0
    (buf,) = s.step_graphs._sets.values()
    assert set(buf.graphs) == buf.seen and not buf.rejected
    # steady state: replays only; the comparison never runs again (no sync of its own)
    monkeypatch.setattr(graph_selfcheck, "first_replay",
                        lambda *a: pytest.fail("a later replay was compared"))
    captures, replays = stats.captures, stats.replays
    prompt = _prompt(2)
    assert torch.equal(s.generate(prompt).tokens, _eager(s, prompt))
    assert stats.captures == captures and stats.replays > replays and s.graph_reason is None


@pytest.mark.parametrize("corrupt, differs", [(_runs_nothing, "tokens differ"),
                                              (_shifted, "differ from the eager step")])
def test_corrupted_replay_falls_back_to_eager(caplog: pytest.LogCaptureFixture,
                                              corrupt: Any, differs: str) -> None:
    s = _sampler(_Corrupting(corrupt))
    for seed in range(3):
        prompt = _prompt(seed)
        with caplog.at_level(logging.WARNING, logger="dllm_decode.graph"):
            out = s.generate(prompt)
        assert torch.equal(out.tokens, _eager(s, prompt))
        assert s.graph_reason is not None and "self-check failed" in s.graph_reason
        assert differs in s.graph_reason and "runs eagerly from now on" in s.graph_reason
    stats = s.step_graphs.stats
    assert stats.captures > 0 and stats.rejected == stats.checked == stats.captures
    assert stats.replays == 0  # every shape was rejected at its first replay
    (buf,) = s.step_graphs._sets.values()
    assert not buf.graphs and set(buf.rejected) == buf.seen  # each captured once, then eager
    warnings = [r for r in caplog.records if r.name == "dllm_decode.graph"]
    assert len(warnings) == stats.rejected
    assert all("self-check failed" in r.getMessage() for r in warnings)


def test_one_bad_shape_falls_back_alone() -> None:
    """Only the first captured graph is corrupted: its shape runs eagerly, the others replay."""
    s = _sampler(_Corrupting(_runs_nothing, which={0}))
    for seed in range(2):
        prompt = _prompt(seed)
        assert torch.equal(s.generate(prompt).tokens, _eager(s, prompt))
        assert "tokens differ" in s.graph_reason
    stats = s.step_graphs.stats
    assert stats.rejected == 1 and stats.replays > 0 and stats.captures > 1
    (buf,) = s.step_graphs._sets.values()
    assert len(buf.rejected) == 1 and len(buf.graphs) == stats.captures - 1


def test_damaged_cache_is_caught() -> None:
    """A replay that also writes a K/V row it should not: only the cache differs."""
    holder: list[DiffusionSampler] = []

    def damage(graph: StandInGraph, replay: Callable[[], None]) -> None:
        replay()
        (buf,) = holder[0].step_graphs._sets.values()
        buf.cache.k[:, :, :, -1] += 1.0

    s = _sampler(_Corrupting(damage))
    holder.append(s)
    prompt = _prompt(0)
    assert torch.equal(s.generate(prompt).tokens, _eager(s, prompt))
    assert "K cache differ" in s.graph_reason


def test_compare_tolerances() -> None:
    """Floats within the compute dtype's tolerance agree; integers must be equal; NaN agrees
    with NaN; a shape difference is named."""
    x = torch.linspace(-20, 20, 101)
    rtol, atol = graph_selfcheck.TOLERANCE[torch.bfloat16]
    near = x + (atol + rtol * x.abs()) * 0.5
    far = x.clone()
    far[7] += 1.0
    ids = torch.arange(10)
    bad = ids.clone()
    bad[3] = 0
    compare = graph_selfcheck.compare_results
    assert compare([("logits", near, x), ("tokens", ids, ids)], torch.bfloat16) is None
    assert "logits differ" in compare([("logits", near, x)], torch.float32)
    assert "max |replay - eager| = 1 " in compare([("logits", far, x)], torch.bfloat16)
    assert "1 of 10 entries differ (compared exactly)" in compare([("tokens", bad, ids)],
                                                                  torch.bfloat16)
    nan = torch.tensor([float("nan"), 1.0])
    assert compare([("logits", nan, nan.clone())], torch.float32) is None
    assert "the replay gave (3,)" in compare([("tokens", ids[:3], ids[:4])], torch.float32)


def test_large_results_are_compared_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A K/V-sized result is compared a slice of its leading dim at a time (small widened
    copies); a difference in the last slice is still found and measured."""
    monkeypatch.setattr(graph_selfcheck, "CHUNK", 24)
    k = (torch.arange(120) % 7).reshape(5, 2, 3, 4).to(torch.bfloat16)  # exact in bf16
    assert len(graph_selfcheck._chunks(k, k)) == 5
    bad = k.clone()
    bad[4, 1, 2, 3] += 4.0
    compare = graph_selfcheck.compare_results
    assert compare([("K cache", k.clone(), k)], torch.bfloat16) is None
    assert "K cache differ from the eager step: max |replay - eager| = 4" in compare(
        [("K cache", bad, k)], torch.bfloat16)
    ids = torch.arange(60).reshape(5, 12)
    wrong = ids.clone()
    wrong[4, 0] = -1
    assert "1 of 60 entries differ" in compare([("tokens", wrong, ids)], torch.bfloat16)
