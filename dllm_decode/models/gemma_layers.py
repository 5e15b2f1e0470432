"""Gemma-4 MoE text layers, as DiffusionGemma uses them (torch reference for every op).

Written from the released config fields and tensor names of ``google/diffusiongemma-26B-A4B-it``
(facts: ``shared/research/models-2026.md`` (c); reference: Hugging Face transformers
``models/diffusion_gemma/modeling_diffusion_gemma.py``). What differs from the LLaDA / Dream
layers in ``models/base.py``:

* RMSNorm multiplies by its weight directly (no ``1 + w``), all in fp32; a few norms have no
  weight at all (the value norm, the router's input norm, the self-conditioning output norm).
* Attention: per-head q / k / v norms, **scale 1.0** (no ``1/sqrt(D)``), RoPE after the norms;
  sliding and full layers have their own head dim, KV-head count and RoPE; full layers have no
  ``v_proj`` (**K = V**: the value is the raw ``k_proj`` output, value-normed).
* RoPE ``proportional`` (full layers): the first ``partial * D / 2`` frequency pairs rotate
  with ``theta^(-2i / D)``, the rest have frequency 0 (identity), over the whole head dim.
* The block: sandwich norms around attention; a dense GeGLU (tanh) MLP in parallel with a
  softmax-routed MoE (top-k renormalised, times a learned per-expert scale), each post-normed,
  summed and post-normed again, added to the residual; the result times ``layer_scalar``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.models.sparse_moe import DenseMLP, expert_offsets


@dataclass(frozen=True)
class GemmaLayerSpec:
    """Per-layer attention shape (``text_config`` + its ``per_layer_config`` overrides)."""

    sliding: bool
    head_dim: int
    num_kv_heads: int
    rope_type: str  # "default" | "proportional"
    rope_theta: float
    partial_rotary_factor: float = 1.0


def gemma_rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """``x * (mean(x^2) + eps)^-0.5 [* weight]`` in fp32, cast back to ``x``'s dtype.

    ``x [..., D]``; ``weight [D]`` or ``None`` (the scale-less norms). ``pow(-0.5)`` as the
    reference (not ``rsqrt``)."""
    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        h = h * weight.float()
    return h.type_as(x)


class GemmaNorm(nn.Module):
    """RMSNorm with an optional weight used as is (see ``gemma_rms_norm``)."""

    def __init__(self, dim: int, eps: float, *, scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x: Tensor) -> Tensor:
        return gemma_rms_norm(x, self.weight, self.eps)


def gemma_inv_freq(spec: GemmaLayerSpec, device: torch.device | None = None) -> Tensor:
    """``[D / 2]`` fp32 inverse frequencies of one layer type.

    ``default``: ``theta^(-2i / d)`` over ``d = D * partial`` (``D / 2`` pairs when partial is
    1). ``proportional``: ``int(partial * D // 2)`` rotated pairs with exponent ``2i / D``, then
    zeros up to ``D / 2`` pairs (those dims are not rotated)."""
    d = spec.head_dim
    if spec.rope_type == "proportional":
        n_rot = int(spec.partial_rotary_factor * d // 2)
        idx = torch.arange(0, 2 * n_rot, 2, dtype=torch.int64, device=device).float()
        rot = 1.0 / (spec.rope_theta ** (idx / d))
        return torch.cat([rot, torch.zeros(d // 2 - n_rot, device=device)])
    if spec.rope_type != "default":
        raise ValueError(f"rope_type {spec.rope_type!r} is not supported (default, proportional)")
    dim = int(d * spec.partial_rotary_factor)
    return 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float,
                                                   device=device) / dim))


def gemma_rope(positions: Tensor, spec: GemmaLayerSpec, dtype: torch.dtype
               ) -> tuple[Tensor, Tensor]:
    """``positions [B, N]`` -> ``cos, sin [B, N, 1, D]`` (computed in fp32, cast to
    ``dtype`` as the reference does)."""
    inv = gemma_inv_freq(spec, positions.device)
    freqs = positions.float()[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_gemma_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE on ``x [B, N, H, D]`` in ``x``'s dtype."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class GemmaAttention(nn.Module):
    """Q/K/V projections + per-head norms + RoPE, attention with scale 1.0, output proj.

    ``project`` returns the fed tokens' ``q [B, H, N, D]`` and ``k, v [B, Hkv, N, D]`` (what a
    cache stores); ``attend`` runs attention against given keys with a bool mask."""

    def __init__(self, hidden: int, num_heads: int, spec: GemmaLayerSpec, eps: float) -> None:
        super().__init__()
        self.spec, self.num_heads = spec, num_heads
        d, hkv = spec.head_dim, spec.num_kv_heads
        self.q_proj = nn.Linear(hidden, num_heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, hkv * d, bias=False)
        self.v_proj = nn.Linear(hidden, hkv * d, bias=False) if spec.sliding else None
        self.o_proj = nn.Linear(num_heads * d, hidden, bias=False)
        self.q_norm = GemmaNorm(d, eps)
        self.k_norm = GemmaNorm(d, eps)
        self.eps = eps

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x [B, N, hidden]`` -> ``q [B, H, N, D]``, ``k, v [B, Hkv, N, D]``."""
        b, n, _ = x.shape
        d = self.spec.head_dim
        q = apply_gemma_rope(self.q_norm(self.q_proj(x).view(b, n, -1, d)), cos, sin)
        raw_k = self.k_proj(x).view(b, n, -1, d)
        raw_v = raw_k if self.v_proj is None else self.v_proj(x).view(b, n, -1, d)  # K = V
        k = apply_gemma_rope(self.k_norm(raw_k), cos, sin)
        v = gemma_rms_norm(raw_v, None, self.eps)  # value norm: no weight
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               causal: bool = False) -> Tensor:
        """``q [B, H, N, D]``, ``k, v [B, Hkv, Lk, D]``, ``mask [B, N, Lk]`` bool or ``None``
        (every key visible; ``causal``: SDPA's own causal mask, ``Lk == N``) -> ``[B, N,
        hidden]`` (SDPA, scale 1.0)."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if mask is None else mask[:, None], is_causal=causal,
            scale=1.0,
            enable_gqa=self.num_heads != self.spec.num_kv_heads)
        b, _, n, _ = q.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU, tanh approximation (Gemma's ``gelu_pytorch_tanh``)."""
    return F.gelu(x, approximate="tanh")


