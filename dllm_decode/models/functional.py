"""Stateless tensor helpers of the decoders (``models/base.py``, ``models/fused.py``,
``models/moe_decoder.py``): RoPE rotation and the attention core shared by every attention
module (cache read/write, SDPA, the kernel path). The RoPE tables (``rope_cos_sin``) live with
the kernels that read them (``kernels.layer_reference``) and the block-causal mask with the
attention reference (``kernels.reference``); both are re-exported here."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode import kernels
from dllm_decode.kernels.layer_reference import rope_cos_sin  # noqa: F401 (re-exported)
from dllm_decode.kernels.reference import block_causal_mask  # noqa: F401 (re-exported)
from dllm_decode.types import Impl

if TYPE_CHECKING:
    from dllm_decode.cache.kv import BlockKVCache


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [B, H, N, D]`` in fp32 and cast back."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def qkv_heads(attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``x [B, N, hidden]`` -> q ``[B, H, N, D]``, k, v ``[B, H_kv, N, D]`` before RoPE, by
    ``attn``'s projections: one fused head-major ``qkv_proj`` (``[Q heads | K heads | V
    heads]``) or ``q_proj`` / ``k_proj`` / ``v_proj``, then the per-head ``q_norm`` /
    ``k_norm`` when ``attn.spec.qk_norm``."""
    s = attn.spec
    b, n, _ = x.shape
    if hasattr(attn, "qkv_proj"):
        q, k, v = attn.qkv_proj(x).view(b, n, s.num_heads + 2 * s.num_kv_heads,
                                        s.head_dim).split(
            [s.num_heads, s.num_kv_heads, s.num_kv_heads], dim=2)
    else:
        q = attn.q_proj(x).view(b, n, s.num_heads, s.head_dim)
        k = attn.k_proj(x).view(b, n, s.num_kv_heads, s.head_dim)
        v = attn.v_proj(x).view(b, n, s.num_kv_heads, s.head_dim)
    if s.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H*, N, D]


def cached_kv(cache: BlockKVCache | None, layer: int, slots: Tensor, k: Tensor, v: Tensor,
              store: bool) -> tuple[Tensor, Tensor]:
    """The keys/values a forward attends to: fresh ``k, v [B, H_kv, N, D]`` alone without a
    cache; with one, written at ``slots [B, N]`` and the whole cache layer read back
    (``store``), or appended after the cache layer without writing (``store=False``)."""
    if cache is None:
        return k, v
    if store:
        cache.write(layer, slots, k, v)
        return cache.layer(layer)
    ck, cv = cache.layer(layer)
    return torch.cat((ck, k), dim=2), torch.cat((cv, v), dim=2)


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """SDPA of ``q [B, H, N, D]`` over ``k, v [B, H_kv, Lk, D]`` (GQA when ``H != H_kv``),
    scale ``1/sqrt(D)`` -> ``[B, H, N, D]``.

    mask: bool ``[B, N, Lk]``, a key mask ``[B, Lk]`` shared by every query, or ``None``
    (all visible).
    """
    attn_mask = None
    if mask is not None:
        attn_mask = mask[:, None, None, :] if mask.dim() == 2 else mask[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                          scale=1.0 / math.sqrt(q.shape[-1]),
                                          enable_gqa=q.shape[1] != k.shape[1])


def kernel_attention(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                     slots: Tensor, mask: Tensor | None, impl: Impl) -> Tensor:
    """The kernel path of a cached forward that stores its K/V: ``kernels.kv_write_`` of
    ``k, v [B, H_kv, N, D]`` at ``slots [B, N]`` into one cache layer ``[B, H_kv, L, D]``, then
    ``kernels.block_attention`` of ``q [B, H, N, D]`` over the whole layer under the key mask
    ``mask [B, L]`` (or none) -> ``[B, H, N, D]``."""

    kernels.kv_write_(k_cache, v_cache, k, v, slots, impl=impl)
    full = torch.full((q.shape[0],), k_cache.shape[2], dtype=torch.int32, device=q.device)
    return kernels.block_attention(q, k_cache, v_cache, torch.zeros_like(full), full,
                                   kv_mask=mask, sm_scale=1.0 / math.sqrt(q.shape[-1]),
                                   impl=impl).out


def attention_probs(q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax attention probabilities of ``q [B, H, N, D]`` over ``k [B, H_kv, Lk, D]``
    (GQA: keys repeated per head group), scale ``1/sqrt(D)``, averaged over the heads ->
    ``[B, N, Lk]`` in ``q``'s dtype (``mask`` as ``sdpa``'s; hidden keys get probability 0).
    What SDPA computes and never materialises; DAWN's attention maps
    (``models.attention_maps``)."""
    if q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        keep = mask[:, None, None, :] if mask.dim() == 2 else mask[:, None]
        scores = scores.masked_fill(~keep, -torch.inf)
    return torch.softmax(scores, dim=-1).mean(dim=1)
