"""In-place scatter of fresh K/V rows into one layer's cache, with optional RoPE on K.

Grid ``(B * H_kv, cdiv(Lq, BLOCK_T))``; each program moves a ``[BLOCK_T, D]`` tile of K and V.
Rows whose destination is outside ``[0, L_max)`` (``-1`` by convention) are skipped. RoPE is
the rotate-half form ``k * cos + rotate_half(k) * sin`` in fp32, launched without FMA
contraction so the result is bitwise equal to the torch reference.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from dllm_decode.kernels.common import kv_write_blocks, rope_table
from dllm_decode.kernels.count import launch_range

#: how ``pos`` is given (constexpr ``POS_MODE``): shared int start, ``[B]`` starts, ``[B, Lq]``
POS_SCALAR, POS_STARTS, POS_EXPLICIT = 0, 1, 2
#: RoPE table layout (constexpr ``ROPE``): off, ``[P, D]`` by cache row, ``[B, Lq, D]`` by row
ROPE_OFF, ROPE_BY_SLOT, ROPE_BY_ROW = 0, 1, 2


@triton.jit
def _kv_write_kernel(
    kc_ptr, vc_ptr, kn_ptr, vn_ptr, pos_ptr, cos_ptr, sin_ptr,
    pos0, H_kv, n_new, max_len, head_dim,
    s_kcb, s_kch, s_kcn,  # k_cache [B, H_kv, L_max, D] (unit stride on D everywhere)
    s_vcb, s_vch, s_vcn,
    s_knb, s_knh, s_knt,  # k_new [B, H_kv, Lq, D]
    s_vnb, s_vnh, s_vnt,
    s_pb, s_pt,  # pos [B] or [B, Lq]
    s_rb, s_rt,  # cos/sin: [P, D] (s_rb = 0, s_rt = row stride) or [B, Lq, D]
    POS_MODE: tl.constexpr, ROPE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = (pid_bh // H_kv).to(tl.int64)
    hk = pid_bh % H_kv
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < n_new
    d_ok = d < head_dim
    if POS_MODE == 0:
        slot = (pos0 + t).to(tl.int64)
    elif POS_MODE == 1:
        slot = tl.load(pos_ptr + b * s_pb).to(tl.int64) + t
    else:
        slot = tl.load(pos_ptr + b * s_pb + t * s_pt, mask=t_ok, other=-1).to(tl.int64)
    row_ok = t_ok & (slot >= 0) & (slot < max_len)
    ok = row_ok[:, None] & d_ok[None, :]

    k_src = kn_ptr + b * s_knb + hk * s_knh + t[:, None] * s_knt
    k = tl.load(k_src + d[None, :], mask=ok, other=0.0)
    v = tl.load(vn_ptr + b * s_vnb + hk * s_vnh + t[:, None] * s_vnt + d[None, :], mask=ok,
                other=0.0)
    if ROPE != 0:
        half = head_dim // 2
        partner = tl.where(d < half, d + half, d - half)
        sign = tl.where(d < half, -1.0, 1.0)
        k_pair = tl.load(k_src + partner[None, :], mask=ok, other=0.0).to(tl.float32)
        if ROPE == 1:
            r_off = tl.where(row_ok, slot, 0)[:, None] * s_rt + d[None, :]
        else:
            r_off = b * s_rb + t[:, None] * s_rt + d[None, :]
        cos = tl.load(cos_ptr + r_off, mask=ok, other=0.0)
        sin = tl.load(sin_ptr + r_off, mask=ok, other=0.0)
        k = k.to(tl.float32) * cos + (sign[None, :] * k_pair) * sin
    dst = slot[:, None]
    tl.store(kc_ptr + b * s_kcb + hk * s_kch + dst * s_kcn + d[None, :],
             k.to(kc_ptr.dtype.element_ty), mask=ok)
    tl.store(vc_ptr + b * s_vcb + hk * s_vch + dst * s_vcn + d[None, :],
             v.to(vc_ptr.dtype.element_ty), mask=ok)


def kv_write_(
    k_cache: Tensor,
    v_cache: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    pos: int | Tensor,
    cos: Tensor | None = None,
    sin: Tensor | None = None,
) -> None:
    """Launch the scatter (arguments as ``kernels.kv_write_``; checked by the caller).

    Caches need unit stride on D (never copied); fresh tensors are made so if needed.
    """
    b, h_kv, n_new, head_dim = k_new.shape
    max_len = k_cache.shape[2]
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache/v_cache need unit stride on D")
    if b * h_kv * n_new == 0:
        return
    kn = k_new if k_new.stride(-1) == 1 else k_new.contiguous()
    vn = v_new if v_new.stride(-1) == 1 else v_new.contiguous()
    if isinstance(pos, int):
        mode, pos_t, pos0, s_p = POS_SCALAR, k_cache, pos, (0, 0)
    else:
        mode = POS_STARTS if pos.ndim == 1 else POS_EXPLICIT
        pos_t, pos0 = pos, 0
        s_p = (pos.stride(0), pos.stride(1) if pos.ndim == 2 else 0)
    rope, cos_t, sin_t, s_r = ROPE_OFF, k_cache, k_cache, (0, 0)
    if cos is not None:
        cos_t, by_slot = rope_table(cos.float(), b, n_new, max_len)
        sin_t, _ = rope_table(sin.float(), b, n_new, max_len)
        cos_t, sin_t = cos_t.contiguous(), sin_t.contiguous()
        rope = ROPE_BY_SLOT if by_slot else ROPE_BY_ROW
        s_r = (0, cos_t.stride(0)) if by_slot else (cos_t.stride(0), cos_t.stride(1))
    block_t, block_d, num_warps = kv_write_blocks(n_new, head_dim)
    grid = (b * h_kv, triton.cdiv(n_new, block_t))
    with launch_range("kv_write"):
        _kv_write_kernel[grid](
            k_cache, v_cache, kn, vn, pos_t, cos_t, sin_t,
            pos0, h_kv, n_new, max_len, head_dim,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            kn.stride(0), kn.stride(1), kn.stride(2),
            vn.stride(0), vn.stride(1), vn.stride(2),
            *s_p, *s_r,
            POS_MODE=mode, ROPE=rope, BLOCK_T=block_t, BLOCK_D=block_d,
            num_warps=num_warps, enable_fp_fusion=False,
        )

