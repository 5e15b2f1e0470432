"""Hostile sizes are errors, not crashes (README "What runs code"): absurd ``config.json``
sizes, safetensors headers that lie, oversized JSON and filter cards, and a ``gen_length`` whose
decode would not fit in the device's memory fail with a clear error before any large
allocation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")



def _copy_tiny(tmp_path: Path, **changes) -> Path:
    import json

    from dllm_decode.models.loading import ASSETS

    d = tmp_path / "hostile"
    d.mkdir(exist_ok=True)
    cfg = json.loads((ASSETS / "tiny-llada/config.json").read_text()) | changes
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes((ASSETS / "tiny-llada/model.safetensors").read_bytes())
    return d


@pytest.mark.parametrize("changes, message", [
    ({"vocab_size": 10**12, "embedding_size": 10**12}, "need at least"),
    ({"n_layers": 10**6}, "need at least"),
    ({"d_model": 2**40, "n_heads": 2**10, "head_dim": 2**30}, "need at least"),
    ({"mlp_hidden_size": 10**15}, "need at least"),
    ({"n_layers": 0}, "number of layers must be >= 1"),
    ({"mlp_hidden_size": -5}, "must be >= 1"),
])
def test_absurd_config_sizes_fail_before_any_allocation(tmp_path, changes, message):
    import time

    from dllm_decode import load_model
    from dllm_decode.models.weights import CheckpointError

    d = _copy_tiny(tmp_path, **changes)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=message):
        load_model(d)
    assert time.perf_counter() - start < 5  # no million-module meta model, no allocation


def _raw_safetensors(path: Path, header: dict, data: bytes, length: int | None = None) -> None:
    import json
    import struct

    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)


@pytest.mark.parametrize("header, length", [
    ({"model.transformer.wte.weight": {"dtype": "F32", "shape": [10**6, 10**6],
                                       "data_offsets": [0, 16]}}, None),  # shape > data
    ({"model.transformer.wte.weight": {"dtype": "F32", "shape": [2, 2],
                                       "data_offsets": [0, 4 * 10**12]}}, None),  # past the end
    ({"model.transformer.wte.weight": {"dtype": "F32", "shape": [10**12] * 3,
                                       "data_offsets": [0, 16]}}, None),  # overflowing shape
    ({}, 10**12),  # header length beyond the file
])
def test_safetensors_header_that_lies_is_a_checkpoint_error(tmp_path, header, length):
    from dllm_decode import load_model
    from dllm_decode.models.weights import CheckpointError

    d = _copy_tiny(tmp_path)
    _raw_safetensors(d / "model.safetensors", header, b"\0" * 16, length)
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        load_model(d)


def test_header_shapes_are_checked_against_the_config_before_data_is_read(tmp_path,
                                                                         monkeypatch):
    from safetensors.torch import load_file, save_file

    from dllm_decode import load_model
    from dllm_decode.models import loading
    from dllm_decode.models.weights import CheckpointError

    d = _copy_tiny(tmp_path)
    state = load_file(str(d / "model.safetensors"))
    name = "model.transformer.blocks.0.q_proj.weight"
    state[name] = state[name][:, :-2].contiguous()
    save_file(state, str(d / "model.safetensors"))

    def no_reads(*args, **kwargs):
        raise AssertionError("tensor data read before the header check")

    monkeypatch.setattr(loading, "iter_tensors", no_reads)
    with pytest.raises(CheckpointError, match=f"{name}.*has shape"):
        load_model(d)


def test_build_model_and_filters_refuse_sizes_that_cannot_fit(tmp_path):
    import json

    from dllm_decode.memory import MemoryBudgetError
    from dllm_decode.models.loading import ASSETS, build_model
    from dllm_decode.policies.learn2pd_filter import FilterMismatchError, load_filter

    cfg = json.loads((ASSETS / "tiny-llada/config.json").read_text())
    with pytest.raises(MemoryBudgetError, match="building this model's weights"):
        build_model(cfg | {"n_layers": 10**6})
    card = json.loads(next(ASSETS.glob("*/learn2pd_k*.json")).read_text())
    weights = next(ASSETS.glob("*/learn2pd_k*.safetensors"))
    (tmp_path / "f.json").write_text(json.dumps(card | {"block_length": 10**6}))
    (tmp_path / "f.safetensors").write_bytes(weights.read_bytes())
    with pytest.raises(FilterMismatchError, match="block_length 1000000 does not match"):
        load_filter(tmp_path / "f.safetensors")


def test_gen_length_beyond_the_devices_memory_is_a_clear_error(monkeypatch):
    import dataclasses

    from dllm_decode import DiffusionSampler, load_model, memory
    from dllm_decode.memory import MemoryBudgetError

    model = load_model("tiny-llada")
    model.spec = dataclasses.replace(model.spec, max_length=10**13)
    prompt = torch.tensor([[5, 6, 7]])
    for cache in ("none", "prefix"):
        sampler = DiffusionSampler(model, cache=cache)
        with pytest.raises(MemoryBudgetError, match="gen_length 1000000000000.*free"):
            sampler.generate(prompt, gen_length=10**12, block_length=10**6, steps=10**6)
    # the estimate counts logits and the KV cache: a modest request against a tiny budget
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1)
    monkeypatch.setattr(memory, "CHECK_ABOVE", 0)
    with pytest.raises(MemoryBudgetError, match="lower gen_length or the batch size"):
        DiffusionSampler(model).generate(prompt, gen_length=8, steps=8)
    monkeypatch.setattr(memory, "available_bytes", lambda device: None)  # unknown: no check
    assert DiffusionSampler(model).generate(prompt, gen_length=8, steps=8).tokens.shape[1] == 11
    assert memory.decode_bytes(model, 2, 100, 100, cached=True) > memory.decode_bytes(
        model, 2, 100, 100, cached=False) > memory.decode_bytes(model, 1, 100, 100, False)


def test_an_oversized_json_file_is_refused_unread(tmp_path, monkeypatch):
    from dllm_decode import load_model
    from dllm_decode.models import weights
    from dllm_decode.models.weights import CheckpointError

    d = _copy_tiny(tmp_path)
    monkeypatch.setattr(weights, "MAX_JSON_BYTES", 100)
    with pytest.raises(CheckpointError, match="is not a config or index file"):
        load_model(d)
