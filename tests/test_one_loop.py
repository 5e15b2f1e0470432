"""There is one decode loop (issue 35): ``samplers.loop.decode_loop`` / ``decode_step`` run
every step of both noise kinds, and no other module carries a step loop of its own."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.samplers import loop, mask_run, mask_setup, noise, sampler, uniform
from tests.helpers import tiny_gemma, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = torch.tensor([[5, 6, 7], [8, 9, 10]])


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record ``(run class, step in block)`` of every ``decode_step`` call."""
    calls: list[tuple[str, int]] = []
    real = loop.decode_step

    def spy(run: Any, i: int) -> None:
        calls.append((type(run).__name__, i))
        real(run, i)

    monkeypatch.setattr(loop, "decode_step", spy)
    return calls


@pytest.mark.parametrize("kind, policy, kw", [
    ("mask", "low_confidence", dict(gen_length=8, steps=8, block_length=4)),
    ("mask", "threshold", dict(gen_length=8, block_length=4)),
    ("uniform", "gemma_renoise", dict(gen_length=16, seed=3)),  # 2 canvases, early stop
    ("uniform", "gemma_renoise", dict(gen_length=8, seed=1, early_stop=False)),
    ("uniform", "eb", dict(gen_length=8, seed=2)),  # an acceptance rule wrapped in Renoise
])
def test_every_step_of_both_noise_kinds_runs_the_shared_step(monkeypatch, kind: str,
                                                             policy: str, kw: dict) -> None:
    model = tiny_model("llada") if kind == "mask" else tiny_gemma(steps=5)
    s = DiffusionSampler(model, policy, **kw)
    assert s.noise is noise.NOISE_KINDS[kind] and s.noise_kind == kind
    plain = s.generate(PROMPT)
    calls = _spied(monkeypatch)
    out = s.generate(PROMPT)
    run = "MaskRun" if kind == "mask" else "UniformRun"
    assert [c for c, _ in calls] == [run] * out.steps and out.steps > 0
    assert out.forwards == len(calls)  # one forward per shared step (no extra forwards here)
    assert torch.equal(out.tokens, plain.tokens) and torch.equal(out.nfe, plain.nfe)
    if kind == "uniform":  # steps restart at each canvas, bounded by the step budget
        assert all(i < 5 for _, i in calls)


def _step_loops(module: Any) -> list[str]:
    """``for ... in range(...)`` and ``while`` statements in ``module``'s source."""
    found = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.While):
            found.append(f"while at line {node.lineno}")
        elif isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
                getattr(node.iter.func, "id", None) == "range":
            found.append(f"for-range at line {node.lineno}")
    return found


def test_no_second_loop() -> None:
    """The block and step loops live in ``samplers.loop`` only; the noise kinds' modules and
    the sampler define per-block / per-step parts, no loop (``decode_uniform`` is gone)."""
    assert len(_step_loops(loop)) == 2  # blocks, steps
    for module in (uniform, mask_run, mask_setup, sampler, noise):
        assert _step_loops(module) == [], module.__name__
    assert not hasattr(uniform, "decode_uniform")
    assert "decode_loop(run)" in inspect.getsource(sampler.DiffusionSampler.generate)


def test_uniform_runs_the_eager_step_with_a_logged_reason(caplog) -> None:
    """Static-buffer steps (``samplers.graph``) are not wired for the uniform kind: asked for
    with ``graphs=True``, the generation runs eagerly and says why (same tokens)."""
    from dllm_decode.samplers.graph_support import UNIFORM_EAGER

    model = tiny_gemma(steps=4)
    eager = DiffusionSampler(model, "gemma_renoise", gen_length=8, seed=1)
    out = eager.generate(PROMPT)
    assert eager.graph_reason is None  # CPU default: not wanted, nothing to explain
    asked = DiffusionSampler(model, "gemma_renoise", gen_length=8, seed=1, graphs=True)
    with caplog.at_level("WARNING", logger="dllm_decode.graph"):
        again = asked.generate(PROMPT)
    assert asked.graph_reason == UNIFORM_EAGER and UNIFORM_EAGER in caplog.text
    assert torch.equal(out.tokens, again.tokens)
