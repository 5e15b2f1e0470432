"""Hostile sizes for the families added after the first loader (README "What runs code"): for
LLaDA2, LLaDA-MoE, Fast-dLLM v2, SDAR-MoE and DiffusionGemma, absurd ``config.json`` sizes and a
safetensors header that lies fail fast with a ``CheckpointError`` naming the problem, before
any large allocation or any million-entry table (``tests/test_security_sizes.py`` does the same
for the bundled dense families)."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from dllm_decode import load_model
from dllm_decode.models import build_model
from dllm_decode.models.loading import save_model
from dllm_decode.models.weights import CheckpointError
from tests.moe_helpers import tiny_moe_config

pytestmark = pytest.mark.usefixtures("one_thread")

MOE = ("llada2", "lladamoe", "sdarmoe")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for family in (*MOE, "fastdllm2"):
        d = tmp_path_factory.mktemp(family)
        save_model(build_model(tiny_moe_config(family)), d)
        out[family] = d
    return out


def _hostile(src: Path, dst: Path, changes: dict[str, Any]) -> Path:
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text()) | changes
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in src.glob("*.safetensors"):
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _fails_fast(directory: Path, message: str) -> None:
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=message):
        load_model(directory)
    assert time.perf_counter() - start < 5  # no million-module meta model, no allocation


@pytest.mark.parametrize("family", [*MOE, "fastdllm2"])
@pytest.mark.parametrize("changes, message", [
    ({"num_hidden_layers": 10**4, "moe_layer_freq": 1}, "need at least"),
    ({"num_hidden_layers": 10**12, "moe_layer_freq": 1}, r"num_hidden_layers|need at least"),
    ({"vocab_size": 10**12}, "need at least"),
    ({"hidden_size": 2**40, "head_dim": 2**30}, r"need at least|rotary_dim .* contradicts"),
])
def test_absurd_sizes_fail_fast(saved, tmp_path, family, changes, message) -> None:
    _fails_fast(_hostile(saved[family], tmp_path / "h", changes), message)


@pytest.mark.parametrize("family", MOE)
def test_absurd_expert_count_fails_before_the_expert_name_table(saved, tmp_path,
                                                                family) -> None:
    """10^9 experts: refused by the size check (the routed experts count), not by building
    a per-expert tensor-name table (which ran out of memory before)."""
    _fails_fast(_hostile(saved[family], tmp_path / "h", {"num_experts": 10**9}),
                "10+ experts of intermediate.*need at least")


@pytest.mark.parametrize("family", [*MOE, "fastdllm2"])
def test_header_that_lies_is_a_checkpoint_error(saved, tmp_path, family) -> None:
    d = _hostile(saved[family], tmp_path / "h", {})
    name = "model.embed_tokens.weight" if family != "llada2" else "model.word_embeddings.weight"
    header = {name: {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 16]}}
    text = json.dumps(header).encode()
    for f in d.glob("*.safetensors"):
        f.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 16)
    _fails_fast(d, "cannot read safetensors")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    from safetensors.torch import save_file

    from dllm_decode.models.gemma_loading import build_diffusion_gemma, checkpoint_name
    from tests.helpers import tiny_gemma_config

    d = tmp_path_factory.mktemp("gemma")
    model = build_diffusion_gemma(tiny_gemma_config())
    save_file({checkpoint_name(k): v.contiguous() for k, v in model.state_dict().items()},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(tiny_gemma_config()))
    return d


def _gemma_text(**text: Any) -> dict[str, Any]:
    from tests.helpers import tiny_gemma_config

    return {"text_config": tiny_gemma_config(**text)["text_config"]}


@pytest.mark.parametrize("text, message", [
    ({"num_hidden_layers": 10**4, "layer_types": ["sliding_attention"] * 10**4},
     "need at least"),  # was: 12 s building a 10^4-layer meta model, then a name mismatch
    ({"num_hidden_layers": 10**12}, r"num_hidden_layers 1000000000000 must be in"),
    ({"vocab_size": 10**12}, "need at least"),
    ({"num_experts": 10**9}, "need at least"),
    ({"top_k_experts": 9}, r"top_k_experts 9 must be in \[1, num_experts 4\]"),
    ({"num_attention_heads": 0}, "num_attention_heads must be >= 1"),
    ({"num_key_value_heads": 3}, "must be a multiple of the key/value heads"),
    ({"head_dim": 7}, "head_dim even"),
    ({"eos_token_id": 10**9}, r"eos_token_id 1000000000 is outside the vocabulary \[0, 64\)"),
])
def test_diffusion_gemma_absurd_config_fails_fast(gemma_dir, tmp_path, text, message) -> None:
    _fails_fast(_hostile(gemma_dir, tmp_path / "h", _gemma_text(**text)), message)


def test_diffusion_gemma_header_that_lies_is_a_checkpoint_error(gemma_dir, tmp_path) -> None:
    d = _hostile(gemma_dir, tmp_path / "h", {})
    header = {"model.decoder.embed_tokens.weight": {"dtype": "F32", "shape": [10**6, 10**6],
                                                    "data_offsets": [0, 16]}}
    text = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 16)
    _fails_fast(d, "cannot read safetensors")


def test_diffusion_gemma_tiny_checkpoint_still_loads(gemma_dir) -> None:
    assert load_model(gemma_dir).spec.num_experts == 4


def test_config_nested_past_the_recursion_limit_is_a_checkpoint_error(saved, tmp_path) -> None:
    d = _hostile(saved["llada2"], tmp_path / "h", {})
    (d / "config.json").write_text('{"a": ' + "[" * 10**5 + "]" * 10**5 + "}")
    _fails_fast(d, "nested deeper than Python's recursion limit")
