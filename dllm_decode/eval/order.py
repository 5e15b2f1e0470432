"""Commit-order summaries per method, from the rows' ``commit_steps`` (``eval analyze``).

Per row, over the useful positions (before the first EOS; all of them when there is none),
each position's *commit time* is the rank of its commit step among the row's distinct commit
steps, scaled to [0, 1] (0 = committed in the first round, 1 = in the last). Per method:

* ``order_kendall_tau``: mean decoding-order Kendall tau (1 = strictly left to right; named so
  that it is not read as a policy's ``tau`` parameter);
* ``in_order``: fraction of adjacent useful pairs committed left before (or with) right;
* ``rounds``: mean distinct commit steps per row; ``max_per_round``: mean of the largest
  number of useful positions committed in one round;
* ``t_q1`` .. ``t_q4``: mean commit time of the positions in each quarter of the useful span
  (left-to-right decoding gives about 0, 0.33, 0.67, 1; all-at-once 0, 0, 0, 0).

Rows are grouped per configuration: ``method_of(config)`` (model, policy, cache, block,
temperature) and, when ``config_of`` is given, ``config_of(config)`` (parameters, steps, gen
length), so configurations that differ only in a parameter (``low_confidence`` at 1 and 4 tokens
per step, a policy's ``growth=1`` and ``growth=2``) stay apart.

Rows written before ``commit_steps`` was recorded are skipped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

Row = dict[str, Any]

#: quarters of the useful span in the profile columns, bins in the plot
QUARTERS: Final[int] = 4
PLOT_BINS: Final[int] = 10


def commit_times(steps: Sequence[int], useful: int) -> list[float]:
    """Commit time in [0, 1] of each of the first ``useful`` positions (uncommitted: 1)."""
    head = list(steps[:useful])
    rounds = sorted({s for s in head if s >= 0})
    rank = {s: i for i, s in enumerate(rounds)}
    scale = max(len(rounds) - 1, 1)
    return [rank[s] / scale if s >= 0 else 1.0 for s in head]


def _useful(row: Mapping[str, Any]) -> int:
    n = int(row.get("gen_tokens_useful") or 0)
    return n if n > 0 else len(row["commit_steps"])


def row_summary(row: Mapping[str, Any]) -> dict[str, float] | None:
    """The per-row numbers of the table (``None``: no ``commit_steps`` or nothing useful)."""
    steps = row.get("commit_steps")
    if not steps:
        return None
    n = min(_useful(row), len(steps))
    head = list(steps[:n])
    if n == 0:
        return None
    times = commit_times(head, n)
    pairs = [a <= b for a, b in zip(head, head[1:], strict=False)]
    counts: dict[int, int] = defaultdict(int)
    for s in head:
        if s >= 0:
            counts[s] += 1
    out = {"in_order": sum(pairs) / len(pairs) if pairs else 1.0,
           "rounds": float(len(counts)), "max_per_round": float(max(counts.values(), default=0))}
    for q in range(QUARTERS):
        lo, hi = q * n // QUARTERS, (q + 1) * n // QUARTERS
        part = times[lo:hi] if hi > lo else [times[min(lo, n - 1)]]  # answers shorter than 4
        out[f"t_q{q + 1}"] = sum(part) / len(part)
    return out


def _groups(rows: Sequence[Row], method_of: Any, config_of: Any) -> dict[tuple[str, str],
                                                                          list[Row]]:
    """Rows by ``(method_of(config), config_of(config) or "")``."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        config = row["config"]
        groups[method_of(config), config_of(config) if config_of else ""].append(row)
    return groups


def order_table(rows: Sequence[Row], method_of: Any, config_of: Any = None) -> list[Row]:
    """One row per configuration (``method_of(config)`` and, if given, ``config_of(config)``
    -> labels; columns ``method`` and ``config``) with the summaries above."""
    out = []
    for (method, config), members in sorted(_groups(rows, method_of, config_of).items()):
        summaries = [s for s in (row_summary(r) for r in members) if s is not None]
        if not summaries:
            continue
        taus = [r["decoding_order_tau"] for r in members if r.get("decoding_order_tau") is not None]
        entry: Row = {"method": method, **({"config": config} if config_of else {}),
                      "rows": len(summaries),
                      "order_kendall_tau": sum(taus) / len(taus) if taus else None}
        for key in summaries[0]:
            entry[key] = sum(s[key] for s in summaries) / len(summaries)
        out.append(entry)
    return out


def order_plot(rows: Sequence[Row], method_of: Any, path: str | Path,
               config_of: Any = None) -> Path | None:
    """Mean commit time vs relative position (``PLOT_BINS`` bins), one line per configuration
    (grouped as ``order_table``).

    Returns the PNG path, or ``None`` when no row has ``commit_steps``.
    """
    curves: dict[str, list[list[float]]] = defaultdict(lambda: [[] for _ in range(PLOT_BINS)])
    for (method, config), members in _groups(rows, method_of, config_of).items():
        label = f"{method} {config}".strip()
        for row in members:
            steps = row.get("commit_steps")
            if not steps:
                continue
            n = min(_useful(row), len(steps))
            for i, t in enumerate(commit_times(list(steps[:n]), n)):
                curves[label][min(i * PLOT_BINS // n, PLOT_BINS - 1)].append(t)
    if not curves:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    xs = [(b + 0.5) / PLOT_BINS for b in range(PLOT_BINS)]
    for method, bins in sorted(curves.items()):
        pts = [(x, sum(v) / len(v)) for x, v in zip(xs, bins, strict=True) if v]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    ax.plot([0, 1], [0, 1], color="0.7", linestyle="--", label="left to right")
    ax.set_xlabel("relative position in the useful answer")
    ax.set_ylabel("mean commit time (0 first round, 1 last)")
    ax.set_title("decoding order per method")
    ax.legend(fontsize=6, loc="best")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