class GemmaMLP(DenseMLP):
    """``down(gelu_tanh(gate(x)) * up(x))`` (the dense MLP and the self-conditioning MLP)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__(hidden, intermediate, gelu_tanh)


class GemmaRouter(nn.Module):
    """Softmax router: ``proj(norm(x) * scale * hidden^-0.5)`` -> fp32 softmax -> top-k ->
    renormalised to sum 1 -> times ``per_expert_scale`` of the chosen experts."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, eps: float) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))
        self.top_k, self.eps, self.root = top_k, eps, hidden ** -0.5

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x [T, hidden]`` -> ``weights [T, k]`` (fp32), ``experts [T, k]`` int64."""
        h = gemma_rms_norm(x, None, self.eps) * self.scale * self.root
        probs = torch.softmax(self.proj(h), dim=-1, dtype=torch.float32)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        return w * self.per_expert_scale[idx], idx


class GemmaExperts(nn.Module):
    """Fused expert tensors ``gate_up_proj [E, 2I, hidden]`` (gate rows first) and
    ``down_proj [E, hidden, I]``; GeGLU (tanh) per expert.

    ``forward`` is the readable reference (a loop over the experts that any token chose);
    ``grouped`` sorts the (token, slot) rows by expert and runs two grouped GEMMs (equal within
    fp32 rounding: ``tests/test_diffusion_gemma.py``; bit for bit what transformers'
    ``grouped_mm`` experts compute, the DiffusionGemma fixtures' recording path)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def forward(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """``x [T, hidden]``, ``weights / experts [T, k]`` -> ``[T, hidden]``."""
        out = torch.zeros_like(x)
        for e in experts.unique().tolist():
            tok, slot = torch.where(experts == e)
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(gelu_tanh(gate) * up, self.down_proj[e])
            out.index_add_(0, tok, (y * weights[tok, slot, None]).to(out.dtype))
        return out

    def grouped(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """Same result as ``forward`` in two grouped GEMMs: the ``[T*k]`` (token, slot) rows
        sorted by expert, one ``grouped_mm`` per projection over the contiguous groups (a
        per-group ``mm`` where ``torch.nn.functional.grouped_mm`` cannot run: older torch,
        unaligned strides; on an accelerator a gather + ``bmm`` instead, without a host sync),
        weighted, un-sorted and summed over the k slots. No per-token or per-expert Python loop
        on the ``grouped_mm`` path; reads only the chosen experts."""
        t, k = experts.shape
        flat = experts.reshape(-1)
        sorted_ids, perm = torch.sort(flat)
        rows = x[perm // k]  # [T*k, hidden], grouped by expert
        offs = expert_offsets(sorted_ids, self.gate_up_proj.shape[0])  # no host sync
        gate, up = _grouped_linear(rows, self.gate_up_proj, offs).chunk(2, dim=-1)
        y = _grouped_linear(gelu_tanh(gate) * up, self.down_proj, offs)
        y = y * weights.reshape(-1)[perm, None]
        out = torch.empty_like(y)
        out[perm] = y  # back to (token, slot) order
        return out.view(t, k, -1).sum(1).to(x.dtype)


def _grouped_linear(rows: Tensor, weight: Tensor, offs: Tensor) -> Tensor:
    """``rows [S, in]`` grouped by expert (group e ends at ``offs[e]``) times ``weight[e].T``
    (``weight [E, out, in]``) -> ``[S, out]``."""
    w = weight.transpose(-2, -1)
    grouped_mm = getattr(F, "grouped_mm", None)
    if grouped_mm is not None:
        try:
            return grouped_mm(rows.to(w.dtype), w, offs=offs)
        except (RuntimeError, NotImplementedError):  # no kernel here, or unaligned strides
            pass
    if rows.device.type != "cpu":  # no host sync on an accelerator
        return _gathered_linear(rows, weight, offs)
    out = rows.new_zeros(rows.shape[0], w.shape[-1])
    start = 0
    for e, end in enumerate(offs.tolist()):  # CPU fallback: one mm per non-empty group
        if end > start:
            torch.mm(rows[start:end], w[e], out=out[start:end])
        start = end
    return out


def _gathered_linear(rows: Tensor, weight: Tensor, offs: Tensor) -> Tensor:
    """``_grouped_linear`` by gathering each row's expert matrix and one ``bmm`` (no host sync;
    ``[S, out, in]`` gathered weights)."""
    expert = torch.searchsorted(offs, torch.arange(rows.shape[0], device=rows.device,
                                                   dtype=offs.dtype), right=True)
    return torch.bmm(weight[expert], rows[:, :, None].to(weight.dtype))[:, :, 0]


class GemmaLayer(nn.Module):
    """One Gemma-4 MoE block (module docstring); K/V handling is the caller's (``attn``)."""

    def __init__(self, hidden: int, num_heads: int, intermediate: int, num_experts: int,
                 top_k: int, moe_intermediate: int, spec: GemmaLayerSpec, eps: float) -> None:
        super().__init__()
        self.spec = spec
        self.self_attn = GemmaAttention(hidden, num_heads, spec, eps)
        self.mlp = GemmaMLP(hidden, intermediate)
        self.router = GemmaRouter(hidden, num_experts, top_k, eps)
        self.experts = GemmaExperts(num_experts, hidden, moe_intermediate)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "pre_feedforward_layernorm_2",
                     "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"):
            setattr(self, name, GemmaNorm(hidden, eps))
        self.layer_scalar = nn.Parameter(torch.ones(1))

    def feed_forward(self, h: Tensor, scalar: Tensor, grouped: bool = False) -> Tensor:
        """The post-attention half: ``h [B, N, hidden]`` (after the attention residual) ->
        the block output, scaled by ``scalar`` (the encoder and decoder each store theirs)."""
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(h)))
        flat = h.reshape(-1, h.shape[-1])
        weights, experts = self.router(flat)
        moe_in = self.pre_feedforward_layernorm_2(flat)
        moe = (self.experts.grouped if grouped else self.experts)(moe_in, weights, experts)
        moe = self.post_feedforward_layernorm_2(moe.reshape(h.shape))
        return (h + self.post_feedforward_layernorm(dense + moe)) * scalar


class SelfConditioning(GemmaMLP):
    """``post_norm(embeds + mlp(pre_norm(soft)))``: ``soft [B, C, hidden]`` is the previous
    step's ``softmax(logits) @ embed * sqrt(hidden)`` (zeros on a canvas's first step);
    ``post_norm`` has no weight. Tensors ``self_conditioning.{pre_norm, gate_proj, up_proj,
    down_proj}.weight``."""

    def __init__(self, hidden: int, intermediate: int, eps: float) -> None:
        super().__init__(hidden, intermediate)
        self.pre_norm = GemmaNorm(hidden, eps)
        self.eps = eps

    def condition(self, embeds: Tensor, soft: Tensor) -> Tensor:
        """``embeds, soft [B, C, hidden]`` -> the decoder input ``[B, C, hidden]``."""
        return gemma_rms_norm(embeds + self(self.pre_norm(soft)), None, self.eps)
