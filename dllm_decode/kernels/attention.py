"""Public attention-cache ops (``impl="auto" | "reference" | "triton"``, as every kernel op;
see ``dllm_decode.kernels`` for how ``impl`` resolves): the in-place K/V cache write and block
attention over a cache. References: ``kernels/reference.py``; Triton:
``kernels/triton/kv_write.py``, ``kernels/triton/attention.py``."""

from __future__ import annotations

from torch import Tensor

from dllm_decode.kernels import dispatch as _k
from dllm_decode.kernels import reference
from dllm_decode.kernels.common import AttentionOutput, check_attention, check_kv_write
from dllm_decode.types import Impl


def kv_write_(k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor, pos: int | Tensor,
              cos: Tensor | None = None, sin: Tensor | None = None, *,
              impl: Impl | str = Impl.AUTO) -> None:
    """In place: write ``k_new, v_new [B, H_kv, Lq, D]`` into ``k_cache, v_cache
    [B, H_kv, L_max, D]`` (one layer's views of ``BlockKVCache``), rotating K if asked.

    Args:
        pos: int (shared first row), int ``[B]`` first rows, or int ``[B, Lq]`` explicit rows;
            destinations outside ``[0, L_max)`` (``-1`` by convention) are skipped. Rows must
            be distinct within a sequence (duplicates race on GPU).
        cos, sin: optional fp32 rotate-half RoPE tables: ``[P, D]`` indexed by cache row
            (P >= L_max) or ``[B, Lq, D]`` / ``[B, 1, Lq, D]`` aligned with ``k_new`` (use this
            form when RoPE positions differ from cache rows, e.g. left padding).
        impl: see ``dllm_decode.kernels``.

    Values are cast to the cache dtype. Triton: bitwise equal to the reference (RoPE in fp32
    without FMA contraction); no host sync. Reference: a tensor ``pos`` syncs on CUDA.
    """
    check_kv_write(k_cache, v_cache, k_new, v_new, cos, sin)
    issue = _k._dtype_issue(k_cache, v_cache, k_new, v_new)
    if _k._choose(impl, k_cache.device, issue, "kv_write_", k_cache.dtype) is Impl.REFERENCE:
        reference.kv_write_(k_cache, v_cache, k_new, v_new, pos, cos, sin)
    else:
        _k._backend().kv_write_(k_cache, v_cache, k_new, v_new, pos, cos, sin)


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
    impl: Impl | str = Impl.AUTO,
) -> AttentionOutput:
    """Bidirectional attention of a query block over cached keys plus optional fresh keys.

    Args:
        q: ``[B, H, Lq, D]`` post-RoPE queries (fp32/fp16/bf16); ``H % H_kv == 0`` (GQA:
            query head h reads KV head ``h // (H / H_kv)``).
        k_cache, v_cache: ``[B, H_kv, L_max, D]`` one layer of ``BlockKVCache`` (post-RoPE K).
        kv_start, kv_end: int ``[B]``; every query sees cache rows ``[kv_start, kv_end)``
            (clamped to ``[0, L_max)``) ...
        kv_mask: ... that are also True in this optional bool ``[B, L_max]`` (non-contiguous
            windows, e.g. Window-Diffusion's decoded tokens + external window) ...
        q_start: ... except, when given, rows ``[q_start, q_start + Lq_new)``, which are
            replaced by the fresh source (their cache contents are ignored).
        k_new, v_new: optional fresh source ``[B, H_kv, Lq_new, D]``, attended *in addition*
            to the cache under ``new_mask``; not stored (call ``kv_write_`` for that).
        new_mask: bool ``[Lq, Lq_new]`` or ``[B, Lq, Lq_new]``, True = query sees fresh key;
            ``None`` = all visible.
        sm_scale: softmax scale, default ``1 / sqrt(D)``.
        return_lse: also return the fp32 ``[B, H, Lq]`` log-sum-exp.
        impl: see ``dllm_decode.kernels``.

    Returns: ``AttentionOutput(out [B, H, Lq, D] in q's dtype, lse or None)``. Rows with no
    visible key give 0 and ``lse = -inf``. Hidden cache rows never contribute, whatever they
    hold (NaN included). fp32 accumulation; no host sync.

    Patterns:
        * dual / prefix cache, refreshed block written first: ``kv_write_`` then attend with
          ``[kv_start, kv_end)`` = the whole canvas.
        * dual cache without storing: ``k_new`` = block K/V, ``q_start`` = block start.
        * block-causal (block diffusion): cache range = committed prefix ``[kv_start,
          block_start)``, ``k_new`` = current block, ``new_mask=None`` (bidirectional inside
          the block), no ``q_start``.
        * S2D2 "2L" verifier (store=False): queries = ``[draft block | mask copy]`` (Lq = 2K),
          ``k_new`` = their K/V, cache range = prefix, ``new_mask [2K, 2K]``: first half
          lower-triangular; second-half row j sees first-half keys ``< j`` and itself.
    """
    check_attention(q, k_cache, v_cache, kv_start, kv_end, k_new, v_new, q_start, new_mask,
                    kv_mask)
    issue = _k._dtype_issue(q, k_cache, v_cache, k_new, v_new)
    if issue is None and (k_cache.dtype != q.dtype or (k_new is not None and
                                                       k_new.dtype != q.dtype)):
        issue = "mixed query/key dtypes"
    kwargs = dict(k_new=k_new, v_new=v_new, q_start=q_start, new_mask=new_mask,
                  kv_mask=kv_mask, sm_scale=sm_scale, return_lse=return_lse)
    if _k._choose(impl, q.device, issue, "block_attention", q.dtype) is Impl.REFERENCE:
        return reference.block_attention(q, k_cache, v_cache, kv_start, kv_end, **kwargs)
    out, lse = _k._backend().block_attention(q, k_cache, v_cache, kv_start, kv_end, **kwargs)
    return AttentionOutput(out, lse)


__all__ = ["block_attention", "kv_write_"]
