"""Benchmark plumbing: CSV schema, ratios, and the roofline projection (an estimate)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from dllm_decode.bench import HEADER, decode_rows, ratios, write_csv
from dllm_decode.roofline import DREAM_7B, H100_SXM, LLADA_8B, forward_seconds
from tests.helpers import tiny_model


def test_decode_rows_schema_and_ratios(tmp_path) -> None:
    rows = decode_rows(tiny_model("llada"), batches=[1], gens=[8], prompt=4, block=4,
                       steps_per_block=2, modes=["none", "dual"], policy="low_confidence",
                       repeats=1, warmup=0, name="tiny")
    metrics = {(r["cache"], r["metric"]) for r in rows}
    assert ("dual", "end_to_end") in metrics and ("none", "tpf") in metrics
    nfe = {r["cache"]: r["p50"] for r in rows if r["metric"] == "nfe"}
    assert nfe == {"none": 4.0, "dual": 4.0}
    rs = ratios(rows)
    assert {(r["cache"], r["metric"]) for r in rs} == {("dual", "end_to_end"), ("dual", "step")}
    path = tmp_path / "out.csv"
    write_csv(rows, path)
    with path.open() as fh:
        read = list(csv.DictReader(fh))
    assert list(read[0]) == HEADER and len(read) == len(rows)


def test_roofline_matches_the_published_cost_model() -> None:
    # kernels.md §2.4: LLaDA-8B B=1 dual ~5.9 ms, prefix ~6.3 ms, no cache ~20 ms (all rows)
    dual = forward_seconds(LLADA_8B, H100_SXM, 1, 32, 768, 32)["total"]
    prefix = forward_seconds(LLADA_8B, H100_SXM, 1, 160, 768, 32)["total"]
    full = forward_seconds(LLADA_8B, H100_SXM, 1, 768, 768, 768)["total"]
    assert dual * 1e3 == pytest.approx(5.9, rel=0.05)
    assert prefix * 1e3 == pytest.approx(6.3, rel=0.05)
    assert full * 1e3 == pytest.approx(20.0, rel=0.1)
    assert LLADA_8B.linear_params == pytest.approx(6.98e9, rel=0.01)
    assert DREAM_7B.kv_bytes_per_token == pytest.approx(57_344)


def _script(name: str) -> Any:
    """A fresh import of ``benchmarks/NAME.py`` (a script, not a package module)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_model_card_table_and_section(tmp_path) -> None:
    bp = _script("bench_policies")
    summary = [dict(policy="low_confidence", params="{}", steps=s, task=f"waiting_line/{t}",
                    n=2, accuracy=acc, nfe=float(s), tokens_per_step=32 / s, wall_s=0.1)
               for s, t, acc in ((32, "copy", 1.0), (32, "reverse", 0.5), (8, "copy", 0.5),
                                 (8, "reverse", 0.0))]
    text = bp.per_task_table(summary)
    lines = text.splitlines()
    assert lines[0] == "| task | low_confidence, 1 tok/step | low_confidence, 4 tok/step |"
    assert lines[2] == "| copy | 100 / 32.0 | 50 / 8.0 |"
    assert lines[4] == "| **mean** | 75 / 32.0 | 25 / 8.0 |"
    readme = tmp_path / "README.md"
    readme.write_text("# card\n")
    bp.write_card_section(readme, "first")
    bp.write_card_section(readme, "second")  # replaced in place, not appended twice
    body = readme.read_text()
    assert body.startswith("# card\n") and "second" in body and "first" not in body
    assert body.count("<!-- results -->") == 1


