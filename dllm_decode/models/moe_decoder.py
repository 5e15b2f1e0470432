"""The decoder shared by the 2026 MoE families (LLaDA2, LLaDA-MoE, SDAR-MoE).

Pre-norm stack: embedding, per layer RMSNorm -> attention -> residual -> RMSNorm -> MLP (dense
SwiGLU or ``SparseMoE``) -> residual, final RMSNorm, untied LM head; logits position-aligned.
Attention: a fused head-major ``[Q heads | K heads | V heads]`` projection (LLaDA2) or separate
q/k/v, optional per-head q/k RMSNorm before RoPE, **partial RoPE** (rotate-half on the first
``rotary_dim`` dims of each head, frequencies ``theta^(-2i / rotary_dim)``, the rest passes
through; ``rotary_dim == head_dim`` is ordinary RoPE), scale ``1/sqrt(head_dim)``, GQA.

Family specifics live in ``ModelSpec.extra["arch"]`` (``ArchSpec``); each family module adds
its tensor-name table. Experts are stacked per layer (``sparse_moe.Experts``) while the
checkpoints store one tensor per expert: ``checkpoint_layout`` says which checkpoint tensor is
which slice, ``load_model`` fills the slices shard by shard, ``checkpoint_state_dict`` writes
them back per expert. Nothing is cached on modules; K/V live in the ``BlockKVCache`` passed to
``forward`` (``DecoderLM.forward``, which runs ``_run_layers`` here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.models.base import DecoderLM, ModelSpec, RMSNorm, to_checkpoint_name
from dllm_decode.models.dream import _L, _M, QWEN_NAMES
from dllm_decode.models.functional import cached_kv, qkv_heads, sdpa
from dllm_decode.models.sparse_moe import DenseMLP, MoEImpl, MoESpec, SparseMoE
from dllm_decode.models.weights import MAX_LAYERS


@dataclass(frozen=True)
class ArchSpec:
    """What the MoE families add to ``ModelSpec`` (kept in ``spec.extra["arch"]``)."""

    moe: MoESpec
    moe_layers: tuple[bool, ...]  # per layer: sparse MLP (True) or dense SwiGLU
    rotary_dim: int
    fused_qkv: bool = False
    out_bias: bool = False


def arch_of(spec: ModelSpec) -> ArchSpec:
    return spec.extra["arch"]


def partial_rope_tables(positions: Tensor, rotary_dim: int, theta: float
                        ) -> tuple[Tensor, Tensor]:
    """positions ``[B, N]`` -> fp32 ``cos, sin [B, 1, N, rotary_dim]`` (rotate-half layout,
    inverse frequencies ``theta^(-2i / rotary_dim)``)."""
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=positions.device,
                                        dtype=torch.float) / rotary_dim))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos(), emb.sin()


def apply_partial_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x [B, H, N, D]`` (fp32), pass the rest."""
    r = cos.shape[-1]
    rot = x[..., :r].float()
    a, b = rot.chunk(2, dim=-1)
    rot = rot * cos + torch.cat((-b, a), dim=-1) * sin
    if r == x.shape[-1]:
        return rot.to(x.dtype)
    return torch.cat((rot.to(x.dtype), x[..., r:]), dim=-1)


