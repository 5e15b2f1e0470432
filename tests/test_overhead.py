"""The loop around the model: overhead measurement, the step function, ``compile=True``."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.models.loading import load_model
from dllm_decode.overhead import (
    CoreClock,
    ForwardClock,
    TimedModel,
    core_modules,
    count_loop_ops,
    measure_overhead,
)
from dllm_decode.samplers.sampler import DiffusionSampler
from dllm_decode.samplers.step import SpanMasks, bits_per_step
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

#: the four policy families of issue 17 and their settings on a gen-16 canvas
FAMILIES = {"low_confidence": {"steps": 16}, "threshold": {"tau": 0.9},
            "entropy": {"steps": 16}, "sched": {"steps": 16}}
PROMPT = torch.tensor([[5, 9, 11, 3], [7, 2, 8, 4]])


def _model(cache: str):
    return tiny_model("sdar" if cache == "block_causal" else "llada")


def _sampler(model, cache: str, family: str, **kw) -> DiffusionSampler:
    block = {} if cache == "block_causal" else {"block_length": 8}
    return DiffusionSampler(model, family, cache=cache, gen_length=16, **block,
                            **FAMILIES[family], **kw)


def test_timed_model_passes_through_and_counts():
    model = tiny_model("llada")
    timed = TimedModel(model)
    ref = _sampler(model, "dual", "threshold").generate(PROMPT)
    out = _sampler(timed, "dual", "threshold").generate(PROMPT)
    assert torch.equal(out.tokens, ref.tokens)
    assert timed.clock.calls == out.forwards
    assert 0 < timed.clock.refresh_calls < timed.clock.calls  # one refresh per block


def test_core_clock_times_the_core_modules_only():
    model = tiny_model("llada")
    timed = TimedModel(model)
    assert core_modules(timed) == core_modules(model) == [
        model.embed, *model.layers, model.norm, model.head]
    core = CoreClock(core_modules(model))
    try:
        timed.__dict__["clock"] = ForwardClock()
        out = _sampler(timed, "none", "low_confidence").generate(PROMPT)
        assert 0 < core.seconds <= timed.clock.total and out.forwards == 16
        core.reset()
        assert core.seconds == 0.0
    finally:
        core.close()
    model(torch.zeros(1, 4, dtype=torch.long), torch.arange(4)[None])
    assert core.seconds == 0.0  # hooks removed


def test_precomputed_rope_tables_give_the_same_logits():
    model = tiny_model("dream")
    x, pos = torch.randint(0, 60, (2, 7)), torch.arange(3, 10).expand(2, -1)
    with torch.inference_mode():
        want = model(x, pos)
        got = model(x, pos, rope=model.rope_tables(pos))
    assert torch.equal(got, want)


def test_loop_ops_exclude_the_model():
    model = TimedModel(tiny_model("llada"))
    x = torch.zeros(1, 4, dtype=torch.long)
    pos = torch.arange(4)[None]

    def run() -> None:
        model(x, pos)
        torch.ones(3).add_(1)

    n, names = count_loop_ops(run)
    assert n == 2 and names == {"aten::ones": 1, "aten::add_": 1}


def test_measure_overhead_splits_the_step():
    model = tiny_model("llada")
    o = measure_overhead(lambda m: _sampler(m, "prefix", "low_confidence"), model, PROMPT,
                         repeats=1)
    assert o.steps == 16 and o.forwards == 16
    assert o.model_ms > 0 and o.loop_ms > 0 and o.loop_ops > 10
    assert 0 < o.refresh_ms < o.model_ms and o.attention_ms > 0


def test_span_masks_are_cached_and_exact():
    spans = SpanMasks(2, 10, torch.device("cpu"))
    a = spans.get(3, 7)
    assert a is spans.get(3, 7) and a.shape == (2, 10)
    assert a[0].nonzero().flatten().tolist() == [3, 4, 5, 6] and torch.equal(a[0], a[1])
    assert spans.flag(True).all() and not spans.flag(False).any()


def test_bits_per_step_sums_committed_information():
    commit_at = torch.tensor([[0, 0, 1, -1], [1, 2, 2, 2]])
    prob = torch.tensor([[0.5, 0.25, 1.0, 0.1], [0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    bits = bits_per_step(commit_at, prob, 3, chunk=2)
    nats = -torch.log(prob)
    expect = torch.tensor([[nats[0, 0] + nats[0, 1], 0.0, 0.0],
                           [0.0, nats[1, 0], 3 * nats[1, 1]]], dtype=torch.float64)
    assert torch.allclose(bits, expect)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "block_causal"])
def test_span_path_matches_scatter_semantics(cache):
    """The cached-span step reports the same fresh / eligible sets as ``Fed.fresh_mask``."""
    seen = []

    def grab(state, commit):
        seen.append((state.fresh.clone(), state.eligible.clone(), state.masked.clone()))

    _sampler(_model(cache), cache, "threshold").generate(PROMPT, on_step=grab)
    for fresh, eligible, masked in seen:
        assert not (eligible & ~(fresh & masked)).any()
        assert (eligible.any(1) | ~(fresh & masked).any(1)).all()


def test_compile_refuses_unsupported_policies():
    model = tiny_model("llada")
    s = DiffusionSampler(model, "random", gen_length=8, steps=8, temperature=0.5,
                         rng="reference", compile="eager")
    with pytest.raises(ValueError, match="compile=True does not support"):
        s.generate(PROMPT)


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "block_causal"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_compiled_step_is_one_graph_and_token_identical(cache, family):
    """``fullgraph=True`` raises on any graph break; the capture (backend ``eager``) decodes
    exactly the eager loop's tokens, NFE and commit steps."""
    model = _model(cache)
    ref = _sampler(model, cache, family).generate(PROMPT)
    torch._dynamo.reset()
    out = _sampler(model, cache, family, compile="eager").generate(PROMPT)
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.nfe, ref.nfe)
    assert torch.equal(out.commit_step, ref.commit_step)
    assert torch.allclose(out.bits, ref.bits, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["threshold", "sched"])
def test_inductor_step_is_token_identical(family):
    """The real compiler (Inductor, C++ on CPU) on the bundled checkpoint, dual cache."""
    model = load_model("tiny-llada")
    prompt = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
    kw = dict(cache="dual", gen_length=32, block_length=8)
    params = {"tau": 0.9} if family == "threshold" else {"steps": 32}
    ref = DiffusionSampler(model, family, **kw, **params).generate(prompt)
    torch._dynamo.reset()
    out = DiffusionSampler(model, family, compile=True, **kw, **params).generate(prompt)
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.nfe, ref.nfe)


@pytest.mark.slow
def test_many_compiled_samplers_in_one_process():
    """Each sampler compiles its own copy of the step: policies and cache modes decoded one
    after another in a process do not share (and exhaust) one recompile budget."""
    model = tiny_model("llada")
    for family in FAMILIES:
        for cache in ("none", "dual"):
            ref = _sampler(model, cache, family).generate(PROMPT)
            out = _sampler(model, cache, family, compile="eager").generate(PROMPT)
            assert torch.equal(out.tokens, ref.tokens)
