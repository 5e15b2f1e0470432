"""dLLM-Cache's forward: the decoder's layers with per-layer feature reuse.

Liu et al., "dLLM-Cache: Accelerating Diffusion Large Language Models with Adaptive Caching",
arXiv 2506.06295 (ICML 2026); reference ``cache_hook_feature`` / ``refresh_index`` in
maomaocun/dLLM-cache ``dllm_cache/hooks/cache_hook_LLaDA.py`` @ 17235bf. The schedule (which
forwards refresh the prompt's and the response's features, and the share of response tokens
recomputed in between) is the cache plan's (``cache.dllm_cache``); this module runs one forward
of ``DecoderLM`` (fused layers) under it. Per layer, for the prompt ``[0, P)`` and the response
``[P, L)``, the plan's ``FeatureStore`` keeps K (rotated), V, the attention output (after
``o_proj``) and the FFN output:

* **both refreshed** (every forward's first layer, and steps where both intervals fall): the
  layer exactly as ``FusedLayer`` computes it (same kernels, bit for bit), its features stored;
* **response refreshed**: Q/K/V, attention and FFN for the response rows, against the stored
  prompt K/V; the prompt's attention / FFN outputs reused;
* **prompt refreshed** / **neither**: the prompt recomputed (or reused), and of the response
  only the ``int(ratio * G)`` rows whose fresh V (computed for every response row, and stored
  for all of them) has the lowest cosine similarity to the stored V: their Q and K, attention
  and FFN; every other response row reuses its attention / FFN output and keeps its stale K.

Every row's residual stream is its own (``h + attention``, then ``+ FFN``): only the block
outputs are reused. Left-padding keys stay hidden (the reference passes no mask).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode import kernels
from dllm_decode.kernels.layer_reference import RopeRows, split_qkv
from dllm_decode.models.functional import sdpa
from dllm_decode.models.fused import FusedLayer


def feature_forward(model: Any, tokens: Tensor, positions: Tensor, store: Any, *,
                    refresh_prompt: bool, refresh_gen: bool, full_mask: Tensor | None,
                    key_mask: Tensor | None, hidden_rows: Tensor | None = None,
                    rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """One forward of the whole canvas under dLLM-Cache's plan.

    Args:
        model: a ``DecoderLM`` whose layers are ``FusedLayer`` (LLaDA, Dream).
        tokens, positions: ``[B, L]`` the canvas and its RoPE positions.
        store: the plan's ``cache.dllm_cache.FeatureStore`` (``prompt_length``, ``ratio``,
            per-layer ``layers[i]`` dicts, ``select``, ``count``).
        refresh_prompt, refresh_gen: this forward's refreshes (layer 0 always refreshes both).
        full_mask: the mask an uncached forward of the canvas uses (``None``, or ``[B, L, L]``).
        key_mask: ``[B, L]`` key validity for partial queries (``None``: all valid).
        hidden_rows: ``[R]`` canvas rows whose logits are returned (``None``: all).
        rope: ``model.rope_tables(positions)`` if the caller has them.

    Returns: logits ``[B, L, V]`` (or ``[B, R, V]``), as ``model.forward``.
    """
    if not all(isinstance(layer, FusedLayer) for layer in model.layers):
        raise ValueError(f"cache='dllm_cache' runs the standard decoder layers; "
                         f"{type(model).__name__} has other layers (e.g. mixture-of-experts): "
                         "use cache='none', 'prefix' or 'dual'")
    h = model.embed(tokens)
    cos, sin = model.rope_tables(positions) if rope is None else rope
    rows = kernels.rope_rows(cos, sin)
    impl = model._impl(h, model.layer_impl, ("qkv_rope", "silu_mul"))
    counts = []
    for i, layer in enumerate(model.layers):
        both = i == 0 or (refresh_prompt and refresh_gen)
        if both:
            h = _refresh_layer(layer, store.layers[i], h, rows, full_mask, impl)
            counts.append(h.shape[1])
        else:
            h, n = _cached_layer(layer, store, i, h, rows, key_mask, impl,
                                 refresh_prompt=refresh_prompt, refresh_gen=refresh_gen)
            counts.append(n)
    store.count(sum(counts) / len(counts))
    h = F.rms_norm(h, (h.shape[-1],), model.norm.weight, model.norm.eps)
    if model.spec.logit_shift:
        h = torch.cat((h[:, :1], h[:, :-1]), dim=1)
    if hidden_rows is not None:
        h = h.index_select(1, hidden_rows)
    return model.head(h)


def _norm(norm: Any, x: Tensor) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)


def _heads(layer: FusedLayer) -> tuple[int, int, int]:
    spec = layer.attn.spec
    return spec.num_heads, spec.num_kv_heads, spec.head_dim


def _qkv(layer: FusedLayer, x: Tensor, rope: RopeRows, impl: Any
         ) -> tuple[Tensor, Tensor, Tensor]:
    """``x [B, N, d]`` (normed) -> q ``[B, H, N, D]``, rotated k and v ``[B, Hkv, N, D]``, as
    ``FusedAttention`` computes them."""
    attn = layer.attn
    spec = attn.spec
    nh, nkv, hd = _heads(layer)
    qkv = attn.qkv(x)
    norm = dict(q_norm=attn.q_norm.weight, k_norm=attn.k_norm.weight,
                eps=spec.norm_eps) if spec.qk_norm else {}
    qk = kernels.qkv_rope(qkv, rope, nh, nkv, hd, **norm, impl=impl)
    q, k = qk[:, :, :nh].transpose(1, 2), qk[:, :, nh:].transpose(1, 2)
    return q, k, split_qkv(qkv, nh, nkv, hd)[2].transpose(1, 2)


def _out(x: Tensor) -> Tensor:
    """``[B, H, N, D]`` attention heads -> ``[B, N, H * D]``."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


