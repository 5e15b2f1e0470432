"""Each reference quirk belongs to the reference it reproduces (issue 52, item 3).

Fast-dLLM's ``generate_with_prefix_cache`` calls ``add_gumbel_noise`` twice per cached step and
keeps the second draw. ``rng="reference"`` reproduces that only for the selectors that name
Fast-dLLM's loops (``reference_loop``: ``threshold``, ``factor``, ``low_confidence``,
``random``); every other policy draws once per forward, as Fast-dLLM++'s own prefix loop does
(``frechet``; its sampled cached cases recorded from the authors' code are replayed in
``tests/test_conformance_methods2026.py``), and as the loops of dInfer (``credit``), DUS
(``dus``) and the wrappers over a Fast-dLLM rule (``sched``, ``credit``) do. Here the rule
itself, on a tiny random model (no ``../shared`` needed): the float64 uniforms a generation
draws are counted.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, make_policy
from dllm_decode.policies import resolve
from dllm_decode.samplers import proposals
from dllm_decode.samplers.proposals import REFERENCE_LOOPS, reference_loop_of
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

#: (preset, parameters) -> the loop it declares; every other built-in preset declares none
DECLARED: dict[tuple[str, tuple[tuple[str, Any], ...]], str] = {
    ("threshold", ()): "fast_dllm",
    ("threshold", (("score", "random"),)): "fast_dllm",
    ("factor", ()): "fast_dllm",
    ("factor", (("score", "random"),)): "fast_dllm",
    ("low_confidence", ()): "fast_dllm",
    ("maskgit_plus", ()): "fast_dllm",  # low_confidence's selector (Dream samples categorically)
    ("random", ()): "fast_dllm",
    ("frechet", ()): "fast_dllm_pp",
    # Streaming-dLLM's loop is a fork of Fast-dLLM's prefix loop (its cached step draws a
    # discarded Gumbel tensor before get_transfer_index draws its own, LLaDA-1.5/generate.py)
    ("streaming_dllm", ()): "fast_dllm",
}
#: variants of the Fast-dLLM rules that are no Fast-dLLM loop
UNDECLARED = [("threshold", {"score": "margin"}), ("threshold", {"tie_window": 1e-5}),
              ("factor", {"score": "neg_entropy"}), ("credit", {}), ("credit", {"base": "factor"}),
              ("sched", {"base": "threshold"}), ("prophet", {}), ("dus", {}),
              ("topk_margin", {}), ("entropy", {}), ("low_confidence", {"alg_temp": 0.5})]


def _built_in() -> list[str]:
    return sorted(resolve.PRESETS)


@pytest.mark.parametrize("name", _built_in())
def test_every_preset_declares_its_loop(name: str) -> None:
    """Only the Fast-dLLM presets name Fast-dLLM's loops; ``frechet`` names Fast-dLLM++'s."""
    try:
        policy = make_policy(name)
    except (TypeError, ValueError) as err:  # presets that need arguments (a filter, a model)
        pytest.skip(f"{name} needs arguments to build: {err}")
    assert reference_loop_of(policy.selector) == DECLARED.get((name, ()))


@pytest.mark.parametrize("name, params", [(n, dict(p)) for n, p in DECLARED if p] + UNDECLARED,
                         ids=lambda v: str(v))
def test_variants_and_wrappers(name: str, params: dict[str, Any]) -> None:
    """Scores Fast-dLLM has no remasking for, dInfer's tie window, and wrappers over a
    Fast-dLLM rule (their authors' loops, not Fast-dLLM's) declare no Fast-dLLM loop."""
    expected = DECLARED.get((name, tuple(sorted(params.items()))))
    assert reference_loop_of(make_policy(name, **params).selector) == expected


def test_unknown_loop_is_refused() -> None:
    class Custom:
        reference_loop = "my_loop"

    with pytest.raises(ValueError, match="known reference loops"):
        reference_loop_of(Custom())
    assert set(REFERENCE_LOOPS) == {"fast_dllm", "fast_dllm_pp"}


def _draws(monkeypatch: pytest.MonkeyPatch, policy: str, cache: str, **params: Any
           ) -> tuple[int, int, int]:
    """(float64 uniform tensors drawn, forwards, blocks) of one sampled generation."""
    count = [0]
    real = torch.rand

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        count[0] += kwargs.get("dtype") is torch.float64
        return real(*args, **kwargs)

    monkeypatch.setattr(proposals.torch, "rand", counted)
    model = tiny_model("llada", seed=3)
    prompt = torch.randint(0, 60, (2, 5), generator=torch.Generator().manual_seed(1))
    out = DiffusionSampler(model, policy, cache=cache, gen_length=16, block_length=8,
                           temperature=0.7, rng="reference", seed=5, **params).generate(prompt)
    monkeypatch.undo()
    return count[0], out.forwards, 2


@pytest.mark.parametrize("policy, params", [
    ("threshold", {"tau": 0.9}), ("factor", {"factor": 1.0}), ("low_confidence", {}),
    ("random", {}), ("threshold", {"score": "random", "tau": 0.5})])
def test_fast_dllm_prefix_loop_draws_twice(monkeypatch: pytest.MonkeyPatch, policy: str,
                                           params: dict[str, Any]) -> None:
    """Fast-dLLM's presets: one Gumbel draw per forward plus one discarded per cached step of
    the prefix loop (every forward but each block's refresh); dual and none: one per forward."""
    draws, forwards, blocks = _draws(monkeypatch, policy, "prefix", **params)
    assert forwards > blocks  # some cached steps ran
    assert draws == forwards + (forwards - blocks)
    for cache in ("dual", "none"):
        draws, forwards, _ = _draws(monkeypatch, policy, cache, **params)
        assert draws == forwards, cache


@pytest.mark.parametrize("policy, params", [
    ("frechet", {}), ("frechet", {"delta": 0.02}), ("credit", {}), ("dus", {}),
    ("sched", {"base": "threshold"}), ("threshold", {"score": "margin"}),
    ("eb", {}), ("ete", {})])
def test_other_loops_draw_once_per_forward(monkeypatch: pytest.MonkeyPatch, policy: str,
                                           params: dict[str, Any]) -> None:
    """Every other policy, Fast-dLLM++'s ``frechet`` first: one draw per forward, cached or
    not (Fast-dLLM++'s ``generate_with_prefix_cache`` calls ``add_gumbel_noise`` once)."""
    draws, forwards, blocks = _draws(monkeypatch, policy, "prefix", **params)
    assert forwards > blocks
    assert draws == forwards
