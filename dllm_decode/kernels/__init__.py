"""Public kernel ops. Each takes ``impl="auto" | "reference" | "triton"``.

How ``impl`` resolves (``auto`` per device and per op, the first-use self-check, the
``DLLM_DECODE_KERNELS`` override) is ``kernels/dispatch.py``. The ops live by concept in
``kernels/vocab.py`` (the vocabulary pass), ``kernels/attention.py`` (the K/V cache write and
block attention) and ``kernels/layer.py`` (the fused layer ops), each with its torch reference
(``reference.py``, ``layer_reference.py``: the oracle and the CPU path) and its Triton twin
(``kernels/triton``, imported lazily, so ``import dllm_decode`` works without Triton).
Kernels import nothing of the models, caches, samplers or policies above them.
"""

from __future__ import annotations

from dllm_decode.kernels import dispatch, selfcheck
from dllm_decode.kernels.attention import block_attention, kv_write_
from dllm_decode.kernels.common import AttentionOutput, GumbelSample
from dllm_decode.kernels.dispatch import (
    AUTO_ON_CUDA,
    ENV_VAR,
    kernels_env,
    resolve_impl,
    triton_status,
)
from dllm_decode.kernels.layer import RopeRows, qkv_rope, rope_rows, silu_mul
from dllm_decode.kernels.rng import mix_seeds, row_uniform
from dllm_decode.kernels.vocab import confidence_stats, gumbel_sample, propose, propose_impl
from dllm_decode.types import Impl

dispatch._CHECKER[:] = [selfcheck]  # the first-use check of ``impl="auto"``

__all__ = ["AUTO_ON_CUDA", "ENV_VAR", "AttentionOutput", "GumbelSample", "Impl", "RopeRows",
           "block_attention", "confidence_stats", "gumbel_sample", "kernels_env", "kv_write_",
           "mix_seeds", "propose", "propose_impl", "qkv_rope", "resolve_impl", "rope_rows",
           "row_uniform", "silu_mul", "triton_status"]
