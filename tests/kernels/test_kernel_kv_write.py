"""kv_write_: bitwise equal to the reference, nothing written outside the target rows."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import kernels
from dllm_decode.kernels import reference

pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

#: filler of every cache element the write must not touch (other layers, D padding)
FILL = 1234.5


def rope_tables(kind: str, batch: int, n_new: int, max_len: int, head_dim: int):
    if kind == "none":
        return None, None
    from dllm_decode.models.base import rope_cos_sin

    if kind == "slot":  # [L_max + 3, D], indexed by cache row
        cos, sin = rope_cos_sin(torch.arange(max_len + 3)[None], head_dim, 10_000.0)
        return cos[0, 0], sin[0, 0]
    pos = torch.randint(0, 500, (batch, n_new), generator=torch.Generator().manual_seed(0))
    return rope_cos_sin(pos, head_dim, 10_000.0)  # [B, 1, Lq, D], aligned with k_new


def make_pos(kind: str, batch: int, n_new: int, max_len: int):
    if kind == "int":
        return max_len - n_new - 1
    if kind == "starts":  # the last row runs past L_max: its tail is skipped
        return torch.tensor([0, max_len - n_new, max_len - 1][:batch], dtype=torch.int32)
    g = torch.Generator().manual_seed(n_new)
    rows = torch.stack([torch.randperm(max_len, generator=g)[:n_new] for _ in range(batch)])
    rows[0, n_new // 2] = -1  # skipped
    return rows


CASES = [  # B, H_kv, L_max, D, Lq, pos kind, rope kind, cache dtype
    (1, 2, 40, 16, 1, "int", "none", torch.float32),
    (3, 2, 40, 16, 7, "starts", "slot", torch.float32),
    (3, 1, 96, 64, 32, "explicit", "row", torch.float32),
    (3, 2, 130, 64, 7, "explicit", "slot", torch.float16),
    (1, 2, 96, 16, 32, "starts", "row", torch.float16),
    (3, 2, 40, 64, 7, "int", "slot", torch.float16),
    (3, 2, 40, 16, 7, "explicit", "none", torch.bfloat16),  # bf16 storage passthrough
]


@pytest.mark.parametrize(("b", "h_kv", "max_len", "d", "n_new", "pos_kind", "rope", "dtype"),
                         CASES)
def test_kv_write_bitwise(b, h_kv, max_len, d, n_new, pos_kind, rope, dtype, device):
    g = torch.Generator().manual_seed(b * max_len + d)
    # layer 1 of a 3-layer cache whose D axis is padded: a stray write lands on FILL
    base = torch.full((3, b, h_kv, max_len, d + 8), FILL, dtype=dtype)
    base[1, ..., :d] = torch.randn(b, h_kv, max_len, d, generator=g).to(dtype)
    k_new = torch.randn(b, h_kv, n_new, d, generator=g)
    v_new = torch.randn(b, h_kv, n_new, d, generator=g)
    if dtype == torch.bfloat16:  # the interpreter's fp32 -> bf16 cast truncates: no casts
        k_new, v_new = k_new.to(dtype), v_new.to(dtype)
    pos = make_pos(pos_kind, b, n_new, max_len)
    cos, sin = rope_tables(rope, b, n_new, max_len, d)

    want_k, want_v = base.clone(), (base + 1).clone()
    reference.kv_write_(want_k[1, ..., :d], want_v[1, ..., :d], k_new, v_new, pos, cos, sin)
    got_k, got_v = base.clone().to(device), (base + 1).clone().to(device)
    moved = [t.to(device) if isinstance(t, torch.Tensor) else t
             for t in (k_new, v_new, pos, cos, sin)]
    kernels.kv_write_(got_k[1, ..., :d], got_v[1, ..., :d], *moved, impl="triton")
    assert torch.equal(got_k.cpu(), want_k) and torch.equal(got_v.cpu(), want_v)


def test_kv_write_matches_block_kv_cache_write(device):
    """Explicit slots agree with ``BlockKVCache.write`` (the lead's scatter)."""
    from dllm_decode.cache.kv import BlockKVCache

    cache = BlockKVCache(2, 2, 2, 40, 16)
    slots = torch.tensor([[3, 4, 9], [0, 38, 39]])
    k, v = torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16)
    cache.write(1, slots, k, v)
    k_c, v_c = torch.zeros(2, 2, 40, 16, device=device), torch.zeros(2, 2, 40, 16, device=device)
    kernels.kv_write_(k_c, v_c, k.to(device), v.to(device), slots.to(device), impl="triton")
    assert torch.equal(k_c.cpu(), cache.k[1]) and torch.equal(v_c.cpu(), cache.v[1])


def test_kv_write_argument_errors():
    k = torch.zeros(1, 2, 8, 6)
    new = torch.zeros(1, 2, 3, 6)
    with pytest.raises(ValueError, match="pos"):
        kernels.kv_write_(k, k.clone(), new, new, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="P >= L_max"):
        kernels.kv_write_(k, k.clone(), new, new, 0, torch.ones(4, 6), torch.ones(4, 6))
    with pytest.raises(ValueError, match="k_new"):
        kernels.kv_write_(k, k.clone(), torch.zeros(1, 1, 3, 6), new, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("pos_kind", ["int", "starts", "explicit"])
def test_kv_write_bf16_rope_on_gpu(pos_kind, device):
    """fp32 -> bf16 casts and RoPE on bf16 caches (the interpreter truncates these casts)."""
    b, h_kv, max_len, d, n_new = 3, 4, 300, 128, 32
    cache = torch.randn(b, h_kv, max_len, d).to(torch.bfloat16)
    k_new, v_new = torch.randn(b, h_kv, n_new, d), torch.randn(b, h_kv, n_new, d)
    pos = make_pos(pos_kind, b, n_new, max_len)
    cos, sin = rope_tables("slot", b, n_new, max_len, d)
    want_k, want_v = cache.clone(), cache.clone()
    reference.kv_write_(want_k, want_v, k_new, v_new, pos, cos, sin)
    got_k, got_v = cache.clone().to(device), cache.clone().to(device)
    moved = [t.to(device) if isinstance(t, torch.Tensor) else t
             for t in (k_new, v_new, pos, cos, sin)]
    kernels.kv_write_(got_k, got_v, *moved, impl="triton")
    assert torch.equal(got_k.cpu(), want_k) and torch.equal(got_v.cpu(), want_v)
