"""Readable torch semantics of every kernel op: the test oracle and the CPU path.

Optimised backends (``kernels/triton``) must match these functions; they never import this
module (anything both need lives in ``kernels/common.py``).
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.kernels.common import (
    AttentionOutput,
    GumbelSample,
    check_active,
    check_attention,
    check_kv_write,
    check_logits,
    mask_inactive_stats,
    positions,
    rope_table,
)
from dllm_decode.kernels.rng import row_exponential, row_seeds_for, row_uniform_torch
from dllm_decode.types import OPTIONAL_FIELDS, Proposal

#: the optional statistics of ``confidence_stats`` (and fields of ``propose``)
STAT_FIELDS = frozenset(OPTIONAL_FIELDS)
#: stands in for -inf in filtered logits, as Dream's top-p/top-k filters do (dtype minimum)
_NEG = torch.finfo(torch.float32).min


def confidence_stats(logits: Tensor,
                     fields: Collection[str] | None = None) -> dict[str, Tensor]:
    """One pass over V: argmax token and its probability, top-2 margins, entropy, LSE.

    Args:
        logits: ``[..., V]`` any float dtype (``-inf`` entries allowed).
        fields: the optional statistics wanted, any of ``margin``, ``logit_margin``,
            ``neg_entropy`` (``None``: all); ``token``, ``p_max`` and ``lse`` are always
            computed. Without a margin the token and its logit come from one ``max`` (first
            index on ties, as ``argmax``) instead of ``topk`` + ``argmax``; the values are the
            same bits either way.

    Returns: dict of ``[...]`` float32 tensors (computed in fp32): ``token`` (int64, ties to
    the lowest index), ``p_max``, ``margin`` (p1 - p2), ``logit_margin`` (z1 - z2),
    ``neg_entropy`` (sum p log p, with 0 log 0 = 0), ``lse``; the optional ones only if asked.
    """
    want = STAT_FIELDS if fields is None else frozenset(fields)
    z = logits if logits.dtype == torch.float32 else logits.float()
    lse = torch.logsumexp(z, dim=-1)
    out = {"lse": lse}
    if "margin" in want or "logit_margin" in want:
        z1, z2 = _top2(z)
        out["token"] = torch.argmax(z, dim=-1)
        p1 = (z1 - lse).exp()
        if "margin" in want:
            out["margin"] = p1 - (z2 - lse).exp()
        if "logit_margin" in want:
            out["logit_margin"] = z1 - z2
    else:
        z1, out["token"] = torch.max(z, dim=-1)  # first maximum, as argmax
        p1 = (z1 - lse).exp()
    out["p_max"] = p1
    if "neg_entropy" in want:
        # sum p log p with 0 log 0 = 0: log p is clamped to the dtype minimum first, whose exp
        # is exactly 0 as exp(-inf) is (same bits as exp(logp) * logp.clamp_min(min)); in place
        logp = (z - lse[..., None]).clamp_min_(_NEG)
        out["neg_entropy"] = logp.exp().mul_(logp).sum(-1)
    return out


def logit_margin(logits: Tensor) -> Tensor:
    """``[..., V]`` -> ``[...]`` float32 top-2 raw-logit gap ``z1 - z2`` (``inf`` if V == 1),
    as ``confidence_stats`` computes it."""
    z1, z2 = _top2(logits if logits.dtype == torch.float32 else logits.float())
    return z1 - z2


def _top2(z: Tensor) -> tuple[Tensor, Tensor]:
    """The two largest values of ``z [..., V]`` (the second ``-inf`` if V == 1)."""
    top2 = torch.topk(z, k=min(2, z.shape[-1]), dim=-1).values
    if z.shape[-1] > 1:
        z1, z2 = top2.unbind(-1)
    else:
        z1 = top2[..., 0]
        z2 = torch.full_like(z1, -math.inf)
    return z1, z2


def gumbel_argmax(logits: Tensor, temperature: float, uniform: Tensor) -> Tensor:
    """LLaDA's Gumbel-max sample: ``argmax(exp(z) / (-log u)^T)`` in float64.

    Equals a draw from ``softmax(z / T)``; float64 because low-precision Gumbel noise truncates
    the tail (LLaDA, citing arXiv 2409.02908). ``uniform``: float64, same shape as ``logits``.
    """
    z = logits.double()
    return torch.argmax(z.exp() / (-torch.log(uniform)) ** temperature, dim=-1)


def filter_logits(logits: Tensor, temperature: float, top_p: float | None,
                  top_k: int | None, *, k_first: bool = False) -> Tensor:
    """Dream's sampling distribution: temper, then top-p, then top-k (filtered -> dtype min).
    ``k_first``: top-k before top-p (LLaDA2's ``_sample_with_temperature_topk_topp``)."""
    z = logits if logits.dtype == torch.float32 else logits.float()
    if temperature > 0:
        z = z / temperature
    if k_first and top_k is not None:
        z = filter_logits(z, 0.0, None, top_k)
        top_k = None
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
    fields: Collection[str] | None = None,
    row_seeds: Tensor | None = None,
) -> Proposal:
    """Proposal for every row of ``logits [B, N, V]``.

    ``sampling="gumbel"`` (LLaDA / Fast-dLLM): the token is the argmax, or at ``T > 0`` a
    float64 Gumbel-max sample; scores use the un-noised, untempered softmax.
    ``sampling="categorical"`` (Dream): the distribution is tempered and top-p/top-k filtered;
    the token is its argmax, or at ``T > 0`` a categorical draw (``argmax(p / E)``, E ~ Exp(1),
    torch's own multinomial algorithm); scores use that distribution (``logit_margin``: the
    raw logits). ``sampling="llada2"`` (LLaDA2's ``_sample_with_temperature_topk_topp``): the
    same draw with top-k applied before top-p; at ``T = 0`` the argmax and the plain softmax
    (no filtering), as the reference.

    ``noise`` (optional, ``[B, N, V]``): uniform float64 for gumbel, Exp(1) float32 for
    categorical; drawn from ``generator`` when omitted, or with ``row_seeds`` (``[B]`` int64)
    from each row's own stream: ``row_uniform(row_seeds, logits.shape)`` (gumbel) or
    ``-log`` of it in float32 (categorical), so row b's draw depends on ``row_seeds[b]`` only
    (batch-invariant). Ties go to the lowest index.
    ``fields``: the optional ``Proposal`` fields to compute (``types.OPTIONAL_FIELDS``;
    ``None``: all); the others are left absent.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    want = STAT_FIELDS if fields is None else STAT_FIELDS & frozenset(fields)
    row_seeds_for(row_seeds, logits, noise)
    if sampling == "gumbel":
        stats = confidence_stats(logits, want)
        if temperature > 0:
            if row_seeds is not None:
                noise = row_uniform_torch(row_seeds, logits.shape)
            elif noise is None:
                noise = torch.rand(logits.shape, dtype=torch.float64, generator=generator,
                                   device=logits.device)
            tokens = gumbel_argmax(logits, temperature, noise)
            lse = stats["lse"]
            prob = (logits.float().gather(-1, tokens[..., None])[..., 0] - lse).exp()
        else:
            tokens, prob = stats["token"], stats["p_max"]
    elif sampling in ("categorical", "llada2"):
        if sampling == "llada2" and temperature == 0:  # the reference filters nothing at T = 0
            top_p = top_k = None
        z = filter_logits(logits, temperature, top_p, top_k, k_first=sampling == "llada2")
        # the logit margin is of the raw logits: computed from them alone, and only if asked
        # (not a second full pass over V)
        stats = confidence_stats(z, want - {"logit_margin"})
        if "logit_margin" in want:
            stats["logit_margin"] = logit_margin(logits)
        if temperature > 0:
            probs = F.softmax(z, dim=-1)
            if row_seeds is not None:
                noise = row_exponential(row_seeds, probs.shape)
            elif noise is None:
                noise = torch.empty_like(probs).exponential_(1, generator=generator)
            tokens = torch.argmax((probs / probs.sum(-1, keepdim=True)) / noise, dim=-1)
            prob = probs.gather(-1, tokens[..., None])[..., 0]
        else:
            tokens, prob = stats["token"], stats["p_max"]
    else:
        raise ValueError(f"sampling must be 'gumbel', 'categorical' or 'llada2', got "
                         f"{sampling!r}")
    prob = prob if prob.dtype == torch.float32 else prob.float()
    return Proposal(tokens=tokens, prob=prob, margin=stats.get("margin"),
                    logit_margin=stats.get("logit_margin"),
                    neg_entropy=stats.get("neg_entropy"),
                    argmax=stats["token"] if temperature > 0 else None, lse=stats["lse"])


# --- ops with a Triton twin (kernels/triton); shared checks live in kernels/common.py ---------


def gumbel_sample(
    logits: Tensor,
    temperature: float,
    seed: int | Tensor = 0,
    offset: int = 0,
    active: Tensor | None = None,
    noise: Tensor | None = None,
    row_seeds: Tensor | None = None,
) -> GumbelSample:
    """Gumbel-max sample from ``softmax(logits / T)`` plus the token's un-noised probability.

    Args:
        logits: ``[N, V]`` or ``[B, L, V]``, any float dtype (math in float64).
        temperature: ``T >= 0``; ``T == 0`` is the argmax (ties to the lowest index).
        seed, offset: select the noise stream when ``noise`` is omitted. This reference draws
            from ``torch.Generator`` seeded with ``(seed, offset)``; it is *not* the Triton
            kernel's Philox stream (same distribution, different draws). A tensor ``seed`` is
            read with ``.item()`` (a host sync).
        active: optional bool ``logits.shape[:-1]``; inactive rows give token -1 and ``-inf``.
        noise: optional uniform float64 ``[..., V]`` (same shape as ``logits``); the token is
            then ``gumbel_argmax(logits, T, noise)`` exactly, as in ``propose``.
        row_seeds: optional ``[B]`` int64: ``noise = row_uniform(row_seeds, logits.shape)``.

    Returns: ``GumbelSample(token int64, p_token float32, lse float32)``, each
    ``logits.shape[:-1]``. ``p_token = exp(z_token - lse)`` under the untempered softmax.
    """
    check_logits(logits)
    check_active(active, logits)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    row_seeds_for(row_seeds, logits, noise)
    z = logits.double()
    lse = torch.logsumexp(z, dim=-1)
    if temperature == 0:
        token = torch.argmax(z, dim=-1)
    else:
        if row_seeds is not None:
            noise = row_uniform_torch(row_seeds, logits.shape)
        if noise is None:
            gen = torch.Generator(device=logits.device)
            gen.manual_seed((int(seed) * 1_000_003 + int(offset)) % 2**63)
            noise = torch.rand(logits.shape, dtype=torch.float64, generator=gen,
                               device=logits.device)
        elif noise.shape != logits.shape:
            raise ValueError(f"noise must have the logits shape {tuple(logits.shape)}, got "
                             f"{tuple(noise.shape)}")
        token = gumbel_argmax(logits, temperature, noise)
    p_token = (z.gather(-1, token[..., None])[..., 0] - lse).exp()
    stats = {"token": token, "p_token": p_token.float(), "lse": lse.float()}
    stats = mask_inactive_stats(stats, active)
    return GumbelSample(stats["token"], stats["p_token"], stats["lse"])


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def kv_write_(
    k_cache: Tensor,
    v_cache: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    pos: int | Tensor,
    cos: Tensor | None = None,
    sin: Tensor | None = None,
) -> None:
    """In place: write fresh K/V rows into one layer's cache, optionally rotating K first.

    Args:
        k_cache, v_cache: ``[B, H_kv, L_max, D]``, modified in place (values cast to their dtype).
        k_new, v_new: ``[B, H_kv, Lq, D]``.
        pos: int (shared first row), int ``[B]`` first rows, or int ``[B, Lq]`` explicit rows.
            Rows outside ``[0, L_max)`` (``-1`` by convention) are skipped. Rows must be
            distinct within a sequence.
        cos, sin: optional fp32 rotate-half RoPE tables, ``[P, D]`` indexed by cache row
            (P >= L_max), or ``[B, Lq, D]`` / ``[B, 1, Lq, D]`` aligned with ``k_new``.
            K is rotated in fp32 as ``k * cos + rotate_half(k) * sin``, then cast.

    Sync: tensor ``pos`` uses boolean indexing (a host sync on CUDA); an in-range int ``pos``
    is a plain slice copy.
    """
    check_kv_write(k_cache, v_cache, k_new, v_new, cos, sin)
    b, _, n_new, _ = k_new.shape
    max_len = k_cache.shape[2]
    slots = positions(pos, b, n_new, k_cache.device)
    k = k_new
    if cos is not None:
        cos_t, by_slot = rope_table(cos, b, n_new, max_len)
        sin_t, _ = rope_table(sin, b, n_new, max_len)
        if by_slot:
            rows = slots.clamp(0, cos_t.shape[0] - 1)
            cos_t, sin_t = cos_t[rows], sin_t[rows]  # [B, Lq, D]
        kf = k.float()
        k = kf * cos_t[:, None].float() + _rotate_half(kf) * sin_t[:, None].float()
    if isinstance(pos, int) and pos >= 0 and pos + n_new <= max_len:
        k_cache[:, :, pos:pos + n_new] = k.to(k_cache.dtype)
        v_cache[:, :, pos:pos + n_new] = v_new.to(v_cache.dtype)
        return
    b_idx, t_idx = ((slots >= 0) & (slots < max_len)).nonzero(as_tuple=True)
    s_idx = slots[b_idx, t_idx]
    k_cache[b_idx, :, s_idx] = k[b_idx, :, t_idx].to(k_cache.dtype)
    v_cache[b_idx, :, s_idx] = v_new[b_idx, :, t_idx].to(v_cache.dtype)


def attention_visibility(
    kv_start: Tensor,
    kv_end: Tensor,
    max_len: int,
    q_len: int,
    *,
    n_new: int = 0,
    q_start: Tensor | None = None,
    new_mask: Tensor | None = None,
    kv_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Which keys each query sees in ``block_attention``.

    Returns ``(cache_vis [B, L_max], new_vis [B, Lq, Lq_new] or None)``, bool. Cache row j is
    visible iff ``kv_start[b] <= j < kv_end[b]``, ``kv_mask[b, j]`` (when given) and j is not
    in ``[q_start[b], q_start[b] + Lq_new)`` (when ``q_start`` is given). Cache visibility is
    the same for every query row; fresh-key visibility is ``new_mask`` (all True if None).
    """
    j = torch.arange(max_len, device=kv_start.device)
    cache_vis = (j >= kv_start[:, None]) & (j < kv_end[:, None])
    if kv_mask is not None:
        cache_vis &= kv_mask
    if q_start is not None:
        cache_vis &= (j < q_start[:, None]) | (j >= q_start[:, None] + n_new)
    if n_new == 0:
        return cache_vis, None
    b = kv_start.shape[0]
    if new_mask is None:
        new_vis = torch.ones(b, q_len, n_new, dtype=torch.bool, device=kv_start.device)
    else:
        new_vis = new_mask.expand(b, q_len, n_new)
    return cache_vis, new_vis


