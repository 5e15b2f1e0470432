"""Stateless tensor helpers of the decoder (``models/base.py``): RoPE tables and rotation,
and the block-causal attention mask."""

from __future__ import annotations

import torch
from torch import Tensor


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """positions ``[B, N]`` -> cos, sin ``[B, 1, N, D]`` in fp32 (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, N, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [B, H, N, D]`` in fp32 and cast back."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def block_causal_mask(q_pos: Tensor, k_pos: Tensor, block_size: int) -> Tensor:
    """``[B, Nq]``, ``[B, Nk]`` absolute positions -> ``[B, Nq, Nk]`` bool.

    Query at position i sees key j iff ``j // block_size <= i // block_size``: bidirectional
    inside a block, causal across blocks, blocks aligned to absolute positions. Block size 1
    is a plain causal mask.
    """
    return (k_pos[:, None, :] // block_size) <= (q_pos[:, :, None] // block_size)
