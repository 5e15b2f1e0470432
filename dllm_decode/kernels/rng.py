"""Per-row (per-request) counter-based random numbers: batch-invariant by construction.

Every number is a pure function of its row's seed and its index inside the row, never of the
batch size, the other rows or their order: row ``b`` of ``row_uniform(seeds, shape)`` equals
``row_uniform(seeds[b:b+1], (1, *shape[1:]))[0]`` bit for bit, on any device.

Row ``b`` is the splitmix64 stream seeded with ``seeds[b]`` (Steele, Lea and Flood, "Fast
splittable pseudorandom number generators", OOPSLA 2014; the finalizer ``mix64`` is Stafford's
variant 13, as in Java's ``SplittableRandom``):

* element ``i`` (the flat index inside the row): ``z = mix64(seeds[b] + (i + 1) * GAMMA)``,
  the textbook stream (seed 0 starts ``0xE220A8397B1DCDAF``);
* uniform ``u = 1/2 + ((z >> 11) | 1) * 2**-53`` with an arithmetic shift: the odd multiples
  of ``2**-53``, 2**52 values strictly inside ``(0, 1)`` (min ``2**-53``, max ``1 - 2**-53``,
  mean exactly 1/2), exact in float64.

Streams of seeds that differ by a small multiple of ``GAMMA`` overlap (shifted): pass keys made
by ``mix_seeds`` (a request's seed and its step, hashed), which makes that a ~2**-64 event.
All arithmetic is modulo 2**64 on int64 tensors (torch's int64 ops wrap); logical right shifts
are arithmetic shifts with the sign-extended bits masked off. The Triton vocabulary pass
(``kernels/triton/vocab.py``, with ``kernels/triton/rng.py``) computes the same bits in-kernel
from a per-row seed pointer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dllm_decode.kernels import dispatch as _k
from dllm_decode.kernels.common import (
    RNG_GAMMA,
    RNG_M1,
    RNG_M2,
    RNG_SALT,
    check_row_seeds,
)
from dllm_decode.types import Impl

_U64 = (1 << 64) - 1
#: ``(1 << (64 - s)) - 1``: keeps the low bits of an arithmetic right shift by ``s``
_LOW = {s: (1 << (64 - s)) - 1 for s in (27, 30, 31)}


def _signed(x: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits (a Python scalar for torch)."""
    x &= _U64
    return x - (1 << 64) if x >> 63 else x


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bits."""
    return (x >> s) & _LOW[s]


def mix64(x: Tensor) -> Tensor:
    """splitmix64's finalizer on int64 bits (a bijection of the 2**64 values; ``mix64(0) = 0``).

    ``x ^= x >> 30; x *= M1; x ^= x >> 27; x *= M2; x ^= x >> 31`` (logical shifts, mod 2**64).
    """
    x = x ^ _shr(x, 30)
    x = x * _signed(RNG_M1)
    x = x ^ _shr(x, 27)
    x = x * _signed(RNG_M2)
    return x ^ _shr(x, 31)


def mix64_int(x: int) -> int:
    """``mix64`` of one Python int (unsigned result in ``[0, 2**64)``); no tensor, no sync."""
    x &= _U64
    x ^= x >> 30
    x = (x * RNG_M1) & _U64
    x ^= x >> 27
    x = (x * RNG_M2) & _U64
    return x ^ (x >> 31)


def _check_counter(counter: Tensor | int, seeds: Tensor) -> None:
    if isinstance(counter, Tensor):
        if counter.dtype != torch.int64 or counter.shape != seeds.shape:
            raise ValueError(f"counter must be an int or an int64 tensor shaped like seeds "
                             f"{tuple(seeds.shape)}, got {counter.dtype} {tuple(counter.shape)}")
        if counter.device != seeds.device:
            raise ValueError(f"counter must be on the seeds' device {seeds.device}, got "
                             f"{counter.device}")
    elif not isinstance(counter, int) or isinstance(counter, bool):
        raise TypeError(f"counter must be an int or an int64 tensor, got "
                        f"{type(counter).__name__}")


def mix_seeds(seeds: Tensor, counter: Tensor | int) -> Tensor:
    """A fresh per-row key for draw number ``counter`` (e.g. a request's block step).

    Args:
        seeds: ``[B]`` int64 (any device).
        counter: an int (every row) or ``[B]`` int64 on the seeds' device (per row).

    Returns: ``[B]`` int64 ``mix64(seeds ^ (counter * GAMMA + SALT))`` (mod 2**64), a
    bijection of ``seeds`` for a fixed counter and of ``counter`` for a fixed seed, so distinct
    draws of one request never share a key; two requests' keys meet only if their seeds differ
    by ``(c1 * GAMMA + SALT) ^ (c2 * GAMMA + SALT)``: never for seeds in ``[0, 2**32)`` and
    counters in ``[0, 2**20)`` (``d * GAMMA`` is at least 2**43 from 0 mod 2**64 there).
    Elementwise: row ``b`` depends only on ``seeds[b]`` and its counter. No host sync; 12 torch
    ops with an int counter, 14 with a tensor one.
    """
    check_row_seeds(seeds)
    _check_counter(counter, seeds)
    if isinstance(counter, Tensor):
        salt = counter * _signed(RNG_GAMMA) + _signed(RNG_SALT)
    else:
        salt = _signed(counter * RNG_GAMMA + RNG_SALT)
    return mix64(seeds ^ salt)


def mix_seeds_int(seed: int, counter: int) -> int:
    """``mix_seeds`` of one row on the host, as the int64 it returns (Python ints only: no
    tensor, no sync; for building a ``[B]`` seed tensor with the rest of a round's values)."""
    return _signed(mix64_int((seed & _U64) ^ ((counter * RNG_GAMMA + RNG_SALT) & _U64)))


def row_bits(seeds: Tensor, n: int) -> Tensor:
    """``[B, n]`` int64: the 64 hash bits of elements ``0 .. n-1`` of each row's stream."""
    check_row_seeds(seeds)
    step = torch.arange(1, n + 1, dtype=torch.int64, device=seeds.device) * _signed(RNG_GAMMA)
    return mix64(seeds[:, None] + step)


def bits_to_uniform(bits: Tensor) -> Tensor:
    """int64 hash bits -> float64 ``1/2 + ((bits >> 11) | 1) * 2**-53`` (arithmetic shift),
    in ``[2**-53, 1 - 2**-53]``: exact, never 0 or 1."""
    return ((bits >> 11) | 1).double().mul_(2.0 ** -53).add_(0.5)


def row_uniform_torch(seeds: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    """``row_uniform`` in torch ops (the reference; 19 torch ops, 17 over the output)."""
    check_row_seeds(seeds)
    shape = _check_shape(seeds, shape)
    return bits_to_uniform(row_bits(seeds, math.prod(shape[1:]))).view(shape)


def _check_shape(seeds: Tensor, shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if not shape or shape[0] != seeds.shape[0]:
        raise ValueError(f"shape must start with B = seeds.numel() = {seeds.shape[0]}, got "
                         f"{shape}")
    return shape


def row_uniform(seeds: Tensor, shape: tuple[int, ...] | torch.Size, *,
                impl: Impl | str = Impl.AUTO) -> Tensor:
    """Per-row uniforms in the open interval ``(0, 1)``, float64, batch-invariant.

    Args:
        seeds: ``[B]`` int64 on the target device (one seed per row / request).
        shape: ``(B, *rest)``; element ``(b, *idx)`` is the hash of ``seeds[b]`` and the flat
            (row-major) index of ``idx`` in ``rest`` (see the module docstring).
        impl: see ``dllm_decode.kernels``; both impls return the same bits (Triton: one
            launch; the reference: 19 torch ops).

    Returns: float64 tensor of ``shape`` on ``seeds.device``. No host sync.
    """
    check_row_seeds(seeds)
    shape = _check_shape(seeds, shape)
    if _k._choose(impl, seeds.device, None, "row_uniform", torch.float32) is Impl.REFERENCE:
        return row_uniform_torch(seeds, shape)
    return _k._backend().row_uniform(seeds, math.prod(shape[1:])).view(shape)


def row_exponential(seeds: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    """``-log(row_uniform(seeds, shape))`` as float32: per-row Exp(1) noise (categorical)."""
    return row_uniform_torch(seeds, shape).log_().neg_().float()


def row_seeds_for(row_seeds: Tensor | None, logits: Tensor, noise: Tensor | None) -> None:
    """Check the ``row_seeds`` argument of a sampling op: ``[B]`` int64 on the logits' device
    for ``logits [B, ..., V]``, and not together with ``noise``."""
    if row_seeds is None:
        return
    if noise is not None:
        raise ValueError("pass noise or row_seeds, not both (one noise source per call)")
    check_row_seeds(row_seeds, logits.shape[0])
    if row_seeds.device != logits.device:
        raise ValueError(f"row_seeds must be on the logits' device {logits.device}, got "
                         f"{row_seeds.device}")


__all__ = ["bits_to_uniform", "mix64", "mix64_int", "mix_seeds", "mix_seeds_int", "row_bits",
           "row_exponential", "row_seeds_for", "row_uniform", "row_uniform_torch"]