class MoEAttention(nn.Module):
    """Attention with fused or separate q/k/v, per-head q/k norm and partial RoPE."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        arch = arch_of(spec)
        self.spec = spec
        h, hd = spec.hidden_size, spec.head_dim
        nq, nkv = spec.num_heads * hd, spec.num_kv_heads * hd
        if arch.fused_qkv:
            self.qkv_proj = nn.Linear(h, nq + 2 * nkv, bias=spec.qkv_bias)
        else:
            self.q_proj = nn.Linear(h, nq, bias=spec.qkv_bias)
            self.k_proj = nn.Linear(h, nkv, bias=spec.qkv_bias)
            self.v_proj = nn.Linear(h, nkv, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(nq, h, bias=arch.out_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(hd, spec.norm_eps)
            self.k_norm = RMSNorm(hd, spec.norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, layer: int,
                cache: BlockKVCache | None, slots: Tensor, store: bool) -> Tensor:
        """x ``[B, N, h]`` -> ``[B, N, h]``; ``mask`` as in ``DecoderLM.forward``."""
        b, n, _ = x.shape
        q, k, v = qkv_heads(self, x)
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        out = sdpa(q, *cached_kv(cache, layer, slots, k, v, store), mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MoELayer(nn.Module):
    """Pre-norm block with a dense or sparse MLP."""

    def __init__(self, spec: ModelSpec, sparse: bool) -> None:
        super().__init__()
        arch = arch_of(spec)
        self.attn_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.attn = MoEAttention(spec)
        self.mlp_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mlp: nn.Module = (SparseMoE(spec.hidden_size, arch.moe) if sparse
                               else DenseMLP(spec.hidden_size, spec.intermediate_size))

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, index: int,
                cache: BlockKVCache | None, slots: Tensor, store: bool,
                moe_impl: MoEImpl) -> Tensor:
        h = h + self.attn(self.attn_norm(h), cos, sin, mask, index, cache, slots, store)
        x = self.mlp_norm(h)
        return h + (self.mlp(x, moe_impl) if isinstance(self.mlp, SparseMoE) else self.mlp(x))


class MoEDecoderLM(DecoderLM):
    """``DiffusionLM`` for the MoE families (see the module docstring).

    ``moe_impl``: ``"grouped"`` (default) or ``"reference"`` (the per-expert loop).
    ``expert_names``: ``(internal regex, checkpoint template)`` pairs for the stacked expert
    tensors; the template's last ``{}`` is the expert index.
    """

    expert_names: tuple[tuple[str, str], ...] = ()
    moe_impl: MoEImpl = "grouped"

    def __init__(self, spec: ModelSpec) -> None:
        nn.Module.__init__(self)
        arch = arch_of(spec)
        if len(arch.moe_layers) != spec.num_layers:
            raise ValueError(f"{len(arch.moe_layers)} per-layer MoE flags for "
                             f"{spec.num_layers} layers")
        if arch.rotary_dim % 2 or not 0 < arch.rotary_dim <= spec.head_dim:
            raise ValueError(f"rotary_dim {arch.rotary_dim} must be even and in (0, head_dim "
                             f"{spec.head_dim}]")
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(MoELayer(spec, sparse) for sparse in arch.moe_layers)
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``positions [B, N]`` -> fp32 ``cos, sin [B, 1, N, rotary_dim]``."""
        return partial_rope_tables(positions, arch_of(self.spec).rotary_dim,
                                   self.spec.rope_theta)

    def with_block_size(self, block_size: int) -> MoEDecoderLM:
        """A view of the same weights with another attention block size (block-causal
        families: LLaDA2 decodes with the generation's ``block_length``)."""
        if self.spec.attention != "block_causal":
            raise ValueError(f"{self.spec.family} attention is {self.spec.attention!r}; only "
                             "block-causal models have a block size")
        return self._block_size_view(block_size)

    def _run_layers(self, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                    cache: BlockKVCache | None, slots: Tensor, store: bool) -> Tensor:
        """The MoE layers and the final norm (``DecoderLM.forward`` does the rest)."""
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, mask, i, cache, slots, store, self.moe_impl)
        return self.norm(h)

    # ---- checkpoint names: stacked experts <-> one tensor per expert -----------------------
    def checkpoint_layout(self) -> dict[str, tuple[str, int | None]]:
        """Checkpoint tensor name -> (internal name, expert index or ``None`` = whole)."""
        out: dict[str, tuple[str, int | None]] = {}
        for internal, value in self.state_dict().items():
            for pattern, template in self.expert_names:
                m = re.fullmatch(pattern, internal)
                if m:
                    for e in range(value.shape[0]):
                        out[template.format(*m.groups(), e)] = (internal, e)
                    break
            else:
                out[to_checkpoint_name(self.names, internal)] = (internal, None)
        return out

    def checkpoint_state_dict(self) -> dict[str, Tensor]:
        """State dict under the released checkpoint's tensor names (one tensor per expert)."""
        state = self.state_dict()
        return {name: state[internal] if e is None else state[internal][e]
                for name, (internal, e) in self.checkpoint_layout().items()}


