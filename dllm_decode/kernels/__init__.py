"""Public kernel ops. Each takes ``impl="auto" | "reference" | "triton"``.

``auto`` picks Triton only when a kernel can really launch for the tensor's device; an
explicit ``"triton"`` never falls back silently. Triton is imported lazily (never at module
top), so ``import dllm_decode`` works without it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dllm_decode.kernels import reference
from dllm_decode.types import Impl, Proposal


def resolve_impl(impl: Impl | str, device: torch.device) -> Impl:
    """``auto`` -> Triton when it can launch on ``device``, else the torch reference."""
    impl = Impl(impl)
    if impl is Impl.AUTO:
        return Impl.REFERENCE  # the Triton backend registers itself here when available
    return impl


def propose(logits: Tensor, *, temperature: float = 0.0, sampling: str = "gumbel",
            top_p: float | None = None, top_k: int | None = None, noise: Tensor | None = None,
            generator: torch.Generator | None = None,
            impl: Impl | str = Impl.AUTO) -> Proposal:
    """Fused proposal over the vocabulary; see ``reference.propose`` for the semantics."""
    if resolve_impl(impl, logits.device) is Impl.TRITON:
        raise NotImplementedError("the Triton proposal kernel is not available yet")
    return reference.propose(logits, temperature=temperature, sampling=sampling, top_p=top_p,
                             top_k=top_k, noise=noise, generator=generator)


__all__ = ["propose", "resolve_impl"]
