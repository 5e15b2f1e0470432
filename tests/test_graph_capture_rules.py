"""What a captured CUDA step may not do, checked on a CPU.

* ``graph_check.cuda_problem``: ops that run on a CPU but sync or cannot be captured on CUDA
  (data-dependent shapes, boolean-mask indexing, random draws, tensors made from host data,
  host-device copies). The CPU replay check and every capture (``Recorder``) refuse them, so a
  graph-safe part that uses one fails the CPU tests and falls back to the eager step on CUDA.
* Tensors made without a device: on CUDA the default device is the CPU while the data is on
  the GPU, so such a tensor is a CPU tensor inside a CUDA step. Here the default device is
  ``meta`` while the data is on the CPU: every decode path of the graphed presets must give the
  same tokens (a tensor made on the default device would be a meta tensor and fail).
* bf16: the static step and the stand-in replay equal the eager loop in the dtype the GPU runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.policies.base import topk_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.samplers import graph_support
from dllm_decode.samplers.graph import StepGraphs
from dllm_decode.samplers.graph_backend import StandInGraphs
from dllm_decode.samplers.graph_check import Recorder, ReplayMismatch

pytestmark = pytest.mark.usefixtures("one_thread")


def _problems(fn: Any) -> list[str]:
    rec = Recorder(set())
    with rec:
        fn()
    return rec.problems


x = torch.arange(12.0).reshape(3, 4)
mask = x > 4
idx = torch.tensor([0, 2])


@pytest.mark.parametrize("fn, why", [
    (lambda: mask.nonzero(), "nonzero"),
    (lambda: x[mask], "boolean mask index"),
    (lambda: x.clone().__setitem__(mask, 0.0), "boolean mask index"),
    (lambda: torch.unique(idx), "unique"),
    (lambda: torch.bincount(idx), "bincount"),
    (lambda: idx.repeat_interleave(idx), "repeat_interleave"),
    (lambda: bool(mask.any()), "host sync"),
    (lambda: torch.rand(3), "random numbers"),
    (lambda: torch.empty(3).exponential_(), "random numbers"),
    (lambda: torch.tensor([1.0, 2.0]) + x[0, :2], "host data"),
    (lambda: x.to("meta"), "between the host and the device"),
])
def test_what_a_capture_refuses(fn: Any, why: str) -> None:
    problems = _problems(fn)
    assert any(why in p for p in problems), problems


def test_what_a_capture_allows() -> None:
    def step() -> None:
        y = torch.where(mask, x, 0.0).index_select(1, idx)
        y = y + torch.arange(2) + x[:, idx].sort(1).values
        x.clone().masked_fill_(mask, -torch.inf).topk(2, dim=1)
        idx.repeat_interleave(idx, output_size=2)
        torch.full((3,), True)
        x.clone()[:, idx] = y

    assert _problems(step) == []


@dataclass(frozen=True)
class _CountingTopK:
    """A top-k that also counts its eligible positions with ``nonzero`` (a sync on CUDA)."""

    capabilities = Capabilities(proposal_fields=())

    def select(self, state: Any) -> torch.Tensor:
        state.eligible.nonzero()
        return topk_mask(state.proposal.prob, state.eligible, state.budget)


def test_a_sync_in_a_graph_safe_part_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The CPU replay check raises; a capture (the stand-in here) fails and the shape runs
    eagerly, with the reason logged, and the tokens of the eager loop."""
    monkeypatch.setattr(graph_support, "GRAPH_SAFE", graph_support.GRAPH_SAFE | {_CountingTopK})
    model = load_model("tiny-llada")
    prompt = torch.randint(3, 1000, (1, 9), generator=torch.Generator().manual_seed(0))
    kw = dict(gen_length=16, block_length=8, steps=16)
    s = DiffusionSampler(model, _CountingTopK(), "dual", graphs=True, **kw)
    s.step_graphs = StepGraphs(capture=False, check=True)
    with pytest.raises(ReplayMismatch, match="nonzero.* syncs with the host"):
        s.generate(prompt)
    s = DiffusionSampler(model, _CountingTopK(), "dual", graphs=True, **kw)
    s.step_graphs = StepGraphs(capture=True, backend=StandInGraphs())
    ref = DiffusionSampler(model, _CountingTopK(), "dual", graphs=False, **kw).generate(prompt)
    assert torch.equal(s.generate(prompt).tokens, ref.tokens)
    (buf,) = s.step_graphs._sets.values()
    assert "syncs with the host" in buf.broken and s.step_graphs.stats.replays == 0
    assert "capture failed" in caplog.text


