"""transformers' own DiffusionGemma ``generate`` (the reference) and the library's
``gemma_renoise`` run side by side on the same machine, with everything both feed the model.

DiffusionGemma samples at every step and self-conditions each step on the last step's logits,
so fp32 rounding differences between CPUs (~1e-5) grow to order-1 logits within a few steps: a
multi-step trajectory recorded on one machine is not reproducible on another, by the reference
itself. The same-machine comparison here is exact on any CPU: both runs see the same rounding.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler
from tests.conformance import INFO, UnmappedCaseField

#: the module holding the reference ``generate`` (``DiffusionGemmaGenerationMixin``)
REFERENCE_MODULE = "transformers.models.diffusion_gemma.generation_diffusion_gemma"
#: case fields: inputs, settings, expected outputs, and recorded traces the tests check
CASE_FIELDS = INFO | {"prompt_ids", "attention_mask", "args", "seed", "output_ids",
                      "answer_ids", "nfe", "nfe_note", "encoder_calls", "encoder_input_ids",
                      "decoder_input_ids_per_forward", "tokens_per_forward_reported",
                      "generation_config_json"}
#: ``generate`` arguments -> ``gemma_renoise`` / ``SamplerConfig`` parameters
ARGS = {"max_new_tokens": "gen_length", "max_denoising_steps": "max_denoising_steps",
        "t_min": "t_min", "t_max": "t_max", "stability_threshold": "stability_threshold",
        "confidence_threshold": "confidence_threshold", "eos_token_id": "eos_token_ids"}


def reference_modules() -> tuple[Any, Any]:
    """``(transformers, its DiffusionGemma generation module)``; skips with the reason when the
    installed transformers has no DiffusionGemma (it arrived in 5.11)."""
    tf = pytest.importorskip("transformers")
    try:
        gen = importlib.import_module(REFERENCE_MODULE)
    except ImportError:
        pytest.skip(f"transformers {tf.__version__} has no DiffusionGemma (the reference "
                    "`generate` this test runs; transformers >= 5.11 has it)")
    return tf, gen


def load_reference(directory: Path) -> Any:
    """The checkpoint in ``directory`` as transformers' ``DiffusionGemmaForBlockDiffusion``
    (fp32, eval; its ``generation_config.json`` read as the reference reads it)."""
    tf, _ = reference_modules()
    return tf.DiffusionGemmaForBlockDiffusion.from_pretrained(
        directory, dtype=torch.float32).eval()


@dataclass(frozen=True)
class Trace:
    """What one ``generate`` call fed the model and returned.

    ``tokens``: ``[B][P + n C]`` (prompt, then every canvas generated; pad after an EOS);
    ``decoder_inputs``: the ``[B][C]`` canvas of every decoder forward, in order;
    ``encoder_inputs``: the ids of every encoder call; ``forwards``: decoder forwards;
    ``tokens_per_forward``: per row, non-pad new tokens / the row's decoder forwards.
    """

    tokens: list[list[int]]
    decoder_inputs: list[list[list[int]]]
    encoder_inputs: list[list[list[int]]]
    forwards: int
    tokens_per_forward: list[float]


def reference_args(args: dict[str, Any]) -> dict[str, Any]:
    """A case's recorded ``generate`` keyword arguments as objects (``sampler_config``)."""
    _, gen = reference_modules()
    out = dict(args)
    sc = out.get("sampler_config")
    if sc is not None:
        if sc.get("_cls_name") != "EntropyBoundSamplerConfig":
            raise UnmappedCaseField(f"sampler {sc}")
        out["sampler_config"] = gen.EntropyBoundSamplerConfig(entropy_bound=sc["entropy_bound"])
    return out


def run_reference(ref: Any, prompt: torch.Tensor, mask: torch.Tensor | None, seed: int,
                  **args: Any) -> Trace:
    """``ref.generate(prompt, **args)`` after ``torch.manual_seed(seed)`` (as the fixtures were
    recorded), spying on its decoder forward (``ref.forward``) and encoder calls."""
    fed: list[list[list[int]]] = []
    encoded: list[list[list[int]]] = []
    decoder, encoder = ref.forward, ref.model.encoder
    encode = encoder.forward

    def spy_decoder(*a: Any, **kw: Any) -> Any:
        fed.append(kw["decoder_input_ids"].tolist())
        return decoder(*a, **kw)

    def spy_encoder(*a: Any, **kw: Any) -> Any:
        encoded.append(kw["input_ids"].tolist())
        return encode(*a, **kw)

    ref.forward, encoder.forward = spy_decoder, spy_encoder
    try:
        torch.manual_seed(seed)
        kw = {} if mask is None else {"attention_mask": mask}
        with torch.no_grad():
            out = ref.generate(input_ids=prompt, **kw, **args)
    finally:
        del ref.forward, encoder.forward
    return Trace(out.sequences.tolist(), fed, encoded, len(fed),
                 out.tokens_per_forward.tolist())