def _addmm(h: Tensor, x: Tensor, linear: Any) -> Tensor:
    """``h + x @ W^T`` as ``FusedLayer``'s residual GEMM (``models.fused._linear_add``)."""
    out = torch.addmm(h.reshape(-1, h.shape[-1]), x.reshape(-1, x.shape[-1]), linear.weight.t())
    if linear.bias is not None:
        out = out + linear.bias
    return out.view(h.shape)


def _refresh_layer(layer: FusedLayer, feats: dict[str, Tensor], h: Tensor, rows: RopeRows,
                   mask: Tensor | None, impl: Any) -> Tensor:
    """The layer as ``FusedLayer`` computes it, its features stored (the block outputs as
    the residual differences: no extra projection)."""
    q, k, v = _qkv(layer, _norm(layer.attn_norm, h), rows, impl)
    h1 = _addmm(h, _out(sdpa(q, k, v, mask)), layer.attn.o_proj)
    mlp = layer.mlp
    h2 = _addmm(h1, kernels.silu_mul(mlp.gate_up(_norm(layer.mlp_norm, h1)), impl=impl),
                mlp.down_proj)
    feats.update(k=k.contiguous(), v=v.contiguous(), att=h1 - h, mlp=h2 - h1)
    return h2


def _rope_at(rows: RopeRows, idx: Tensor) -> RopeRows:
    """``rows`` at canvas positions ``idx [B, N]``."""
    at = idx[:, :, None, None].expand(-1, -1, 1, rows.cos.shape[-1])
    return RopeRows(rows.cos.gather(1, at), rows.sin.gather(1, at))


def _gather(x: Tensor, idx: Tensor) -> Tensor:
    """Rows ``idx [B, N]`` of ``x [B, L, d]``."""
    return x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))


def _scatter(x: Tensor, idx: Tensor, src: Tensor) -> None:
    """``x[b, idx[b, n]] = src[b, n]`` in place (``x [B, L, d]``)."""
    x.scatter_(1, idx[..., None].expand(-1, -1, x.shape[-1]), src)


