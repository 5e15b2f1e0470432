"""Decoding pictures (``plot_decoding``, ``generate --plot``) and commit-order summaries."""

from __future__ import annotations

import struct

import pytest
import torch

from dllm_decode import DiffusionSampler, plot_decoding
from dllm_decode.eval.analyze import analyze_rows, method_of
from dllm_decode.eval.order import commit_times, order_table, row_summary
from tests.helpers import tiny_model

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.usefixtures("one_thread")
LLADA = tiny_model("llada", seed=5)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_generation_records_steps_without_syncs() -> None:
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    out = DiffusionSampler(LLADA, "low_confidence", cache="dual", gen_length=8,
                           block_length=4, steps=8).generate(prompt)
    assert out.refreshed.shape == (2, out.steps) and len(out.step_forwards) == out.steps
    # dual: a full refresh at each block's first step only
    assert out.refreshed[0].tolist() == [True, False, False, False] * 2
    per_step = out.commits_per_step()
    assert per_step.tolist() == [[1] * 8] * 2 and out.forwards == sum(out.step_forwards)
    # tau must lie in (0, 1] (policies.validate): any tau <= 1/V commits every position at once
    fast = DiffusionSampler(LLADA, "threshold", tau=1e-6, gen_length=8).generate(prompt)
    assert fast.commits_per_step().sum(1).tolist() == [8, 8]


@pytest.mark.parametrize("size", [(10.0, 7.0), (6.0, 4.0)])
def test_plot_decoding_png(tmp_path, size) -> None:
    out = DiffusionSampler(LLADA, "threshold", tau=0.3, cache="dual", gen_length=12,
                           block_length=4).generate(torch.tensor([[3, 4, 5]]))
    path = tmp_path / "sub" / "decode.png"
    fig = plot_decoding(out, path, figsize=size, dpi=80, decode=lambda ids: str(ids[0]))
    data = path.read_bytes()
    assert len(data) > 5_000 and _png_size(data) == (int(size[0] * 80), int(size[1] * 80))
    assert "committed positions/forward" in fig._suptitle.get_text()  # no stop ids given
    titled = plot_decoding(out, stop_token_ids=LLADA.eos_token_ids)._suptitle.get_text()
    assert "tokens/forward (" in titled and "answer tokens up to EOS / NFE" in titled
    with pytest.raises(ValueError, match="row must be"):
        plot_decoding(out, row=1)


def test_plot_marks_token_edits(tmp_path) -> None:
    out = DiffusionSampler(LLADA, "llada21", mode="speed", gen_length=8,
                           block_length=4).generate(torch.tensor([[3, 4, 5]]))
    assert out.edits is not None and out.edits.any()
    fig = plot_decoding(out, tmp_path / "edits.png", dpi=40)
    labels = [t.get_text() for ax in fig.axes for leg in [ax.get_legend()] if leg
              for t in leg.get_texts()]
    assert "edit" in labels and "tokens edited" in labels


def test_order_summaries() -> None:
    assert commit_times([0, 1, 2, 3], 4) == [0.0, 1 / 3, 2 / 3, 1.0]
    assert commit_times([5, 5, -1], 3) == [0.0, 0.0, 1.0]
    config = {"model": "m", "policy": "p", "stopper": "sched", "cache": "none",
              "gen_length": 8, "block_length": 8, "temperature": 0.0}
    l2r = {"config": config, "gen_tokens_useful": 8, "decoding_order_tau": 1.0,
           "commit_steps": list(range(8))}
    summary = row_summary(l2r)
    assert summary["in_order"] == 1.0 and summary["rounds"] == 8.0
    assert [round(summary[f"t_q{q}"], 3) for q in (1, 2, 3, 4)] == [0.071, 0.357, 0.643, 0.929]
    at_once = {**l2r, "commit_steps": [0] * 8, "decoding_order_tau": None}
    table = order_table([l2r, at_once, {**l2r, "commit_steps": None}], method_of)
    assert len(table) == 1 and table[0]["method"] == "m:p+sched cache=none block=full T=0"
    assert table[0]["rows"] == 2 and table[0]["max_per_round"] == 4.5


def test_analyze_writes_order(tmp_path) -> None:
    config = {"model": "m", "policy": "p", "cache": "none", "gen_length": 8,
              "block_length": 8, "steps": None, "temperature": 0.0, "params": {}}
    rows = [{"config": config, "config_hash": "h", "task": "waiting_line/copy", "doc_id": i,
             "category": "waiting_line", "score": 1.0, "score_strict": 1.0, "nfe": 4,
             "gen_tokens_useful": 8, "gen_tokens_budget": 8, "wall_time_s": 0.1,
             "decoding_order_tau": 0.9, "commit_steps": [0, 0, 1, 1, 2, 2, 3, 3]}
            for i in range(3)]
    tables = analyze_rows(rows, tmp_path)
    assert tables["order"][0]["rounds"] == 4.0
    assert (tmp_path / "order.md").read_text().startswith("| method")
    assert _png_size((tmp_path / "order.png").read_bytes()) == (800, 500)


def test_one_step_decode_draws_a_sensible_figure(tmp_path) -> None:
    """One step: the colour bar is one band labelled 0, the step axis has only integer ticks."""
    out = DiffusionSampler(LLADA, "low_confidence", gen_length=8, steps=1).generate(
        torch.tensor([[3, 4, 5]]))
    fig = plot_decoding(out, tmp_path / "one.png")
    top, bottom, bar = fig.axes
    lo, hi = bar.get_ylim()
    assert (lo, hi) == (-0.5, 0.5)
    ticks = [t for t in bar.get_yticks() if lo <= t <= hi]
    assert ticks == [0.0]
    steps = [t for t in bottom.get_xticks() if -0.5 <= t <= 0.5]
    assert steps == [0.0] and all(float(t).is_integer() for t in bottom.get_xticks())
    assert fig._suptitle.get_text().startswith("row 0: 1 step, 1 forward, 8.00")


def test_testbed_pareto_plot_distinct_styles_and_legend_outside(tmp_path) -> None:
    """benchmarks/bench_testbed.py: no two methods share a colour (or colour + marker), the
    legend lies outside every panel, and a family keeps its style across panels."""
    import importlib.util
    from pathlib import Path

    from matplotlib.colors import to_hex

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_testbed",
                                                  root / "benchmarks" / "bench_testbed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    families = [f"method{i}" for i in range(22)]
    rows = [{"model": m, "family": f, "tokens_per_step": 1.0 + i / 3 + j, "acc": 90.0 - i,
             "ci_lo": 85.0 - i,
             "ci_hi": 95.0 - i} for m in ("a", "b") for i, f in enumerate(families)
            for j in range(2)]
    fig = bench.pareto_plot(rows, tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").stat().st_size > 10_000
    (legend,) = fig.legends
    box = legend.get_window_extent()
    per_panel = []
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent())
        styles = {c.get_label(): (to_hex(c.lines[0].get_color()), c.lines[0].get_marker())
                  for c in ax.containers}
        assert len(styles) == len(families)
        assert len({c for c, _ in styles.values()}) == len(families)  # no colour reused
        per_panel.append(styles)
    assert per_panel[0] == per_panel[1]
    assert [t.get_text() for t in legend.get_texts()] == families
