"""``Generation.step_positions`` / ``positions``: the token positions per row each step ran
through the model, per cache mode, with extra forwards and on the static-buffer step."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

P, G, K = 5, 8, 4
L = P + G


def _run(model, policy: str, cache: str, **kw):
    prompt = torch.randint(3, 40, (2, P), generator=torch.Generator().manual_seed(1))
    return DiffusionSampler(model, policy, cache=cache, **kw).generate(
        prompt, gen_length=G, block_length=K if model.attention != "block_causal" else None,
        steps=G)


def test_positions_per_cache_mode() -> None:
    """One token per step, blocks of 4: no cache feeds the canvas; prefix the block and
    everything after it (the canvas at each block's refresh); dual the block alone."""
    model = tiny_model("llada", seed=2)
    none, prefix, dual = (_run(model, "low_confidence", c) for c in ("none", "prefix", "dual"))
    assert none.step_positions == [L] * G
    assert prefix.step_positions == [L, G, G, G, L, K, K, K]
    assert dual.step_positions == [L, K, K, K, L, K, K, K]
    for out in (none, prefix, dual):
        assert out.positions == sum(out.step_positions)


def test_extra_forwards_count_their_positions() -> None:
    """WINO's shadow block (4 positions) after each block's first step: without a cache its
    forward recomputes the canvas beside it, against the dual cache it is 4 positions."""
    model = tiny_model("llada", seed=2)
    none = _run(model, "wino", "none")
    dual = _run(model, "wino", "dual")
    per_block = [L] + [L + L + K] * (len(none.step_positions) // 2 - 1)
    assert none.step_positions[: len(per_block)] == per_block
    assert all(s in (L, K + K) for s in dual.step_positions)


def test_block_causal_and_static_step() -> None:
    """The block-causal cache feeds the block (plus the previous one at a block's start); the
    static-buffer step (``graphs=True``, eager on the CPU) counts the same."""
    model = load_model("tiny-sdar")
    eager = _run(model, "low_confidence", "block_causal")
    prompt = torch.randint(3, 40, (2, P), generator=torch.Generator().manual_seed(1))
    sampler = DiffusionSampler(model, "low_confidence", cache="block_causal", graphs=True)
    static = sampler.generate(prompt, gen_length=G, steps=G)
    assert sampler.graph_reason is None, "the static-buffer step ran"
    assert eager.step_positions == static.step_positions
    assert eager.positions < G * L
