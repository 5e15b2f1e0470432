"""Shared input factories and canary checks for the kernel tests.

The Triton interpreter does not detect out-of-bounds accesses, so inputs live inside larger
NaN-filled buffers (a stray read poisons the result) and outputs inside sentinel-filled
buffers (a stray write changes the padding).
"""

from __future__ import annotations

import re
import warnings

import torch
from torch import Tensor

from dllm_decode.kernels import selfcheck

#: filler of output padding; must survive untouched
SENTINEL = -7777.0
#: numpy's floating-point warnings from inside the Triton interpreter (which runs every lane
#: of a block in numpy, masked-out lanes included: log2(0) of an empty row, 0 * inf on a
#: padded lane). A compiled kernel computes the same lanes silently and the results are
#: checked against the references, so these are expected in the kernel tests; only warnings
#: raised in the module ``triton.runtime.interpreter`` are meant, never the library's own (a
#: failed self-check warns from ``dllm_decode.kernels``) nor numpy warnings raised elsewhere.
#: The library's self-check ignores the same ones (``kernels.selfcheck``).
INTERPRETER_NUMPY_WARNINGS = selfcheck.INTERPRETER_NUMPY_WARNINGS


def from_interpreter(w: warnings.WarningMessage) -> bool:
    """Whether a recorded warning is one of ``INTERPRETER_NUMPY_WARNINGS``."""
    return (issubclass(w.category, RuntimeWarning)
            and w.filename.replace("\\", "/").endswith("triton/runtime/interpreter.py")
            and any(re.match(m, str(w.message)) for m in INTERPRETER_NUMPY_WARNINGS))


def embed(values: Tensor, pad: int = 8, fill: float = float("nan")) -> tuple[Tensor, Tensor]:
    """A copy of ``values`` living inside a padded buffer: every dimension gets ``pad`` extra
    slots after it (so rows are strided) and the flat buffer ``pad`` slots on each side.
    Returns ``(view, base)``; ``base`` holds ``fill`` everywhere outside ``view``."""
    shape = values.shape
    padded = [s + pad for s in shape]
    n = 1
    for s in padded:
        n *= s
    base = torch.full((n + 2 * pad,), fill, dtype=values.dtype, device=values.device)
    inner = base[pad:pad + n].view(padded)
    view = inner[tuple(slice(0, s) for s in shape)]
    view.copy_(values)
    return view, base


def outside_untouched(view: Tensor, base: Tensor, fill: float) -> bool:
    """Whether every element of ``base`` outside ``view`` still equals ``fill`` (NaN-aware)."""
    inside = torch.zeros(base.numel(), dtype=torch.bool, device=base.device)
    inside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
    rest = base[~inside]
    if fill != fill:
        return bool(torch.isnan(rest).all())
    return bool((rest == fill).all())


def special_logits(n: int, vocab: int, dtype: torch.dtype, seed: int) -> Tensor:
    """``[n, V]`` logits whose first rows exercise the edge cases (n >= 5 for all of them):
    0 random; 1 a tied maximum far apart (across vocabulary chunks); 2 half ``-inf``;
    3 peaked (p ~ 1); 4 flat (all equal: every index ties)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, vocab, generator=g) * 3
    if n > 1 and vocab > 2:
        top = z[1].max() + 2
        z[1, vocab // 3] = top
        z[1, vocab - 1] = top
    if n > 2 and vocab > 2:
        z[2, ::2] = -float("inf")
    if n > 3:
        z[3, vocab // 2] = 40.0
    if n > 4:
        z[4] = 0.25
    return z.to(dtype)