#: Qwen-MoE / OLMoE-style names (LLaDA-MoE, SDAR-MoE): the Qwen names plus the router and,
#: when a family has one, the shared expert on the decoder layer
#: (``model.layers.{i}.shared_expert``)
QWEN_MOE_NAMES = (
    *QWEN_NAMES,
    (_L + r"mlp\.gate\.weight", _M + "mlp.gate.weight"),
    (_L + r"mlp\.shared\.(gate|up|down)_proj\.weight", _M + "shared_expert.{}_proj.weight"),
)
QWEN_MOE_EXPERT_NAMES = (
    (_L + r"mlp\.experts\.(gate|up|down)_proj",
     "model.layers.{0}.mlp.experts.{2}.{1}_proj.weight"),
)


def token_ids(cfg: dict[str, Any], family: str, released_mask: int) -> dict[str, Any]:
    """mask / eos / pad ids of a config dict: ``mask_token_id`` from the config (or the
    ``generation_config.json`` fields ``load_model`` merges in), else the released
    checkpoints' mask id ``released_mask`` (the id their tokenizer reserves; a checkpoint with
    another vocabulary must state its own). EOS: ``eos_token_id`` (int or list)."""
    mask = cfg.get("mask_token_id", cfg.get("mask_id"))
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])) \
        if eos is not None else ()
    if not eos_ids:
        raise ValueError(f"{family} config.json has no eos_token_id")
    return dict(mask_token_id=int(released_mask if mask is None else mask),
                eos_token_ids=eos_ids, pad_token_id=cfg.get("pad_token_id"))


def token_config(spec: ModelSpec) -> dict[str, Any]:
    """The ``config.json`` fields ``token_ids`` reads back: mask, EOS (an int when there is
    one), pad; and ``use_cache: false``."""
    eos = spec.eos_token_ids
    return {"mask_token_id": spec.mask_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else list(eos),
            "pad_token_id": spec.pad_token_id, "use_cache": False}


def layer_count(cfg: dict[str, Any], family: str) -> int:
    """``num_hidden_layers`` of a config dict; ``ValueError`` outside ``[1, MAX_LAYERS]``."""
    layers = int(cfg["num_hidden_layers"])
    if not 1 <= layers <= MAX_LAYERS:
        raise ValueError(f"{family} num_hidden_layers {layers} must be in [1, {MAX_LAYERS:,}]")
    return layers


def check_config(cfg: dict[str, Any], family: str, unsupported: tuple[str, ...]) -> None:
    """Raise ``ValueError`` for a config that sets any of ``unsupported`` or an activation
    other than SiLU."""
    for key in unsupported:
        if cfg.get(key):
            raise ValueError(f"{family} config {key}={cfg[key]!r} is not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{family} hidden_act {cfg['hidden_act']!r}: only 'silu' is supported")


def moe_spec(cfg: dict[str, Any], name: str, released_mask: int, arch: ArchSpec,
             **fields: Any) -> ModelSpec:
    """``ModelSpec`` of an MoE family's config dict: the Qwen-style fields every MoE config
    names alike (vocabulary, hidden size, layers, heads, RoPE theta, context length,
    ``attention_bias``), the token ids (``token_ids``; ``name`` is the family's name in error
    messages) and ``arch``; ``fields`` gives the rest
    (``family``, ``head_dim``, ``intermediate_size``, ``norm_eps``, ...) and overrides."""
    heads = int(cfg["num_attention_heads"])
    spec: dict[str, Any] = dict(
        vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
        num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        max_length=int(cfg.get("max_position_embeddings", 4096)),
        qkv_bias=bool(cfg.get("attention_bias", False)), extra={"arch": arch},
        **token_ids(cfg, name, released_mask),
    )
    spec.update(fields)
    return ModelSpec(**spec)
