"""The model families a ``config.json`` can name, and its checks before any weight is read.

``family_key`` / ``family_of`` dispatch a config to its family (``architectures`` first, then
``model_type``); ``parse_spec`` turns it into a ``ModelSpec`` checked for internal consistency
(head counts, head_dim, token ids inside the vocabulary), ``check_config_fits`` bounds its
sizes by the weights the files hold, ``with_token_ids`` fills a missing mask id from
``generation_config.json``. ``build_model`` builds any family from a config and a seed;
``register_auto_config`` registers the config classes with ``transformers``. Loading and saving
the weights is ``models.loading``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dllm_decode.memory import check_fits
from dllm_decode.models.base import DecoderLM, ModelSpec
from dllm_decode.models.block import BlockDiffusionModel, sdar_config, sdar_spec
from dllm_decode.models.dream import DreamModel, dream_config, dream_spec
from dllm_decode.models.fastdllm2 import FastDLLMv2Model, fastdllm2_config, fastdllm2_spec
from dllm_decode.models.llada import LLaDAModel, llada_config, llada_spec
from dllm_decode.models.llada2 import LLaDA2MoEModel, llada2_config, llada2_spec
from dllm_decode.models.llada_moe import LLaDAMoEModel, llada_moe_config, llada_moe_spec
from dllm_decode.models.sdar_moe import SDARMoEModel, sdar_moe_config, sdar_moe_spec
from dllm_decode.models.weights import CheckpointError, MaskTokenIdError, read_json

#: model_type (as written in config.json, case-insensitive) -> (class, spec parser, writer)
FAMILIES: dict[str, tuple[type[DecoderLM], Callable[[dict], ModelSpec], Callable]] = {
    "llada": (LLaDAModel, llada_spec, llada_config),
    "dream": (DreamModel, dream_spec, dream_config),
    "sdar": (BlockDiffusionModel, sdar_spec, sdar_config),
    "llada2_moe": (LLaDA2MoEModel, llada2_spec, llada2_config),
    "fast_dllm_qwen": (FastDLLMv2Model, fastdllm2_spec, fastdllm2_config),
    "lladamoe": (LLaDAMoEModel, llada_moe_spec, llada_moe_config),
    "sdar_moe": (SDARMoEModel, sdar_moe_spec, sdar_moe_config),
}
#: ``architectures[0]`` -> ``FAMILIES`` key, read before ``model_type`` (LLaDA-MoE's released
#: config says ``model_type: "llada"`` like dense LLaDA; only its architecture tells them apart)
ARCHITECTURES: dict[str, str] = {
    "LLaDA2MoeModelLM": "llada2_moe",
    "Fast_dLLM_QwenForCausalLM": "fast_dllm_qwen",
    "LLaDAMoEModelLM": "lladamoe",
    "LLaDAMoEModel": "lladamoe",
    "SDARMoeForCausalLM": "sdar_moe",
}
#: families whose released config.json lacks the mask id: ``generation_config.json``'s
#: ``mask_token_id`` is read too (before the family's released default)
GENERATION_IDS = frozenset({"llada2_moe", "fast_dllm_qwen", "lladamoe", "sdar_moe"})


def parse_spec(config: dict[str, Any], where: Path | str) -> ModelSpec:
    """``ModelSpec`` for ``config`` (read from ``where``), checked for internal consistency.

    Raises ``CheckpointError`` for missing / malformed fields, ``hidden_size`` not divisible by
    the head count, a recorded ``head_dim`` that contradicts it, and token ids (mask, EOS, pad)
    outside the vocabulary.
    """
    _, parse, _ = family_of(config, where)
    mt = config.get("model_type")
    try:
        spec = parse(config)
    except KeyError as err:
        raise CheckpointError(f"{where}: model_type {mt!r} needs the field {err.args[0]!r}, "
                              f"which is missing; is model_type right for this checkpoint? "
                              f"(supported: {sorted(FAMILIES)})") from None
    except ZeroDivisionError:
        raise CheckpointError(f"{where}: the number of attention heads must be >= 1") from None
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: {err}") from None
    for field, value in (("vocab size", spec.vocab_size), ("hidden size", spec.hidden_size),
                         ("number of layers", spec.num_layers),
                         ("number of key/value heads", spec.num_kv_heads),
                         ("intermediate (MLP) size", spec.intermediate_size),
                         ("max sequence length", spec.max_length)):
        if value < 1:
            raise CheckpointError(f"{where}: the {field} must be >= 1, got {value}")
    heads, hidden = spec.num_heads, spec.hidden_size
    explicit_hd = "head_dim" in config and spec.family != "llada"
    if heads < 1:
        raise CheckpointError(f"{where}: the number of attention heads must be >= 1, got {heads}")
    if not explicit_hd and hidden % heads:
        raise CheckpointError(f"{where}: hidden size {hidden} is not divisible by the number of "
                              f"attention heads {heads}; fix the head count in the config")
    recorded = config.get("head_dim")
    if spec.family == "llada" and recorded is not None and int(recorded) != hidden // heads:
        raise CheckpointError(f"{where}: n_heads {heads} gives head_dim {hidden // heads}, but "
                              f"the config records head_dim {recorded}; was n_heads changed?")
    if spec.head_dim % 2:
        raise CheckpointError(f"{where}: head_dim {spec.head_dim} must be even (rotary "
                              "embeddings rotate half of it)")
    ids = [("mask_token_id", spec.mask_token_id)]
    ids += [("eos_token_id", e) for e in spec.eos_token_ids]
    if spec.pad_token_id is not None:
        ids.append(("pad_token_id", spec.pad_token_id))
    for name, value in ids:
        if not 0 <= int(value) < spec.vocab_size:
            error = MaskTokenIdError if name == "mask_token_id" else CheckpointError
            raise error(f"{where}: {name} {value} is outside the vocabulary "
                        f"[0, {spec.vocab_size}); fix {name} or vocab_size"
                        + ("" if name != "mask_token_id" else
                           " (or pass load_model(..., mask_token_id=...))"))
    return with_causal_in_block(spec, config, where)


def with_causal_in_block(spec: ModelSpec, config: dict[str, Any], where: Path | str) -> ModelSpec:
    """``spec`` with ``config``'s ``supports_causal_in_block`` (a bool: whether the weights
    were trained to run with causal attention inside a block, e.g. S2D2's block-size-1
    verifier) in ``spec.extra``; absent: not stated."""
    if "supports_causal_in_block" not in config:
        return spec
    flag = config["supports_causal_in_block"]
    if not isinstance(flag, bool):
        raise CheckpointError(f"{where}: supports_causal_in_block must be true or false, got "
                              f"{flag!r}")
    return replace(spec, extra={**spec.extra, "supports_causal_in_block": flag})


def min_parameters(spec: ModelSpec) -> int:
    """A lower bound of the parameter count ``spec`` implies (every family here has at least
    an embedding ``V x d`` and per layer q / k / v / o projections and a 3-matrix MLP: dense
    ``3 d I``, or in an MoE family's sparse layers its ``E`` routed experts, ``3 d I_moe E``,
    which the loader's per-expert name table would otherwise enumerate first)."""
    d, hd = spec.hidden_size, spec.head_dim
    attention = 2 * d * spec.num_heads * hd + 2 * d * spec.num_kv_heads * hd
    dense = 3 * d * spec.intermediate_size
    arch = spec.extra.get("arch")
    if arch is None:
        mlps = spec.num_layers * dense
    else:
        sparse = 3 * d * arch.moe.intermediate_size * arch.moe.num_experts
        mlps = sum(sparse if s else dense for s in arch.moe_layers)
    return spec.vocab_size * d + spec.num_layers * attention + mlps


def check_config_fits(spec: ModelSpec, stored: int, where: Path | str) -> None:
    """``CheckpointError`` when the config implies more than twice the parameters the weight
    files hold (``stored`` values, from the headers): checked before any module is built, so
    absurd sizes (vocabulary 10^12, 10^6 layers, 10^9 experts) fail here and not in an
    allocation. The slack keeps the bound safe for layers ``min_parameters`` counts only in
    part (norms, biases, routers, shared experts left out); a smaller mismatch is caught
    tensor by tensor after. (Released LLaDA2-mini, "16B": the bound is ~15.9 G; DiffusionGemma
    26B-A4B: ~25 G, its own bound.)"""
    check_parameter_bound(
        min_parameters(spec), stored, where,
        f"vocab {spec.vocab_size}, hidden {spec.hidden_size}, {spec.num_layers} layers, "
        f"{spec.num_heads} heads, intermediate {spec.intermediate_size}{_experts(spec)}")


def check_parameter_bound(need: int, stored: int, where: Path | str, sizes: str) -> None:
    """``CheckpointError`` naming ``sizes`` (the config's, as text) when a config's lower bound
    of ``need`` parameters exceeds twice the ``stored`` values its weight files hold."""
    if need > 2 * stored:
        raise CheckpointError(
            f"{where}: its sizes ({sizes}) need at least {need:,} parameters, but the weight "
            f"files hold {stored:,} values: the config does not describe these weights (check "
            f"its vocabulary, layer count and sizes)")


def _experts(spec: ModelSpec) -> str:
    """``", 64 experts of intermediate 1024"`` for an MoE family's spec, else ``""``."""
    arch = spec.extra.get("arch")
    return "" if arch is None else (f", {arch.moe.num_experts} experts of intermediate "
                                    f"{arch.moe.intermediate_size}")


def build_model(config: dict[str, Any], *, seed: int | None = 0,
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                init_std: float = 0.02) -> DecoderLM:
    """A model of any family from a config dict, with weights drawn from ``seed``.

    For tests and examples: N(0, init_std^2) matrices, unit norm weights.
    """
    cls, _, _ = family_of(config)
    spec = parse_spec(config, "config")
    elem = torch.empty((), dtype=dtype).element_size()
    check_fits(min_parameters(spec) * max(4, elem), "cpu", "building this model's weights",
               "the config's sizes (vocabulary, layers, hidden / intermediate) are too large")
    gen = torch.Generator().manual_seed(seed or 0)
    model = cls(spec)
    state = {}  # drawn by the released (unfused) tensors, in their order: seeds stay stable
    for name, p in model.state_dict().items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(p.shape)
        elif name.endswith("bias"):
            state[name] = torch.zeros(p.shape)
        else:
            state[name] = torch.randn(p.shape, generator=gen) * init_std
    model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()


def family_key(config: dict[str, Any]) -> str:
    """The ``FAMILIES`` key of a config: by ``architectures`` when listed in
    ``ARCHITECTURES``, else by ``model_type`` (lower-cased)."""
    archs = config.get("architectures") or []
    for arch in archs if isinstance(archs, list) else [archs]:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    return str(config.get("model_type", "")).lower()


def family_of(config: dict[str, Any], where: Path | str = "config"
              ) -> tuple[type[DecoderLM], Callable, Callable]:
    mt = family_key(config)
    if mt not in FAMILIES:
        raise CheckpointError(
            f"{where}: unknown model_type {config.get('model_type')!r}; supported: "
            f"{sorted(FAMILIES)}, or architectures {sorted(ARCHITECTURES)}"
        )
    return FAMILIES[mt]


def with_token_ids(config: dict[str, Any], directory: Path,
                   mask_token_id: int | None) -> dict[str, Any]:
    """``config`` with ``mask_token_id`` set from the argument, or (families in
    ``GENERATION_IDS`` whose config lacks it) from ``generation_config.json``."""
    if mask_token_id is not None:
        return {**config, "mask_token_id": int(mask_token_id)}
    gen_path = directory / "generation_config.json"
    if "mask_token_id" in config or family_key(config) not in GENERATION_IDS or \
            not gen_path.is_file():
        return config
    gen = read_json(gen_path)
    mask = gen.get("mask_token_id", gen.get("mask_id"))
    return config if mask is None else {**config, "mask_token_id": int(mask)}


def register_auto_config() -> None:
    """Register the families' config classes with ``transformers.AutoConfig``."""
    from transformers import AutoConfig, PretrainedConfig

    for model_type in ("llada", "Dream", "sdar", "llada2_moe", "Fast_dLLM_Qwen", "sdar_moe"):
        name = re.sub(r"\W", "", model_type.capitalize()) + "DecodeConfig"
        cls = type(name, (PretrainedConfig,), {"model_type": model_type})
        try:
            AutoConfig.register(model_type, cls, exist_ok=True)
        except TypeError:  # older transformers without exist_ok
            with contextlib.suppress(ValueError):
                AutoConfig.register(model_type, cls)
