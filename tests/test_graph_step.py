"""The static-buffer step (``samplers.graph``) against the eager loop.

On the CPU ``graphs=True`` runs the step a CUDA graph would capture, eagerly, on the same
static buffers, under ``graph_check.ReplayCheck``: every run of a step key after its capture
run must launch the same ops with the same host scalars on the same buffers (a replay would
run exactly that), with no host sync. Each case decodes two different prompts of one shape
with one sampler (the buffers and keys carry over) and compares everything a ``Generation``
records with the ordinary loop. The ``gpu`` tests replay real CUDA graphs.
"""

from __future__ import annotations

import logging
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
from dllm_decode.samplers.graph_check import ReplayMismatch
from tests.conformance import (
    CONFORMANCE,
    dream_settings,
    llada_settings,
    load_cases,
    require_shared,
    tensors,
)
from tests.helpers import left_pad_rows

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = {  # name -> parameters (steps where the preset is scheduled)
    "low_confidence": {"steps": 16}, "threshold": {}, "factor": {}, "entropy": {"steps": 16},
    "sched": {"steps": 16}, "topk_margin": {"steps": 16}, "entropy_threshold": {},
    "frechet": {},
}
CACHES = {"tiny-llada": ("none", "prefix", "dual"), "tiny-dream": ("none", "prefix", "dual"),
          "tiny-sdar": ("none", "block_causal")}
_MODELS: dict[str, Any] = {}


def _model(name: str) -> Any:
    if name not in _MODELS:
        path = require_shared(CONFORMANCE / name) if name.endswith("-tiny") else name
        _MODELS[name] = load_model(path)
    return _MODELS[name]


def _prompts(model: Any, b: int = 2, p: int = 9) -> list[torch.Tensor]:
    v = model.spec.vocab_size
    gens = (torch.Generator().manual_seed(s) for s in (0, 1))
    return [torch.randint(3, min(v, 1000), (b, p), generator=g) for g in gens]


def _same(a: Any, b: Any) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.nfe, b.nfe) and a.forwards == b.forwards
    assert torch.equal(a.commit_step, b.commit_step)
    assert torch.equal(a.refreshed, b.refreshed) and a.step_forwards == b.step_forwards
    assert torch.allclose(a.bits, b.bits, rtol=1e-5, atol=1e-6)


def _static(model: Any, policy: Any, cache: str, **kw: Any) -> DiffusionSampler:
    s = DiffusionSampler(model, policy, cache, graphs=True, **kw)
    s.step_graphs = StepGraphs(capture=False, check=True)
    return s


def _compare(model: Any, policy: Any, cache: str, prompts: list, masks: list | None = None,
             **kw: Any) -> DiffusionSampler:
    """Eager vs static on each prompt (one static sampler for all); returns the sampler."""
    static = _static(model, policy, cache, **kw)
    for i, prompt in enumerate(prompts):
        mask = None if masks is None else masks[i]
        ref = DiffusionSampler(model, policy, cache, graphs=False, **kw).generate(prompt, mask)
        out = static.generate(prompt, mask)
        assert static.graph_reason is None, static.graph_reason
        _same(ref, out)
    return static


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("name, cache", [(m, c) for m, cs in CACHES.items() for c in cs])
def test_static_step_matches_eager(name: str, cache: str, preset: str) -> None:
    model = _model(name)
    kw = dict(gen_length=16, block_length=8, **PRESETS[preset])
    if name == "tiny-sdar":
        kw.pop("block_length")
    s = _compare(model, preset, cache, _prompts(model), **kw)
    stats = s.step_graphs.stats
    assert stats.eager > 0 and stats.replays == 0
    if "steps" in kw:  # scheduled: keys repeat, and later runs were compared with the first
        assert s.step_graphs.check.checked > 0


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_static_step_left_padding_and_four_tokens_per_step(cache: str) -> None:
    """Ragged prompts (key masks from the validity buffer) at 4 tokens per step, batch 3,
    with the EOS fill between steps (a new canvas, copied into the buffer)."""
    model = _model("tiny-llada")
    rows = [torch.arange(5, 11), torch.arange(11, 14), torch.arange(14, 18)]
    prompt, mask = left_pad_rows(rows, model.spec.pad_token_id)
    other, other_mask = left_pad_rows([r + 20 for r in rows[::-1]], model.spec.pad_token_id)
    _compare(model, "low_confidence", cache, [prompt, other], [mask, other_mask],
             gen_length=32, block_length=16, steps=8, stop_at_eos=True)


