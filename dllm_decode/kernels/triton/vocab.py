"""One streaming pass over the vocabulary: confidence statistics and Gumbel-max sampling.

Per row of ``logits [N, V]`` the kernel walks V in ``BLOCK_V`` chunks and keeps, in fp32,
the running max ``m``, ``s = sum exp(x - m)``, ``w = sum exp(x - m) * (x - m)``, the second
largest logit (with multiplicity) and the argmax; every chunk rescales them by
``exp(m_old - m_new)``. At the end ``lse = m + log s``, ``p_max = 1 / s``,
``margin = (1 - exp(m2 - m)) / s`` and ``sum p log p = w / s - log s``. The optional Gumbel
path adds, in fp64, ``score = z - T * log(E)`` with ``E ~ Exp(1)`` and keeps the best score;
``E`` comes from Philox (one seed), a supplied uniform tensor, or per-row seeds hashed in-kernel
(``kernels/rng.py``: splitmix64, the same bits as ``row_uniform``; no ``[N, V]`` tensor).

Reads V once per row; writes ``O(N)``. Short rows (small V) are packed ``BLOCK_R`` to a
program. Ties go to the lowest index (``tl.argmax`` tie-break left, strict ``>`` across chunks).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dllm_decode.kernels.common import STAT_NAMES, rows_view, vocab_blocks
from dllm_decode.kernels.count import launch_range
from dllm_decode.kernels.triton.rng import _row_start, _row_uniform

#: noise sources of the sampling path (constexpr ``NOISE``)
NOISE_OFF, NOISE_PHILOX, NOISE_TENSOR, NOISE_ROWS = 0, 1, 2, 3
#: rows of the packed float output: ``STAT_NAMES`` then the sampled token's probability
N_OUT = len(STAT_NAMES) + 1


@triton.jit
def _exp1_from_philox(seed, counter):
    """Exp(1) variates in fp64 from 64 Philox bits per element (both tails kept).

    ``u = (X + 0.5) / 2**64`` and ``1 - u`` are formed from the 64-bit integer and its
    complement so each is exact where it is small: ``E = -log(u)`` for ``u < 1/2`` and
    ``E = -log1p(-(1 - u))`` otherwise (log1p via Goldberg's ``log(y) * x / (y - 1)``).
    """
    hi, lo, _, _ = tl.randint4x(seed, counter)
    two32 = 4294967296.0
    inv64 = 5.421010862427522e-20  # 2**-64
    u = (hi.to(tl.float64) * two32 + lo.to(tl.float64) + 0.5) * inv64
    c = ((~hi).to(tl.float64) * two32 + (~lo).to(tl.float64) + 0.5) * inv64
    y = 1.0 - c
    den = tl.where(y == 1.0, 1.0, y - 1.0)
    log1p_neg_c = tl.where(y == 1.0, -c, tl.log(y) * (-c) / den)
    return tl.where((hi >> 31) == 1, -log1p_neg_c, -tl.log(u))


@triton.jit
def _vocab_kernel(
    x_ptr,  # logits, row r at (r // inner) * stride_xo + (r % inner) * stride_xi
    active_ptr,  # bool [N] (read only when HAS_ACTIVE)
    noise_ptr,  # fp64 uniform [N, V] (read only when NOISE == NOISE_TENSOR)
    seed_ptr,  # int64 [1] Philox seed (NOISE_PHILOX) or [N // seed_inner] row seeds (ROWS)
    token_ptr,  # int64 [N] argmax token
    sample_ptr,  # int64 [N] sampled token (written only when NOISE != NOISE_OFF)
    out_ptr,  # fp32 [N_OUT, N] with row stride stride_out: lse, p_max, margin, ..., p_sample
    n_rows, vocab, inner, stride_xo, stride_xi, stride_xv, stride_nr, stride_nv, stride_out,
    temperature, offset, seed_inner,
    HAS_ACTIVE: tl.constexpr, STATS: tl.constexpr, NOISE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    if HAS_ACTIVE:
        row_ok &= tl.load(active_ptr + rows, mask=row_ok, other=0) != 0
    rows64 = rows.to(tl.int64)
    x_row = x_ptr + (rows64 // inner) * stride_xo + (rows64 % inner) * stride_xi
    cols0 = tl.arange(0, BLOCK_V)

    m = tl.full((BLOCK_R,), -float("inf"), tl.float32)
    s = tl.zeros((BLOCK_R,), tl.float32)
    w = tl.zeros((BLOCK_R,), tl.float32)
    m2 = tl.full((BLOCK_R,), -float("inf"), tl.float32)
    arg = tl.zeros((BLOCK_R,), tl.int32)
    best = tl.full((BLOCK_R,), -float("inf"), tl.float64)
    best_i = tl.zeros((BLOCK_R,), tl.int32)
    best_z = tl.full((BLOCK_R,), -float("inf"), tl.float32)
    if NOISE == 1:
        seed = tl.load(seed_ptr)
    if NOISE == 3:  # per-row seeds: row r is element (r % seed_inner) of seed r // seed_inner
        seed = tl.load(seed_ptr + rows64 // seed_inner, mask=rows < n_rows, other=0)
        start = _row_start(seed, (rows64 % seed_inner) * vocab)  # this row's first element

    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + cols0
        ok = row_ok[:, None] & (cols < vocab)[None, :]
        x = tl.load(x_row[:, None] + cols[None, :] * stride_xv, mask=ok, other=-float("inf"))
        x = x.to(tl.float32)
        # argmax / max / second max (with multiplicity) of this chunk
        bm = tl.max(x, axis=1)
        bi = tl.argmax(x, axis=1, tie_break_left=True)
        arg = tl.where(bm > m, bi + v0, arg)
        m_new = tl.maximum(m, bm)
        safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m - safe)
        p = tl.exp(x - safe[:, None])
        if STATS:
            is_bi = cols0[None, :] == bi[:, None]
            b2 = tl.max(tl.where(is_bi, -float("inf"), x), axis=1)
            m2 = tl.maximum(tl.minimum(m, bm), tl.maximum(m2, b2))
            # w is kept relative to the running max: shift it along with m
            shift = tl.where(m == -float("inf"), 0.0, (m - safe) * s)
            px = tl.where(p > 0, p * (x - safe[:, None]), 0.0)
            w = alpha * (w + shift) + tl.sum(px, axis=1)
        s = s * alpha + tl.sum(p, axis=1)
        m = m_new
        if NOISE != 0:
            if NOISE == 1:
                counter = offset + rows64[:, None] * vocab + cols[None, :]
                e = _exp1_from_philox(seed, counter)
            elif NOISE == 3:
                e = -tl.log(_row_uniform(start[:, None], cols[None, :]))
            else:
                u = tl.load(noise_ptr + rows64[:, None] * stride_nr + cols[None, :] * stride_nv,
                            mask=ok, other=0.5)
                e = -tl.log(u)
            score = x.to(tl.float64) - temperature * tl.log(e)
            score = tl.where(ok, score, -float("inf"))
            bs = tl.max(score, axis=1)
            bsi = tl.argmax(score, axis=1, tie_break_left=True)
            bz = tl.max(tl.where(cols0[None, :] == bsi[:, None], x, -float("inf")), axis=1)
            better = bs > best
            best_z = tl.where(better, bz, best_z)
            best_i = tl.where(better, bsi + v0, best_i)
            best = tl.maximum(best, bs)

    ninf = -float("inf")
    log_s = tl.log(s)
    lse = m + log_s
    tl.store(token_ptr + rows, tl.where(row_ok, arg.to(tl.int64), -1), mask=rows < n_rows)
    tl.store(out_ptr + rows, tl.where(row_ok, lse, ninf), mask=rows < n_rows)
    if STATS:
        p_max = 1.0 / s
        margin = (1.0 - tl.exp(m2 - m)) / s
        tl.store(out_ptr + stride_out + rows, tl.where(row_ok, p_max, ninf), mask=rows < n_rows)
        tl.store(out_ptr + 2 * stride_out + rows, tl.where(row_ok, margin, ninf),
                 mask=rows < n_rows)
        tl.store(out_ptr + 3 * stride_out + rows, tl.where(row_ok, m - m2, ninf),
                 mask=rows < n_rows)
        tl.store(out_ptr + 4 * stride_out + rows, tl.where(row_ok, w / s - log_s, ninf),
                 mask=rows < n_rows)
    if NOISE != 0:
        p_tok = tl.exp(best_z - lse)
        tl.store(sample_ptr + rows, tl.where(row_ok, best_i.to(tl.int64), -1), mask=rows < n_rows)
        tl.store(out_ptr + 5 * stride_out + rows, tl.where(row_ok, p_tok, ninf),
                 mask=rows < n_rows)


def launch_vocab(
    logits: Tensor,
    token: Tensor,
    sample: Tensor,
    out: Tensor,
    *,
    stats: bool,
    temperature: float = 0.0,
    seed: Tensor | None = None,
    offset: int = 0,
    noise: Tensor | None = None,
    active: Tensor | None = None,
    row_seeds: Tensor | None = None,
) -> None:
    """Run the vocabulary pass into preallocated outputs (no allocation, no host sync).

    Args:
        logits: ``[N, V]`` or ``[B, L, V]`` (any strides), fp32/fp16/bf16.
        token, sample: int64 ``[N]`` (contiguous): argmax token, sampled token.
        out: fp32 ``[N_OUT, N]`` with unit column stride; rows follow ``STAT_NAMES`` then
            ``p_sample``. Only ``lse`` (and ``p_sample`` when sampling) are written unless
            ``stats``.
        temperature: Gumbel temperature (> 0 when sampling).
        seed: int64 ``[1]`` device tensor; with ``noise=None`` turns on in-kernel Philox noise.
            Element ``(r, c)`` uses Philox counter ``offset + r * V + c``.
        noise: uniform fp64, logits-shaped; turns on the deterministic sampling path.
        active: bool ``[N]`` (flattened rows); inactive rows give -1 / ``-inf``.
        row_seeds: int64 ``[B]`` for ``logits [B, ..., V]`` (``[N]`` for ``[N, V]``); turns
            on the per-row hash: element ``(b, idx)`` uses ``row_uniform(row_seeds, shape)``'s
            bits, computed in-kernel. Exclusive with ``seed`` and ``noise``.
    """
    x, inner, (s_o, s_i, s_v) = rows_view(logits)
    n_rows, vocab = token.shape[0], logits.shape[-1]
    if n_rows == 0:
        return
    mode = NOISE_OFF if seed is None and noise is None else (
        NOISE_TENSOR if noise is not None else NOISE_PHILOX)
    if row_seeds is not None:
        if seed is not None or noise is not None:
            raise ValueError("row_seeds excludes seed and noise (one noise source per call)")
        mode, seed = NOISE_ROWS, row_seeds.contiguous()
    seed_inner = max(n_rows // max(logits.shape[0], 1), 1)  # rows per leading index
    block_r, block_v, num_warps = vocab_blocks(n_rows, vocab, mode != NOISE_OFF)
    noise2d = noise.reshape(-1, vocab) if noise is not None else None
    grid = (triton.cdiv(n_rows, block_r),)
    with launch_range("vocab"):
        _vocab_kernel[grid](
            x, active if active is not None else token, noise2d if noise2d is not None else out,
            seed if seed is not None else token, token, sample, out,
            n_rows, vocab, inner, s_o, s_i, s_v,
            noise2d.stride(0) if noise2d is not None else 0,
            noise2d.stride(1) if noise2d is not None else 0,
            out.stride(0), float(temperature), int(offset), seed_inner,
            HAS_ACTIVE=active is not None, STATS=stats, NOISE=mode,
            BLOCK_R=block_r, BLOCK_V=block_v, num_warps=num_warps,
        )


def vocab_pass(
    logits: Tensor,
    *,
    stats: bool,
    temperature: float = 0.0,
    seed: Tensor | None = None,
    offset: int = 0,
    noise: Tensor | None = None,
    active: Tensor | None = None,
    row_seeds: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Allocate outputs and run ``launch_vocab``; returns ``(token, sample, out)`` flat."""
    n_rows = logits.numel() // logits.shape[-1]
    dev = logits.device
    token = torch.empty(n_rows, dtype=torch.int64, device=dev)
    sample = torch.empty(n_rows, dtype=torch.int64, device=dev)
    out = torch.empty(N_OUT, n_rows, dtype=torch.float32, device=dev)
    launch_vocab(logits, token, sample, out, stats=stats, temperature=temperature, seed=seed,
                 offset=offset, noise=noise,
                 active=None if active is None else active.reshape(-1), row_seeds=row_seeds)
    return token, sample, out
