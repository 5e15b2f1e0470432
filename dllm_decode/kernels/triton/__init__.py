"""Triton backend. Imported lazily by ``dllm_decode.kernels`` on the first Triton op.

Under ``TRITON_INTERPRET=1`` (set before this package is first imported) every kernel is an
interpreted function that runs on CPU tensors; otherwise the kernels are compiled for the
current GPU at their first launch. ``INTERPRETED`` records which of the two happened.
"""

from __future__ import annotations

from triton.runtime.interpreter import InterpretedFunction

from dllm_decode.kernels.triton.attention import block_attention, launch_block_attention
from dllm_decode.kernels.triton.kv_write import kv_write_
from dllm_decode.kernels.triton.layer import qkv_rope_, silu_mul
from dllm_decode.kernels.triton.rng import row_uniform
from dllm_decode.kernels.triton.vocab import N_OUT, _vocab_kernel, launch_vocab, vocab_pass

#: True when the kernels were defined under the interpreter (CPU tensors only)
INTERPRETED: bool = isinstance(_vocab_kernel, InterpretedFunction)


def driver_ready() -> bool:
    """Whether a compiled kernel can launch here: an active GPU driver with a device."""
    if INTERPRETED:
        return False
    try:
        from triton.runtime import driver

        driver.active.get_current_target()
    except Exception:  # any failure (no libcuda, no device, ...) means "cannot launch"
        return False
    return True


__all__ = ["INTERPRETED", "N_OUT", "block_attention", "driver_ready", "kv_write_",
           "launch_block_attention", "launch_vocab", "qkv_rope_", "row_uniform", "silu_mul",
           "vocab_pass"]
