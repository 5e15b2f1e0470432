"""Pieces shared by the torch reference and the Triton backend: argument checks, row layout,
position normalisation, result types and tile-size heuristics.

Nothing here launches a kernel or imports Triton; both backends import this module, neither
imports the other (reference first, optimised backends must not depend on it).
"""

from __future__ import annotations

from typing import Final, NamedTuple

import torch
from torch import Tensor

#: names of the float statistics of ``confidence_stats``, in the order the Triton kernel
#: packs them into its ``[len(STAT_NAMES), N]`` output buffer
STAT_NAMES: Final = ("lse", "p_max", "margin", "logit_margin", "neg_entropy")

#: elements per vocabulary tile (rows x columns); 4096 fp32 = 16 KiB of registers per program
VOCAB_TILE: Final = 4096
#: smaller tile when the Gumbel path is on: its fp64 noise doubles the live registers
VOCAB_TILE_SAMPLE: Final = 2048


class GumbelSample(NamedTuple):
    """Result of ``gumbel_sample``; every field is shaped like ``logits.shape[:-1]``.

    token: int64 sampled index (-1 on inactive rows). p_token: float32 probability of ``token``
    under the un-noised, untempered softmax. lse: float32 log-sum-exp of the raw logits.
    """

    token: Tensor
    p_token: Tensor
    lse: Tensor


