"""``benchmarks/bench_testbed_long.py`` on a small ``--n``: the CSV schema, the exact oracle's
one-token-per-step rows (accuracy 1.0), refusals as rows with a note, cache modes on tiny
exported students (a bidirectional one and a block-diffusion one), the table, plot and the
best-TPF summary."""

from __future__ import annotations

import csv
import importlib.util
import sys
from dataclasses import asdict
from pathlib import Path
from types import ModuleType

import pytest

from dllm_decode.eval.parallelbench.testbed_long import long_codec
from dllm_decode.train.state import save_state
from dllm_decode.train.testbed_long import LongTrainConfig, build_student, export_student

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["model", "policy", "cache", "task", "n", "accuracy", "nfe", "tpf", "rounds",
           "positions", "wall_s_per_answer", "cpu_s_per_answer", "note", "gen_length",
           "block_length", "seed", "device", "threads", "torch", "python", "cpu", "commit",
           "timestamp"]


def bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_testbed_long",
                                                  ROOT / "benchmarks" / "bench_testbed_long.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_student(tmp: Path, family: str) -> Path:
    """A fresh (untrained) tiny student from a config and seed, exported as a checkpoint."""
    cfg = LongTrainConfig(family=family, out=str(tmp / f"run-{family}"), hidden=32, layers=1,
                          heads=2, intermediate=64, seed=3)
    model = build_student(cfg, long_codec(cfg.gen_length))
    run = Path(cfg.out)
    run.mkdir(parents=True)
    save_state(run / "checkpoint.safetensors", {"model": model.state_dict(), "step": 0,
                                                "wall_s": 0.0, "config": asdict(cfg)})
    return export_student(run, tmp / f"student-{family}")


