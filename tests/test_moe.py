"""MoE blocks: router numerics against a per-token transcription of each reference, the
grouped expert path against the per-expert loop, and a bounded kernel count."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dllm_decode.models import sparse_moe
from dllm_decode.models.sparse_moe import MoESpec, SparseMoE, route

pytestmark = pytest.mark.usefixtures("one_thread")

SIGMOID = MoESpec(num_experts=8, top_k=2, intermediate_size=16, score="sigmoid",
                  norm_topk_prob=True, routed_scaling_factor=2.5, n_group=4, topk_group=2,
                  expert_bias=True, shared_intermediate_size=16)
SOFTMAX = MoESpec(num_experts=8, top_k=2, intermediate_size=16, score="softmax",
                  norm_topk_prob=False)
RENORM = MoESpec(num_experts=16, top_k=4, intermediate_size=8, score="softmax",
                 norm_topk_prob=True)
SPECS = {"sigmoid_grouped": SIGMOID, "softmax": SOFTMAX, "softmax_renorm": RENORM}


def route_one_token(logits: list[float], spec: MoESpec, bias: list[float]) -> dict[int, float]:
    """Per-token transcription of the references' routers: expert -> combine weight."""
    x = torch.tensor(logits, dtype=torch.float64)
    scores = torch.sigmoid(x) if spec.score == "sigmoid" else torch.softmax(x, -1)
    choice = scores + torch.tensor(bias, dtype=torch.float64)
    allowed = list(range(spec.num_experts))
    if spec.n_group > 1:
        per = spec.num_experts // spec.n_group
        group_score = [sorted(choice[g * per:(g + 1) * per].tolist())[-2:] for g in
                       range(spec.n_group)]
        best = sorted(range(spec.n_group), key=lambda g: -sum(group_score[g]))[:spec.topk_group]
        allowed = [e for e in allowed if e // per in best]
    chosen = sorted(allowed, key=lambda e: -choice[e].item())[:spec.top_k]
    w = {e: scores[e].item() for e in chosen}  # un-biased scores
    if spec.norm_topk_prob:
        total = sum(w.values()) + 1e-20
        w = {e: v / total for e, v in w.items()}
    return {e: v * spec.routed_scaling_factor for e, v in w.items()}


@pytest.mark.parametrize("name", SPECS)
def test_router_matches_a_per_token_transcription(name: str) -> None:
    spec = SPECS[name]
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(40, spec.num_experts, generator=gen) * 2
    bias = torch.randn(spec.num_experts, generator=gen) if spec.expert_bias else None
    idx, weight = route(logits, spec, bias)
    assert weight.dtype == torch.float32
    for t in range(logits.shape[0]):
        want = route_one_token(logits[t].tolist(), spec,
                               bias.tolist() if bias is not None else [0.0] * spec.num_experts)
        got = dict(zip(idx[t].tolist(), weight[t].tolist(), strict=True))
        assert got.keys() == want.keys(), t
        for e in want:
            assert abs(got[e] - want[e]) < 1e-6


def test_expert_bias_selects_but_does_not_weigh() -> None:
    logits = torch.zeros(1, 8)
    bias = torch.zeros(8)
    bias[5], bias[7] = 3.0, 2.0  # groups 2 and 3 win; experts 5 and 7 are chosen
    idx, weight = route(logits, SIGMOID, bias)
    assert sorted(idx[0].tolist()) == [5, 7]
    # equal un-biased scores: renormalised halves, times the scaling factor
    assert torch.allclose(weight, torch.full((1, 2), 1.25))


def _moe(spec: MoESpec, hidden: int = 32, seed: int = 0) -> SparseMoE:
    gen = torch.Generator().manual_seed(seed)
    moe = SparseMoE(hidden, spec)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        if moe.gate.expert_bias is not None:
            moe.gate.expert_bias.copy_(torch.randn(spec.num_experts, generator=gen) * 0.3)
    return moe


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("grouped_mm", [True, False])
def test_grouped_path_equals_the_expert_loop(name: str, grouped_mm: bool, monkeypatch) -> None:
    """Tolerance: 1e-5 absolute in fp32 (outputs of size ~1; summation order differs)."""
    if not grouped_mm:
        monkeypatch.setattr(sparse_moe, "_grouped_mm_ok", lambda x, w: False)
    spec = SPECS[name]
    moe = _moe(spec)
    x = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref, got = moe(x, "reference"), moe(x, "grouped")
    assert (ref - got).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="grouped"):
        moe(x, "bogus")


