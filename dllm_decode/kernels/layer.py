"""Public fused decoder-layer ops (``impl="auto" | "reference" | "triton"``, as every kernel
op; see ``dllm_decode.kernels``). References: ``kernels/layer_reference.py``; Triton:
``kernels/triton/layer.py``."""

from __future__ import annotations

import torch
from torch import Tensor

from dllm_decode.kernels import dispatch as _k
from dllm_decode.kernels import layer_reference as ref
from dllm_decode.kernels.layer_reference import RopeRows, rope_rows
from dllm_decode.types import Impl


def qkv_rope(qkv: Tensor, rope: RopeRows, heads: int, kv_heads: int, head_dim: int, *,
             q_norm: Tensor | None = None, k_norm: Tensor | None = None, eps: float = 0.0,
             k_cache: Tensor | None = None, v_cache: Tensor | None = None,
             slots: Tensor | None = None, impl: Impl | str = Impl.AUTO) -> Tensor:
    """q and k of the fused projection output ``qkv [B, N, (H + 2 H_kv) D]``, per-head
    RMSNorm'd (with ``q_norm, k_norm [D]``) and rotated (rotate-half RoPE) -> ``[B, N,
    H + H_kv, D]``; with ``k_cache, v_cache [B, H_kv, L_max, D]`` and ``slots [B, N]`` the
    rotated K and the V rows are also written to the cache (RoPE fused with the cache write).

    Reference: a new tensor, 3 kernels (+3 with the norm, +2 with the write), differentiable.
    Triton: one launch, in place (the result is a view of ``qkv``, whose q/k part the caller
    must not read again), not differentiable. See ``layer_reference.qkv_rope`` for the math;
    fp32 results agree within an ulp or two (tested).
    """
    if qkv.dim() != 3 or qkv.shape[-1] != (heads + 2 * kv_heads) * head_dim or \
            qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be [B, N, (H + 2 H_kv) D] = [B, N, "
                         f"{(heads + 2 * kv_heads) * head_dim}] with a unit last stride, got "
                         f"{tuple(qkv.shape)} strides {qkv.stride()}")
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("pass both q_norm and k_norm, or neither")
    if (k_cache is None) != (v_cache is None) or (k_cache is None) != (slots is None):
        raise ValueError("the cache write needs k_cache, v_cache and slots together")
    if k_cache is not None and (k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype):
        raise ValueError(f"cache dtype {k_cache.dtype} must equal the qkv dtype {qkv.dtype}")
    issue = _k._dtype_issue(qkv)
    if issue is None and torch.is_grad_enabled() and qkv.requires_grad:
        issue = "inputs that require grad (the kernel writes in place; use the reference)"
    if _k._choose(impl, qkv.device, issue, "qkv_rope", qkv.dtype) is Impl.REFERENCE:
        return ref.qkv_rope(qkv, rope, heads, kv_heads, head_dim, q_norm=q_norm, k_norm=k_norm,
                            eps=eps, k_cache=k_cache, v_cache=v_cache, slots=slots)
    _k._backend().qkv_rope_(qkv, rope.cos, rope.sin, heads, kv_heads, head_dim, q_norm, k_norm,
                            eps, k_cache, v_cache, slots)
    b, n, _ = qkv.shape
    return qkv.view(b, n, heads + 2 * kv_heads, head_dim)[:, :, :heads + kv_heads]


def silu_mul(gate_up: Tensor, *, impl: Impl | str = Impl.AUTO) -> Tensor:
    """SwiGLU's ``silu(gate) * up`` of the fused ``[..., 2 I]`` gate/up output (gate first)
    -> ``[..., I]`` in its dtype. Reference: 2 kernels; Triton: one (fp32 math)."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim must be 2 * intermediate, got {gate_up.shape[-1]}")
    issue = _k._dtype_issue(gate_up)
    if issue is None and gate_up.stride(-1) != 1:
        issue = "a non-unit last stride"
    if issue is None and torch.is_grad_enabled() and gate_up.requires_grad:
        issue = "inputs that require grad (no backward kernel; use the reference)"
    if _k._choose(impl, gate_up.device, issue, "silu_mul", gate_up.dtype) is Impl.REFERENCE:
        return ref.silu_mul(gate_up)
    return _k._backend().silu_mul(gate_up)


__all__ = ["RopeRows", "qkv_rope", "rope_rows", "silu_mul"]