def test_testbed_model_card_lists_every_training_stage(tmp_path) -> None:
    import json

    tp = _script("testbed_parallel")
    dirs = []
    for i, (layers, hidden) in enumerate(((2, 128), (4, 192))):
        d = tmp_path / f"stage{i}"
        d.mkdir()
        cfg = dict(family="llada", layers=layers, hidden=hidden, heads=4, intermediate=512,
                   batch_size=32, eval_size=12)
        (d / "run.json").write_text(json.dumps(dict(
            command=f"dllm-decode train testbed --stage {i}", config=cfg, steps_done=100 * (i + 1),
            wall_s=60.0 * (i + 1), parameters=1_000_000, vocab_size=525)))
        (d / "loss.csv").write_text("step,loss\n100,1.0\n" if i == 0 else "step,loss\n"
                                    + "".join(f"{s},{s / 1e4}\n" for s in range(50, 1250, 50)))
        (d / "eval.csv").write_text(f"step,copy\n100,0.{i}\n")
        dirs.append(d)
    rows = [dict(model="m", task="copy", k1=100, k4=100, k8=100, oracle_k1=100, oracle_k4=100,
                 oracle_k8=100, oracle_ties_k4=100, oracle_ties_k8=100, target_met=True,
                 target_met_random_ties=True)]
    card = tp.model_card("m", dirs, rows)
    assert "4 layers, hidden 192" in card and "300 steps in 2 stage(s)" in card
    assert "1. `dllm-decode train testbed --stage 0`" in card
    assert "2. `dllm-decode train testbed --stage 1`" in card
    assert "100,0.1" in card
    # the curves: first, every (rows // 12)-th and last row, the last one once
    assert card.count("100,1.0") == 1
    assert card.count("1200,0.12\n") == 1 and "\n50,0.005\n150,0.015\n" in card
    assert "\n100,0.01\n" not in card
    assert "| m | copy | 100 | 100 | 100 | 100 / 100 / 100 | 100 / 100 | met | met |" in card


def test_testbed_parallel_fit_writes_the_oracle_fit(tmp_path, capsys) -> None:
    """``--fit``: one row per random task, the exact oracle fitting itself (KL 0, no misses)."""
    tp = _script("testbed_parallel")
    tp.RESULTS = tmp_path
    assert tp.main(["--fit", "--models", "oracle", "--n", "3", "--tag", "t"]) == 0
    rows = list(csv.DictReader((tmp_path / "t_fit.csv").open()))
    assert [r["task"] for r in rows] == ["shuffle", "insert_random", "replace_random",
                                         "remove_random"]
    assert all(abs(float(r["kl"])) < 1e-4 and float(r["argmax_miss"]) == 0 for r in rows)
    assert all(float(r["positions"]) > 0 for r in rows)
    assert "| oracle | insert_random |" in capsys.readouterr().out


def test_testbed_parallel_slots_writes_one_row_per_length_and_slot(tmp_path, capsys) -> None:
    """``--slots``: insert_random's ambiguous state per (list length, slot), the oracle exact."""
    tp = _script("testbed_parallel")
    tp.RESULTS = tmp_path
    assert tp.main(["--slots", "--models", "oracle", "--n", "6", "--tag", "t"]) == 0
    rows = list(csv.DictReader((tmp_path / "t_slots.csv").open()))
    assert rows and all(int(r["slot"]) <= int(r["length"]) for r in rows)
    assert all(float(r["argmax_x"]) == 0 and abs(float(r["model_x"]) - float(r["oracle_x"])) < 1e-3
               for r in rows)
    assert "| oracle | " in capsys.readouterr().out


def test_testbed_parallel_draws_checks_every_draw_against_the_oracle(tmp_path, capsys) -> None:
    """``--draws``: per (model, task, k) the accuracy of each draw; the oracle against itself
    is within the tolerance on every draw; the random-ties reference is the mean of the
    tie-breaking oracles per draw and equals the exact oracle on the tasks without ties."""
    tp = _script("testbed_parallel")
    tp.RESULTS = tmp_path
    assert tp.main(["--draws", "2", "--models", "oracle", "--n", "3", "--tag", "t"]) == 0
    rows = list(csv.DictReader((tmp_path / "t_draws.csv").open()))
    assert {(r["task"], r["k"]) for r in rows} == {
        (t, k) for t in ("shuffle", "insert_random", "replace_random", "remove_random")
        for k in ("4", "8")}
    for r in rows:
        per = [float(v) for v in r["per_draw"].split()]
        assert len(per) == 2 and r["within_10"] == "2" and r["seeds"] == "0-1"
        assert float(r["mean"]) == float(r["oracle_mean"]) == sum(per) / 2
        tied = [float(v) for v in r["per_draw_ties"].split()]
        assert len(tied) == 2 and abs(float(r["oracle_ties_mean"]) - sum(tied) / 2) < 0.06
        if r["task"] != "shuffle":
            assert r["oracle_ties_mean"] == r["oracle_mean"] and r["within_10_ties"] == "2"
    assert "| oracle | insert_random | 4 |" in capsys.readouterr().out


