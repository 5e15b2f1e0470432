"""DiffusionGemma (``google/diffusiongemma-26B-A4B-it``): a uniform-noise block diffusion LM.

Clean-room, from the released ``config.json`` and tensor names (facts:
``shared/research/models-2026.md`` (c); reference: Hugging Face transformers
``models/diffusion_gemma``, v5.24). One Gemma-4 MoE text stack (``models.gemma_layers``) runs
twice with the same weights:

* **encoder**: causal over the prompt (and later every finished canvas), sliding-window layers
  seeing the last ``sliding_window`` positions; it only fills the K/V cache (``encode``);
* **decoder**: over one canvas of ``canvas_length`` tokens at the positions right after the
  cache, attending bidirectionally to the cached prefix and the canvas (``decode``); its input
  embedding is mixed with the **self-conditioning** signal from the previous step's logits.
  On sliding layers the decoder sees only the last ``sliding_window - 1`` cached positions,
  which is what the reference's sliding cache layers keep (``DynamicSlidingWindowLayer``).

Logits are ``tanh(head(h) / 30) * 30`` in fp32 (``final_logit_softcapping``), the head tied to
the embedding. There is no mask token: the model declares ``noise_kind = "uniform"`` and the
sampler starts each canvas from uniformly random tokens (``samplers.uniform``, run by the one
decode loop with the encoder-decoder cache plan ``cache.canvas``).

Text only: the vision tower's tensors (``model.encoder.vision_tower.*``,
``model.encoder.embed_vision.*``) are skipped when loading, and an image placeholder token in
the input is a ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.models.gemma_layers import (
    GemmaLayer,
    GemmaLayerSpec,
    GemmaNorm,
    SelfConditioning,
    gemma_rope,
)
from dllm_decode.models.weights import MAX_LAYERS, CheckpointError

ARCHITECTURE = "DiffusionGemmaForBlockDiffusion"
#: the reference's generation defaults when ``generation_config.json`` leaves one unset
REFERENCE_GENERATION = {"max_denoising_steps": 48, "entropy_bound": 0.1, "t_min": 0.4,
                        "t_max": 0.8, "stability_threshold": 1, "confidence_threshold": 0.005}


@dataclass(frozen=True)
class GemmaSpec:
    """The text architecture plus the special ids and canvas length (``config.json``)."""

    vocab_size: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    norm_eps: float
    sliding_window: int
    softcap: float
    canvas_length: int
    max_length: int
    layers: tuple[GemmaLayerSpec, ...]
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    bos_token_id: int | None
    image_token_ids: tuple[int, ...] = ()
    generation: dict = field(default_factory=dict)


def is_diffusion_gemma(config: dict[str, Any]) -> bool:
    """Dispatch on ``architectures`` first, ``model_type`` second."""
    arch = config.get("architectures") or []
    return ARCHITECTURE in arch or str(config.get("model_type", "")) == "diffusion_gemma"


def gemma_spec(config: dict[str, Any], generation: dict[str, Any] | None = None) -> GemmaSpec:
    """``config.json`` (+ ``generation_config.json``) -> ``GemmaSpec``; ``CheckpointError`` on
    missing or inconsistent fields."""
    try:
        text = config["text_config"]
        n_layers = int(text["num_hidden_layers"])
        if not 1 <= n_layers <= MAX_LAYERS:  # before any per-layer table is built
            raise CheckpointError(f"DiffusionGemma config: num_hidden_layers {n_layers} must be "
                                  f"in [1, {MAX_LAYERS:,}]")
        types = list(text["layer_types"])
        per_layer = {str(k): v for k, v in (text.get("per_layer_config") or {}).items()}
        rope = text["rope_parameters"]
        layers = []
        for i, kind in enumerate(types):
            full = kind == "full_attention"
            over = per_layer.get(str(i), {})
            hd = over.get("head_dim", text.get("global_head_dim") if full else None)
            kvh = over.get("num_key_value_heads",
                           text.get("num_global_key_value_heads") if full else None)
            rp = rope[kind]
            layers.append(GemmaLayerSpec(
                sliding=kind == "sliding_attention", head_dim=int(hd or text["head_dim"]),
                num_kv_heads=int(kvh or text["num_key_value_heads"]),
                rope_type=rp.get("rope_type", "default"), rope_theta=float(rp["rope_theta"]),
                partial_rotary_factor=float(rp.get("partial_rotary_factor", 1.0))))
        eos = config.get("eos_token_id", text.get("eos_token_id"))
        if (generation or {}).get("eos_token_id") is not None:
            eos = generation["eos_token_id"]
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
        spec = GemmaSpec(
            vocab_size=int(text["vocab_size"]), hidden_size=int(text["hidden_size"]),
            num_heads=int(text["num_attention_heads"]),
            intermediate_size=int(text["intermediate_size"]),
            num_experts=int(text["num_experts"]), top_k=int(text["top_k_experts"]),
            moe_intermediate_size=int(text["moe_intermediate_size"]),
            norm_eps=float(text["rms_norm_eps"]), sliding_window=int(text["sliding_window"]),
            softcap=float(text.get("final_logit_softcapping") or 30.0),
            canvas_length=int(config["canvas_length"]),
            max_length=int(text["max_position_embeddings"]), layers=tuple(layers),
            eos_token_ids=eos_ids, pad_token_id=text.get("pad_token_id"),
            bos_token_id=text.get("bos_token_id"),
            image_token_ids=tuple(int(config[k]) for k in ("image_token_id",) if k in config),
            generation=_generation_defaults(generation or {}))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"DiffusionGemma config: missing or invalid field {err}") from None
    if len(layers) != n_layers:
        raise CheckpointError(f"DiffusionGemma config: {len(layers)} layer_types for "
                              f"num_hidden_layers {n_layers}")
    if text.get("use_bidirectional_attention") == "all":
        raise CheckpointError("DiffusionGemma config: use_bidirectional_attention='all' (a "
                              "bidirectional encoder) is not supported; the release uses 'vision'")
    _check_spec(spec)
    return spec


def _check_spec(spec: GemmaSpec) -> None:
    """``CheckpointError`` for sizes below 1, a top-k outside ``[1, num_experts]``, head
    counts that do not group, odd head dims (RoPE rotates halves) and token ids outside the
    vocabulary: each names the field and what is allowed."""
    where = "DiffusionGemma config"
    sizes = {"vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
             "num_attention_heads": spec.num_heads, "intermediate_size": spec.intermediate_size,
             "num_experts": spec.num_experts, "moe_intermediate_size":
             spec.moe_intermediate_size, "canvas_length": spec.canvas_length,
             "max_position_embeddings": spec.max_length}
    for i, layer in enumerate(spec.layers):
        sizes[f"layer {i} head_dim"] = layer.head_dim
        sizes[f"layer {i} num_key_value_heads"] = layer.num_kv_heads
    for name, value in sizes.items():
        if value < 1:
            raise CheckpointError(f"{where}: {name} must be >= 1, got {value}")
    if not 1 <= spec.top_k <= spec.num_experts:
        raise CheckpointError(f"{where}: top_k_experts {spec.top_k} must be in [1, num_experts "
                              f"{spec.num_experts}]")
    for i, layer in enumerate(spec.layers):
        if spec.num_heads % layer.num_kv_heads or layer.head_dim % 2:
            raise CheckpointError(
                f"{where}: layer {i} has {layer.num_kv_heads} key/value heads and head_dim "
                f"{layer.head_dim}; num_attention_heads {spec.num_heads} must be a multiple "
                f"of the key/value heads and head_dim even (RoPE rotates halves)")
    ids = [("eos_token_id", e) for e in spec.eos_token_ids]
    ids += [(n, v) for n, v in (("pad_token_id", spec.pad_token_id),
                                ("bos_token_id", spec.bos_token_id),
                                *(("image_token_id", i) for i in spec.image_token_ids))
            if v is not None]
    for name, value in ids:
        if not 0 <= int(value) < spec.vocab_size:
            raise CheckpointError(f"{where}: {name} {value} is outside the vocabulary [0, "
                                  f"{spec.vocab_size}); fix {name} or vocab_size")


def gemma_min_parameters(spec: GemmaSpec) -> int:
    """A lower bound of the parameter count ``spec`` implies: the tied embedding ``V x d``
    and per layer q / k / o projections, the dense MLP ``3 d I``, the experts
    ``3 d I_moe E`` (``v_proj`` and the norms left out)."""
    d = spec.hidden_size
    per_layer = 3 * d * spec.intermediate_size + 3 * d * spec.moe_intermediate_size * \
        spec.num_experts
    attention = sum(d * (2 * spec.num_heads + s.num_kv_heads) * s.head_dim for s in spec.layers)
    return spec.vocab_size * d + len(spec.layers) * per_layer + attention


def _generation_defaults(gen: dict[str, Any]) -> dict[str, Any]:
    """The decoding settings of ``generation_config.json`` (missing ones: the reference's)."""
    out = dict(REFERENCE_GENERATION)
    for key in ("max_denoising_steps", "t_min", "t_max", "stability_threshold",
                "confidence_threshold", "max_new_tokens"):
        if key in gen:
            out[key] = gen[key]
    bound = (gen.get("sampler_config") or {}).get("entropy_bound")
    if bound is not None:
        out["entropy_bound"] = bound
    return out


class GemmaCache:
    """Per-layer K/V of the encoded prefix, ``[B, Hkv_l, L_max, D_l]`` (head shapes differ
    between sliding and full layers), the prefix ``length`` (a host int, equal for every row:
    prompts are left-padded) and key validity ``valid [B, L_max]`` (False = padding)."""

    def __init__(self, spec: GemmaSpec, batch_size: int, max_len: int, *, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.k = [torch.zeros(batch_size, s.num_kv_heads, max_len, s.head_dim, dtype=dtype,
                              device=device) for s in spec.layers]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.length = 0
        self.padded = False  # any invalid key (host flag, set by ``encode``)

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]


class DiffusionGemmaModel(nn.Module):
    """The text model of ``DiffusionGemmaForBlockDiffusion`` (module docstring).

    ``encode`` fills a ``GemmaCache``; ``decode`` (also ``forward``) returns the canvas logits.
    ``moe_impl``: ``"grouped"`` (default: tokens sorted by expert, grouped GEMMs; the
    reference's default path, bit for bit on CPU) or ``"reference"`` (a readable loop over the
    chosen experts; equal within fp32 rounding)."""

    noise_kind = "uniform"
    mask_token_id = None
    attention = "bidirectional"
    block_size = None
    logit_shift = 0
    family = "diffusion_gemma"

    def __init__(self, spec: GemmaSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.embed = nn.Embedding(spec.vocab_size, h)
        self.layers = nn.ModuleList(
            GemmaLayer(h, spec.num_heads, spec.intermediate_size, spec.num_experts, spec.top_k,
                       spec.moe_intermediate_size, ls, spec.norm_eps) for ls in spec.layers)
        self.encoder_scalars = nn.ParameterList(nn.Parameter(torch.ones(1))
                                                for _ in spec.layers)
        self.norm = GemmaNorm(h, spec.norm_eps)
        self.self_conditioning = SelfConditioning(h, spec.intermediate_size, spec.norm_eps)
        self.moe_impl = "grouped"

    # ---- what the sampler reads ------------------------------------------------------------
    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.spec.eos_token_ids

    @property
    def pad_token_id(self) -> int | None:
        return self.spec.pad_token_id

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def max_length(self) -> int:
        return self.spec.max_length

    @property
    def canvas_length(self) -> int:
        return self.spec.canvas_length

    @property
    def generation_defaults(self) -> dict[str, Any]:
        return dict(self.spec.generation)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def new_cache(self, batch_size: int, max_len: int) -> GemmaCache:
        return GemmaCache(self.spec, batch_size, max_len, dtype=self.dtype, device=self.device)

    # ---- forward passes --------------------------------------------------------------------
    def _embed(self, tokens: Tensor) -> Tensor:
        scale = torch.tensor(self.spec.hidden_size ** 0.5, dtype=self.dtype)
        return self.embed(tokens) * scale.to(tokens.device)

    def _check_tokens(self, tokens: Tensor, what: str, images: bool = False) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"{what} must be [B, N] token ids, got shape {tuple(tokens.shape)}")
        ids = self.spec.image_token_ids
        if images and ids and torch.isin(tokens, torch.tensor(ids, device=tokens.device)).any():
            raise ValueError(f"{what} contains image tokens {list(ids)}: image inputs are not "
                             "supported (DiffusionGemma is loaded text-only; its vision tower "
                             "was skipped)")

    def _layer_rope(self, positions: Tensor, dtype: torch.dtype) -> dict[GemmaLayerSpec, Any]:
        return {s: gemma_rope(positions, s, dtype) for s in set(self.spec.layers)}

    @torch.no_grad()
    def encode(self, tokens: Tensor, cache: GemmaCache, valid: Tensor | None = None, *,
               prompt: bool = True) -> None:
        """Run the causal encoder over ``tokens [B, N]`` (positions ``cache.length + i``) and
        append their K/V to ``cache``. ``valid [B, N]`` marks real tokens (False = left
        padding: never attended to; pads still take positions, as in the reference).
        ``prompt``: user input, checked for image placeholder tokens (``image_token_id``: an
        image input, which this text-only model rejects); ``False`` for generated canvases."""
        self._check_tokens(tokens, "encoder input", images=prompt)
        b, n = tokens.shape
        start, end = cache.length, cache.length + n
        if end > cache.max_len:
            raise ValueError(f"the cache holds {cache.max_len} positions; encoding {n} more "
                             f"after {start} overflows it")
        cache.valid[:, start:end] = True if valid is None else valid.bool()
        if valid is not None and not cache.padded:  # one host read per encoded chunk
            cache.padded = not bool(valid.all())
        positions = torch.arange(start, end, device=tokens.device).expand(b, n)
        # sliding layers read the last window - 1 cached positions (what the reference's
        # sliding cache layers keep), full layers the whole cache
        lows = {True: max(start - (self.spec.sliding_window - 1), 0), False: 0}
        masks: dict[bool, Tensor | None] = {}
        for sliding, lo in lows.items():
            width = end - lo
            if not cache.padded and (width == n or n == 1) and not (
                    sliding and width >= self.spec.sliding_window):
                masks[sliding] = None  # SDPA's is_causal, as the reference's mask skip
                continue
            q_pos = positions[0][:, None]
            k_pos = torch.arange(lo, end, device=tokens.device)[None]
            seen = (k_pos <= q_pos) & cache.valid[:, None, lo:end] | (k_pos == q_pos)
            masks[sliding] = seen & (q_pos - k_pos < self.spec.sliding_window) if sliding \
                else seen  # [B, N, end - lo]
        h = self._embed(tokens)
        rope = self._layer_rope(positions, h.dtype)
        for i, layer in enumerate(self.layers):
            ls = layer.spec
            lo = lows[ls.sliding]
            x = layer.input_layernorm(h)
            q, k, v = layer.self_attn.project(x, *rope[ls])
            cache.k[i][:, :, start:end] = k
            cache.v[i][:, :, start:end] = v
            mask = masks[ls.sliding]
            a = layer.self_attn.attend(q, cache.k[i][:, :, lo:end], cache.v[i][:, :, lo:end],
                                       mask, causal=mask is None and n > 1)
            h = h + layer.post_attention_layernorm(a)
            h = layer.feed_forward(h, self.encoder_scalars[i], self.moe_impl == "grouped")
        cache.length = end

    @torch.no_grad()
    def decode(self, canvas: Tensor, cache: GemmaCache,
               self_conditioning: Tensor | None = None) -> Tensor:
        """Logits ``[B, C, V]`` (fp32, soft-capped) of ``canvas [B, C]`` at positions
        ``cache.length + j``, bidirectional over the cached prefix and the canvas.

        ``self_conditioning``: ``[B, C, V]`` logits of the previous step (the reference passes
        its temperature-scaled logits), or ``None`` on a canvas's first step (zero signal)."""
        self._check_tokens(canvas, "canvas")
        b, c = canvas.shape
        n = cache.length
        w = self.embed.weight
        x = self._embed(canvas)
        if self_conditioning is None:
            soft = torch.zeros_like(x)
        else:
            probs = torch.softmax(self_conditioning, dim=-1, dtype=torch.float32).to(w.dtype)
            soft = (probs @ w) * torch.tensor(self.spec.hidden_size ** 0.5, dtype=x.dtype,
                                              device=x.device)
        h = self.self_conditioning.condition(x, soft)
        positions = torch.arange(n, n + c, device=canvas.device).expand(b, c)
        rope = self._layer_rope(positions, h.dtype)
        # the reference's sliding cache layers keep only the last window - 1 prefix entries
        start = {True: max(n - (self.spec.sliding_window - 1), 0), False: 0}
        masks = {}
        if cache.padded:  # key masks over the kept prefix + the canvas (else: no mask, as SDPA
            for sliding, lo in start.items():  # is called by the reference, bit for bit)
                keys = torch.cat([cache.valid[:, lo:n], torch.ones(b, c, dtype=torch.bool,
                                                                   device=canvas.device)], 1)
                masks[sliding] = keys[:, None].expand(b, c, n - lo + c)
        for i, layer in enumerate(self.layers):
            ls = layer.spec
            lo = start[ls.sliding]
            q, k, v = layer.self_attn.project(layer.input_layernorm(h), *rope[ls])
            keys_k = torch.cat([cache.k[i][:, :, lo:n], k], 2)
            keys_v = torch.cat([cache.v[i][:, :, lo:n], v], 2)
            a = layer.self_attn.attend(q, keys_k, keys_v, masks.get(ls.sliding))
            h = h + layer.post_attention_layernorm(a)
            h = layer.feed_forward(h, layer.layer_scalar, self.moe_impl == "grouped")
        logits = F.linear(self.norm(h), w).float()
        return torch.tanh(logits / self.spec.softcap) * self.spec.softcap

    def forward(self, canvas: Tensor, cache: GemmaCache,
                self_conditioning: Tensor | None = None) -> Tensor:
        """``decode`` (the model's one sampler-facing forward)."""
        return self.decode(canvas, cache, self_conditioning)
