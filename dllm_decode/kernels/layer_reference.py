"""Torch references of the fused decoder-layer ops: the oracle and the CPU path.

A decoder layer runs its projections as two fused GEMMs (``[q | k | v] = x @ W_qkv^T``,
``[gate | up] = x @ W_gu^T``); these ops work on their outputs in place or in one pass:

* ``qkv_rope``: per-head RMSNorm of q and k (when the family has it) and rotate-half RoPE of
  q and k of the ``[B, N, (H + 2 H_kv) D]`` GEMM output, and optionally the K/V rows written
  to the cache at ``slots``.
* ``silu_mul``: ``silu(gate) * up`` of the ``[..., 2 I]`` gate/up GEMM output.

Each stays a few torch ops (3 for RoPE, 2 for the cache write, 3 for the q/k norm, 2 for
SwiGLU), so the reference path of a layer launches 14 kernels (17 with q/k norm); the Triton
twins (``kernels/triton/layer.py``) do each op in one launch. Math is the decoder's: RMSNorm
``w * (x * rsqrt(mean(x^2) + eps)).to(dtype)`` (fp32 statistics), RoPE in fp32 with the
model-dtype result (``models.functional.apply_rope``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """positions ``[B, N]`` -> cos, sin ``[B, 1, N, D]`` in fp32 (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, N, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos(), emb.sin()


class RopeRows(NamedTuple):
    """RoPE tables of one forward in the layout the fused ops read, built once per forward.

    ``cos [B, N, 1, D]`` fp32 and ``sin [B, N, 1, D]`` fp32 with the first half negated, so
    that ``rope(x) = x * cos + roll(x, D/2) * sin`` (the rotate-half form of ``apply_rope``:
    ``(-x2) * s == x2 * (-s)`` exactly).
    """

    cos: Tensor
    sin: Tensor


def rope_rows(cos: Tensor, sin: Tensor) -> RopeRows:
    """``rope_cos_sin``'s ``cos, sin [B, 1, N, D]`` -> ``RopeRows`` (2 kernels, per forward)."""
    half = cos.shape[-1] // 2
    c = cos.transpose(1, 2)
    s = sin.transpose(1, 2)
    return RopeRows(c, torch.cat((-s[..., :half], s[..., half:]), dim=-1))


def split_qkv(qkv: Tensor, heads: int, kv_heads: int, head_dim: int
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Views ``q [B, N, H, D]``, ``k, v [B, N, H_kv, D]`` of the ``[B, N, (H + 2 H_kv) D]``
    fused projection output (no copy)."""
    b, n, _ = qkv.shape
    heads_all = qkv.view(b, n, heads + 2 * kv_heads, head_dim)
    return (heads_all[:, :, :heads], heads_all[:, :, heads:heads + kv_heads],
            heads_all[:, :, heads + kv_heads:])


def qkv_rope(qkv: Tensor, rope: RopeRows, heads: int, kv_heads: int, head_dim: int, *,
             q_norm: Tensor | None = None, k_norm: Tensor | None = None, eps: float = 0.0,
             k_cache: Tensor | None = None, v_cache: Tensor | None = None,
             slots: Tensor | None = None) -> Tensor:
    """q and k of ``qkv [B, N, (H + 2 H_kv) D]`` normalised (if ``q_norm``) and rotated ->
    ``[B, N, H + H_kv, D]`` (a new tensor here; differentiable); with ``k_cache``, the rotated
    K and the V rows also go to the cache.

    Args:
        qkv: the fused projection output (last dim contiguous), model dtype.
        rope: ``rope_rows`` of the fed positions.
        q_norm, k_norm: optional per-head RMSNorm weights ``[D]`` (Qwen3 / SDAR), ``eps``.
        k_cache, v_cache: optional ``[B, H_kv, L_max, D]`` (one layer of ``BlockKVCache``).
        slots: int ``[B, N]`` cache rows of the fed tokens (distinct within a row).
    """
    b, n, _ = qkv.shape
    hq = heads + kv_heads
    x = qkv.view(b, n, heads + 2 * kv_heads, head_dim)[:, :, :hq]
    if q_norm is not None:
        w = torch.cat((q_norm.expand(heads, head_dim), k_norm.expand(kv_heads, head_dim)))
        x = F.rms_norm(x, (head_dim,), eps=eps) * w
    # fp32 math (the tables are fp32), one rounding to the model dtype on the way out
    out = torch.empty(x.shape, dtype=qkv.dtype, device=qkv.device)
    if torch.is_grad_enabled() and x.requires_grad:  # out= does not differentiate
        out = torch.addcmul(x * rope.cos, x.roll(head_dim // 2, -1), rope.sin).to(qkv.dtype)
    else:
        torch.addcmul(x * rope.cos, x.roll(head_dim // 2, -1), rope.sin, out=out)
    if k_cache is not None:
        k = out[:, :, heads:]
        v = split_qkv(qkv, heads, kv_heads, head_dim)[2]
        idx = slots[:, None, :, None].expand(-1, kv_heads, -1, head_dim)
        k_cache.scatter_(2, idx, k.transpose(1, 2))
        v_cache.scatter_(2, idx, v.transpose(1, 2))
    return out


def silu_mul(gate_up: Tensor) -> Tensor:
    """``gate_up [..., 2 I]`` (gate first) -> ``silu(gate) * up [..., I]`` (SwiGLU)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