class AttentionOutput(NamedTuple):
    """Result of ``block_attention``.

    out: ``[B, H, Lq, D]`` in the query dtype (rows that see no key are 0).
    lse: float32 ``[B, H, Lq]`` natural-log softmax normaliser (``-inf`` where no key is
    visible), or ``None`` unless ``return_lse=True``.
    """

    out: Tensor
    lse: Tensor | None


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``max(n, 1)``."""
    return 1 << max(int(n) - 1, 0).bit_length()


# --- vocabulary ops ---------------------------------------------------------------------------


def check_logits(logits: Tensor) -> None:
    if logits.ndim < 2:
        raise ValueError(f"logits must be [N, V] or [B, L, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if logits.shape[-1] == 0:
        raise ValueError("logits must have V >= 1")


def check_active(active: Tensor | None, logits: Tensor) -> None:
    if active is None:
        return
    if active.dtype != torch.bool or active.shape != logits.shape[:-1]:
        raise ValueError(f"active must be bool with shape {tuple(logits.shape[:-1])}, got "
                         f"{active.dtype} {tuple(active.shape)}")


def rows_view(logits: Tensor) -> tuple[Tensor, int, tuple[int, int, int]]:
    """Describe the rows of ``logits [..., V]`` without copying when possible.

    Returns ``(x, inner, (stride_outer, stride_inner, stride_v))`` such that row ``r`` of the
    flattened ``[N, V]`` view starts at ``(r // inner) * stride_outer + (r % inner) *
    stride_inner``. ``[N, V]`` and ``[B, L, V]`` inputs are never copied (any strides);
    more leading dimensions are reshaped to three (a copy only if they do not merge).
    """
    if logits.ndim == 2:
        return logits, max(logits.shape[0], 1), (0, logits.stride(0), logits.stride(1))
    x = logits if logits.ndim == 3 else logits.reshape(-1, *logits.shape[-2:])
    return x, max(x.shape[1], 1), (x.stride(0), x.stride(1), x.stride(2))


def vocab_blocks(n_rows: int, vocab: int, sample: bool) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_V, num_warps)`` for the vocabulary pass.

    Long rows stream one row per program in ``BLOCK_V`` chunks; short rows (small V) pack many
    rows into one program so that tiny vocabularies do not launch one program per row. Packed
    tiles are half as large: their 2-D layouts cost more registers (checked with ptxas -v).
    """
    tile = VOCAB_TILE_SAMPLE if sample else VOCAB_TILE
    block_v = min(next_pow2(vocab), tile)
    block_r = 1 if block_v == tile else max(1, min(tile // 2 // block_v, next_pow2(n_rows)))
    num_warps = 8 if block_r * block_v > 512 else 4
    return block_r, block_v, num_warps


def mask_inactive_stats(stats: dict[str, Tensor], active: Tensor | None) -> dict[str, Tensor]:
    """Inactive rows get token -1 and ``-inf`` float statistics (never selected)."""
    if active is None:
        return stats
    out = {}
    for name, value in stats.items():
        fill = -1 if name == "token" else -float("inf")
        out[name] = value.masked_fill(~active, fill)
    return out


# --- per-row random numbers (kernels/rng.py and the Triton vocabulary pass) ------------------

#: splitmix64's constants (unsigned 64-bit): the stream increment (golden ratio, odd) and the
#: two multipliers of its finalizer (Stafford's variant 13)
RNG_GAMMA: Final = 0x9E3779B97F4A7C15
RNG_M1: Final = 0xBF58476D1CE4E5B9
RNG_M2: Final = 0x94D049BB133111EB
#: added to ``counter * RNG_GAMMA`` by ``mix_seeds`` (any constant; keeps counter 0 off 0)
RNG_SALT: Final = 0x2545F4914F6CDD1D


def check_row_seeds(seeds: Tensor, rows: int | None = None) -> None:
    """``seeds`` must be ``[B]`` int64 (``B == rows`` when given)."""
    if not isinstance(seeds, Tensor) or seeds.dtype != torch.int64 or seeds.ndim != 1:
        got = (f"{seeds.dtype} {tuple(seeds.shape)}" if isinstance(seeds, Tensor)
               else type(seeds).__name__)
        raise ValueError(f"row seeds must be a [B] int64 tensor, got {got}")
    if rows is not None and seeds.shape[0] != rows:
        raise ValueError(f"row seeds must have one seed per batch row ({rows}), got "
                         f"{seeds.shape[0]}")


# --- kv_write ---------------------------------------------------------------------------------


def check_kv_write(k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor,
                   cos: Tensor | None, sin: Tensor | None) -> None:
    if k_cache.ndim != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [B, H_kv, L_max, D], got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    b, h_kv, _, d = k_cache.shape
    if k_new.ndim != 4 or k_new.shape != v_new.shape or k_new.shape[:2] != (b, h_kv) \
            or k_new.shape[3] != d:
        raise ValueError(f"k_new and v_new must be [B={b}, H_kv={h_kv}, Lq, D={d}], got "
                         f"{tuple(k_new.shape)} and {tuple(v_new.shape)}")
    if (cos is None) != (sin is None):
        raise ValueError("pass both cos and sin, or neither")
    if cos is not None:
        if d % 2:
            raise ValueError(f"rotate-half RoPE needs an even head dim, got D={d}")
        if cos.shape != sin.shape or cos.shape[-1] != d:
            raise ValueError(f"cos/sin must share a shape ending in D={d}, got "
                             f"{tuple(cos.shape)} and {tuple(sin.shape)}")
        rope_table(cos, b, k_new.shape[2], k_cache.shape[2])


def rope_table(cos: Tensor, batch: int, n_new: int, max_len: int) -> tuple[Tensor, bool]:
    """Normalise a RoPE table to ``([P, D], by_slot=True)`` or ``([B, Lq, D], by_slot=False)``.

    ``[P, D]`` (P >= L_max) is indexed by the destination cache row; ``[B, Lq, D]`` or the
    model's ``[B, 1, Lq, D]`` is aligned with the rows of ``k_new`` (use it when RoPE positions
    differ from cache rows, e.g. left-padded prompts).
    """
    if cos.ndim == 4 and cos.shape[1] == 1:
        cos = cos[:, 0]
    if cos.ndim == 2:
        if cos.shape[0] < max_len:
            raise ValueError(f"a [P, D] RoPE table needs P >= L_max={max_len}, got {cos.shape[0]}")
        return cos, True
    if cos.ndim == 3 and cos.shape[:2] == (batch, n_new):
        return cos, False
    raise ValueError(f"cos/sin must be [P, D], [B, Lq, D] or [B, 1, Lq, D], got "
                     f"{tuple(cos.shape)}")


def positions(pos: int | Tensor, batch: int, n_new: int, device: torch.device) -> Tensor:
    """Destination cache rows ``[B, Lq]`` int64 for each ``pos`` form (-1 = skip)."""
    steps = torch.arange(n_new, device=device)
    if isinstance(pos, int):
        return (pos + steps).expand(batch, n_new)
    if pos.ndim == 1 and pos.shape[0] == batch:
        return pos.long()[:, None] + steps
    if pos.ndim == 2 and pos.shape == (batch, n_new):
        return pos.long()
    raise ValueError(f"pos must be an int, [B={batch}] or [B={batch}, Lq={n_new}], got "
                     f"{tuple(pos.shape)}")


# --- block attention --------------------------------------------------------------------------


def check_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, kv_start: Tensor,
                    kv_end: Tensor, k_new: Tensor | None, v_new: Tensor | None,
                    q_start: Tensor | None, new_mask: Tensor | None,
                    kv_mask: Tensor | None) -> None:
    if q.ndim != 4 or k_cache.ndim != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"q must be [B, H, Lq, D] and caches [B, H_kv, L_max, D], got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    b, h, lq, d = q.shape
    h_kv, max_len = k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape[0] != b or k_cache.shape[3] != d or h % h_kv:
        raise ValueError(f"cache {tuple(k_cache.shape)} does not fit q {tuple(q.shape)} "
                         f"(same B and D, H % H_kv == 0)")
    for name, t in (("kv_start", kv_start), ("kv_end", kv_end), ("q_start", q_start)):
        if t is not None and (t.shape != (b,) or t.is_floating_point()):
            raise ValueError(f"{name} must be an integer [B={b}] tensor, got "
                             f"{t.dtype} {tuple(t.shape)}")
    if (k_new is None) != (v_new is None):
        raise ValueError("pass both k_new and v_new, or neither")
    if k_new is None and (q_start is not None or new_mask is not None):
        raise ValueError("q_start and new_mask need k_new/v_new")
    if k_new is not None:
        if k_new.ndim != 4 or k_new.shape != v_new.shape or k_new.shape[:2] != (b, h_kv) \
                or k_new.shape[3] != d:
            raise ValueError(f"k_new/v_new must be [B={b}, H_kv={h_kv}, Lq_new, D={d}], got "
                             f"{tuple(k_new.shape)} and {tuple(v_new.shape)}")
        n_new = k_new.shape[2]
        if new_mask is not None and (
                new_mask.dtype != torch.bool
                or new_mask.shape not in ((lq, n_new), (b, lq, n_new))):
            raise ValueError(f"new_mask must be bool [Lq, Lq_new] or [B, Lq, Lq_new] = "
                             f"[{b}, {lq}, {n_new}], got {new_mask.dtype} "
                             f"{tuple(new_mask.shape)}")
    if kv_mask is not None and (kv_mask.dtype != torch.bool or kv_mask.shape != (b, max_len)):
        raise ValueError(f"kv_mask must be bool [B={b}, L_max={max_len}], got "
                         f"{kv_mask.dtype} {tuple(kv_mask.shape)}")


def attention_blocks(q_len: int, head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_D, num_warps)`` for ``block_attention`` (no autotuning).

    BLOCK_N >= 16 and BLOCK_D >= 16 keep both ``tl.dot`` shapes legal on NVIDIA (K >= 16 for
    16-bit inputs); fp32 inputs use smaller key tiles so the fp32 operands fit in registers.
    """
    block_d = max(16, next_pow2(head_dim))
    block_m = min(64, max(16, next_pow2(q_len)))
    block_n = 64 if dtype != torch.float32 and block_d <= 64 else 32
    if block_d >= 256:
        block_n = 16
    num_warps = 8 if block_m * block_d >= 64 * 64 or block_d >= 128 else 4
    return block_m, block_n, block_d, num_warps


def kv_write_blocks(n_new: int, head_dim: int) -> tuple[int, int, int]:
    """``(BLOCK_T, BLOCK_D, num_warps)`` for ``kv_write_``: at most 2048 elements per tile
    (8 per thread), which keeps the RoPE variant free of spills."""
    block_d = next_pow2(head_dim)
    block_t = min(next_pow2(n_new), max(1, 2048 // block_d))
    return block_t, block_d, 8 if block_t * block_d >= 2048 else 4