def run_library(model: Any, prompt: torch.Tensor, mask: torch.Tensor | None, seed: int,
                gen_length: int, **params: Any) -> Trace:
    """``gemma_renoise`` on ``model`` with the same spies (the canvas of every step's decoder
    forward via ``on_step``, the encoder via ``model.encode``)."""
    fed: list[list[list[int]]] = []
    encoded: list[list[list[int]]] = []

    def record(state: Any, accepted: Any) -> None:
        fed.append(state.canvas[:, state.block_start:state.block_end].tolist())

    encode = model.encode

    def spy(tokens: torch.Tensor, cache: Any, valid: Any = None, **kw: Any) -> Any:
        encoded.append(tokens.tolist())
        return encode(tokens, cache, valid, **kw)

    model.encode = spy
    try:
        out = DiffusionSampler(model, "gemma_renoise", **params).generate(
            prompt, mask, gen_length=gen_length, seed=seed, on_step=record)
    finally:
        del model.encode
    p = prompt.shape[1]
    pad = model.pad_token_id
    useful = [sum(t != pad for t in row[p:]) for row in out.tokens.tolist()]
    tpf = [u / n for u, n in zip(useful, out.nfe.tolist(), strict=True)]
    return Trace(out.tokens.tolist(), fed, encoded, out.forwards, tpf)


def assert_same_run(got: Trace, want: Trace, pad: int) -> None:
    """The library's run equals the reference's: tokens (the library returns whole canvases
    up to ``gen_length``; canvases the reference never generated are pad), the canvas of every
    decoder forward, the encoder inputs, the forwards and the tokens per forward."""
    for row_got, row_want in zip(got.tokens, want.tokens, strict=True):
        assert row_got[:len(row_want)] == row_want
        assert set(row_got[len(row_want):]) <= {pad}
    assert got.decoder_inputs == want.decoder_inputs
    assert got.encoder_inputs == want.encoder_inputs
    assert got.forwards == want.forwards
    assert got.tokens_per_forward == pytest.approx(want.tokens_per_forward, abs=1e-6)


def case_params(case: dict, canvas_length: int) -> tuple[dict[str, Any], int]:
    """A recorded case -> (``DiffusionSampler`` keyword arguments, gen_length); unknown fields
    raise ``UnmappedCaseField``."""
    extra = set(case) - CASE_FIELDS
    if extra:
        raise UnmappedCaseField(f"{case['name']}: unmapped case fields {sorted(extra)}")
    params: dict[str, Any] = {}
    gen_length = None
    for key, value in case["args"].items():
        if key == "sampler_config":
            if value.get("_cls_name") != "EntropyBoundSamplerConfig":
                raise UnmappedCaseField(f"sampler {value}")
            params["entropy_bound"] = value["entropy_bound"]
        elif key not in ARGS:
            raise UnmappedCaseField(f"{case['name']}: argument {key!r}")
        elif key == "max_new_tokens":
            gen_length = value
        elif key == "eos_token_id":
            params["eos_token_ids"] = [value] if isinstance(value, int) else value
        else:
            params[ARGS[key]] = value
    # the reference drops adaptive stopping when either threshold is None
    if params.get("stability_threshold", 0) is None or \
            params.get("confidence_threshold", 0) is None:
        params.pop("stability_threshold", None)
        params.pop("confidence_threshold", None)
        params["early_stop"] = False
    if gen_length is None:
        raise UnmappedCaseField(f"{case['name']}: no max_new_tokens")
    # the reference returns whole canvases (ceil(max_new_tokens / C) of them); the library
    # returns gen_length tokens of the same canvases: ask for the whole canvases
    return params, -(-gen_length // canvas_length) * canvas_length


def canvas_length(directory: Path) -> int:
    return json.loads((directory / "config.json").read_text())["canvas_length"]
