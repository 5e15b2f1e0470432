"""The reference-loop comparison of ``benchmarks/bench_overhead.py --reference``.

The unit tests need no reference environment: the skip path and its reasons, the mapping of
the compared reference calls onto ``DiffusionSampler`` settings, the runner protocol's replies,
the summary numbers. The last tests run the real comparison, only where ``DLLM_REF_PYTHON`` /
``DLLM_REF_SRC`` point at a reference environment (see benchmarks/README.md); they are
skipped with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.conformance import CONFORMANCE, load_cases

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ovr = _module("overhead_reference")


def _fake_src(root: Path) -> Path:
    for f in ovr.REF_FILES:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")
    return root


def _stub_python(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_reference_env_skips_with_a_reason(tmp_path: Path) -> None:
    ok, why = ovr.reference_env({})
    assert not ok and "DLLM_REF_PYTHON" in why and "README" in why
    src = _fake_src(tmp_path / "src")
    ok, why = ovr.reference_env({"DLLM_REF_PYTHON": str(tmp_path / "nope"),
                                 "DLLM_REF_SRC": str(src)})
    assert not ok and "not an executable" in why
    (src / "Dream" / "generation_utils.py").unlink()
    ok, why = ovr.reference_env({"DLLM_REF_PYTHON": sys.executable, "DLLM_REF_SRC": str(src)})
    assert not ok and "Dream/generation_utils.py" in why


@pytest.mark.parametrize("body, ok, words", [
    ("echo 2.13.0 4.46.2 0.8.2", True, "run with"),
    ("echo 2.13.0 5.0.0 0.8.2", False, "transformers 5.0.0"),
    ("echo \"PackageNotFoundError: einops\" >&2; exit 1", False, "einops"),
])
def test_reference_env_probes_the_python(tmp_path: Path, body: str, ok: bool,
                                         words: str) -> None:
    env = {"DLLM_REF_PYTHON": _stub_python(tmp_path / "python", body),
           "DLLM_REF_SRC": str(_fake_src(tmp_path / "src"))}
    got, why = ovr.reference_env(env)
    assert got is ok and words in why


def test_bench_overhead_reference_skips_cleanly(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DLLM_REF_PYTHON", raising=False)
    monkeypatch.delenv("DLLM_REF_SRC", raising=False)
    monkeypatch.syspath_prepend(str(BENCH))
    bench = _module("bench_overhead")
    monkeypatch.setattr(sys, "argv", ["bench_overhead.py", "--reference"])
    bench.main()
    assert "reference comparison skipped: DLLM_REF_PYTHON" in capsys.readouterr().out


def test_compared_calls_map_onto_sampler_settings() -> None:
    prompt = [[5, 6, 7]]
    got = {}
    for cfg in ovr.configs("llada", 32, 8, 500) + ovr.configs("dream", 32, 8, 440):
        policy, params = ovr.sampler_settings(ovr.as_case(cfg, prompt, 0), None)
        got[(cfg.reference, cfg.name)] = (policy, params)
        assert params["gen_length"] == 32 and params.get("cache", "none") == cfg.cache
    policy, params = got[("llada.generate", "low_confidence")]
    assert (policy, params["steps"], params["block_length"]) == ("low_confidence", 32, 8)
    for fn in ("generate", "generate_with_prefix_cache", "generate_with_dual_cache"):
        policy, params = got[(f"fastdllm.{fn}", "threshold0.9")]
        assert (policy, params["tau"], params["steps"]) == ("threshold", 0.9, 4)
    policy, params = got[("dream.diffusion_generate", "entropy")]
    assert (policy, params["steps"], params["schedule"]) == ("entropy", 32, "dream")


def test_mapping_checks_the_mask_id_against_the_model() -> None:
    model = type("M", (), {"mask_token_id": 9, "eos_token_ids": (8,)})()
    cfg = ovr.configs("llada", 16, 8, 500)[0]
    with pytest.raises(ValueError, match="mask_id"):
        ovr.sampler_settings(ovr.as_case(cfg, [[1, 2]], 0), model)


def test_parse_reply_fails_loudly() -> None:
    req = {"id": "a", "reference": "llada.generate"}
    good = {"id": "a", "output_ids": [[1]], "nfe": 1, "runs": []}
    assert ovr.parse_reply(json.dumps(good), req) == good
    with pytest.raises(RuntimeError, match="boom"):
        ovr.parse_reply(json.dumps({"id": "a", "error": "ValueError: boom"}), req)
    with pytest.raises(RuntimeError, match="for request 'a'"):
        ovr.parse_reply(json.dumps(dict(good, id="b")), req)
    with pytest.raises(RuntimeError, match="nfe"):
        ovr.parse_reply(json.dumps({"id": "a", "output_ids": [[1]], "runs": []}), req)


def test_summary_numbers() -> None:
    ref = ovr.Run(total_s=0.10, model_s=0.06, forwards=4, tokens=[[1, 2, 3]])
    ours = ovr.Run(total_s=0.08, model_s=0.06, forwards=4, tokens=[[1, 2, 3]])
    s = ovr.summarize(ref, ours, repeats=3)
    assert s["tokens_identical"] and s["positions_differing"] == 0
    assert s["cpu_ratio"] == pytest.approx(0.8)
    assert s["nonmodel_ms_step_ref"] == pytest.approx(10.0)
    assert s["nonmodel_ms_step_ours"] == pytest.approx(5.0)
    assert s["model_ms_step_ours"] == pytest.approx(15.0)
    bad = ovr.summarize(ref, ovr.Run(0.08, 0.06, 4, [[1, 9, 9]]), repeats=3)
    assert not bad["tokens_identical"] and bad["positions_differing"] == 2
    row = dict(model="m", reference="llada.generate", config="c", cache="none", **bad)
    assert "| NO |" in ovr.markdown([row])
    # like for like: "model" = the core modules; RoPE / masks set up in forward are loop work
    ref = ovr.Run(total_s=0.10, model_s=0.06, forwards=4, tokens=[[1]], core_s=0.05)
    ours = ovr.Run(total_s=0.08, model_s=0.06, forwards=4, tokens=[[1]], core_s=0.055)
    s = ovr.summarize(ref, ours, repeats=1)
    assert s["loop_ms_step_ref"] == pytest.approx(12.5)
    assert s["loop_ms_step_ours"] == pytest.approx(6.25)
    assert s["core_ms_step_ours"] == pytest.approx(13.75) and s["loop_ratio"] == pytest.approx(0.5)
    line = ovr.markdown([dict(model="m", reference="r", config="c", cache="none", **s)])
    assert "6.25 vs 12.50 (0.50)" in line and "5.00 vs 10.00 |" in line


def test_generation_config_is_written_beside_links(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 1,
                                                 "pad_token_id": 0}))
    (src / "model.safetensors").write_bytes(b"x")
    dst = ovr.with_generation_config(src, tmp_path / "dst")
    gen = json.loads((dst / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"], gen["alg"]) == (1, 0, "origin")
    assert (dst / "model.safetensors").is_symlink()


def test_prompt_avoids_special_ids() -> None:
    model = type("M", (), {"mask_token_id": 2, "eos_token_ids": (1,), "vocab_size": 6,
                           "spec": type("S", (), {"pad_token_id": 0})()})()
    prompt = ovr.draw_prompt(model, 64)
    assert prompt.shape == (1, 64) and set(prompt.flatten().tolist()) <= {3, 4, 5}


# ---- with a reference environment only ---------------------------------------------------

REF_OK, REF_WHY = ovr.reference_env()
needs_ref = pytest.mark.skipif(not REF_OK, reason=f"no reference environment: {REF_WHY}")


@needs_ref
def test_runner_reproduces_a_recorded_case() -> None:
    cases = [c for c in load_cases("llada-tiny")
             if c["reference_function"] == "generate_with_dual_cache"
             and c.get("reference_commit") == "24cc59e"]
    if not cases:
        pytest.skip("conformance fixtures absent")
    case = cases[0]
    runner = ovr.ReferenceRunner(os.environ["DLLM_REF_PYTHON"], os.environ["DLLM_REF_SRC"])
    try:
        reply = runner.run({"id": case["name"], "reference": "fastdllm.generate_with_dual_cache",
                            "checkpoint": str(CONFORMANCE / "llada-tiny"),
                            "prompt_ids": case["prompt_ids"], "args": case["args"],
                            "seed": case["seed"]})
    finally:
        runner.close()
    assert reply["output_ids"] == case["output_ids"] and reply["nfe"] == case["nfe"]


@needs_ref
@pytest.mark.usefixtures("one_thread")
def test_tiny_comparison_gives_identical_tokens() -> None:
    from dllm_decode.models.loading import load_model

    if not (CONFORMANCE / "llada-tiny").exists():
        pytest.skip("conformance fixtures absent")
    runner = ovr.ReferenceRunner(os.environ["DLLM_REF_PYTHON"], os.environ["DLLM_REF_SRC"])
    try:
        for family in ("llada", "dream"):
            path = CONFORMANCE / f"{family}-tiny"
            model = load_model(path)
            prompt = ovr.draw_prompt(model, 8)
            cfg = ovr.configs(family, 16, 8, model.mask_token_id)[-1]
            row = ovr.compare(runner, model, str(path), cfg, prompt, repeats=1)
            assert row["tokens_identical"], row
            assert row["nfe_ours"] <= row["nfe_ref"] and row["cpu_ratio"] > 0
    finally:
        runner.close()
    assert torch.get_num_threads() == 1
