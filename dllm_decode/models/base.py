"""The ``DiffusionLM`` contract and the shared transformer layers.

Every family (LLaDA, Dream, SDAR-style block diffusion) is the same pre-norm decoder stack:
token embedding, per layer RMSNorm -> attention with RoPE (rotate-half) -> residual ->
RMSNorm -> SwiGLU MLP -> residual, final RMSNorm and an untied LM head. Families differ only
in tensor names, biases, per-head q/k norms, attention structure and logit alignment, which
``ModelSpec`` and the family modules capture. Nothing is cached on modules: K/V live in an
explicit ``BlockKVCache`` passed to ``forward``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode import kernels
from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.models.functional import (  # noqa: F401 (re-exported)
    apply_rope,
    block_causal_mask,
    cached_kv,
    kernel_attention,
    qkv_heads,
    rope_cos_sin,
    sdpa,
)
from dllm_decode.models.fused import FusedLayer
from dllm_decode.models.norm import RMSNorm  # noqa: F401 (re-exported)
from dllm_decode.types import DiffusionLM, Impl  # noqa: F401 (DiffusionLM re-exported)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers shared by every family (read from each family's config.json)."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    norm_eps: float
    max_length: int
    mask_token_id: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    attention: str = "bidirectional"
    block_size: int | None = None
    logit_shift: int = 0
    eot_token_id: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.attention not in ("bidirectional", "block_causal"):
            raise ValueError(f"attention must be 'bidirectional' or 'block_causal', got "
                             f"{self.attention!r}")
        if self.attention == "block_causal" and not self.block_size:
            raise ValueError("a block_causal model needs block_size >= 1")


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        h, hd = spec.hidden_size, spec.head_dim
        self.q_proj = nn.Linear(h, spec.num_heads * hd, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(spec.num_heads * hd, h, bias=False)
        if spec.qk_norm:
            self.q_norm = RMSNorm(hd, spec.norm_eps)
            self.k_norm = RMSNorm(hd, spec.norm_eps)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | None,
        layer: int,
        cache: BlockKVCache | None,
        slots: Tensor | None,
        store: bool,
        impl: Impl = Impl.REFERENCE,
    ) -> Tensor:
        """x ``[B, N, h]`` -> ``[B, N, h]``.

        mask: bool ``[B, N, Lk]``, a key mask ``[B, Lk]`` shared by every query, or ``None``
        (all visible). With ``impl=triton``, a cached forward that stores its K/V and has a key
        mask (or none) runs the ``kv_write_`` and ``block_attention`` kernels; every other
        forward uses SDPA.
        """
        b, n, _ = x.shape
        q, k, v = qkv_heads(self, x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None and store and impl is Impl.TRITON and (mask is None or
                                                                     mask.dim() == 2):
            out = kernel_attention(q, k, v, *cache.layer(layer), slots, mask, impl)
        else:
            out = sdpa(q, *cached_kv(cache, layer, slots, k, v, store), mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """Pre-norm block: ``h + attn(norm(h))``, then ``h + mlp(norm(h))``.

    One module with a ``forward`` so that device-placement engines (accelerate's dispatch
    hooks) can move a block's inputs to the block's device.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.attn = Attention(spec)
        self.mlp_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mlp = MLP(spec)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, index: int,
                cache: BlockKVCache | None, slots: Tensor, store: bool, impl: Impl) -> Tensor:
        """``h [B, N, hidden]`` -> ``[B, N, hidden]``; ``index`` is this layer's cache row."""
        h = h + self.attn(self.attn_norm(h), cos, sin, mask, index, cache, slots, store, impl)
        return h + self.mlp(self.mlp_norm(h))