def test_testbed_uniform_trained_runs_each_method_on_its_noise_kind(tmp_path, capsys) -> None:
    """``testbed_uniform_trained.py``: masked methods on the mask model, re-noising on the
    uniform-noise model, one row per (model, method, budget, task); re-noising without its
    early stop runs exactly N forwards, ``low_confidence`` exactly N steps."""
    tu = _script("testbed_uniform_trained")
    out = tmp_path / "u.csv"
    assert tu.main(["--mask-models", "testbed-llada2", "--uniform-model", "testbed-gemma",
                    "--n", "1", "--seeds", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == (2 + 3) * len(tu.FORWARDS) * 9
    kinds = {(r["model"], r["method"]) for r in rows}
    assert kinds == {("testbed-llada2", "low_confidence"), ("testbed-llada2", "eb"),
                     ("testbed-gemma", "renoise"), ("testbed-gemma", "renoise + early stop"),
                     ("testbed-gemma", "renoise sticky")}
    for r in rows:
        if r["method"] in ("renoise", "low_confidence"):
            assert float(r["nfe"]) == float(r["forwards"]), r
        assert float(r["nfe"]) <= float(r["forwards"])
    assert out.with_suffix(".png").stat().st_size > 0
    text = capsys.readouterr().out
    assert "| testbed-gemma | renoise | 16 |" in text and "| model | method | forwards |" in text


def test_2026_card_states_each_stage_and_a_stage_stopped_early(tmp_path) -> None:
    """``testbed_cards.card``: one line per stage with its command, steps and times; a stage
    stopped before the end of its schedule says so; the recipe names the on-policy rows."""
    import json

    from dllm_decode.models.loading import resolve_path

    tc = _script("testbed_cards")
    dirs = []
    for i, (done, planned) in enumerate(((1000, 9000), (8000, 8000))):
        d = tmp_path / f"stage{i}"
        d.mkdir()
        cfg = dict(family="gemma", steps=planned, random_weight=4.0, batch_size=32,
                   name_noise_frac=0.25, onpolicy_frac=0.5 * i)
        (d / "run.json").write_text(json.dumps(dict(
            command=f"dllm-decode train testbed --stage {i}", config=cfg, steps_done=done,
            wall_s=120.0, cpu_s=60.0, parameters=1_970_000)))
        (d / "loss.csv").write_text("step,loss\n100,1.0\n")
        (d / "eval.csv").write_text("step,copy\n100,1.0\n")
        dirs.append(d)
    card = tc.card("testbed-gemma", resolve_path("testbed-gemma"), dirs, "", "TABLE")
    assert ("1. `dllm-decode train testbed --stage 0` (1000 steps of its 9000-step schedule: "
            "stopped there, the next stage grew from this state, 1 CPU min, 2 wall min)") in card
    assert "2. `dllm-decode train testbed --stage 1` (8000 steps, 1 CPU min, 2 wall min)" in card
    assert "9000 steps, batch 32, 2 CPU minutes" in card and "TABLE" in card
    assert "on 50% of the rows the canvases the student's own `gemma_renoise`" in card
    assert "DiffusionGemma (`DiffusionGemmaForBlockDiffusion`): 3 layers" in card


def test_bench_cli_writes_to_the_working_directory_by_default() -> None:
    """``dllm-decode bench`` appends to ``./dllm_decode_bench.csv`` unless told otherwise, never
    to the repository's committed ``benchmarks/results/decode.csv``."""
    from dllm_decode.cli import build_parser

    args = build_parser().parse_args(["bench"])
    assert args.out == Path("dllm_decode_bench.csv")
