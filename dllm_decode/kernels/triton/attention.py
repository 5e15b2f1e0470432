"""Block attention over a per-sequence cache range plus an optional fresh key source.

Grid ``(B * H, cdiv(Lq, BLOCK_M))``. Each program holds a ``[BLOCK_M, D]`` query tile and runs
an online softmax (fp32 accumulators, ``exp2`` with the scale folded in) first over the cache
rows ``[kv_start, kv_end)`` in ``BLOCK_N`` tiles, then over the fresh ``k_new/v_new`` rows.
Cache rows that are hidden (outside the range, ``kv_mask`` False, or replaced by the fresh
source) are masked on the scores *and* zeroed on the V load, so their contents never matter.
Reads each visible cache row once per query head (no GQA head packing yet); no host sync.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from dllm_decode.kernels.common import attention_blocks
from dllm_decode.kernels.count import launch_range

_LOG2E = 1.4426950408889634


@triton.jit
def _softmax_tile(q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION: tl.constexpr):
    """Fold one key tile into the running ``(max, sum, acc)``; ``visible [BLOCK_M, BLOCK_N]``."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(visible, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    p = tl.exp2(s - safe[:, None])
    alpha = tl.exp2(m_i - safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _block_attention_kernel(
    q_ptr, k_ptr, v_ptr, kn_ptr, vn_ptr, o_ptr, lse_ptr,
    kv_start_ptr, kv_end_ptr, q_start_ptr, new_mask_ptr, kv_mask_ptr,
    qk_scale, H, GROUP, q_len, max_len, n_new, head_dim,
    s_qb, s_qh, s_qm,  # q [B, H, Lq, D] (unit stride on D for every tensor)
    s_kb, s_kh, s_kn,  # k_cache [B, H_kv, L_max, D]
    s_vb, s_vh, s_vn,
    s_knb, s_knh, s_knn,  # k_new [B, H_kv, Lq_new, D]
    s_vnb, s_vnh, s_vnn,
    s_ob, s_oh, s_om,  # out [B, H, Lq, D]
    s_lb, s_lh,  # lse [B, H, Lq]
    s_mb, s_mm, s_mn,  # new_mask [B | 1, Lq, Lq_new] (s_mb = 0 when shared)
    s_cb,  # kv_mask [B, L_max]
    HAS_NEW: tl.constexpr, HAS_Q_START: tl.constexpr, HAS_NEW_MASK: tl.constexpr,
    HAS_KV_MASK: tl.constexpr, RETURN_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs K >= 16 for 16-bit inputs on NVIDIA")
    tl.static_assert(BLOCK_D >= 16, "tl.dot needs K >= 16 for 16-bit inputs on NVIDIA")
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < head_dim
    b64 = b.to(tl.int64)

    q = tl.load(q_ptr + b64 * s_qb + h * s_qh + offs_m[:, None] * s_qm + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)

    # source 1: cache rows [lo, hi), minus the rows the fresh source replaces
    lo = tl.maximum(tl.load(kv_start_ptr + b).to(tl.int32), 0)
    hi = tl.minimum(tl.load(kv_end_ptr + b).to(tl.int32), max_len)
    if HAS_Q_START:
        fresh_lo = tl.load(q_start_ptr + b).to(tl.int32)
        fresh_hi = fresh_lo + n_new
    k_base = k_ptr + b64 * s_kb + hk * s_kh
    v_base = v_ptr + b64 * s_vb + hk * s_vh
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        in_range = n < hi
        keep = in_range
        if HAS_Q_START:
            keep &= (n < fresh_lo) | (n >= fresh_hi)
        if HAS_KV_MASK:
            keep &= tl.load(kv_mask_ptr + b64 * s_cb + n, mask=in_range, other=0) != 0
        k = tl.load(k_base + n[:, None] * s_kn + offs_d[None, :],
                    mask=in_range[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_base + n[:, None] * s_vn + offs_d[None, :],
                    mask=keep[:, None] & d_ok[None, :], other=0.0)
        visible = keep[None, :] & m_ok[:, None]
        m_i, l_i, acc = _softmax_tile(q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION)

    # source 2: fresh keys, visible under new_mask
    if HAS_NEW:
        kn_base = kn_ptr + b64 * s_knb + hk * s_knh
        vn_base = vn_ptr + b64 * s_vnb + hk * s_vnh
        for start in range(0, n_new, BLOCK_N):
            n = start + offs_n
            n_ok = n < n_new
            visible = n_ok[None, :] & m_ok[:, None]
            if HAS_NEW_MASK:
                allowed = tl.load(new_mask_ptr + b64 * s_mb + offs_m[:, None] * s_mm
                                  + n[None, :] * s_mn, mask=visible, other=0)
                visible &= allowed != 0
            kv_ok = n_ok[:, None] & d_ok[None, :]
            k = tl.load(kn_base + n[:, None] * s_knn + offs_d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(vn_base + n[:, None] * s_vnn + offs_d[None, :], mask=kv_ok, other=0.0)
            m_i, l_i, acc = _softmax_tile(q, k, v, visible, m_i, l_i, acc, qk_scale,
                                          DOT_PRECISION)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_ptr + b64 * s_ob + h * s_oh + offs_m[:, None] * s_om + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    if RETURN_LSE:
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # log2 units -> natural log
        tl.store(lse_ptr + b64 * s_lb + h * s_lh + offs_m, lse, mask=m_ok)


def _unit_d(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def launch_block_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_start: Tensor,
    kv_end: Tensor,
    out: Tensor,
    lse: Tensor | None,
    *,
    k_new: Tensor | None = None,
    v_new: Tensor | None = None,
    q_start: Tensor | None = None,
    new_mask: Tensor | None = None,
    kv_mask: Tensor | None = None,
    sm_scale: float | None = None,
) -> None:
    """Run the kernel into preallocated ``out [B, H, Lq, D]`` (q dtype, unit stride on D) and
    optional ``lse`` fp32 ``[B, H, Lq]`` (unit stride on Lq). Arguments as ``block_attention``;
    caches must have unit stride on D (they are never copied)."""
    b, h, q_len, head_dim = q.shape
    h_kv, max_len = k_cache.shape[1], k_cache.shape[2]
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache/v_cache need unit stride on D")
    if out.stride(-1) != 1 or (lse is not None and lse.stride(-1) != 1):
        raise ValueError("out needs unit stride on D and lse on Lq")
    if b * h * q_len == 0:
        return
    q = _unit_d(q)
    has_new = k_new is not None
    kn = _unit_d(k_new) if has_new else k_cache
    vn = _unit_d(v_new) if has_new else v_cache
    n_new = kn.shape[2] if has_new else 0
    mask3 = None
    if new_mask is not None:
        mask3 = new_mask if new_mask.ndim == 3 else new_mask[None]
        mask_strides = (mask3.stride(0) if new_mask.ndim == 3 else 0,
                        mask3.stride(1), mask3.stride(2))
    else:
        mask_strides = (0, 0, 0)
    block_m, block_n, block_d, num_warps = attention_blocks(q_len, head_dim, q.dtype)
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    lse_arg = lse if lse is not None else out
    grid = (b * h, triton.cdiv(q_len, block_m))
    with launch_range("block_attention"):
        _block_attention_kernel[grid](
            q, k_cache, v_cache, kn, vn, out, lse_arg,
            kv_start, kv_end, q_start if q_start is not None else kv_start,
            mask3 if mask3 is not None else kv_start, kv_mask if kv_mask is not None else kv_start,
            scale * _LOG2E, h, h // h_kv, q_len, max_len, n_new, head_dim,
            q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            kn.stride(0), kn.stride(1), kn.stride(2),
            vn.stride(0), vn.stride(1), vn.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            lse_arg.stride(0) if lse is not None else 0,
            lse_arg.stride(1) if lse is not None else 0,
            *mask_strides,
            kv_mask.stride(0) if kv_mask is not None else 0,
            HAS_NEW=has_new, HAS_Q_START=q_start is not None, HAS_NEW_MASK=mask3 is not None,
            HAS_KV_MASK=kv_mask is not None, RETURN_LSE=lse is not None,
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=num_warps,
        )


def block_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_start: Tensor,
    kv_end: Tensor,
    *,
    k_new: Tensor | None = None,
    v_new: Tensor | None = None,
    q_start: Tensor | None = None,
    new_mask: Tensor | None = None,
    kv_mask: Tensor | None = None,
    sm_scale: float | None = None,
    return_lse: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Allocate outputs and launch. ``out`` is a ``[B, H, Lq, D]`` view of a ``[B, Lq, H, D]``
    buffer, so ``out.transpose(1, 2).reshape(B, Lq, H * D)`` is free for the output projection."""
    b, h, q_len, head_dim = q.shape
    out = torch.empty(b, q_len, h, head_dim, dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty(b, h, q_len, dtype=torch.float32, device=q.device) if return_lse else None
    launch_block_attention(q, k_cache, v_cache, kv_start, kv_end, out, lse, k_new=k_new,
                           v_new=v_new, q_start=q_start, new_mask=new_mask, kv_mask=kv_mask,
                           sm_scale=sm_scale)
    return out, lse