def _scatter_heads(x: Tensor, idx: Tensor, src: Tensor) -> None:
    """``x[b, :, idx[b, n]] = src[b, :, n]`` in place (``x [B, H, L, D]``)."""
    at = idx[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[-1])
    x.scatter_(2, at, src)


def _mlp(layer: FusedLayer, x: Tensor, impl: Any) -> Tensor:
    """The FFN output (no residual) of residual rows ``x [B, N, d]``."""
    mlp = layer.mlp
    return F.linear(kernels.silu_mul(mlp.gate_up(_norm(layer.mlp_norm, x)), impl=impl),
                    mlp.down_proj.weight, mlp.down_proj.bias)


def _attend(layer: FusedLayer, q: Tensor, feats: dict[str, Tensor],
            key_mask: Tensor | None) -> Tensor:
    """Attention output (after ``o_proj``) of queries ``q [B, H, N, D]`` over the stored K/V."""
    o = layer.attn.o_proj
    return F.linear(_out(sdpa(q, feats["k"], feats["v"], key_mask)), o.weight, o.bias)


def _cached_layer(layer: FusedLayer, store: Any, i: int, h: Tensor, rows: RopeRows,
                  key_mask: Tensor | None, impl: Any, *, refresh_prompt: bool,
                  refresh_gen: bool) -> tuple[Tensor, int]:
    """One layer that reuses features (see the module docstring); returns the new residual
    stream and the number of positions whose attention and FFN it recomputed."""
    feats = store.layers[i]
    b, length, _ = h.shape
    p = store.prompt_length
    g = length - p
    device = h.device
    gen = torch.arange(p, length, device=device).expand(b, -1)
    prompt = torch.arange(p, device=device).expand(b, -1)
    if refresh_gen:  # the response's Q/K/V, attention and FFN against the stored prompt
        chosen = gen
        q, k, v = _qkv(layer, _norm(layer.attn_norm, h[:, p:]), _rope_at(rows, gen), impl)
        feats["k"][:, :, p:], feats["v"][:, :, p:] = k, v
    elif store.ratio > 0:  # the ``ratio`` share of response rows whose V moved most
        xg = _norm(layer.attn_norm, h[:, p:])
        nh, nkv, hd = _heads(layer)
        w = layer.attn.qkv.weight[(nh + nkv) * hd:]
        bias = None if layer.attn.qkv.bias is None else layer.attn.qkv.bias[(nh + nkv) * hd:]
        v_new = F.linear(xg, w, bias)  # [B, G, Hkv * D]
        old = feats["v"][:, :, p:].transpose(1, 2).reshape(b, g, -1)
        picked = store.select(v_new, old)  # [B, k] response indices
        feats["v"][:, :, p:] = v_new.view(b, g, nkv, hd).transpose(1, 2)
        chosen = picked + p
        q = None
        if picked.shape[1]:
            q, k, _ = _qkv(layer, _gather(xg, picked), _rope_at(rows, chosen), impl)
            _scatter_heads(feats["k"], chosen, k)
    else:  # no partial refresh: the response's features are all reused
        chosen, q = gen[:, :0], None
    if refresh_prompt:
        qp, kp, vp = _qkv(layer, _norm(layer.attn_norm, h[:, :p]), _rope_at(rows, prompt),
                          impl)
        feats["k"][:, :, :p], feats["v"][:, :, :p] = kp, vp
        q = qp if q is None else torch.cat([qp, q], dim=2)
        chosen = torch.cat([prompt, chosen], dim=1)
    if q is not None:
        _scatter(feats["att"], chosen, _attend(layer, q, feats, key_mask))
    h1 = h + feats["att"]
    if chosen.shape[1]:
        _scatter(feats["mlp"], chosen, _mlp(layer, _gather(h1, chosen), impl))
    return h1 + feats["mlp"], chosen.shape[1]
