"""Fused decoder-layer kernels: q/k norm + RoPE (+ the K/V cache write) and SwiGLU.

``qkv_rope_``: grid ``(B * N, cdiv(heads, BLOCK_H))``: a program takes ``BLOCK_H`` heads of
one token's row of the fused projection output as a ``[BLOCK_H, BLOCK_HALF]`` tile per half
of the head dim (tiles of at most 512 elements: no register spills at head dim 128). q and
k heads: optional RMSNorm (fp32 statistics, model-dtype result times the weight),
rotate-half RoPE in fp32, stored in place; k and v heads are also written to the cache row
``slots[b, n]`` when asked. Launched without FMA contraction (fp32 results agree with the
torch reference, ``kernels/layer_reference.py``, within an ulp or two: torch's CPU
``addcmul`` may fuse its multiply-add).

``silu_mul``: grid ``(rows, cdiv(I, BLOCK))``, ``silu(gate) * up`` in fp32, stored in the
input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dllm_decode.kernels.count import launch_range


@triton.jit
def _qkv_rope_kernel(
    x_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, kc_ptr, vc_ptr, slot_ptr,
    n_tok, H, H_kv, half, eps,
    s_xb, s_xn,  # qkv [B, N, (H + 2 H_kv) D], unit stride inside a row
    s_rb, s_rn,  # cos / sin [B, N, 1, D]
    s_kb, s_kh, s_kl,  # k_cache [B, H_kv, L_max, D]
    s_vb, s_vh, s_vl,
    s_sb, s_sn, max_len,  # slots [B, N]
    NORM: tl.constexpr, WRITE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0)
    b = (row // n_tok).to(tl.int64)
    n = (row % n_tok).to(tl.int64)
    hd = 2 * half
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_HALF)[None, :]
    d_ok = d < half
    hk = H + H_kv
    rot = (h < hk) & d_ok  # q and k heads
    base = x_ptr + b * s_xb + n * s_xn + h * hd + d
    x1 = tl.load(base, mask=rot, other=0.0)
    x2 = tl.load(base + half, mask=rot, other=0.0)
    dtype = x1.dtype
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    if NORM:
        ms = (tl.sum(a1 * a1, axis=1) + tl.sum(a2 * a2, axis=1)) / hd
        r = (1.0 / tl.sqrt(ms + eps))[:, None]
        is_q = h < H
        w1 = tl.where(is_q, tl.load(qw_ptr + d, mask=d_ok, other=0.0),
                      tl.load(kw_ptr + d, mask=d_ok, other=0.0)).to(tl.float32)
        w2 = tl.where(is_q, tl.load(qw_ptr + half + d, mask=d_ok, other=0.0),
                      tl.load(kw_ptr + half + d, mask=d_ok, other=0.0)).to(tl.float32)
        a1 = ((a1 * r).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        a2 = ((a2 * r).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    rb = cos_ptr + b * s_rb + n * s_rn + d
    c1 = tl.load(rb, mask=d_ok, other=0.0)
    c2 = tl.load(rb + half, mask=d_ok, other=0.0)
    sb = sin_ptr + b * s_rb + n * s_rn + d
    s1 = tl.load(sb, mask=d_ok, other=0.0)
    s2 = tl.load(sb + half, mask=d_ok, other=0.0)
    o1 = (a1 * c1 + a2 * s1).to(dtype)
    o2 = (a2 * c2 + a1 * s2).to(dtype)
    tl.store(base, o1, mask=rot)
    tl.store(base + half, o2, mask=rot)
    if WRITE:
        slot = tl.zeros([BLOCK_H, 1], dtype=tl.int64) + tl.load(slot_ptr + b * s_sb + n * s_sn)
        ok = (slot >= 0) & (slot < max_len)  # rows outside the cache are skipped
        is_k = (h >= H) & (h < hk) & d_ok & ok
        kd = kc_ptr + b * s_kb + (h - H) * s_kh + slot * s_kl + d
        tl.store(kd, o1, mask=is_k)
        tl.store(kd + half, o2, mask=is_k)
        is_v = (h >= hk) & (h < hk + H_kv) & d_ok & ok
        v1 = tl.load(base, mask=is_v, other=0.0)
        v2 = tl.load(base + half, mask=is_v, other=0.0)
        vd = vc_ptr + b * s_vb + (h - hk) * s_vh + slot * s_vl + d
        tl.store(vd, v1, mask=is_v)
        tl.store(vd + half, v2, mask=is_v)


def layer_blocks(heads: int, head_dim: int) -> tuple[int, int, int]:
    """``(BLOCK_H, BLOCK_HALF, num_warps)`` of ``_qkv_rope_kernel`` for ``heads`` heads (q + k,
    + v when writing the cache): tiles of at most 512 elements (8 heads at head dim 128, the
    whole row of a tiny model), 4 warps."""
    block_half = triton.next_power_of_2(head_dim // 2)
    block_h = min(triton.next_power_of_2(heads), max(1, 512 // block_half))
    return block_h, block_half, 4


def qkv_rope_(qkv: Tensor, cos: Tensor, sin: Tensor, heads: int, kv_heads: int, head_dim: int,
              q_norm: Tensor | None, k_norm: Tensor | None, eps: float,
              k_cache: Tensor | None, v_cache: Tensor | None, slots: Tensor | None) -> None:
    """See ``kernels.qkv_rope_``; ``cos, sin`` are ``RopeRows`` fields ``[B, N, 1, D]``."""
    b, n, _ = qkv.shape
    cos, sin = cos.float(), sin.float()
    if cos.stride(-1) != 1 or sin.stride(-1) != 1 or sin.stride()[:2] != cos.stride()[:2]:
        cos, sin = cos.contiguous(), sin.contiguous()
    write = k_cache is not None
    all_heads = heads + (2 if write else 1) * kv_heads
    block_h, block_half, warps = layer_blocks(all_heads, head_dim)
    norm = q_norm is not None
    kc, vc = (k_cache, v_cache) if write else (qkv, qkv)
    sl = slots if write else qkv
    grid = (b * n, triton.cdiv(all_heads, block_h))
    with launch_range("qkv_rope"):
        _qkv_rope_kernel[grid](
            qkv, cos, sin, q_norm if norm else cos, k_norm if norm else cos, kc, vc, sl,
            n, heads, kv_heads, head_dim // 2, float(eps),
            qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1),
            *(kc.stride()[:3] if write else (0, 0, 0)),
            *(vc.stride()[:3] if write else (0, 0, 0)),
            *(sl.stride() if write else (0, 0)), k_cache.shape[2] if write else 0,
            NORM=norm, WRITE=write, BLOCK_H=block_h, BLOCK_HALF=block_half, num_warps=warps,
            enable_fp_fusion=False,
        )


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, inter, s_x, s_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < inter
    g = tl.load(x_ptr + row * s_x + c, mask=ok, other=0.0)
    u = tl.load(x_ptr + row * s_x + inter + c, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    tl.store(out_ptr + row * s_o + c, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype),
             mask=ok)


def silu_mul(gate_up: Tensor) -> Tensor:
    """See ``kernels.silu_mul``."""
    inter = gate_up.shape[-1] // 2
    x = gate_up.reshape(-1, gate_up.shape[-1])
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    grid = (x.shape[0], triton.cdiv(inter, block))
    with launch_range("silu_mul"):
        _silu_mul_kernel[grid](x, out, inter, x.stride(0), inter, BLOCK=block)
    return out
