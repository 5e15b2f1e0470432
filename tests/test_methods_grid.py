"""WINO, LoPA and dLLM-Cache run from a grid file through the sweep runner
(``benchmarks/grids/wino_lopa_cache.yaml``, cut to one prompt of two tasks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dllm_decode import load_model
from dllm_decode.eval.parallelbench.codec import ModelCodec
from dllm_decode.eval.parallelbench.grid import parse_grid
from dllm_decode.eval.parallelbench.rows import read_rows
from dllm_decode.eval.runner import load_records, run_grid, sampler_decode_fn
from dllm_decode.train.testbed import waiting_line_oracle

pytestmark = pytest.mark.usefixtures("one_thread")
GRID = Path(__file__).resolve().parents[1] / "benchmarks" / "grids" / "wino_lopa_cache.yaml"


def test_grid_runs_every_method(tmp_path: Path) -> None:
    spec = yaml.safe_load(GRID.read_text())
    spec.update(num_samples=1, batch_size=1, tasks=["waiting_line/copy",
                                                    "waiting_line/insert_random"])
    grid = parse_grid(spec)
    model = load_model(grid.model)
    summary = run_grid(grid, load_records(grid, testbed=True), tmp_path,
                       decode=sampler_decode_fn(model), codec=ModelCodec(waiting_line_oracle()),
                       model=grid.model, progress=False)
    rows = read_rows(summary.rows_path)
    policies = {(r["config"]["policy"], r["config"]["cache"]) for r in rows}
    assert policies == {("wino", "none"), ("lopa", "none"), ("low_confidence", "dllm_cache"),
                        ("threshold", "dllm_cache")}
    assert len(rows) == 2 * 8 and all(r["nfe"] >= 1 for r in rows)
    copy = [r for r in rows if r["task"] == "waiting_line/copy"]
    assert all(r["score"] == 1.0 for r in copy), "the test bed's copy task is solved"
