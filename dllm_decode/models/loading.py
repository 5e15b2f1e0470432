"""Load and save models: ``config.json`` + ``model.safetensors`` (or a sharded index).

``load_model(path_or_name)`` reads the real release formats by ``model_type`` ("llada",
"Dream", "sdar") and checks every tensor name and shape against the architecture, naming the
offending tensor in the error. Bundled checkpoints under ``models/assets/<name>`` resolve by
name (``load_model("tiny-llada")``).

Every problem with the files is a ``CheckpointError`` naming the file and the fix: unreadable
(truncated / corrupt) safetensors, invalid JSON (with line and column), a ``model_type`` whose
fields or tensor names do not match, token ids outside the vocabulary, inconsistent head
counts, and (``check_finite=True``, the default) NaN / inf weights.

A changed head count is caught whenever it changes a tensor shape (Qwen-style configs record
``head_dim`` and ``num_key_value_heads``, so ``q_proj`` / ``k_proj`` / the q/k-norm weights
change shape) or contradicts a recorded ``head_dim`` (``save_model`` writes it for LLaDA too).
A release LLaDA config without ``head_dim`` cannot be checked: every attention matrix is
``d_model x d_model`` whatever ``n_heads`` is and no tensor is per head, so only comparing
outputs with a reference (the conformance fixtures) can tell.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dllm_decode.models.base import DecoderLM, ModelSpec, to_checkpoint_name
from dllm_decode.models.block import BlockDiffusionModel, sdar_config, sdar_spec
from dllm_decode.models.dream import DreamModel, dream_config, dream_spec
from dllm_decode.models.llada import LLaDAModel, llada_config, llada_spec

ASSETS = Path(__file__).parent / "assets"

#: model_type (as written in config.json, case-insensitive) -> (class, spec parser, writer)
FAMILIES: dict[str, tuple[type[DecoderLM], Callable[[dict], ModelSpec], Callable]] = {
    "llada": (LLaDAModel, llada_spec, llada_config),
    "dream": (DreamModel, dream_spec, dream_config),
    "sdar": (BlockDiffusionModel, sdar_spec, sdar_config),
}


class CheckpointError(ValueError):
    """A checkpoint directory that does not match the architecture it declares."""


def bundled_models() -> list[str]:
    """Names of the checkpoints shipped under ``models/assets``."""
    if not ASSETS.is_dir():
        return []
    return sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file())


def resolve_path(path_or_name: str | Path) -> Path:
    """A directory path, or the name of a bundled checkpoint."""
    p = Path(path_or_name)
    if p.is_dir():
        return p
    if (ASSETS / str(path_or_name)).is_dir():
        return ASSETS / str(path_or_name)
    raise FileNotFoundError(
        f"no model directory {str(path_or_name)!r}; pass a directory with config.json and "
        f"model.safetensors, or a bundled name: {bundled_models() or 'none bundled'}"
    )


def read_config(directory: Path) -> dict[str, Any]:
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{directory} has no config.json")
    return _read_json(cfg_path)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ``CheckpointError`` with the line and column if invalid."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno} "
                              f"({err.msg}); fix that line or re-save the checkpoint with "
                              "save_model") from None
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: not a UTF-8 text file ({err.reason}); is it the right "
                              "file?") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """``load_file`` with the file named when it cannot be read."""
    try:
        return load_file(str(path))
    except Exception as err:  # noqa: BLE001 - SafetensorError / OSError: name the file
        raise CheckpointError(f"{path}: cannot read safetensors ({type(err).__name__}: {err}); "
                              "the file is truncated or corrupt: download or save it "
                              "again") from None


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
            raise CheckpointError(f"{where}: {name} {value} is outside the vocabulary "
                                  f"[0, {spec.vocab_size}); fix {name} or vocab_size")
    return spec


def build_model(config: dict[str, Any], *, seed: int | None = 0,
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                init_std: float = 0.02) -> DecoderLM:
    """A model of any family from a config dict, with weights drawn from ``seed``.

    For tests and examples: N(0, init_std^2) matrices, unit norm weights.
    """
    cls, _, _ = family_of(config)
    spec = parse_spec(config, "config")
    gen = torch.Generator().manual_seed(seed or 0)
    model = cls(spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * init_std)
    return model.to(device=device, dtype=dtype).eval()


def family_of(config: dict[str, Any], where: Path | str = "config"
              ) -> tuple[type[DecoderLM], Callable, Callable]:
    mt = str(config.get("model_type", "")).lower()
    if mt not in FAMILIES:
        raise CheckpointError(
            f"{where}: unknown model_type {config.get('model_type')!r}; supported: "
            f"{sorted(FAMILIES)} (LLaDA 'llada', Dream 'Dream', SDAR-style 'sdar')"
        )
    return FAMILIES[mt]


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return _load_safetensors(single)
    if index.is_file():
        weight_map = _read_json(index).get("weight_map", {})
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = directory / shard
            if not shard_path.is_file():
                raise FileNotFoundError(f"shard {shard} listed in {index.name} is missing")
            part = _load_safetensors(shard_path)
            for name in part:
                if weight_map.get(name) != shard:
                    raise CheckpointError(f"tensor {name!r} in {shard} is not listed there "
                                          f"by {index.name}")
            tensors.update(part)
        missing = set(weight_map) - set(tensors)
        if missing:
            raise CheckpointError(f"tensors listed in {index.name} but absent: "
                                  f"{sorted(missing)[:5]}")
        return tensors
    raise FileNotFoundError(f"{directory} has neither model.safetensors nor "
                            f"model.safetensors.index.json")


def load_model(path_or_name: str | Path, *, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", check_finite: bool = True) -> DecoderLM:
    """Load a checkpoint directory (or bundled name) into its family's model, in eval mode.

    Args:
        path_or_name: a directory with ``config.json`` and safetensors, or a bundled name.
        dtype: parameter dtype after loading.
        device: where the model goes.
        check_finite: reject NaN / inf weights, naming the tensor (one pass over the weights
            as stored, before the dtype cast; turn off only to inspect a broken checkpoint).

    Raises: ``CheckpointError`` (a ``ValueError``) naming the file and the fix.
    """
    directory = resolve_path(path_or_name)
    config = read_config(directory)
    cfg_path = directory / "config.json"
    cls, _, _ = family_of(config, cfg_path)
    spec = parse_spec(config, cfg_path)
    with torch.device("meta"):
        model = cls(spec)
    expected = {to_checkpoint_name(cls.names, k): (k, tuple(v.shape))
                for k, v in model.state_dict().items()}
    tensors = _read_tensors(directory)
    unexpected = sorted(set(tensors) - set(expected))
    hint = (f"; {cfg_path} declares model_type {config.get('model_type')!r}: is that the "
            "family these tensors were saved from?")
    if unexpected:
        raise CheckpointError(f"{directory}: unexpected tensor(s) for {spec.family}: "
                              f"{unexpected[:5]}" + hint)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"{directory}: missing tensor(s) for {spec.family}: {missing[:5]}"
                              + hint)
    state = {}
    for name, (internal, shape) in expected.items():
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{directory}: tensor {name!r} has shape {tuple(t.shape)}, "
                                  f"{cfg_path.name} implies {shape} (check the head counts, "
                                  f"head_dim and sizes in it)")
        if check_finite and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{directory}: tensor {name!r} holds NaN or inf values; the "
                                  "checkpoint is corrupt (re-save it from a finite model), or "
                                  "pass check_finite=False to inspect it")
        state[internal] = t.to(dtype)
    model.load_state_dict(state, assign=True)
    return model.to(device=device).eval()


def save_model(model: DecoderLM, directory: str | Path, *, max_shard_bytes: int | None = None,
               config_extra: dict[str, Any] | None = None) -> Path:
    """Write ``config.json`` and safetensors (sharded above ``max_shard_bytes``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    _, _, writer = FAMILIES[model.spec.family]
    config = writer(model.spec) | dict(config_extra or {})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.checkpoint_state_dict().items()}
    if max_shard_bytes is None:
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = state[name]
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return out


def register_auto_config() -> None:
    """Register the families' config classes with ``transformers.AutoConfig``."""
    from transformers import AutoConfig, PretrainedConfig

    for model_type in ("llada", "Dream", "sdar"):
        name = re.sub(r"\W", "", model_type.capitalize()) + "DecodeConfig"
        cls = type(name, (PretrainedConfig,), {"model_type": model_type})
        try:
            AutoConfig.register(model_type, cls, exist_ok=True)
        except TypeError:  # older transformers without exist_ok
            with contextlib.suppress(ValueError):
                AutoConfig.register(model_type, cls)