def read(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_parse_policy_specs() -> None:
    b = bench()
    assert b.parse_policy("low_confidence_k1") == ("low_confidence_k1", None, None, {})
    assert b.parse_policy("threshold:tau=0.7") == ("threshold", None, None, {"tau": 0.7})
    assert b.parse_policy("threshold+sched+eotp:tau=0.8,stopper.tau_low=2,steps=32") == (
        "threshold", "sched", "eotp", {"tau": 0.8, "stopper.tau_low": 2, "steps": 32})
    for bad in ("thresold", "threshold+threshold", "threshold:tau"):
        with pytest.raises(ValueError):
            b.parse_policy(bad)
    front = b.frontier_policies()
    assert front[0] == b.BASELINE and "threshold" in front and "low_confidence" not in front
    assert "threshold+eotp" in front and "threshold+sched" in front


def test_oracle_and_students_rows(tmp_path) -> None:
    b = bench()
    llada, sdar = tiny_student(tmp_path, "llada"), tiny_student(tmp_path, "sdar")
    out = tmp_path / "long.csv"
    assert b.main(["--models", f"oracle,{llada}", str(sdar), "--policies",
                   "low_confidence_k1,threshold", "--cache", "none,prefix,dual,block_causal",
                   "--n", "2", "--workers", "1", "--batch", "2", "--out", str(out),
                   "--best"]) == 0
    rows = read(out)
    assert list(rows[0]) == COLUMNS
    models, tasks = ["oracle", str(llada), str(sdar)], ["copy", "shuffle", "carry"]
    assert [(r["model"], r["policy"], r["cache"], r["task"]) for r in rows] == [
        (m, p, c, t) for m in models for p in ("low_confidence_k1", "threshold")
        for c in ("none", "prefix", "dual", "block_causal") for t in tasks]
    got = {(r["model"], r["policy"], r["cache"], r["task"]): r for r in rows}
    for t in tasks:  # the exact oracle at one token per step: every answer right, 128 steps
        k1 = got["oracle", "low_confidence_k1", "none", t]
        assert (k1["n"], float(k1["accuracy"]), float(k1["nfe"]), k1["note"]) == (
            "2", 1.0, 128.0, "")
        assert float(k1["positions"]) == 128 * 256 and int(k1["gen_length"]) == 128
        assert float(got["oracle", "threshold", "none", t]["accuracy"]) == 1.0
        assert float(got["oracle", "threshold", "none", t]["nfe"]) < 128
    refused = {(m, c) for (m, _, c, _), r in got.items() if r["note"]}
    assert refused == {("oracle", "prefix"), ("oracle", "dual"), ("oracle", "block_causal"),
                       (str(llada), "block_causal"), (str(sdar), "prefix"),
                       (str(sdar), "dual")}
    for r in rows:
        if r["note"]:  # a refusal is a row with the reason, not a crash
            assert r["note"].startswith("refused: ") and r["n"] == "0" and r["accuracy"] == ""
        else:
            assert 0.0 <= float(r["accuracy"]) <= 1.0 and float(r["tpf"]) > 0
            assert float(r["wall_s_per_answer"]) > 0 and r["device"] == "cpu"
    # caches compute fewer positions than the whole canvas, at the same 128 forwards
    full = float(got[str(llada), "low_confidence_k1", "none", "copy"]["positions"])
    for cache in ("prefix", "dual"):
        r = got[str(llada), "low_confidence_k1", cache, "copy"]
        assert float(r["nfe"]) == 128.0 and float(r["positions"]) < full
    bc = got[str(sdar), "low_confidence_k1", "block_causal", "copy"]
    assert float(bc["positions"]) < float(got[str(sdar), "low_confidence_k1", "none",
                                              "copy"]["positions"])
    md = out.with_suffix(".md").read_text()
    assert "best **threshold** / none" in md and "### oracle" in md and "Refused by" in md
    assert (tmp_path / "long_pareto.png").stat().st_size > 10_000
    out.with_suffix(".md").unlink()
    assert b.main(["--render", "--out", str(out)]) == 0  # table and plot from the CSV alone
    assert "best **threshold** / none" in out.with_suffix(".md").read_text()


def test_unknown_names_fail_before_decoding(tmp_path) -> None:
    b = bench()
    with pytest.raises(ValueError, match="unknown preset"):
        b.main(["--models", "oracle", "--policies", "thresh", "--out", str(tmp_path / "x.csv")])
    with pytest.raises(SystemExit, match="unknown modes"):
        b.main(["--models", "oracle", "--cache", "duall", "--out", str(tmp_path / "x.csv")])


def test_card_writer_bundles_a_run_with_its_recipe(tmp_path) -> None:
    """``testbed_long_cards.py`` on a really trained (two-step) run: the exported directory
    loads by path, the card quotes each stage's command and the held-out table, and the rows
    land in the CSV with the bundled name."""
    from dllm_decode import load_model
    from dllm_decode.train.testbed_long import train

    common = {"out": str(tmp_path / "run"), "batch_size": 2, "hidden": 32, "layers": 1,
              "heads": 2, "intermediate": 64, "curriculum": 2, "steps": 2, "seed": 5}
    train(LongTrainConfig(stop_after=1, **common))
    train(LongTrainConfig(resume=True, **common))
    spec = importlib.util.spec_from_file_location("testbed_long_cards",
                                                  ROOT / "benchmarks" / "testbed_long_cards.py")
    cards = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec.loader.exec_module(cards)
    out, results = tmp_path / "bundle", tmp_path / "cards.csv"
    assert cards.main(["--card", "testbed-long-x", str(tmp_path / "run"), "--n", "2",
                       "--out", str(out), "--results", str(results)]) == 0
    text = (out / "README.md").read_text()
    assert text.startswith("# testbed-long-x") and "Held-out results" in text
    assert "1. `OMP_NUM_THREADS=1 dllm-decode train testbed-long" in text
    assert "--stop-after 1" in text and "(steps 1-2," in text and "--resume" in text
    assert "| one token per step" in text and "| threshold 0.9" in text
    with results.open() as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["model"], r["policy"]) for r in rows} == {
        ("testbed-long-x", "low_confidence_k1"), ("testbed-long-x", "threshold")}
    assert len(rows) == 6 and all(r["n"] == "2" and r["note"] == "" for r in rows)
    assert load_model(str(out)).vocab_size == long_codec().vocab_size
    (out / "README.md").unlink()  # --render: the card again from the recorded rows
    assert cards.main(["--card", "testbed-long-x", str(tmp_path / "run"), "--out", str(out),
                       "--results", str(results), "--render", "--note", "A note."]) == 0
    again = (out / "README.md").read_text()
    assert again.replace(" A note.", "") == text and "A note." in again