@pytest.mark.parametrize("name, cache, keys, relative", [("tiny-llada", "dual", 6, 2),
                                                          ("tiny-sdar", "block_causal", 13, 4)])
def test_cached_steps_share_one_key_across_blocks(name: str, cache: str, keys: int,
                                                  relative: int) -> None:
    """Cached steps of one block width are position-free (the span's origin is a buffer):
    every block replays the same step graphs; what stays per block is the refresh (dual:
    scored rows ``[P, block end)``) or the block's first forward (block-causal: it also feeds
    the previous block)."""
    model = _model(name)
    kw = dict(gen_length=32, steps=32) | ({"block_length": 8} if cache == "dual" else {})
    s = _compare(model, "low_confidence", cache, _prompts(model), **kw)
    (buf,) = s.step_graphs._sets.values()
    # dual: 4 refreshes + one step + one last step; block-causal (prompt 9, blocks of 4): a
    # first forward per block (a partial one, 7 whole, the canvas end's), then a step and a
    # last step for the partial block and for every whole one
    assert len(buf.seen) == keys
    assert sum(k.relative for k in buf.seen) == relative


def test_static_step_reuses_buffers_and_keeps_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """One buffer set (K/V cache included: the second plan allocates none) serves both
    generations; results own their tensors (the next generation does not overwrite them)."""
    model = _model("tiny-llada")
    a, b = _prompts(model)
    s = DiffusionSampler(model, "low_confidence", "dual", graphs=True, gen_length=16,
                         block_length=8, steps=16)
    first = s.generate(a)
    kept = first.tokens.clone()
    (buf,) = s.step_graphs._sets.values()
    cache = buf.cache
    monkeypatch.setattr(model, "new_cache", lambda *a: pytest.fail("a second K/V cache"))
    s.generate(b)
    assert torch.equal(first.tokens, kept)
    assert list(s.step_graphs._sets.values()) == [buf] and buf.cache is cache


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_static_step_conformance_cases(family: str) -> None:
    """Recorded: every greedy conformance case the static step supports gives the recorded
    tokens (machine-independent, as ``test_conformance.test_llada_case``). Greedy
    cases run with ``rng="compact"`` (no draws either way): the static step's own top-k, ties to
    the lower index — the recordings have no exact tie at a top-k boundary (their
    ``min_topk_boundary_gap`` >= 1e-4), so that order gives the reference's tokens, whereas
    ``rng="reference"`` would select on the host (``tests/test_reference_ties.py``)."""
    cases = load_cases(f"{family}-tiny")
    settings = llada_settings if family == "llada" else dream_settings
    model = _model(f"{family}-tiny")
    ran = 0
    for case in cases:
        policy, params = settings(case, model)
        if not params["temperature"]:
            params["rng"] = "compact"
        prompt, mask = tensors(case)
        s = _static(model, policy, params.pop("cache", "none"), **params)
        out = s.generate(prompt, mask)
        assert torch.equal(out.tokens, torch.tensor(case["output_ids"])), case["name"]
        ran += s.graph_reason is None
    assert ran >= 3, f"only {ran} {family} cases ran the static step"


