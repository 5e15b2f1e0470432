"""Readable torch semantics of every kernel op: the test oracle and the CPU path.

Optimised backends (``kernels/triton``) must match these functions; they never import this
module (anything both need lives in ``kernels/common.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.types import Proposal

#: stands in for -inf in filtered logits, as Dream's top-p/top-k filters do (dtype minimum)
_NEG = torch.finfo(torch.float32).min


def confidence_stats(logits: Tensor) -> dict[str, Tensor]:
    """One pass over V: argmax token and its probability, top-2 margins, entropy, LSE.

    Args:
        logits: ``[..., V]`` any float dtype.

    Returns: dict of ``[...]`` tensors: ``token`` (int64, ties to the lowest index),
    ``p_max``, ``margin`` (p1 - p2), ``logit_margin`` (z1 - z2), ``neg_entropy``
    (sum p log p), ``lse``; float32, computed in float64.
    """
    z = logits.double()
    lse = torch.logsumexp(z, dim=-1)
    top2 = torch.topk(z, k=min(2, z.shape[-1]), dim=-1).values
    z1 = top2[..., 0]
    z2 = top2[..., 1] if z.shape[-1] > 1 else torch.full_like(z1, -math.inf)
    logp = z - lse[..., None]
    p = logp.exp()
    neg_entropy = torch.xlogy(p, p).sum(-1)
    return {
        "token": torch.argmax(z, dim=-1),
        "p_max": (z1 - lse).exp().float(),
        "margin": ((z1 - lse).exp() - (z2 - lse).exp()).float(),
        "logit_margin": (z1 - z2).float(),
        "neg_entropy": neg_entropy.float(),
        "lse": lse.float(),
    }


def gumbel_argmax(logits: Tensor, temperature: float, uniform: Tensor) -> Tensor:
    """LLaDA's Gumbel-max sample: ``argmax(exp(z) / (-log u)^T)`` in float64.

    Equals a draw from ``softmax(z / T)``; float64 because low-precision Gumbel noise truncates
    the tail (LLaDA, citing arXiv 2409.02908). ``uniform``: float64, same shape as ``logits``.
    """
    z = logits.double()
    return torch.argmax(z.exp() / (-torch.log(uniform)) ** temperature, dim=-1)


def filter_logits(logits: Tensor, temperature: float, top_p: float | None,
                  top_k: int | None) -> Tensor:
    """Dream's sampling distribution: temper, then top-p, then top-k (filtered -> dtype min)."""
    z = logits.float()
    if temperature > 0:
        z = z / temperature
    if top_p is not None and top_p < 1:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        cum = torch.cumsum(F.softmax(sorted_z, dim=-1), dim=-1)
        drop_sorted = cum > top_p
        drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        z = z.masked_fill(drop, _NEG)
    if top_k is not None:
        k = min(int(top_k), z.shape[-1])
        kth = torch.topk(z, k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, _NEG)
    return z


def propose(
    logits: Tensor,
    *,
    temperature: float = 0.0,
    sampling: str = "gumbel",
    top_p: float | None = None,
    top_k: int | None = None,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Proposal:
    """Proposal for every row of ``logits [B, N, V]``.

    ``sampling="gumbel"`` (LLaDA / Fast-dLLM): the token is the argmax, or at ``T > 0`` a
    float64 Gumbel-max sample; scores use the un-noised, untempered softmax.
    ``sampling="categorical"`` (Dream): the distribution is tempered and top-p/top-k filtered;
    the token is its argmax, or at ``T > 0`` a categorical draw (``argmax(p / E)``, E ~ Exp(1),
    torch's own multinomial algorithm); scores use that distribution.

    ``noise`` (optional, ``[B, N, V]``): uniform float64 for gumbel, Exp(1) float32 for
    categorical; drawn from ``generator`` when omitted. Ties go to the lowest index.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if sampling == "gumbel":
        stats = confidence_stats(logits)
        if temperature > 0:
            if noise is None:
                noise = torch.rand(logits.shape, dtype=torch.float64, generator=generator,
                                   device=logits.device)
            tokens = gumbel_argmax(logits, temperature, noise)
            lse = stats["lse"].double()
            prob = (logits.double().gather(-1, tokens[..., None])[..., 0] - lse).exp().float()
        else:
            tokens, prob = stats["token"], stats["p_max"]
    elif sampling == "categorical":
        z = filter_logits(logits, temperature, top_p, top_k)
        stats = confidence_stats(z)
        stats["logit_margin"] = confidence_stats(logits)["logit_margin"]
        if temperature > 0:
            probs = F.softmax(z, dim=-1)
            if noise is None:
                noise = torch.empty_like(probs).exponential_(1, generator=generator)
            tokens = torch.argmax((probs / probs.sum(-1, keepdim=True)) / noise, dim=-1)
            prob = probs.gather(-1, tokens[..., None])[..., 0]
        else:
            tokens, prob = stats["token"], stats["p_max"]
    else:
        raise ValueError(f"sampling must be 'gumbel' or 'categorical', got {sampling!r}")
    return Proposal(tokens=tokens, prob=prob.float(), margin=stats["margin"],
                    logit_margin=stats["logit_margin"], neg_entropy=stats["neg_entropy"])
