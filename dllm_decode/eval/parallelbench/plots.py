"""Matplotlib figures (Agg backend, PNG) built from ``analyze.cell_table`` cells.

* :func:`pareto_plot`: score vs TPF per task (one subplot per task), one line per method,
  the all-method Pareto front drawn as a dashed step line.
* :func:`score_panels`: score vs tokens-per-step per category (task-averaged), one line per
  method, log2 x axis as in the ParallelBench figures.

Both put one legend right of the panels and give every panel a score axis at least 10 points
wide (``score_limits``).
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
#: score axes: at least this many points wide, this much room above and below the scores
_MIN_SPAN: Final[float] = 10.0
_MARGIN: Final[float] = 2.0
_PERCENT: Final[float] = 100.0


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


def _save(fig: Any, axes: list[Any], path: Path) -> Path:
    """Tight layout, one legend for every panel right of the grid (methods from any panel,
    each once), saved with the legend inside the picture."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.tight_layout()
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper left",
                   bbox_to_anchor=(1.0, 1.0), fontsize=7, title="method")
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def score_limits(scores: Sequence[float]) -> tuple[float, float]:
    """The y range of a score panel (percent): the scores with a margin, at least
    ``_MIN_SPAN`` points wide (a flat score is not blown up into noise) and inside
    [-``_MARGIN``, 100 + ``_MARGIN``]."""
    lo, hi = min(scores), max(scores)
    if hi - lo < _MIN_SPAN:
        mid = min(max((lo + hi) / 2, _MIN_SPAN / 2), _PERCENT - _MIN_SPAN / 2)
        lo, hi = mid - _MIN_SPAN / 2, mid + _MIN_SPAN / 2
    return max(lo - _MARGIN, -_MARGIN), min(hi + _MARGIN, _PERCENT + _MARGIN)


def _lines(ax: Any, points: dict[str, list[tuple[float, float]]], xlabel: str) -> None:
    for method, xy in sorted(points.items()):
        xy = sorted(xy)
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", markersize=3, label=method)
    scores = [y for xy in points.values() for _, y in xy]
    if scores:
        ax.set_ylim(*score_limits(scores))
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
    return _save(fig, axes, Path(path))


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
    return _save(fig, axes, Path(path))
