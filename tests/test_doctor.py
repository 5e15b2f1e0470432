"""``dllm-decode doctor`` on CPU: facts, every kernel vs its reference, timed decodes, CSV."""

from __future__ import annotations

import csv
import re

import pytest
import torch

from dllm_decode import cli
from dllm_decode.doctor import CACHE_MODES, SHAPES, random_model
from dllm_decode.kernels import selfcheck

pytestmark = pytest.mark.usefixtures("one_thread")


def test_doctor_runs_on_cpu_and_appends_a_row(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as on a CPU-only machine (set before triton)
    out = tmp_path / "results" / "doctor.csv"
    argv = ["doctor", "--shape", "small", "--prompt-length", "16", "--gen-length", "16",
            "--block-length", "8", "--steps", "4", "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "== facts" in text and "torch" in text
    assert "FAIL" not in text
    for mode in CACHE_MODES:
        assert f"cache={mode}" in text
    # graphs: not run on CUDA here, said so; the stand-in capture / replay / self-check ran
    assert "CUDA graph self-check: not run (no CUDA device" in text and "stand-in" in text
    for mode in ("none", "prefix", "dual"):
        assert re.search(rf"cache={mode} +ok +(\d+) step shapes captured, \1 passed the "
                         r"self-check, 0 failed; [1-9]\d* replays; tokens equal to graphs "
                         "off: yes", text), mode
    assert re.search(r"cache=window +eager +runs without graphs: cache='window'", text)
    assert cli.main(argv) == 0  # a second run appends under the same header
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2
    row = rows[0]
    assert row["device"] == "cpu" and row["shape"] == "small" and row["kernels_failed"] == ""
    assert int(row["kernels_ok"]) + int(row["kernels_skipped"]) == len(selfcheck.CHECKS)
    assert all(float(row[f"s_{m}"]) > 0 for m in CACHE_MODES) and row["nfe"] == "4"
    assert row["graphs"] == "stand-in:none=ok,prefix=ok,dual=ok,window=eager"


def test_doctor_reports_a_failed_graph_self_check(tmp_path, monkeypatch, capsys) -> None:
    """A replay that disagrees with the eager step: the mode says FAIL with the reason, the
    tokens still equal graphs off (the shape fell back), and doctor exits 1."""
    from dllm_decode import doctor
    from dllm_decode.samplers.graph_backend import StandInGraph, StandInGraphs

    class Idle(StandInGraphs):  # every replay runs nothing
        def new_graph(self) -> StandInGraph:
            graph = super().new_graph()
            graph.replay = lambda: None
            return graph

    monkeypatch.setattr(doctor, "_graph_backend", lambda device: Idle())
    monkeypatch.setattr(doctor, "kernel_report", lambda *a, **k: [])
    argv = ["doctor", "--shape", "small", "--prompt-length", "8", "--gen-length", "8",
            "--block-length", "8", "--steps", "2"]
    assert cli.main(argv) == 1
    text = capsys.readouterr().out
    assert re.search(r"cache=dual +FAIL +\d+ step shapes captured, 0 passed the self-check, "
                     r"[1-9]\d* failed; 0 replays; tokens equal to graphs off: yes", text)
    assert "graph self-check failed for the step (batch 1, canvas 16" in text
    assert "tokens differ from the eager step" in text


def test_doctor_row_widens_an_older_header(tmp_path) -> None:
    """A row with a new column (``graphs``) appended to a record written before it existed:
    the file is rewritten under the widened header, the old row kept."""
    from dllm_decode.doctor import append_row

    path = tmp_path / "doctor.csv"
    append_row(path, {"device": "cuda", "s_none": "1.0"})
    append_row(path, {"device": "cpu", "s_none": "2.0", "graphs": "stand-in:none=ok"})
    append_row(path, {"device": "cpu", "graphs": "stand-in:none=ok"})
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["device", "s_none", "graphs"]
    assert [tuple(r.values()) for r in rows] == [
        ("cuda", "1.0", ""), ("cpu", "2.0", "stand-in:none=ok"), ("cpu", "", "stand-in:none=ok")]


def test_default_shape_is_llada_8b() -> None:
    s = SHAPES["llada-8b"]
    assert (s["d_model"], s["n_heads"], s["mlp_hidden_size"], s["vocab"]) == \
        (4096, 32, 12288, 126464)
    model = random_model("small", 2, torch.device("cpu"), torch.float32)
    assert model.vocab_size == SHAPES["small"]["vocab"] and len(model.layers) == 2


def test_doctor_rejects_bad_arguments(capsys) -> None:
    assert cli.main(["doctor", "--device", "tpu9"]) == 2
    assert "tpu9" in capsys.readouterr().err


def test_doctor_fails_when_a_kernel_disagrees(tmp_path, monkeypatch, capsys) -> None:
    from dllm_decode import doctor
    from dllm_decode.kernels import selfcheck

    monkeypatch.setattr(doctor, "_backend_status", lambda device: (device, "compiled"))
    monkeypatch.setattr(selfcheck, "check", lambda op, device, dtype: (
        "max |out - reference| = 0.5 > 0.002" if op == "block_attention" else None))
    out = tmp_path / "d.csv"
    argv = ["doctor", "--shape", "small", "--prompt-length", "8", "--gen-length", "8",
            "--block-length", "8", "--steps", "2", "--out", str(out)]
    assert cli.main(argv) == 1
    assert "block_attention   FAIL     max |out - reference| = 0.5" in capsys.readouterr().out
    assert list(csv.DictReader(out.open()))[0]["kernels_failed"] == "block_attention"


def test_doctor_defaults_to_the_small_shape_on_cpu(tmp_path, monkeypatch, capsys) -> None:
    """A plain ``dllm-decode doctor`` on a CPU runs the small shape (seconds, not minutes) and
    prints ms per forward for every cache mode."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "doctor.csv"
    argv = ["doctor", "--device", "cpu", "--prompt-length", "8", "--gen-length", "8",
            "--block-length", "8", "--steps", "2", "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "(small:" in text and text.count("ms/forward") == len(CACHE_MODES)
    assert "floor" not in text  # the weight-streaming floor is a CUDA number
    assert list(csv.DictReader(out.open()))[0]["shape"] == "small"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_doctor_on_cuda_reports_the_floor_ratio(tmp_path, capsys) -> None:
    argv = ["doctor", "--shape", "small", "--prompt-length", "16", "--gen-length", "16",
            "--block-length", "8", "--steps", "4", "--out", str(tmp_path / "d.csv")]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "weight-streaming floor" in text and text.count("x the floor") == len(CACHE_MODES)
    assert "== CUDA graph self-check per cache mode" in text
    for mode in ("none", "prefix", "dual"):  # CUDA graphs captured, checked and replayed
        assert re.search(rf"cache={mode} +ok +(\d+) step shapes captured, \1 passed", text)


def test_timed_decode_on_cuda_follows_two_warm_ups(monkeypatch) -> None:
    """On CUDA a step shape seen once per decode is captured in the second decode, so the
    timed decode comes after two warm-ups there (one on a CPU): captures are never timed."""
    from types import SimpleNamespace

    from dllm_decode import doctor
    from dllm_decode.samplers.sampler import DiffusionSampler

    calls: list[str] = []
    real = DiffusionSampler.generate

    def counted(self, prompt, *args, **kwargs):
        calls.append(self.config.cache.value)
        return real(self, prompt, *args, **kwargs)

    monkeypatch.setattr(DiffusionSampler, "generate", counted)
    monkeypatch.setattr(doctor, "_sync", lambda device: None)
    model = random_model("small", 1, torch.device("cpu"), torch.float32)
    cpu_prompt = doctor._prompt(model, torch.device("cpu"), 4)
    monkeypatch.setattr(doctor, "_prompt", lambda *a: cpu_prompt)
    for device, decodes in ((torch.device("cpu"), 2), (SimpleNamespace(type="cuda"), 3)):
        calls.clear()
        doctor.time_decodes(model, device, 4, 4, 4, 2)
        assert calls == [c for c in CACHE_MODES for _ in range(decodes)]
