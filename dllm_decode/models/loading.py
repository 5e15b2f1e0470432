"""Load and save models: ``config.json`` + ``model.safetensors`` (or a sharded index).

``load_model(name_or_path)`` reads the real release formats by ``model_type`` ("llada",
"Dream", "sdar") and checks every tensor name and shape against the architecture, naming the
offending tensor in the error. Bundled checkpoints under ``models/assets/<name>`` resolve by
name (``load_model("tiny-llada")``), Hub ids through the Hub cache (``models.hub``); dtype,
device and device maps are chosen in ``models.placement``; files are read one tensor at a time
(``models.weights``). The family dispatch and the config checks (``parse_spec``,
``build_model``, ...) are ``models.families``, re-exported here.

Every problem with the files is a ``CheckpointError`` naming the file and the fix: unreadable
(truncated / corrupt) safetensors, invalid JSON (with line and column), a ``model_type`` whose
fields or tensor names do not match, token ids outside the vocabulary, inconsistent head
counts, and (``check_finite=True``, the default) NaN / inf weights. Hub ids whose snapshot
lacks a file raise ``HubError`` instead.

A changed head count is caught whenever it changes a tensor shape (Qwen-style configs record
``head_dim`` and ``num_key_value_heads``, so ``q_proj`` / ``k_proj`` / the q/k-norm weights
change shape) or contradicts a recorded ``head_dim`` (``save_model`` writes it for LLaDA too).
A release LLaDA config without ``head_dim`` cannot be checked: every attention matrix is
``d_model x d_model`` whatever ``n_heads`` is and no tensor is per head, so only comparing
outputs with a reference (the conformance fixtures) can tell.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from dllm_decode.models.base import DecoderLM, to_checkpoint_name
from dllm_decode.models.diffusion_gemma import DiffusionGemmaModel, is_diffusion_gemma
from dllm_decode.models.families import (  # noqa: F401 (re-exported: dispatch, config checks)
    ARCHITECTURES,
    FAMILIES,
    GENERATION_IDS,
    build_model,
    check_config_fits,
    family_key,
    family_of,
    min_parameters,
    parse_spec,
    register_auto_config,
    with_token_ids,
)
from dllm_decode.models.gemma_loading import load_diffusion_gemma, save_diffusion_gemma
from dllm_decode.models.hub import (
    MODEL_PATTERNS,
    check_model_snapshot,
    looks_like_hub_id,
    snapshot,
)
from dllm_decode.models.moe_decoder import MoEDecoderLM
from dllm_decode.models.placement import (
    check_dtype_runs,
    device_for,
    dispatch,
    infer_device_map,
    resolve_device,
    resolve_dtype,
)
from dllm_decode.models.weights import CheckpointError, iter_tensors, read_json, tensor_index
from dllm_decode.models.weights import check_finite as check_tensor_finite

ASSETS = Path(__file__).parent / "assets"


def bundled_models() -> list[str]:
    """Names of the checkpoints shipped under ``models/assets``."""
    if not ASSETS.is_dir():
        return []
    return sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file())


def resolve_path(name_or_path: str | Path, *, revision: str | None = None,
                 local_files_only: bool | None = None, token: str | bool | None = None,
                 patterns: tuple[str, ...] = MODEL_PATTERNS, purpose: str = "model") -> Path:
    """A directory path, the name of a bundled checkpoint, or a Hub id (``"org/name"``).

    A Hub id resolves to its snapshot in the Hub cache, fetching only ``patterns`` when
    downloads are allowed (see ``models.hub``); errors are ``HubError``.
    """
    p = Path(name_or_path)
    if p.is_dir():
        return p
    if (ASSETS / str(name_or_path)).is_dir():
        return ASSETS / str(name_or_path)
    if looks_like_hub_id(name_or_path):
        return snapshot(str(name_or_path), revision=revision, patterns=patterns,
                        local_files_only=local_files_only, token=token, purpose=purpose)
    close = difflib.get_close_matches(str(name_or_path), bundled_models(), n=1)
    hint = f" (did you mean the bundled {close[0]!r}?)" if close else ""
    raise FileNotFoundError(
        f"no model directory {str(name_or_path)!r}{hint}; pass a directory with config.json and "
        f"model.safetensors, a Hub id 'org/name', or a bundled name: "
        f"{bundled_models() or 'none bundled'}"
    )


def read_config(directory: Path) -> dict[str, Any]:
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{directory} has no config.json")
    return read_json(cfg_path)


def _place(t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Cast/move one tensor; the result owns its memory (never a view of the mapped file)."""
    out = t.to(device=device, dtype=dtype)
    return out.clone() if out.data_ptr() == t.data_ptr() and device.type == "cpu" else out