class DecoderLM(nn.Module):
    """One pre-norm decoder for every family; see the module docstring.

    Internal parameter names are family-neutral; ``names`` maps them to and from the released
    checkpoint names (``checkpoint_state_dict`` / ``load_checkpoint_state_dict``).
    """

    #: internal-name regex -> checkpoint-name template, set by each family subclass
    names: tuple[tuple[str, str], ...] = ()
    #: attention kernels for cached forwards (``kv_write_``, ``block_attention``): ``auto``
    #: follows ``kernels.AUTO_ON_CUDA`` (SDPA and torch's scatter on CUDA, measured faster)
    attn_impl: Impl = Impl.AUTO
    #: the fused layer ops (``kernels.qkv_rope``, ``kernels.silu_mul``): ``auto`` = Triton
    #: on CUDA, the torch reference elsewhere
    layer_impl: Impl = Impl.AUTO

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        #: fused layers (``models.fused``); ``Layer`` above is their readable reference
        self.layers = nn.ModuleList(FusedLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    # ---- the DiffusionLM attributes -------------------------------------------------------
    @property
    def mask_token_id(self) -> int:
        return self.spec.mask_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.spec.eos_token_ids

    @property
    def attention(self) -> str:
        return self.spec.attention

    @property
    def block_size(self) -> int | None:
        return self.spec.block_size

    @property
    def logit_shift(self) -> int:
        return self.spec.logit_shift

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def max_length(self) -> int:
        return self.spec.max_length

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def supports_causal_in_block(self) -> bool | None:
        """Whether the weights run with causal attention inside a block (block size 1: an
        AR model; S2D2's verifier, ``draft_causal``, ``causal_prefix``): ``config.json``'s
        ``supports_causal_in_block``; ``None``: not stated (policies then trust the family)."""
        return self.spec.extra.get("supports_causal_in_block")

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the weights (``load_model(dtype=...)``)."""
        return self.head.weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the input embedding (where token ids go; ``device_map`` may spread the
        rest)."""
        return self.embed.weight.device

    def rope_positions(self, valid: Tensor) -> Tensor:
        """Canvas validity ``[B, L]`` (False = left padding) -> RoPE positions ``[B, L]``.

        LLaDA and block models keep absolute positions (pads included), as the mask-aware
        LLaDA modeling does; Dream overrides this with ``cumsum(valid) - 1``.
        """
        b, length = valid.shape
        return torch.arange(length, device=valid.device).expand(b, length)

    def rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``positions [B, N]`` -> the fp32 ``cos, sin [B, 1, N, D]`` a forward at those
        positions uses (``rope_cos_sin``): a caller that feeds the same positions again (the
        cache plans, every step of a block) computes them once and passes ``rope=``."""
        return rope_cos_sin(positions, self.spec.head_dim, self.spec.rope_theta)

    def new_cache(self, batch_size: int, max_len: int) -> BlockKVCache:
        """A preallocated K/V cache for this model (model dtype and device)."""
        p = self.head.weight
        devices = {q.device for q in self.parameters()}
        if len(devices) > 1:
            raise ValueError(f"a K/V cache needs the whole model on one device; this model is "
                             f"spread over {sorted(map(str, devices))} (device_map): decode "
                             f"with cache='none', or load it on one device")
        s = self.spec
        return BlockKVCache(s.num_layers, batch_size, s.num_kv_heads, max_len, s.head_dim,
                            dtype=p.dtype, device=p.device)

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        *,
        cache: BlockKVCache | None = None,
        slots: Tensor | None = None,
        mask: Tensor | None = None,
        store: bool = True,
        hidden_rows: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Logits aligned by position.

        Args:
            tokens: ``[B, N]`` token ids fed this forward.
            positions: ``[B, N]`` RoPE positions.
            cache: optional K/V cache; fresh K/V are written at ``slots`` when ``store``.
            slots: ``[B, N]`` cache rows of the fed tokens (default: ``positions``).
            mask: bool, ``[B, N, Lk]`` or key mask ``[B, Lk]``; Lk = N without a cache, the
                cache length with ``store=True``, cache length + N with ``store=False``.
                ``None``: everything visible (block-causal models build their mask).
            store: write fresh K/V into the cache (else attend to them without storing).
            hidden_rows: optional ``[R]`` indices into N; logits only for those rows.
            rope: optional ``rope_tables(positions)`` computed by the caller (the same
                tables; ``None``: computed here).

        Returns: logits ``[B, N, V]`` (or ``[B, R, V]``); ``logits[:, i]`` predicts
        ``tokens[:, i]``.
        """
        if tokens.shape != positions.shape or tokens.dim() != 2:
            raise ValueError(f"tokens {tuple(tokens.shape)} and positions "
                             f"{tuple(positions.shape)} must both be [B, N]")
        if slots is None:
            slots = positions
        if mask is None and self.spec.attention == "block_causal":
            if cache is not None:
                raise ValueError("pass an explicit mask for cached block-causal forwards")
            mask = block_causal_mask(positions, positions, self.spec.block_size)
        h = self.embed(tokens)
        cos, sin = self.rope_tables(positions) if rope is None else rope
        h = self._run_layers(h, cos, sin, mask, cache, slots, store)
        if self.spec.logit_shift:
            h = torch.cat((h[:, :1], h[:, :-1]), dim=1)
        if hidden_rows is not None:
            h = h.index_select(1, hidden_rows)
        return self.head(h)

    def _run_layers(self, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                    cache: BlockKVCache | None, slots: Tensor, store: bool) -> Tensor:
        """The layer stack and the final norm: embeddings ``h [B, N, hidden]`` -> normed
        ``[B, N, hidden]`` (a family with other layers overrides this, not ``forward``)."""
        rows = kernels.rope_rows(cos, sin)  # once per forward, shared by every layer
        attn_impl = self._cached_attn_impl(h) if cache is not None else Impl.REFERENCE
        impl = self._impl(h, self.layer_impl, ("qkv_rope", "silu_mul"))
        if torch.is_grad_enabled() and h.requires_grad:  # training: the differentiable path
            impl = Impl.REFERENCE
        for i, layer in enumerate(self.layers):
            if isinstance(layer, FusedLayer):
                h = layer(h, rows, mask, i, cache, slots, store, impl, attn_impl)
            else:  # a family's own (unfused) layer with the ``Layer`` signature
                h = layer(h, cos, sin, mask, i, cache, slots, store, attn_impl)
        return F.rms_norm(h, (h.shape[-1],), self.norm.weight, self.norm.eps)

    def feature_forward(self, tokens: Tensor, positions: Tensor, store: object,
                        **plan: object) -> Tensor:
        """dLLM-Cache's forward of the whole canvas, reusing per-layer features held in
        ``store`` as ``plan`` says (``models.feature_cache.feature_forward``; used by
        ``cache="dllm_cache"``). Logits as ``forward``."""
        from dllm_decode.models.feature_cache import feature_forward

        return feature_forward(self, tokens, positions, store, **plan)

    def capture_attention(self, layers: int) -> object:
        """A context (``models.attention_maps.AttentionCapture``) in which forwards keep the
        head-averaged softmax attention of the last ``layers`` layers (``.mean()``: ``[B, N,
        N]`` averaged over them); checked now (``ValueError``: layers this model cannot
        capture). DAWN's attention maps (``Capabilities.attention_maps``)."""
        from dllm_decode.models.attention_maps import capture_attention

        return capture_attention(self, layers)

    @property
    def input_embedding(self) -> Tensor:
        """The input-embedding matrix ``[V, H]`` (ReMix's ``W``; ``policies.remix``)."""
        return self.embed.weight

    def feed_embeddings(self, transform: Callable[[Tensor], Tensor]) -> object:
        """A context (``models.soft_inputs.FedEmbeddings``) in which forwards feed
        ``transform(embeds [B, N, H])`` instead of their tokens' embeddings (ReMix's soft
        inputs, ``Capabilities.soft_inputs``)."""
        from dllm_decode.models.soft_inputs import feed_embeddings

        return feed_embeddings(self, transform)

    def _block_size_view(self, block_size: int) -> DecoderLM:
        """A view of the same weights whose spec has another ``block_size`` (the families'
        ``with_block_size``)."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.spec = replace(self.spec, block_size=block_size)
        return other

    def _cached_attn_impl(self, h: Tensor) -> Impl:
        """``attn_impl`` resolved for ``h``'s device and dtype, once per setting of the
        ``DLLM_DECODE_KERNELS`` variable (read on every call, as ``kernels_env`` documents)."""
        return self._impl(h, self.attn_impl, ("kv_write_", "block_attention"))

    def _impl(self, h: Tensor, impl: Impl, ops: tuple[str, ...]) -> Impl:
        """``impl`` for ``ops`` resolved for ``h``'s device and dtype, memoised per setting of
        ``DLLM_DECODE_KERNELS`` (read on every call, as ``kernels_env`` documents)."""
        key = (h.device, h.dtype, impl, ops, os.environ.get(kernels.ENV_VAR))
        memo = self.__dict__.setdefault("_attn_impl_memo", {})
        got = memo.get(key)
        if got is None:
            got = memo[key] = kernels.resolve_impl(impl, h.device, dtype=h.dtype, ops=ops)
        return got

    # ---- checkpoint names -----------------------------------------------------------------
    def checkpoint_state_dict(self) -> dict[str, Tensor]:
        """State dict under the released checkpoint's tensor names."""
        return {to_checkpoint_name(self.names, k): v for k, v in self.state_dict().items()}


def to_checkpoint_name(names: tuple[tuple[str, str], ...], internal: str) -> str:
    """Map an internal parameter name to the checkpoint name using the family table."""
    import re

    for pattern, template in names:
        m = re.fullmatch(pattern, internal)
        if m:
            return template.format(*m.groups())
    raise KeyError(f"no checkpoint name for internal parameter {internal!r}")
