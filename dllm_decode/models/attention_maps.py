"""Attention probabilities of a forward, materialised only when a policy asks for them.

DAWN (Luo et al., arXiv 2602.06953; ``policies.dawn``) reads, at every step, the softmax
attention of the model's last layers, averaged over heads and then over those layers, from the
same forward that gave the step's logits. The attention kernels (SDPA, FlashAttention, the
library's Triton ``block_attention``) never materialise the ``[B, H, N, Lk]`` probabilities, so
the authors' modeling recomputes ``softmax(q k^T / sqrt(D) + bias)`` beside SDPA in the
captured layers (``attn_avg`` in their ``llada/model/modeling_llada.py``). ``capture_attention``
does the same: while its context is open, a forward pre-hook on the attention module of each of
the last ``layers`` decoder layers recomputes that layer's q and k from the layer's own input
(one q/k/v projection GEMM per captured layer, the layer's RoPE tables and mask) and keeps
``functional.attention_probs`` of them; ``mean()`` stacks the layers and averages them, as the
authors do (``torch.stack(all_avg_scores).mean(0)``). Outside the context nothing is hooked and
forwards cost nothing extra. Memory: ``O(B N Lk)`` per captured layer plus one
``[B, H, N, Lk]`` transient.

Supported: ``DecoderLM``'s fused layers (``models.fused.FusedLayer``: LLaDA, Dream, SDAR and
the test-bed students) in uncached forwards (the keys are the fed rows themselves). Other
layers (the MoE families, a family's own unfused layers) and cached forwards are refused with
one line.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch import Tensor, nn

from dllm_decode import kernels
from dllm_decode.models.functional import attention_probs
from dllm_decode.models.fused import FusedAttention


class AttentionCapture:
    """Head-averaged attention probabilities of the last ``layers`` decoder layers, for the
    forwards run while the context is open (the last forward's are kept).

    Args:
        model: a ``DecoderLM`` whose layers are ``FusedLayer`` s.
        layers: how many of the last layers to capture (``>= 1``; every layer of a model with
            fewer).

    Raises:
        ValueError: another layer type, or ``layers < 1``.
    """

    def __init__(self, model: nn.Module, layers: int) -> None:
        stack = list(getattr(model, "layers", ()))
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1 or not stack:
            raise ValueError(f"attention maps of the last {layers!r} layers: need an int >= 1 "
                             f"and a model with layers ({type(model).__name__})")
        attns = [getattr(layer, "attn", None) for layer in stack[-layers:]]
        if not all(isinstance(a, FusedAttention) for a in attns):
            kinds = sorted({type(a).__name__ for a in attns})
            raise ValueError(f"attention maps are captured from DecoderLM's fused dense layers; "
                             f"this model's attention modules are {kinds} "
                             f"({type(model).__name__}): no attention capture for it")
        self._attns: list[FusedAttention] = attns  # type: ignore[assignment]
        self._handles: list[Any] = []
        self._maps: list[Tensor] = []

    def __enter__(self) -> AttentionCapture:
        self._maps = []
        self._handles = [a.register_forward_pre_hook(self._hook) for a in self._attns]
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, module: FusedAttention, args: tuple[Any, ...]) -> None:
        """``FusedAttention.forward``'s positional arguments ``(x, h, rope, mask, layer, cache,
        slots, store, impl, attn_impl)``: q and k as that forward computes them, then their
        probabilities. A new forward (the first captured layer again) starts a new list."""
        x, _, rope, mask, _, cache = args[:6]
        impl = args[8]
        if cache is not None:
            raise ValueError("attention maps need an uncached forward (cache='none'): a cached "
                             "forward attends to keys it does not compute")
        if module is self._attns[0]:
            self._maps = []
        spec = module.spec
        nh, nkv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
        norm = dict(q_norm=module.q_norm.weight, k_norm=module.k_norm.weight,
                    eps=spec.norm_eps) if spec.qk_norm else {}
        with torch.no_grad():
            qk = kernels.qkv_rope(module.qkv(x), rope, nh, nkv, hd, **norm, impl=impl)
            q, k = qk[:, :, :nh].transpose(1, 2), qk[:, :, nh:].transpose(1, 2)
            self._maps.append(attention_probs(q, k, mask))

    def mean(self) -> Tensor:
        """``[B, N, Lk]`` (``Lk = N`` uncached): the captured layers' head-averaged
        probabilities averaged over the layers, in the model's dtype (the authors' order:
        heads, then layers)."""
        if len(self._maps) != len(self._attns):
            raise RuntimeError(f"captured {len(self._maps)} of {len(self._attns)} attention "
                               "layers: run one forward inside the capture_attention context")
        return torch.stack(self._maps).mean(0)


def capture_attention(model: nn.Module, layers: int) -> AttentionCapture:
    """``AttentionCapture(model, layers)`` (validated now; hooks only inside ``with``)."""
    return AttentionCapture(model, layers)
