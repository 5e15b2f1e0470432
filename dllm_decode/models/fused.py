"""Fused decoder layers: what ``DecoderLM`` runs (fewer kernels per layer).

Same function as ``base.Attention`` / ``base.MLP`` / ``base.Layer`` (kept there as the
readable reference), with the launches cut for a GPU decode step at batch 1:

* q/k/v is one GEMM (``qkv``: ``[W_q; W_k; W_v]``) and gate/up one GEMM (``gate_up``); the
  weights are fused once, when a state dict is loaded, and ``state_dict()`` gives them back
  under the unfused names (``q_proj.weight`` ...), so checkpoints load and save by their
  released tensor names and the family name tables do not change;
* RMSNorm is ``torch.nn.functional.rms_norm`` (one kernel) and the residual adds ride in the
  output GEMMs' epilogue (``addmm(h, x, W^T)``);
* q/k norm + RoPE (+ the K/V cache write on cached forwards) is ``kernels.qkv_rope``, in
  place in the GEMM output, and SwiGLU's ``silu(gate) * up`` is ``kernels.silu_mul``: one
  Triton launch each on CUDA, a few torch ops elsewhere; no separate dtype round trips.

Launches per layer, batch-1 cached forward (``diagnostics.launches``): 14 on the torch path
(17 with q/k norm), 9 on CUDA's ``auto`` path (SDPA + Triton layer ops).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode import kernels
from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.kernels.layer_reference import RopeRows, split_qkv
from dllm_decode.models.functional import kernel_attention, sdpa
from dllm_decode.models.norm import RMSNorm
from dllm_decode.types import Impl

#: fused parameter -> the unfused (released) parameters it holds, in order
_QKV = ("q_proj", "k_proj", "v_proj")
_GATE_UP = ("gate_proj", "up_proj")


def _split_state(module: nn.Module, state: dict[str, Any], prefix: str,
                 fused: str, parts: tuple[str, ...], sizes: list[int]) -> None:
    """``state_dict`` hook: replace ``prefix + fused.{weight,bias}`` by views of the unfused
    parts, in the order the unfused module lists them (each part's weight, then its bias),
    keeping this module's other entries (they are the last ones in ``state``)."""
    entries = {k: state.pop(k) for k in [k for k in state if k.startswith(prefix)]}
    weight = entries.pop(f"{prefix}{fused}.weight")
    bias = entries.pop(f"{prefix}{fused}.bias", None)
    biases = bias.split(sizes) if bias is not None else [None] * len(parts)
    for part, w, b in zip(parts, weight.split(sizes), biases, strict=True):
        state[f"{prefix}{part}.weight"] = w
        if b is not None:
            state[f"{prefix}{part}.bias"] = b
    state.update(entries)


def _fuse_state(state: dict[str, Any], prefix: str, fused: str, parts: tuple[str, ...]) -> None:
    """``load_state_dict`` pre-hook: concatenate the unfused parts into ``prefix + fused``
    (only when every part is there; otherwise the usual missing/unexpected keys report)."""
    for kind in ("weight", "bias"):
        keys = [f"{prefix}{p}.{kind}" for p in parts]
        if all(k in state for k in keys):
            state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(k) for k in keys])


