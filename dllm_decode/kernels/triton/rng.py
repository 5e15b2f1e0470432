"""Per-row counter-based uniforms in Triton: the bits of ``kernels/rng.py``'s ``row_uniform``.

``_mix64`` and ``_row_uniform`` are the device helpers the vocabulary pass inlines (per-row
seeds, no ``[N, V]`` noise tensor); ``row_uniform`` is the standalone op (one launch instead of
the reference's ~15 elementwise kernels). All integer math is uint64 (wrapping multiplies,
logical shifts); the seeds' int64 bits are reinterpreted, never converted.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dllm_decode.kernels.common import RNG_GAMMA, RNG_M1, RNG_M2, next_pow2
from dllm_decode.kernels.count import launch_range

#: splitmix64's constants as compile-time values (``kernels/common.py``; uint64 literals)
_GAMMA: tl.constexpr = tl.constexpr(RNG_GAMMA)
_M1: tl.constexpr = tl.constexpr(RNG_M1)
_M2: tl.constexpr = tl.constexpr(RNG_M2)
#: elements per program of the standalone kernel
_BLOCK: int = 1024


@triton.jit
def _mix64(x):
    """splitmix64's finalizer on uint64 (wrapping multiplies, logical shifts)."""
    x = x ^ (x >> 30)
    x = x * _M1
    x = x ^ (x >> 27)
    x = x * _M2
    return x ^ (x >> 31)


@triton.jit
def _row_start(seed, first):
    """The stream state just before flat index ``first`` (int64) of the row seeded ``seed``
    (int64): ``seed + first * GAMMA`` in uint64 (one value per row or chunk)."""
    return seed.to(tl.uint64, bitcast=True) + first.to(tl.uint64) * _GAMMA


@triton.jit
def _row_uniform(start, offset):
    """``row_uniform``'s value at flat index ``first + offset`` (``offset`` int, >= 0) of the
    row whose ``_row_start`` is ``start``: with ``z = mix64(start + (offset + 1) * GAMMA)``,
    ``1/2 + ((z >> 11) | 1) * 2**-53`` in fp64 (arithmetic shift of z's int64 bits)."""
    z = _mix64(start + (offset + 1).to(tl.uint64) * _GAMMA).to(tl.int64, bitcast=True)
    return ((z >> 11) | 1).to(tl.float64) * 1.1102230246251565e-16 + 0.5  # 2**-53


@triton.jit
def _row_uniform_kernel(seed_ptr, out_ptr, n_per_row, BLOCK: tl.constexpr):
    """Program ``(b, j)`` writes elements ``[j * BLOCK, (j + 1) * BLOCK)`` of row ``b``."""
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1).to(tl.int64) * BLOCK
    start = _row_start(tl.load(seed_ptr + row), first)
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + row * n_per_row + first + offs, _row_uniform(start, offs),
             mask=first + offs < n_per_row)


def row_uniform(seeds: Tensor, n_per_row: int) -> Tensor:
    """``[B, n_per_row]`` float64 from ``seeds [B]`` int64 (contiguous output, no sync)."""
    rows = seeds.shape[0]
    out = torch.empty(rows, n_per_row, dtype=torch.float64, device=seeds.device)
    if rows == 0 or n_per_row == 0:
        return out
    block = min(_BLOCK, next_pow2(n_per_row))
    with launch_range("row_uniform"):
        _row_uniform_kernel[(rows, triton.cdiv(n_per_row, block))](
            seeds.contiguous(), out, n_per_row, BLOCK=block, num_warps=4)
    return out
