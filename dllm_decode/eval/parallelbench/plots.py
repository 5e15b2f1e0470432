"""Matplotlib figures (Agg backend, PNG) built from ``analyze.cell_table`` cells.

* :func:`pareto_plot`: score vs TPF per task (one subplot per task), one line per method,
  the all-method Pareto front drawn as a dashed step line.
* :func:`score_panels`: score vs tokens-per-step per category (task-averaged), one line per
  method, log2 x axis as in the ParallelBench figures.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from dllm_decode.eval.metrics import pareto_front

#: Subplot grid width and per-subplot size in inches.
_COLUMNS: Final[int] = 4
_PANEL_INCHES: Final[tuple[float, float]] = (4.0, 3.2)
_DPI: Final[int] = 120
_LOG_BASE: Final[int] = 2


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(count: int) -> tuple[Any, list[Any]]:
    plt = _pyplot()
    columns = min(_COLUMNS, count)
    rows = math.ceil(count / columns)
    width, height = _PANEL_INCHES
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    _pyplot().close(fig)
    return path


def _lines(ax: Any, points: dict[str, list[tuple[float, float]]], xlabel: str) -> None:
    for method, xy in sorted(points.items()):
        xy = sorted(xy)
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", markersize=3, label=method)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("score (%)")
    ax.grid(alpha=0.3)


def pareto_plot(cells: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Score vs TPF (useful tokens per forward) per task; dashed line = Pareto front."""
    tasks = sorted({c["task"] for c in cells})
    if not tasks:
        raise ValueError("no cells to plot")
    fig, axes = _grid(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        mine = [c for c in cells if c["task"] == task and c["tpf"] is not None]
        curves: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for cell in mine:
            curves[cell["method"]].append((cell["tpf"], cell["score"]))
        _lines(ax, curves, "tokens per forward")
        xy = [(c["tpf"], c["score"]) for c in mine]
        front = [xy[i] for i in pareto_front(xy)]
        if front:
            ax.step([x for x, _ in front], [y for _, y in front], "k--", where="pre", lw=1)
        ax.set_title(task, fontsize=9)
    axes[0].legend(fontsize=6)
    return _save(fig, Path(path))


def score_panels(cells: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Task-averaged score vs tokens-per-step, one panel per category (log2 x axis)."""
    sums: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for cell in cells:
        if cell["tokens_per_step"] is not None:
            key = (cell["category"], cell["method"], cell["config_hash"])
            sums[key].append((cell["tokens_per_step"], cell["score"]))
    categories = sorted({category for category, _, _ in sums})
    if not categories:
        raise ValueError("no cells with tokens-per-step to plot")
    fig, axes = _grid(len(categories))
    for ax, category in zip(axes, categories, strict=True):
        curves: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for (cat, method, _), xy in sums.items():
            if cat == category:
                x = sum(p[0] for p in xy) / len(xy)
                curves[method].append((x, sum(p[1] for p in xy) / len(xy)))
        _lines(ax, curves, "tokens per step")
        ax.set_xscale("log", base=_LOG_BASE)
        ax.set_title(category, fontsize=9)
    axes[0].legend(fontsize=6)
    return _save(fig, Path(path))
