"""block_attention: Triton (interpreter on CPU) against the reference over a sampled grid.

Every cache row a query must not see is NaN (a masking bug poisons the output), caches sit in
NaN-padded buffers (stray reads) and outputs in sentinel-padded buffers (stray writes).
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from kernel_utils import SENTINEL, embed, outside_untouched

from dllm_decode import kernels
from dllm_decode.kernels import reference

pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float16: {"atol": 2e-3, "rtol": 1e-3},
       torch.bfloat16: {"atol": 2e-2, "rtol": 1.6e-2}}
KINDS = ("range", "dual", "block_causal", "causal", "s2d2", "window", "batch_mask", "empty")


def s2d2_mask(block: int) -> torch.Tensor:
    """The "2L" verifier mask ``[2K, 2K]``: draft half causal; mask-copy row j sees draft
    keys < j and itself."""
    k = block
    mask = torch.zeros(2 * k, 2 * k, dtype=torch.bool)
    mask[:k, :k] = torch.ones(k, k, dtype=torch.bool).tril()
    mask[k:, :k] = torch.ones(k, k, dtype=torch.bool).tril(-1)
    mask[k:, k:] = torch.eye(k, dtype=torch.bool)
    return mask


def make_case(b, h, h_kv, d, lq, max_len, kind, seed):
    """Inputs (fp32, CPU) for one attention pattern; invisible cache rows are NaN."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g)
    k = torch.randn(b, h_kv, max_len, d, generator=g)
    v = torch.randn(b, h_kv, max_len, d, generator=g)
    starts = [max_len - 1, 5, 0][:b]  # a length-1 range, a left-padded row, a full row
    ends = [max_len, max_len, max_len - 3][:b]
    kw: dict = {}
    n_new = lq
    if kind in ("block_causal", "s2d2"):  # cache = committed prefix, fresh = the block
        ends = [max(s + 1, max_len - lq - 2) for s in starts]
    if kind == "empty":
        starts[0] = ends[0] = max_len // 2
    if kind in ("dual", "causal", "batch_mask"):
        kw["q_start"] = torch.tensor([max(0, e - n_new - 1) for e in ends], dtype=torch.int32)
    if kind in ("dual", "block_causal", "causal", "s2d2", "batch_mask"):
        kw["k_new"] = torch.randn(b, h_kv, n_new, d, generator=g)
        kw["v_new"] = torch.randn(b, h_kv, n_new, d, generator=g)
    if kind == "causal":
        kw["new_mask"] = torch.ones(lq, n_new, dtype=torch.bool).tril()
    if kind == "s2d2":
        kw["new_mask"] = s2d2_mask(lq // 2) if lq % 2 == 0 else torch.ones(lq, lq).tril() > 0
    if kind == "batch_mask":
        kw["new_mask"] = (torch.rand(b, lq, n_new, generator=g) < 0.5) | torch.eye(lq).bool()
    if kind == "window":
        kw["kv_mask"] = torch.rand(b, max_len, generator=g) < 0.6
    kv_start = torch.tensor(starts, dtype=torch.int32)
    kv_end = torch.tensor(ends, dtype=torch.int32)
    visible, _ = reference.attention_visibility(
        kv_start, kv_end, max_len, lq, n_new=n_new if "k_new" in kw else 0,
        q_start=kw.get("q_start"), kv_mask=kw.get("kv_mask"))
    k = k.masked_fill(~visible[:, None, :, None], float("nan"))
    v = v.masked_fill(~visible[:, None, :, None], float("nan"))
    return q, k, v, kv_start, kv_end, kw


def check_case(b, h, h_kv, d, lq, max_len, dtype, kind, seed, device):
    from dllm_decode.kernels.triton import launch_block_attention

    q, k, v, kv_start, kv_end, kw = make_case(b, h, h_kv, d, lq, max_len, kind, seed)
    cast = {n: t.to(dtype) if t.is_floating_point() else t for n, t in kw.items()}
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    want = reference.block_attention(q, k, v, kv_start, kv_end, return_lse=True, **cast)
    assert not torch.isnan(want.out).any()

    dev = {n: t.to(device) for n, t in cast.items()}
    k_d, _ = embed(k.to(device))
    v_d, _ = embed(v.to(device))
    out, out_base = embed(torch.zeros(b, h, lq, d, dtype=dtype, device=device), fill=SENTINEL)
    lse, lse_base = embed(torch.zeros(b, h, lq, device=device), fill=SENTINEL)
    launch_block_attention(q.to(device), k_d, v_d, kv_start.to(device), kv_end.to(device), out,
                           lse, **dev)
    assert outside_untouched(out, out_base, SENTINEL)
    assert outside_untouched(lse, lse_base, SENTINEL)
    torch.testing.assert_close(out.cpu(), want.out, **TOL[dtype])
    torch.testing.assert_close(lse.cpu(), want.lse, atol=1e-4, rtol=1e-5)
    if kind == "empty":
        assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()


BRANCH_CASES = [  # every pattern once in fp32 and once in fp16 (B, H, H_kv, D, Lq, L_max)
    (2, 2, 1, 16, 8, 40, dtype, kind)
    for kind in KINDS for dtype in (torch.float32, torch.float16)
]


@pytest.mark.parametrize(("b", "h", "h_kv", "d", "lq", "max_len", "dtype", "kind"),
                         BRANCH_CASES)
def test_attention_patterns(b, h, h_kv, d, lq, max_len, dtype, kind, device):
    check_case(b, h, h_kv, d, lq, max_len, dtype, kind, seed=len(kind), device=device)


def _grid_sample(n: int) -> list[tuple]:
    grid = [
        (b, h, h_kv, d, lq, max_len, dtype, kind)
        for b, h, d, lq, max_len, dtype, kind in itertools.product(
            (1, 3), (2, 4), (16, 64), (1, 7, 32), (40, 96, 130),
            (torch.float32, torch.float16), KINDS)
        for h_kv in (h, h // 2)
    ]
    return random.Random(0).sample(grid, n)


@pytest.mark.parametrize(("b", "h", "h_kv", "d", "lq", "max_len", "dtype", "kind"),
                         _grid_sample(10))
def test_attention_grid_sample(b, h, h_kv, d, lq, max_len, dtype, kind, device):
    check_case(b, h, h_kv, d, lq, max_len, dtype, kind, seed=b * lq + max_len, device=device)


def test_public_op_and_scale(device):
    q, k, v, kv_start, kv_end, kw = make_case(3, 4, 2, 16, 7, 40, "dual", seed=1)
    k, v = k.nan_to_num(), v.nan_to_num()
    args = [t.to(device) for t in (q, k, v, kv_start, kv_end)]
    dev = {n: t.to(device) for n, t in kw.items()}
    got = kernels.block_attention(*args, sm_scale=0.3, impl="triton", **dev)
    want = kernels.block_attention(q, k, v, kv_start, kv_end, sm_scale=0.3, impl="reference",
                                   **kw)
    assert isinstance(got, kernels.AttentionOutput) and got.lse is None
    torch.testing.assert_close(got.out.cpu(), want.out, atol=1e-5, rtol=1e-5)


def test_s2d2_mask_spec():
    """methods.md: L=4 block; draft half causal, mask-copy strict-causal into draft + self."""
    m = s2d2_mask(4)
    assert m[:4, :4].equal(torch.ones(4, 4).tril().bool()) and not m[:4, 4:].any()
    assert m[4:, :4].equal(torch.ones(4, 4).tril(-1).bool()) and m[4:, 4:].equal(torch.eye(4) > 0)


def test_attention_argument_errors():
    q, k = torch.zeros(1, 3, 4, 16), torch.zeros(1, 2, 8, 16)
    rng = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="H % H_kv"):
        kernels.block_attention(q, k, k, rng, rng)
    with pytest.raises(ValueError, match="new_mask"):
        kernels.block_attention(torch.zeros(1, 2, 4, 16), k, k, rng, rng,
                                new_mask=torch.ones(4, 4, dtype=torch.bool))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_attention_bf16_on_gpu(kind, device):
    """bf16 math is only trustworthy on a GPU (the interpreter computes bf16 wrongly)."""
    check_case(3, 8, 2, 128, 32, 300, torch.bfloat16, kind, seed=3, device=device)