class FusedAttention(nn.Module):
    """Self-attention with one q/k/v GEMM; state dict names as ``base.Attention``."""

    def __init__(self, spec: Any) -> None:
        super().__init__()
        self.spec = spec
        h, hd = spec.hidden_size, spec.head_dim
        self.sizes = [spec.num_heads * hd, spec.num_kv_heads * hd, spec.num_kv_heads * hd]
        self.qkv = nn.Linear(h, sum(self.sizes), bias=spec.qkv_bias)
        self.o_proj = nn.Linear(spec.num_heads * hd, h, bias=False)
        if spec.qk_norm:
            self.q_norm = RMSNorm(hd, spec.norm_eps)
            self.k_norm = RMSNorm(hd, spec.norm_eps)
        self._register_state_dict_hook(
            lambda m, state, prefix, meta: _split_state(m, state, prefix, "qkv", _QKV, m.sizes))
        self.register_load_state_dict_pre_hook(
            lambda m, state, prefix, *args: _fuse_state(state, prefix, "qkv", _QKV))

    def forward(self, x: Tensor, h: Tensor, rope: RopeRows, mask: Tensor | None, layer: int,
                cache: BlockKVCache | None, slots: Tensor, store: bool, impl: Impl,
                attn_impl: Impl) -> Tensor:
        """``h + attention(x)``: x (normed) and residual h ``[B, N, hidden]`` ->
        ``[B, N, hidden]``. Masks and cache semantics as ``base.Attention.forward``;
        ``impl``: the fused layer ops, ``attn_impl``: ``kv_write_`` / ``block_attention``
        (Triton when it resolved so, else SDPA)."""
        spec = self.spec
        b, n, _ = x.shape
        nh, nkv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
        qkv = self.qkv(x)
        norm = dict(q_norm=self.q_norm.weight, k_norm=self.k_norm.weight,
                    eps=spec.norm_eps) if spec.qk_norm else {}
        kernel_attn = (cache is not None and store and attn_impl is Impl.TRITON
                       and (mask is None or mask.dim() == 2))
        write = cache is not None and store and not kernel_attn
        ck, cv = cache.layer(layer) if cache is not None else (None, None)
        qk = kernels.qkv_rope(qkv, rope, nh, nkv, hd, **norm, impl=impl,
                              **(dict(k_cache=ck, v_cache=cv, slots=slots) if write else {}))
        q, k = qk[:, :, :nh].transpose(1, 2), qk[:, :, nh:].transpose(1, 2)  # [B, H*, N, D]
        v = split_qkv(qkv, nh, nkv, hd)[2].transpose(1, 2)
        if kernel_attn:
            out = kernel_attention(q, k, v, ck, cv, slots, mask, attn_impl)
        else:
            if write:
                k, v = ck, cv
            elif cache is not None:
                k, v = torch.cat((ck, k), dim=2), torch.cat((cv, v), dim=2)
            out = sdpa(q, k, v, mask)
        return _linear_add(h, out.transpose(1, 2).reshape(b, n, -1), self.o_proj)


class FusedMLP(nn.Module):
    """SwiGLU with one gate/up GEMM; state dict names as ``base.MLP``."""

    def __init__(self, spec: Any) -> None:
        super().__init__()
        self.sizes = [spec.intermediate_size, spec.intermediate_size]
        self.gate_up = nn.Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)
        self._register_state_dict_hook(
            lambda m, state, prefix, meta: _split_state(m, state, prefix, "gate_up", _GATE_UP,
                                                        m.sizes))
        self.register_load_state_dict_pre_hook(
            lambda m, state, prefix, *args: _fuse_state(state, prefix, "gate_up", _GATE_UP))

    def forward(self, x: Tensor, h: Tensor, impl: Impl = Impl.REFERENCE) -> Tensor:
        """``h + down(silu(gate(x)) * up(x))``, x and h ``[B, N, hidden]``."""
        return _linear_add(h, kernels.silu_mul(self.gate_up(x), impl=impl), self.down_proj)


def _linear_add(h: Tensor, x: Tensor, linear: nn.Linear) -> Tensor:
    """``h + x @ W^T`` as one GEMM with the residual in its epilogue (``addmm``), ``[B, N, *]``
    (a bias, if any, is added separately)."""
    out = torch.addmm(h.reshape(-1, h.shape[-1]), x.reshape(-1, x.shape[-1]), linear.weight.t())
    if linear.bias is not None:
        out = out + linear.bias
    return out.view(h.shape)


class FusedLayer(nn.Module):
    """Pre-norm block ``h + attn(norm(h))`` then ``h + mlp(norm(h))`` with fused ops; same
    parameter names (through the state dict) as ``base.Layer``."""

    def __init__(self, spec: Any) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.attn = FusedAttention(spec)
        self.mlp_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mlp = FusedMLP(spec)

    def forward(self, h: Tensor, rope: RopeRows, mask: Tensor | None, index: int,
                cache: BlockKVCache | None, slots: Tensor, store: bool, impl: Impl,
                attn_impl: Impl = Impl.REFERENCE) -> Tensor:
        """``h [B, N, hidden]`` -> ``[B, N, hidden]``; ``index`` is this layer's cache row,
        ``rope`` the forward's ``kernels.rope_rows``."""
        h = self.attn(_norm(self.attn_norm, h), h, rope, mask, index, cache, slots, store, impl,
                      attn_impl)
        return self.mlp(_norm(self.mlp_norm, h), h, impl)


def _norm(norm: nn.Module, x: Tensor) -> Tensor:
    """``norm``'s RMSNorm as one ``rms_norm`` kernel."""
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)