def load_model(name_or_path: str | Path, *, revision: str | None = None,
               dtype: str | torch.dtype = "auto", device: str | torch.device | None = None,
               device_map: str | dict[str, Any] | None = None,
               local_files_only: bool | None = None, token: str | bool | None = None,
               check_finite: bool = True, mask_token_id: int | None = None
               ) -> DecoderLM | DiffusionGemmaModel:
    """Load a checkpoint into its family's model, in eval mode.

    Args:
        name_or_path: a directory (``config.json`` + safetensors, sharded or not), a bundled
            name (``"tiny-llada"``) or a Hub id (``"GSAI-ML/LLaDA-8B-Instruct"``; only config,
            generation config, safetensors and tokenizer files are fetched).
        revision: Hub branch, tag or commit (Hub ids only; default ``main``).
        dtype: ``"auto"`` = the config's ``torch_dtype`` (float32 when absent; bf16 on CPU
            works but is slow: pass ``torch.float32`` there), or a dtype / ``"bf16"`` etc.
        device: where the weights go (``None``: CPU). Each tensor is read from its shard
            straight to this device and dtype; nothing is materialised twice on the host.
        device_map: instead of ``device``: ``{module prefix: device}`` or ``"auto"`` etc.,
            resolved and dispatched by accelerate (see ``models.placement``).
        local_files_only: Hub ids: never use the network (``None``: when ``HF_HUB_OFFLINE``).
        token: Hub token for gated / private repositories (``None``: ``HF_TOKEN`` / login).
        check_finite: reject NaN / inf weights, naming the tensor (checked per tensor as it
            is read, in the stored dtype before the cast, with one min/max reduction; turn off
            only to inspect a broken checkpoint).
        mask_token_id: the mask id, for a checkpoint whose config does not state it and whose
            vocabulary differs from the released one (LLaDA2, LLaDA-MoE, Fast-dLLM v2 and
            SDAR-MoE configs omit it; ``None``: the config's, else ``generation_config.json``'s,
            else the family's released id).

    Raises: ``FileNotFoundError`` (``HubError`` for Hub ids) for missing files,
    ``CheckpointError`` (a ``ValueError``) naming the file and the fix when the files are
    unreadable or do not match the architecture, ``ValueError`` for a dtype or device that
    cannot be used here.
    """
    hub = not Path(name_or_path).is_dir() and not (ASSETS / str(name_or_path)).is_dir() and \
        looks_like_hub_id(name_or_path)
    directory = resolve_path(name_or_path, revision=revision, local_files_only=local_files_only,
                             token=token)
    if hub:
        check_model_snapshot(directory, str(name_or_path))
    config = read_config(directory)
    cfg_path = directory / "config.json"
    if is_diffusion_gemma(config):  # encoder-decoder, uniform noise: its own module
        if device_map is not None:
            raise ValueError("device_map is not supported for DiffusionGemma; pass device=")
        target = resolve_dtype(dtype, config)
        dev = resolve_device(device)
        check_dtype_runs(target, dev)
        return load_diffusion_gemma(directory, config, dtype=target, device=dev,
                                    check_finite=check_finite)
    cls, _, _ = family_of(config, cfg_path)
    config = with_token_ids(config, directory, mask_token_id)
    spec = parse_spec(config, cfg_path)
    target = resolve_dtype(dtype, config)
    if device_map is not None and device is not None:
        raise ValueError("pass either device or device_map, not both")
    index = tensor_index(directory)  # headers only: every check below precedes any data read
    stored = sum(math.prod(shape) for _, shape in index.values())
    check_config_fits(spec, stored, cfg_path)
    with torch.device("meta"):
        model = cls(spec)
    placement = infer_device_map(model, device_map, target) if device_map is not None else None
    dev = resolve_device(device)
    for d in set(placement.values()) if placement else {dev}:
        check_dtype_runs(target, d)
    layout = checkpoint_layout(model)  # name -> (internal name, expert slice or None)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = {name: (k, shapes[k][1:] if part is not None else shapes[k])
                for name, (k, part) in layout.items()}
    hint = (f"; {cfg_path} declares model_type {config.get('model_type')!r}: is that the "
            "family these tensors were saved from?")
    _check_tensor_names(directory, cfg_path, spec.family, index, expected, hint)
    state = _read_state(directory, cfg_path, index, expected, layout, shapes,
                        fp32_tensors(model), target, dev, placement, check_finite)
    if tied_embeddings(model):  # the head is the embedding (no lm_head tensor is saved)
        state["head.weight"] = state["embed.weight"]
    model.load_state_dict(state, assign=True)
    model.eval()
    return dispatch(model, placement) if placement else model