def block_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_start: Tensor,
    kv_end: Tensor,
    *,
    k_new: Tensor | None = None,
    v_new: Tensor | None = None,
    q_start: Tensor | None = None,
    new_mask: Tensor | None = None,
    kv_mask: Tensor | None = None,
    sm_scale: float | None = None,
    return_lse: bool = False,
) -> AttentionOutput:
    """Bidirectional attention of a query block over a cache range plus optional fresh keys.

    Semantics (shared with the Triton kernel; see ``kernels.block_attention`` for the usage
    patterns): visibility from ``attention_visibility``; softmax over the visible keys in
    fp32 (inputs upcast); rows with no visible key give 0 and ``lse = -inf``. Invisible cache
    rows are zeroed in a copy first, so their contents (even NaN) never matter. Without
    ``return_lse`` this is one SDPA call (the CPU fast path); with it, explicit fp32 math.
    """
    check_attention(q, k_cache, v_cache, kv_start, kv_end, k_new, v_new, q_start, new_mask,
                    kv_mask)
    b, h, lq, d = q.shape
    h_kv, max_len = k_cache.shape[1], k_cache.shape[2]
    n_new = 0 if k_new is None else k_new.shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    cache_vis, new_vis = attention_visibility(kv_start, kv_end, max_len, lq, n_new=n_new,
                                              q_start=q_start, new_mask=new_mask,
                                              kv_mask=kv_mask)
    hidden = ~cache_vis[:, None, :, None]
    k = k_cache.float().masked_fill(hidden, 0.0)
    v = v_cache.float().masked_fill(hidden, 0.0)
    vis = cache_vis[:, None, :].expand(b, lq, max_len)
    if k_new is not None:
        k = torch.cat((k, k_new.float()), dim=2)
        v = torch.cat((v, v_new.float()), dim=2)
        vis = torch.cat((vis, new_vis), dim=2)
    if not return_lse:
        out = F.scaled_dot_product_attention(q.float(), k, v, attn_mask=vis[:, None],
                                             scale=scale, enable_gqa=h != h_kv)
        out = out.masked_fill(~vis.any(-1)[:, None, :, None], 0.0)  # no visible key -> 0
        return AttentionOutput(out.to(q.dtype), None)
    qg = q.float().reshape(b, h_kv, -1, d)  # [B, H_kv, (H / H_kv) * Lq, D]: heads by KV head
    s = torch.einsum("bgqd,bgkd->bgqk", qg, k) * scale
    s = s.view(b, h_kv, h // h_kv, lq, -1).masked_fill(~vis[:, None, None], -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(lse == -math.inf, 0.0, lse)[..., None])
    out = torch.einsum("bgjqk,bgkd->bgjqd", p, v).reshape(b, h, lq, d).to(q.dtype)
    return AttentionOutput(out, lse.reshape(b, h, lq))


def block_causal_mask(q_pos: Tensor, k_pos: Tensor, block_size: int) -> Tensor:
    """``[B, Nq]``, ``[B, Nk]`` absolute positions -> ``[B, Nq, Nk]`` bool.

    Query at position i sees key j iff ``j // block_size <= i // block_size``: bidirectional
    inside a block, causal across blocks, blocks aligned to absolute positions. Block size 1
    is a plain causal mask.
    """
    return (k_pos[:, None, :] // block_size) <= (q_pos[:, :, None] // block_size)