def test_fallbacks_are_logged_and_eager(caplog: pytest.LogCaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model("tiny-llada")
    prompt = _prompts(model)[0]
    kw = dict(gen_length=16, block_length=8, steps=16)
    ref = DiffusionSampler(model, "low_confidence", **kw, temperature=0.5, seed=3)
    s = DiffusionSampler(model, "low_confidence", graphs=True, **kw, temperature=0.5, seed=3)
    with caplog.at_level(logging.WARNING, logger="dllm_decode.graph"):
        out = s.generate(prompt)
    assert "temperature" in s.graph_reason and "temperature" in caplog.text
    assert torch.equal(out.tokens, ref.generate(prompt).tokens)
    for policy, extra, why in [("random", {}, "not declared graph-safe"),
                               ("low_confidence", {"cache": "window"}, "window"),
                               ("origin", {}, "after selection"),
                               ("edit", {"base": "threshold"}, "token editing")]:
        s = DiffusionSampler(model, policy, graphs=True, **{**kw, **extra})
        s.generate(prompt)
        assert why in s.graph_reason
    s = DiffusionSampler(model, "low_confidence", graphs=True, **kw)
    s.generate(prompt, on_step=lambda state, commit: None)
    assert "on_step" in s.graph_reason
    cpu = DiffusionSampler(model, "low_confidence", **kw)  # default: CUDA only
    cpu.generate(prompt)
    assert cpu.step_graphs is None and cpu.graph_reason is None
    cuda = torch.device("cuda")
    assert graph_support.wanted(None, cuda) and not graph_support.wanted(False, cuda)
    monkeypatch.setenv(graph_support.ENV_VAR, "0")
    assert not graph_support.wanted(None, cuda) and graph_support.wanted(True, cuda)


@dataclass(frozen=True)
class _StepsLeftTopK:
    """A top-k that reads ``state.steps_left`` (a host int a graph would bake in)."""

    capabilities = Capabilities(proposal_fields=())

    def select(self, state: Any) -> torch.Tensor:
        score = state.proposal.prob * state.steps_left  # the same order, a baked scalar
        return topk_mask(score, state.eligible, state.budget)


def test_replay_check_catches_a_baked_host_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_support, "GRAPH_SAFE", graph_support.GRAPH_SAFE | {_StepsLeftTopK})
    model = _model("tiny-llada")
    s = _static(model, _StepsLeftTopK(), "dual", gen_length=16, block_length=8, steps=16)
    with pytest.raises(ReplayMismatch, match="differs from the capture"):
        s.generate(_prompts(model)[0])


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_static_step_compiles_fullgraph_on_cpu(backend: str) -> None:
    """``torch.compile(fullgraph=True)`` captures the whole static step, forward included
    (a graph break raises), once per step key; tokens equal the eager loop's. One block of
    one row keeps it to three keys (Dynamo ~8 s here, Inductor ~100 s on a busy 2-core CPU,
    hence ``slow``)."""
    import torch._dynamo

    model = _model("tiny-llada")
    prompt = _prompts(model, b=1)[0]
    kw = dict(gen_length=8, block_length=8, steps=4)
    ref = DiffusionSampler(model, "low_confidence", "dual", **kw).generate(prompt)
    s = DiffusionSampler(model, "low_confidence", "dual", graphs=True, **kw)
    s.step_graphs = StepGraphs(capture=False, compile_backend=backend)
    torch._dynamo.reset()
    for _ in range(2):  # the second generation reuses the compiled keys
        _same(ref, s.generate(prompt))


_INSPECT: list[Any] = []  # the current inspecting backend (registered once, below)


def _inspect_backend(gm: Any, inputs: Any) -> Any:
    return _INSPECT[0](gm, inputs)


@pytest.mark.parametrize("preset", ["low_confidence", "threshold"])
def test_compiled_post_forward_mutates_no_input(preset: str) -> None:
    """``compile=True``: the compiled step edits no input in place (the mask column of the
    logits and the commit record are new tensors under ``torch.compile``); a mutated input
    makes Inductor skip CUDA graphs (issue 33). Checked on the Dynamo graph itself."""
    import torch._dynamo

    mutated: list[tuple[str, str]] = []

    def inspect(gm: Any, inputs: Any) -> Any:
        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target.endswith("_") and node.args and \
                    getattr(node.args[0], "op", "") == "placeholder":
                mutated.append((node.target, node.args[0].name))
        return gm

    _INSPECT[:] = [inspect]
    model = _model("tiny-llada")
    prompt = _prompts(model, b=1)[0]
    kw = dict(gen_length=8, block_length=8) | ({} if preset == "threshold" else {"steps": 8})
    ref = DiffusionSampler(model, preset, "dual", **kw).generate(prompt)
    torch._dynamo.reset()
    if "graph33_inspect" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(name="graph33_inspect")(_inspect_backend)
    out = DiffusionSampler(model, preset, "dual", compile="graph33_inspect", **kw)
    _same(ref, out.generate(prompt))
    assert mutated == []