@contextlib.contextmanager
def _default_device(device: str) -> Iterator[None]:
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


CASES = [("tiny-llada", "none", "low_confidence"), ("tiny-llada", "prefix", "threshold"),
         ("tiny-llada", "dual", "factor"), ("tiny-llada", "dual", "sched"),
         ("tiny-llada", "none", "eb"), ("tiny-dream", "dual", "entropy"),
         ("tiny-sdar", "block_causal", "low_confidence"), ("tiny-sdar", "none", "threshold")]


@pytest.mark.parametrize("name, cache, preset", CASES)
def test_no_step_tensor_lands_on_the_default_device(name: str, cache: str,
                                                    preset: str) -> None:
    model = load_model(name)
    prompt = torch.randint(3, 1000, (2, 9), generator=torch.Generator().manual_seed(1))
    kw = dict(gen_length=16, steps=16) | ({} if name == "tiny-sdar" else {"block_length": 8})
    ref = DiffusionSampler(model, preset, cache, graphs=False, **kw).generate(prompt)
    eager = DiffusionSampler(model, preset, cache, graphs=False, **kw)
    graphed = DiffusionSampler(model, preset, cache, graphs=True, **kw)
    graphed.step_graphs = StepGraphs(capture=True, backend=StandInGraphs())
    with _default_device("meta"):
        outs = [eager.generate(prompt)] + [graphed.generate(prompt) for _ in range(3)]
    for out in outs:
        assert out.tokens.device.type == "cpu" and torch.equal(out.tokens, ref.tokens)
    assert graphed.graph_reason is None and graphed.step_graphs.stats.replays > 0


@pytest.mark.parametrize("cache, preset", [("dual", "low_confidence"), ("none", "threshold"),
                                           ("prefix", "entropy")])
def test_bf16_static_step_and_replay_match_the_eager_loop(cache: str, preset: str) -> None:
    model = load_model("tiny-llada").to(torch.bfloat16)
    kw = dict(gen_length=16, block_length=8, steps=16)
    checked = DiffusionSampler(model, preset, cache, graphs=True, **kw)
    checked.step_graphs = StepGraphs(capture=False, check=True)
    replayed = DiffusionSampler(model, preset, cache, graphs=True, **kw)
    replayed.step_graphs = StepGraphs(capture=True, backend=StandInGraphs())
    for seed in range(2):
        prompt = torch.randint(3, 1000, (2, 9), generator=torch.Generator().manual_seed(seed))
        ref = DiffusionSampler(model, preset, cache, graphs=False, **kw).generate(prompt)
        for s in (checked, replayed):
            out = s.generate(prompt)
            assert s.graph_reason is None and torch.equal(out.tokens, ref.tokens)
            assert torch.equal(out.commit_step, ref.commit_step)
    assert replayed.step_graphs.stats.checked > 0 and replayed.step_graphs.stats.rejected == 0


def test_a_model_over_several_devices_runs_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    """``device_map`` spreads layers over GPUs; a CUDA graph captures one device's stream, so
    such a model runs the eager step (the reason kept), with the eager loop's tokens."""
    import copy

    model = load_model("tiny-llada")
    spread = copy.deepcopy(model)
    spread.layers[1].to("meta")
    assert graph_support.model_devices(spread) == {torch.device("cpu"), torch.device("meta")}
    assert graph_support.model_devices(model) == {torch.device("cpu")}
    assert graph_support.model_devices(object()) == set()  # a DiffusionLM that is no Module
    monkeypatch.setattr(graph_support, "model_devices",
                        lambda m: {torch.device("cuda", 0), torch.device("cuda", 1)})
    prompt = torch.randint(3, 1000, (1, 9), generator=torch.Generator().manual_seed(0))
    kw = dict(gen_length=16, block_length=8, steps=16)
    s = DiffusionSampler(model, "low_confidence", graphs=True, **kw)
    out = s.generate(prompt)
    assert "spread over several devices" in s.graph_reason and s.step_graphs is None
    ref = DiffusionSampler(model, "low_confidence", graphs=False, **kw).generate(prompt)
    assert torch.equal(out.tokens, ref.tokens)
