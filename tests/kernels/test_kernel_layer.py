"""Fused decoder-layer ops (``kernels.qkv_rope``, ``kernels.silu_mul``): Triton (the
interpreter on CPU) against the torch reference, alone and inside model forwards, and the
launches per layer of the Triton path (issue 33: at most 14)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import kernels
from dllm_decode.models.functional import rope_cos_sin
from dllm_decode.types import Impl
from tests.helpers import EOS, tiny_model
from tests.kernels.kernel_utils import SENTINEL

pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def _inputs(device, dtype, b, n, heads, kv_heads, dim, max_len):
    g = torch.Generator().manual_seed(b * 100 + n * 10 + heads + kv_heads)
    qkv = torch.randn(b, n, (heads + 2 * kv_heads) * dim, generator=g).to(device, dtype)
    pos = torch.randint(0, 50, (b, n), generator=g).to(device)
    rope = kernels.rope_rows(*rope_cos_sin(pos, dim, 10000.0))
    w = [(1 + 0.3 * torch.randn(dim, generator=g)).to(device, dtype) for _ in "qk"]
    slots = torch.stack([torch.randperm(max_len, generator=g)[:n] for _ in range(b)]).to(device)
    return qkv, rope, w, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize(("b", "n", "heads", "kv_heads", "dim"),
                         [(2, 5, 4, 2, 16), (1, 3, 2, 2, 32), (3, 1, 4, 1, 8),
                          (1, 3, 8, 4, 128)])  # D 128: heads split over programs
def test_qkv_rope_matches_reference(device, dtype, norm, write, b, n, heads, kv_heads,
                                    dim) -> None:
    max_len = 7
    qkv, rope, w, slots = _inputs(device, dtype, b, n, heads, kv_heads, dim, max_len)
    kw = dict(q_norm=w[0], k_norm=w[1], eps=1e-6) if norm else {}
    out = {}
    for impl in ("reference", "triton"):
        caches = [torch.full((b, kv_heads, max_len, dim), SENTINEL, dtype=dtype, device=device)
                  for _ in "kv"]
        extra = dict(k_cache=caches[0], v_cache=caches[1], slots=slots) if write else {}
        x = qkv.clone()
        qk = kernels.qkv_rope(x, rope, heads, kv_heads, dim, **kw, **extra, impl=impl)
        # v is never touched; the Triton result is a view of x
        assert torch.equal(x[..., (heads + kv_heads) * dim:], qkv[..., (heads + kv_heads) * dim:])
        out[impl] = (qk.clone(), *caches)
    # fp32: within an ulp or two (torch's CPU addcmul may fuse its multiply-add)
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    for got, want in zip(out["triton"], out["reference"], strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    if write:  # rows that were not written keep the sentinel (no stray writes)
        hit = torch.zeros(b, max_len, dtype=torch.bool, device=device)
        hit.scatter_(1, slots, True)
        for cache in out["triton"][1:]:
            assert (cache.transpose(1, 2)[~hit] == SENTINEL).all()
            assert (cache.transpose(1, 2)[hit] != SENTINEL).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 5, 80), (2, 2100), (1, 1, 2)])
def test_silu_mul_matches_reference(device, dtype, shape) -> None:
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(7)) * 4).to(device, dtype)
    got = kernels.silu_mul(x, impl="triton")
    want = kernels.silu_mul(x, impl="reference")
    assert got.shape == want.shape == (*shape[:-1], shape[-1] // 2) and got.dtype == dtype
    tol = 2e-6 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_model_forwards_with_triton_layer_ops_match_reference(device, family) -> None:
    """Uncached and cached (stored) forwards: logits and cache with ``layer_impl=triton``
    equal the reference path (fp32, 1e-5)."""
    model = tiny_model(family, seed=3).to(device)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, EOS, (2, 6), generator=g).to(device)
    pos = torch.arange(6, device=device).expand(2, 6)
    res = {}
    for impl in (Impl.REFERENCE, Impl.TRITON):
        model.layer_impl = impl
        cache = model.new_cache(2, 10)
        mask = cache.valid_keys()
        if family == "sdar":  # block-causal models pass their mask with a cache
            from dllm_decode.models.functional import block_causal_mask

            k_pos = torch.arange(10, device=device).expand(2, 10)
            mask = block_causal_mask(pos, k_pos, model.block_size) & mask[:, None]
        with torch.no_grad():
            plain = model(tokens, pos)
            cached = model(tokens, pos, cache=cache, mask=mask)
        res[impl] = (plain, cached, cache.k.clone(), cache.v.clone())
    model.layer_impl = Impl.AUTO
    for got, want in zip(res[Impl.TRITON], res[Impl.REFERENCE], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("family", "mode"), [
    ("llada", "none"), ("llada", "prefix"), ("llada", "dual"),
    ("dream", "none"), ("dream", "prefix"), ("dream", "dual"),
    ("sdar", "none"), ("sdar", "block_causal")])
def test_triton_layer_path_launches_at_most_14_per_layer(device, family, mode) -> None:
    """CUDA's ``auto`` path (SDPA + Triton layer ops) counted on CPU: Triton launches are
    profiler ranges, torch ops the top-level kernel-launching aten ops (``diagnostics.launches``).
    """
    from dllm_decode.diagnostics.launches import layer_launches

    model = tiny_model(family).to(device)
    model.layer_impl = Impl.TRITON
    model.attn_impl = Impl.REFERENCE
    count = layer_launches(model, mode, prompt_length=4, gen_length=4, block_length=4)
    assert count.per_range and count.max <= 14, count.by_op
    assert count.by_op.get("triton::qkv_rope") == len(count.per_range)  # the kernels ran
    assert count.by_op.get("triton::silu_mul") == len(count.per_range)


def test_training_forward_falls_back_to_the_differentiable_reference(device) -> None:
    """``layer_impl=triton`` (what ``auto`` picks on CUDA) with autograd on: the reference
    ops run (the Triton ones write in place and have no backward), gradients flow."""
    model = tiny_model("sdar", seed=1).to(device)
    model.layer_impl = Impl.TRITON
    tokens = torch.randint(0, EOS, (1, 4), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(4, device=device)[None]
    model(tokens.to(device), pos).float().logsumexp(-1).sum().backward()
    assert model.layers[0].attn.qkv.weight.grad.abs().sum() > 0
    assert model.layers[0].mlp.gate_up.weight.grad.abs().sum() > 0
    model.layer_impl = Impl.AUTO


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_bf16_triton_layer_ops_match_reference_on_gpu(device, family) -> None:
    """bf16 (the interpreter cannot compute in bf16): the fused ops and a cached forward with
    Triton layer ops against the reference, within bf16 rounding."""
    qkv, rope, w, slots = _inputs(device, torch.bfloat16, 2, 7, 8, 2, 64, 11)
    got = kernels.qkv_rope(qkv.clone(), rope, 8, 2, 64, q_norm=w[0], k_norm=w[1], eps=1e-6,
                           impl="triton")
    want = kernels.qkv_rope(qkv.clone(), rope, 8, 2, 64, q_norm=w[0], k_norm=w[1], eps=1e-6,
                            impl="reference")
    torch.testing.assert_close(got, want, atol=3e-2, rtol=2e-2)
    x = torch.randn(4, 2 * 300, device=device).bfloat16()
    torch.testing.assert_close(kernels.silu_mul(x, impl="triton"),
                               kernels.silu_mul(x, impl="reference"), atol=2e-2, rtol=2e-2)
    model = tiny_model(family, seed=3, init_std=0.1).to(device, torch.bfloat16)
    tokens = torch.randint(0, EOS, (2, 6), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(6, device=device).expand(2, 6)
    logits = {}
    for impl in (Impl.REFERENCE, Impl.TRITON):
        model.layer_impl = impl
        with torch.no_grad():
            logits[impl] = model(tokens.to(device), pos).float()
    model.layer_impl = Impl.AUTO
    torch.testing.assert_close(logits[Impl.TRITON], logits[Impl.REFERENCE], atol=5e-2, rtol=5e-2)