def test_bench_gpu_smoke_and_refusal(tmp_path: Any) -> None:
    """``benchmarks/bench_gpu.py --smoke``: rows in the benchmark schema with the device in
    each; without CUDA the full grid refuses with exit status 2."""
    import csv
    import importlib.util
    import sys
    from pathlib import Path

    from dllm_decode.bench import HEADER

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules["bench_gpu"]
    out = tmp_path / "gpu.csv"
    assert bench.main(["--smoke", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == HEADER and all(r["device"] for r in rows)
    metrics = {(r["cache"], r["provider"], r["metric"]) for r in rows}
    assert ("dual", "eager", "ms_per_refresh") in metrics
    assert {("none", p, "tokens_per_s") for p in ("eager", "static", "graphs")} & metrics
    if not torch.cuda.is_available():
        assert bench.main(["--out", str(out)]) == 2


@pytest.mark.parametrize("preset, cache", [("low_confidence", "dual"), ("sched", "none"),
                                           ("threshold", "prefix")])
def test_capture_and_replay_logic_on_cpu(preset: str, cache: str) -> None:
    """The CUDA path of ``samplers.graph`` (warm-up run, capture, self-checked first replay,
    replay, the host-side restore of the contract's view, carried memory) on the CPU with a
    stand-in graph that replays recorded ops without Python (``graph_backend``): three
    generations equal the eager loop's."""
    model = _model("tiny-llada")
    kw = dict(gen_length=16, block_length=8, **PRESETS[preset])
    s = DiffusionSampler(model, preset, cache, graphs=True, **kw)
    s.step_graphs = StepGraphs(capture=True, backend=StandInGraphs())
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        prompt = torch.randint(3, 1000, (2, 9), generator=gen)
        ref = DiffusionSampler(model, preset, cache, graphs=False, **kw).generate(prompt)
        _same(ref, s.generate(prompt))
        assert s.graph_reason is None
    stats = s.step_graphs.stats
    assert stats.captures > 0 and stats.replays > stats.captures
    assert stats.checked == stats.captures and stats.rejected == 0


# ---- CUDA: real graphs ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("preset, cache", [("low_confidence", "none"), ("low_confidence", "dual"),
                                           ("threshold", "prefix"), ("sched", "dual"),
                                           ("entropy", "dual"), ("factor", "none")])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replay_matches_eager_on_cuda(preset: str, cache: str, dtype: Any) -> None:
    """Capture once, replay across three generations (different prompts, one shape): token
    for token the eager loop's, in the same dtype."""
    model = load_model("tiny-llada").to("cuda", dtype)
    kw = dict(gen_length=32, block_length=8, **PRESETS[preset])
    s = DiffusionSampler(model, preset, cache, **kw)  # graphs: on by default on CUDA
    captures = []
    for seed in range(3):
        prompt = torch.randint(3, 1000, (2, 12), generator=torch.Generator().manual_seed(seed))
        prompt = prompt.cuda()
        ref = DiffusionSampler(model, preset, cache, graphs=False, **kw).generate(prompt)
        out = s.generate(prompt)
        assert s.graph_reason is None
        _same(ref, out)
        captures.append(s.step_graphs.stats.captures)
    assert s.step_graphs.stats.replays > 0
    if "steps" in PRESETS[preset]:  # scheduled: the same keys every generation, so the
        assert captures[2] == captures[1]  # third generation only replays


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name, cache", [("tiny-dream", "dual"), ("tiny-sdar", "block_causal")])
def test_graph_replay_other_families_on_cuda(name: str, cache: str) -> None:
    model = load_model(name).to("cuda")
    kw = dict(gen_length=32, steps=32)
    s = DiffusionSampler(model, "low_confidence", cache, **kw)
    for seed in range(3):
        prompt = torch.randint(3, 1000, (1, 8), generator=torch.Generator().manual_seed(seed))
        ref = DiffusionSampler(model, "low_confidence", cache, graphs=False, **kw)
        _same(ref.generate(prompt.cuda()), s.generate(prompt.cuda()))
    assert s.step_graphs.stats.replays > 0
