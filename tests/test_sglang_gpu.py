"""``--dllm-algorithm DllmDecode`` end to end in a real SGLang server process (GPU only).

A random-weight tiny LLaDA2 (``benchmarks/bench_sglang.py``'s ``tiny_llada2``: the released
architecture and vocabulary, ``--load-format dummy``) is served by SGLang's ``Engine`` (its
scheduler and model runner in spawned processes: the plugin entry point has to register
``DllmDecode`` there) with the built-in ``LowConfidence`` and with ``DllmDecode`` running
``llada2`` at the same settings: the greedy tokens must be identical. Random weights put the
mask token in the built-in's softmax with a tiny probability, so its ordering could differ from
ours only on near ties (none expected at these sizes). Needs CUDA and the ``sglang`` extra
(``pip install -e ".[sglang]"``); skipped otherwise.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("sglang.srt.entrypoints.engine", reason="pip install -e '.[sglang]'")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_sglang.py"
    spec = importlib.util.spec_from_file_location("bench_sglang", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def served_tokens(bench, ckpt: Path, tmp_path: Path, algorithm: str, config: dict,
                  batch: list[list[int]], max_new: int) -> list[list[int]]:
    served = bench.Served(str(ckpt), algorithm, config, dummy=True, max_batch=len(batch),
                          folder=tmp_path)
    try:  # the request asks for the YAML's own temperature (other sampling is refused)
        out, _ = served.generate(batch, max_new,
                                 float(config.get("params", {}).get("temperature", 0.0)))
    finally:
        served.close()
    return out


def test_dllm_decode_serves_the_tokens_of_low_confidence(bench, tmp_path) -> None:
    ckpt = bench.tiny_llada2(tmp_path / "tiny-llada2")
    batch = bench.prompts(4, 40) + bench.prompts(1, 7, seed=1)  # a prompt tail too
    out = {name: served_tokens(bench, ckpt, tmp_path, name, config, batch, 70)
           for name, config in bench.ALGORITHMS.items()}
    assert [len(o) for o in out["DllmDecode"]] == [70] * len(batch)
    assert out["DllmDecode"] == out["LowConfidence"]


@pytest.mark.parametrize("config", [
    {"policy": "llada21", "params": {"mode": "speed", "max_post_steps": 2}},
    {"policy": "klass"},  # per-request memory
    {"policy": "threshold", "params": {"tau": 0.5, "temperature": 0.7, "seed": 3}},
], ids=["editing", "memory", "sampling"])
def test_dllm_decode_serves_other_policies(bench, tmp_path, config) -> None:
    ckpt = bench.tiny_llada2(tmp_path / "tiny-llada2")
    batch = bench.prompts(3, 21)
    first = served_tokens(bench, ckpt, tmp_path, "DllmDecode", config, batch, 40)
    assert [len(o) for o in first] == [40] * len(batch)
    assert bench.LLADA2_MASK not in {t for o in first for t in o}