def _check_tensor_names(directory: Path, cfg_path: Path, family: str,
                        index: dict[str, tuple[Path, tuple[int, ...]]],
                        expected: dict[str, tuple[str, tuple[int, ...]]], hint: str) -> None:
    """Every stored tensor is one the architecture expects, and the reverse, each of the
    expected shape (from the headers, before any data is read)."""
    names = set(index)
    unexpected = sorted(names - set(expected))
    if unexpected:
        raise CheckpointError(f"{directory}: unexpected tensor(s) for {family}: "
                              f"{unexpected[:5]}" + hint)
    missing = sorted(set(expected) - names)
    if missing:
        raise CheckpointError(f"{directory}: missing tensor(s) for {family}: {missing[:5]}"
                              + hint)
    for name, (_, shape) in sorted(index.items()):
        _shape_matches(directory, cfg_path, name, shape, expected[name][1])


def _read_state(directory: Path, cfg_path: Path, index: dict[str, tuple[Path, tuple[int, ...]]],
                expected: dict[str, tuple[str, tuple[int, ...]]], layout: dict[str, Any],
                shapes: dict[str, tuple[int, ...]], keep_fp32: frozenset[str], target: torch.dtype,
                dev: torch.device, placement: dict[str, Any] | None,
                check_finite: bool) -> dict[str, torch.Tensor]:
    """The internal state dict, one shard at a time, each tensor read straight to its device
    and dtype (fp32 where the family keeps it); an expert's slice is copied into its stacked
    tensor."""
    state: dict[str, torch.Tensor] = {}
    files = sorted({file for file, _ in index.values()})
    for name, t in iter_tensors(files, dev):
        internal, shape = expected[name]
        _shape_matches(directory, cfg_path, name, tuple(t.shape), shape)
        if check_finite:
            check_tensor_finite(t, name, directory)
        where = device_for(internal, placement) if placement else dev
        dtype = torch.float32 if internal in keep_fp32 else target
        part = layout[name][1]
        if part is None:
            state[internal] = _place(t, dtype, where)
        else:  # one expert's slice of a stacked tensor
            if internal not in state:
                state[internal] = torch.empty(shapes[internal], dtype=dtype, device=where)
            state[internal][part].copy_(t)
        del t
    return state


def _shape_matches(directory: Path, cfg_path: Path, name: str, shape: tuple[int, ...],
                   want: tuple[int, ...]) -> None:
    if shape != want:
        raise CheckpointError(f"{directory}: tensor {name!r} has shape {shape}, "
                              f"{cfg_path.name} implies {want} (check the head counts, "
                              f"head_dim and sizes in it)")


def tied_embeddings(model: DecoderLM) -> bool:
    """The config ties the LM head to the input embedding (Fast-dLLM v2 on a tied Qwen2.5)."""
    return bool(model.spec.extra.get("tie_word_embeddings"))


def checkpoint_layout(model: DecoderLM) -> dict[str, tuple[str, int | None]]:
    """Checkpoint tensor name -> (internal name, index of the slice it fills or ``None``).

    MoE families stack their experts internally and store one tensor per expert; a tied
    head has no tensor of its own."""
    if isinstance(model, MoEDecoderLM):
        return model.checkpoint_layout()
    skip = {"head.weight"} if tied_embeddings(model) else set()
    return {to_checkpoint_name(type(model).names, k): (k, None) for k in model.state_dict()
            if k not in skip}


def fp32_tensors(model: DecoderLM) -> frozenset[str]:
    """Internal names kept in float32 whatever the load dtype (router expert biases: the
    references keep them in fp32 and add them to fp32 scores)."""
    return frozenset(k for k in model.state_dict() if k.endswith("expert_bias"))


def save_model(model: DecoderLM, directory: str | Path, *, max_shard_bytes: int | None = None,
               config_extra: dict[str, Any] | None = None) -> Path:
    """Write ``config.json`` and safetensors (sharded above ``max_shard_bytes``; a
    DiffusionGemma: its own writer, one file)."""
    if isinstance(model, DiffusionGemmaModel):
        return save_diffusion_gemma(model, directory)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    _, _, writer = FAMILIES[model.spec.family]
    config = writer(model.spec) | dict(config_extra or {})
    if "supports_causal_in_block" in model.spec.extra:  # stated in the config it was built from
        config.setdefault("supports_causal_in_block", model.spec.extra["supports_causal_in_block"])
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.checkpoint_state_dict().items()}
    if tied_embeddings(model):
        state.pop(to_checkpoint_name(type(model).names, "head.weight"))
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