def test_grouped_path_in_bfloat16_matches_the_loop_in_bfloat16() -> None:
    """Same routing (the router runs in fp32 either way); the expert GEMMs round differently:
    within 2 % of the output scale."""
    moe = _moe(SIGMOID).to(torch.bfloat16)
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(3)).bfloat16()
    with torch.no_grad():
        want, got = moe(x, "reference").float(), moe(x, "grouped").float()
    assert (want - got).abs().max().item() < 0.02 * want.abs().max().item()


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("grouped_mm", [True, False])
def test_grouped_path_launches_a_bounded_number_of_ops(grouped_mm: bool, monkeypatch) -> None:
    """The op count of one MoE layer does not grow with the number of experts or tokens (the
    reference loop's does)."""
    if not grouped_mm:
        monkeypatch.setattr(sparse_moe, "_grouped_mm_ok", lambda x, w: False)
    counts = {}
    for experts, tokens in ((8, 4), (32, 4), (32, 64)):
        spec = MoESpec(num_experts=experts, top_k=2, intermediate_size=16, score="sigmoid",
                       norm_topk_prob=True, n_group=4, topk_group=2, expert_bias=True)
        moe = _moe(spec)
        x = torch.randn(1, tokens, 32)
        for impl in ("grouped", "reference"):
            with torch.no_grad(), _CountOps() as c:
                moe(x, impl)
            counts[impl, experts, tokens] = c.n
    grouped = {v for (impl, _, _), v in counts.items() if impl == "grouped"}
    assert len(grouped) == 1, counts
    assert counts["reference", 32, 64] > 2 * counts["grouped", 32, 64]


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        MoESpec(num_experts=4, top_k=5, intermediate_size=8, score="softmax",
                norm_topk_prob=False)
    with pytest.raises(ValueError, match="n_group"):
        MoESpec(num_experts=6, top_k=2, intermediate_size=8, score="sigmoid",
                norm_topk_prob=True, n_group=4)
    with pytest.raises(ValueError, match="score"):
        MoESpec(num_experts=4, top_k=2, intermediate_size=8, score="relu",  # type: ignore
                norm_topk_prob=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_path_traces_as_one_graph(dtype: torch.dtype) -> None:
    """``torch.compile(fullgraph=True)`` sees no graph break (no host sync, no data-dependent
    shapes); dynamo only (the eager backend), to stay fast."""
    moe = _moe(SIGMOID).to(dtype)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(4)).to(dtype)
    compiled = torch.compile(lambda t: moe(t, "grouped"), fullgraph=True, backend="eager")
    with torch.no_grad():
        got, want = compiled(x), moe(x, "reference")
    assert (got.float() - want.float()).abs().max().item() < (1e-5 if dtype is torch.float32
                                                              else 0.02 * want.abs().max())
    torch._dynamo.reset()


def test_expert_offsets_equal_bincount_without_it() -> None:
    """``expert_offsets`` (both grouped paths' ``offs``; no host sync) equals the cumulative
    ``bincount``, empty experts included."""
    from dllm_decode.models.sparse_moe import expert_offsets

    ids = torch.randint(0, 5, (37,), generator=torch.Generator().manual_seed(0)) * 2  # odd: empty
    want = torch.bincount(ids, minlength=11).cumsum(0).to(torch.int32)
    assert torch.equal(expert_offsets(ids, 11), want)
    assert torch.equal(expert_offsets(ids[:0], 3), torch.zeros(3, dtype=torch.int32))


class _OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_grouped_paths_call_no_op_that_syncs_on_an_accelerator() -> None:
    """Neither grouped path (the MoE families' ``Experts`` and DiffusionGemma's
    ``GemmaExperts``) reads a scalar back or calls ``bincount`` (which syncs on CUDA to size
    its output); DiffusionGemma's called ``bincount`` before."""
    from dllm_decode.models.gemma_layers import GemmaExperts

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 32, generator=gen)
    idx = torch.randint(0, 8, (6, 2), generator=gen)
    weight = torch.rand(6, 2, generator=gen)
    gemma = GemmaExperts(8, 32, 16)
    moe = _moe(SOFTMAX).experts
    for module in (moe, gemma):
        for p in module.parameters():
            torch.nn.init.normal_(p, generator=gen)
        with _OpNames() as ops:
            module.grouped(x, idx, weight) if module is moe else module.grouped(x, weight, idx)
        assert not ops.names & {"bincount", "_local_scalar_dense", "item", "nonzero"}, ops.names
