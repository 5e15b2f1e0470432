"""analyze: tables (hand-computed on a synthetic run), files, plots."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dllm_decode.eval.analyze import (
    aup_table,
    cell_table,
    config_table,
    method_of,
    pbx_table,
    qps_table,
    to_markdown,
)

COPY, SUDOKU = "waiting_line/copy", "puzzle/sudoku_n4_12"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rows_for(config_id: str, task: str, scores: list[float], nfe: list[int], **config) -> list:
    category = task.split("/")[0]
    full = {"model": "m", "policy": "low_confidence", "params": {}, "cache": "none",
            "gen_length": 32, "block_length": 32, "steps": None, "temperature": 0.0, "seed": 0,
            **config}  # fmt: skip
    return [
        {"config_hash": config_id, "task": task, "category": category, "doc_id": i,
         "config": full, "score": s, "score_strict": s, "nfe": n, "gen_tokens_useful": 8,
         "gen_tokens_budget": full["gen_length"], "wall_time_s": 0.5,
         "decoding_order_tau": 1.0 if n > 1 else None}
        for i, (s, n) in enumerate(zip(scores, nfe, strict=True))
    ]  # fmt: skip


@pytest.fixture
def rows() -> list[dict]:
    threshold = {"policy": "threshold", "params": {"tau": 0.9}}
    return [
        *rows_for("a32", COPY, [1, 1], [32, 32], steps=32),
        *rows_for("a32", SUDOKU, [1, 0], [32, 32], steps=32),
        *rows_for("a8", COPY, [1, 0], [8, 8], steps=8),
        *rows_for("a8", SUDOKU, [0, 0], [8, 8], steps=8),
        *rows_for("b", COPY, [1, 1], [4, 12], **threshold),
        *rows_for("b", SUDOKU, [1, 1], [8, 8], **threshold),
    ]


def by(table: list[dict], **match) -> dict:
    (row,) = [r for r in table if all(r[k] == v for k, v in match.items())]
    return row


def test_cells_and_config_means(rows: list[dict]) -> None:
    cells = cell_table(rows)
    assert len(cells) == 6
    cell = by(cells, config_hash="b", task=COPY)
    assert (cell["score"], cell["nfe"], cell["tokens_per_step"]) == (100.0, 8.0, 4.0)
    assert cell["tpf"] == 1.0 and cell["tpf_macro"] == pytest.approx((8 / 4 + 8 / 12) / 2)
    assert cell["tokens_per_second"] == 16.0 and cell["adaptive"]
    overall = config_table(cells, by="")
    assert by(overall, config_hash="a32")["score"] == 75.0
    assert by(overall, config_hash="a8")["score"] == 25.0
    categories = config_table(cells, by="category")
    assert by(categories, config_hash="a8", group="waiting_line")["score"] == 50.0
    assert method_of(rows[0]["config"]) == "m:low_confidence cache=none block=full T=0"


def test_pbx_aup_qps_hand_computed(rows: list[dict]) -> None:
    cells = cell_table(rows)
    pbx = pbx_table(cells)
    topk = by(pbx, adaptive=False)  # points (1, 75), (4, 25)
    assert (topk["PB90"], topk["PB80"], topk["PB70"], topk["PB60"]) == (None, None, 1.0, 1.0)
    assert by(pbx, adaptive=True)["PB90"] == 4.0  # single point (4, 100)
    aup = aup_table(cells)
    # top-k: copy (0.25, 100), (1, 50): 50 is cut -> 0.25*100; sudoku 0.25*50 (0 is cut).
    low = by(aup, method="m:low_confidence cache=none block=full T=0")
    assert (low[COPY], low[SUDOKU], low["mean"]) == (25.0, 12.5, 18.75)
    assert by(aup, method="m:threshold cache=none block=full T=0")["mean"] == 100.0
    qps = qps_table(cells)  # baseline: most forwards (a32)
    assert by(qps, config_hash="a32")["qps"] == 1.0
    a8 = by(qps, config_hash="a8")  # speed-up 4: copy 4 * 0.5^4, sudoku 4 * 0^4
    assert a8["speedup"] == 4.0 and a8["qps"] == pytest.approx((0.25 + 0.0) / 2)
    b = by(qps, config_hash="b")  # copy 4 * 1^4, sudoku 4 * 2^4
    assert b["qps"] == pytest.approx((4 + 64) / 2) and b["pct_of_baseline"] == 150.0
    explicit = qps_table(cells, baseline="a8")
    assert by(explicit, config_hash="a8")["speedup"] == 1.0


def test_markdown_escapes_and_missing() -> None:
    text = to_markdown([{"a": "x|y", "b": None, "c": 1.234}])
    assert text.splitlines()[2] == "| x\\|y | - | 1.23 |"
    assert to_markdown([]) == "_no rows_\n"


def test_analyze_writes_tables_and_plots(rows: list[dict], tmp_path: Path) -> None:
    from dllm_decode.eval.analyze import analyze_rows

    tables = analyze_rows(rows, tmp_path)
    assert set(tables) == {"tasks", "categories", "overall", "pbx", "aup", "qps"}
    for name in tables:
        assert (tmp_path / f"{name}.md").read_text().startswith("| ")
        with (tmp_path / f"{name}.csv").open() as handle:
            assert len(list(csv.DictReader(handle))) == len(tables[name])
    for png in ("pareto.png", "panels.png"):
        data = (tmp_path / png).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    with pytest.raises(ValueError, match="no result rows"):
        analyze_rows([], tmp_path)


def test_overall_rows_name_gen_length_steps_and_the_tasks_they_cover() -> None:
    """gen_length: auto gives one config per task length: the overall rows must differ."""
    from dllm_decode.eval.analyze import COLUMNS, config_label

    rows = [*rows_for("g32", COPY, [1], [8], steps=8),
            *rows_for("g64", SUDOKU, [0], [16], steps=16, gen_length=64, block_length=64)]
    overall = config_table(cell_table(rows), by="")
    labels = {r["config_hash"]: (r["config"], r["covers"]) for r in overall}
    assert labels == {"g32": ("low_confidence[steps=8] gen=32 block=full", "waiting_line (1)"),
                      "g64": ("low_confidence[steps=16] gen=64 block=full", "puzzle (1)")}
    cell = cell_table(rows)[0]
    assert "order_kendall_tau" in cell and "tau" not in cell  # not a policy's tau
    assert "tau" not in config_table([cell], by="category")[0]
    assert {"tpf", "tokens_per_step", "order_kendall_tau"} <= set(COLUMNS)
    assert config_label({"policy": "threshold", "params": {"tau": 0.9}, "gen_length": 32,
                         "block_length": 8, "steps": None}) == "threshold[tau=0.9] gen=32 block=8"


def test_testbed_grid_rows_are_labelled_by_k() -> None:
    """The rows of benchmarks/grids/testbed.yaml (k = 1 / 4 / 8, threshold, the 2026 methods)
    read differently."""
    from dllm_decode.eval.analyze import config_label
    from dllm_decode.eval.parallelbench.grid import expand_configs, load_grid

    grid = load_grid(Path(__file__).resolve().parents[1] / "benchmarks/grids/testbed.yaml")
    configs = expand_configs(grid, COPY, "testbed-llada")
    labels = [config_label(c.as_dict()) for c in configs]
    assert len(set(labels)) == len(labels) == 9
    assert "low_confidence[schedule=llada,steps=4] gen=16 block=full" in labels
    assert "frechet[delta=0.25] gen=16 block=full" in labels


def test_analysis_folder_explains_its_columns(rows: list[dict], tmp_path: Path) -> None:
    from dllm_decode.eval.analyze import analyze_rows

    analyze_rows(rows, tmp_path, plots=False)
    legend = (tmp_path / "README.md").read_text()
    assert "`tpf`: tokens per forward: answer tokens up to the first EOS" in legend
    assert "`order_kendall_tau`" in legend and "EOS fill included" in legend
