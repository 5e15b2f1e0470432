"""DiffusionGemma checkpoints: released tensor names, loading (text only), seeded builds.

Only the decoder copy of the shared text weights is stored (``model.decoder.*``), plus the
encoder's own ``layer_scalar`` per layer; the vision tower (``model.encoder.vision_tower.*``,
``model.encoder.embed_vision.*``) is skipped knowingly: the library runs DiffusionGemma text
only (``models.diffusion_gemma``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dllm_decode.memory import check_fits
from dllm_decode.models.diffusion_gemma import (
    DiffusionGemmaModel,
    GemmaSpec,
    gemma_min_parameters,
    gemma_spec,
)
from dllm_decode.models.families import check_parameter_bound
from dllm_decode.models.gemma_layers import GemmaLayerSpec
from dllm_decode.models.weights import CheckpointError, iter_tensors, read_json, tensor_index
from dllm_decode.models.weights import check_finite as check_tensor_finite

#: checkpoint prefixes of the vision tower: skipped knowingly (text-only support)
VISION_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")


def build_diffusion_gemma(config: dict[str, Any], *, seed: int = 0, init_std: float = 0.02,
                          generation: dict[str, Any] | None = None) -> DiffusionGemmaModel:
    """A model from a ``config.json`` dict with seeded weights (tests, benchmarks): matrices
    and expert tensors N(0, init_std^2), norm weights and learned scales 1."""
    spec = gemma_spec(config, generation)
    check_fits(gemma_min_parameters(spec) * 4, "cpu", "building this model's weights",
               "the config's sizes (vocabulary, layers, experts) are too large")
    model = DiffusionGemmaModel(spec)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * init_std)
    return model.eval()


def gemma_config(spec: GemmaSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config.json, generation_config.json)`` dicts that ``gemma_spec`` reads back as
    ``spec`` (release field names; text only: no vision config)."""
    def first(sliding: bool) -> GemmaLayerSpec | None:
        return next((s for s in spec.layers if s.sliding == sliding), None)

    base = {True: first(True) or spec.layers[0], False: first(False) or spec.layers[0]}
    per_layer = {}
    for i, layer in enumerate(spec.layers):
        ref = base[layer.sliding]
        over = {k: getattr(layer, a) for k, a in (("head_dim", "head_dim"),
                                                  ("num_key_value_heads", "num_kv_heads"))
                if getattr(layer, a) != getattr(ref, a)}
        if over:
            per_layer[str(i)] = over
    rope = {}
    for sliding, kind in ((True, "sliding_attention"), (False, "full_attention")):
        ls = base[sliding]
        rope[kind] = {"rope_type": ls.rope_type, "rope_theta": ls.rope_theta}
        if ls.partial_rotary_factor != 1.0:
            rope[kind]["partial_rotary_factor"] = ls.partial_rotary_factor
    eos = list(spec.eos_token_ids)
    text = {
        "model_type": "diffusion_gemma_text", "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": len(spec.layers), "num_attention_heads": spec.num_heads,
        "head_dim": base[True].head_dim, "num_key_value_heads": base[True].num_kv_heads,
        "global_head_dim": base[False].head_dim,
        "num_global_key_value_heads": base[False].num_kv_heads,
        "layer_types": ["sliding_attention" if s.sliding else "full_attention"
                        for s in spec.layers],
        "per_layer_config": per_layer, "rope_parameters": rope,
        "sliding_window": spec.sliding_window, "num_experts": spec.num_experts,
        "top_k_experts": spec.top_k, "moe_intermediate_size": spec.moe_intermediate_size,
        "rms_norm_eps": spec.norm_eps, "max_position_embeddings": spec.max_length,
        "final_logit_softcapping": spec.softcap, "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False, "use_bidirectional_attention": "vision",
        "tie_word_embeddings": True, "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos}
    config = {"architectures": ["DiffusionGemmaForBlockDiffusion"],
              "model_type": "diffusion_gemma", "canvas_length": spec.canvas_length,
              "tie_word_embeddings": True, "eos_token_id": text["eos_token_id"],
              "text_config": text}
    gen = dict(spec.generation)
    generation = {k: gen[k] for k in ("max_denoising_steps", "t_min", "t_max",
                                      "stability_threshold", "confidence_threshold",
                                      "max_new_tokens") if k in gen}
    generation["sampler_config"] = {"_cls_name": "EntropyBoundSamplerConfig",
                                    "entropy_bound": gen["entropy_bound"]}
    generation |= {"eos_token_id": text["eos_token_id"], "pad_token_id": spec.pad_token_id}
    return config, generation


def save_diffusion_gemma(model: DiffusionGemmaModel, directory: str | Path) -> Path:
    """Write ``config.json``, ``generation_config.json`` and ``model.safetensors`` under the
    released tensor names (the decoder copy of the text weights, the encoder's layer scalars;
    no vision tower): what ``load_diffusion_gemma`` reads back."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config, generation = gemma_config(model.spec)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2,
                                                           sort_keys=True) + "\n")
    state = {checkpoint_name(k): v.detach().contiguous().cpu()
             for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


# ---- checkpoint names -------------------------------------------------------------------------
def checkpoint_name(internal: str) -> str:
    """Internal parameter name -> released tensor name."""
    if internal.startswith("encoder_scalars."):
        return f"model.encoder.language_model.layers.{internal.split('.')[1]}.layer_scalar"
    if internal.startswith("embed."):
        return "model.decoder.embed_tokens." + internal[len("embed."):]
    return "model.decoder." + internal


def load_diffusion_gemma(directory: Path, config: dict[str, Any], *, dtype: torch.dtype,
                         device: torch.device, check_finite: bool = True) -> DiffusionGemmaModel:
    """Build the model from ``config.json`` (+ ``generation_config.json``) and read its
    safetensors tensor by tensor into ``dtype`` on ``device``.

    Every text tensor must be present with the shape the config implies; the vision tower's
    tensors are skipped (text-only); any other tensor is a ``CheckpointError``."""
    gen_path = directory / "generation_config.json"
    spec = gemma_spec(config, read_json(gen_path) if gen_path.is_file() else None)
    index = tensor_index(directory)  # headers only: every check below precedes any data read
    stored = sum(math.prod(shape) for _, shape in index.values())
    check_parameter_bound(gemma_min_parameters(spec), stored, directory / "config.json",
                          f"vocab {spec.vocab_size}, hidden {spec.hidden_size}, "
                          f"{len(spec.layers)} layers, {spec.num_experts} experts of "
                          f"intermediate {spec.moe_intermediate_size}")
    with torch.device("meta"):
        model = DiffusionGemmaModel(spec)
    expected = {checkpoint_name(k): (k, tuple(v.shape)) for k, v in model.state_dict().items()}
    text = {n: f for n, (f, _) in index.items() if not n.startswith(VISION_PREFIXES)}
    unexpected = sorted(set(text) - set(expected))
    missing = sorted(set(expected) - set(text))
    if unexpected or missing:
        raise CheckpointError(f"{directory}: tensors do not match the DiffusionGemma text model "
                              f"its config.json describes: unexpected {unexpected[:5]}, missing "
                              f"{missing[:5]}")
    for name in sorted(text):
        _check_shape(directory, name, index[name][1], expected[name][1])
    state: dict[str, Tensor] = {}
    files = sorted(set(text.values()))
    offsets = file_offsets(files)
    for name, t in iter_tensors(files, device):
        if name not in expected:  # a vision tensor stored in a shard with text tensors
            continue
        internal, shape = expected[name]
        _check_shape(directory, name, tuple(t.shape), shape)
        if check_finite:
            check_tensor_finite(t, name, directory)
        t = t.to(device=device, dtype=dtype)
        state[internal] = _aligned_copy(t, offsets.get(name)) if t.device.type == "cpu" \
            and t.dtype == torch.float32 else t.clone()
    model.load_state_dict(state, assign=True)
    return model.eval()


def _check_shape(directory: Path, name: str, shape: tuple[int, ...],
                 want: tuple[int, ...]) -> None:
    if shape != want:
        raise CheckpointError(f"{directory}: tensor {name!r} has shape {shape}, config.json "
                              f"implies {want} (check the head counts, head dims and sizes)")


#: byte alignment reproduced from the file (the widest SIMD load a CPU GEMM kernel checks)
ALIGN = 64


def file_offsets(files: list[Path]) -> dict[str, int]:
    """``{tensor name: byte offset of its data in its safetensors file}`` (header read only)."""
    out: dict[str, int] = {}
    for file in files:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                out[name] = 8 + n + int(meta["data_offsets"][0])
    return out


def _aligned_copy(t: Tensor, offset: int | None) -> Tensor:
    """An owned copy of ``t`` whose address has the same remainder modulo ``ALIGN`` as its data
    in the file. transformers keeps CPU weights as views of the memory-mapped file, and the
    CPU ``grouped_mm`` kernel rounds differently for differently aligned operands: the copy
    makes the float32 CPU forward bit-identical to the reference's (the sampled conformance
    cases depend on it). ``offset=None``: a plain copy."""
    if offset is None:
        return t.clone()
    size = t.element_size()
    buf = torch.empty(t.numel() + 2 * ALIGN // size, dtype=t.dtype)
    shift = ((offset - buf.data_ptr()) % ALIGN) // size
    out = buf[shift:shift + t.numel()].view(t.shape)
    out.copy_(t)
    return out
