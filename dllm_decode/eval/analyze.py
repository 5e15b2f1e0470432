"""Tables and plots from result rows (never from inside the decoding loop).

Aggregation levels:

* **cell** = (config, task): ``score`` = 100 x mean grader score, NFE mean, ``tpf`` (tokens
  per forward: the answer's tokens up to its first EOS / NFE, micro; ``tpf_macro`` per row:
  the field's speed figure), ``tokens_per_step`` = sum(gen_length) / sum(NFE) (the budget
  per forward, EOS fill included: ParallelBench's x axis, ``gen_length / steps`` for fixed
  schedules, measured for adaptive ones), tokens/s, ``order_kendall_tau`` (the mean
  decoding-order Kendall tau, 1 = left to right; not a policy's ``tau`` parameter).
  ``COLUMNS`` explains each column; ``analysis/README.md`` repeats it beside the tables.
* **config** = unweighted mean over tasks (per category and overall). A sweep entry with
  ``gen_length: auto`` yields one config per task length, so its overall rows name the gen
  length in ``config`` and the tasks they average in ``covers``.
* **order** = per configuration (method and ``setting_label``: parameters, steps, gen length),
  how the canvas was filled: Kendall tau, pairs in order, rounds, commit time per quarter of the
  answer (``eval.order``; ``order.png``).
* **method** = a config minus its speed knob (``steps`` for top-k policies, ``params`` for
  adaptive ones): the curve along which PBx and AUP are computed. Block lengths equal to the
  generation length are reported as ``full`` so methods line up across 32/64-token tasks.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dllm_decode.eval import metrics
from dllm_decode.eval.order import order_plot, order_table
from dllm_decode.eval.parallelbench.rows import PLAN_FILE, load_rows, read_plan
from dllm_decode.speed import tokens_per_step

ANALYSIS_DIR: Final[str] = "analysis"
_PERCENT: Final[float] = 100.0
Row = dict[str, Any]


def policy_label(config: Mapping[str, Any]) -> str:
    """The composed policy of a config: ``policy[+stopper][+truncator]``."""
    parts = [config["policy"], config.get("stopper"), config.get("truncator")]
    return "+".join(str(p) for p in parts if p)


def method_of(config: Mapping[str, Any]) -> str:
    """Label of a config's method: ``model:policy[+stopper][+truncator] cache=.. block=.. T=..``
    (``block=full`` when the block spans the whole generation)."""
    block = config.get("block_length")
    block_label = "full" if block in (None, config.get("gen_length")) else str(block)
    return (
        f"{config['model']}:{policy_label(config)} cache={config.get('cache', 'none')} "
        f"block={block_label} T={config.get('temperature', 0.0):g}"
    )


#: what each table column means (``analysis/README.md``; ``eval analyze`` prints the speed ones)
COLUMNS: Final[dict[str, str]] = {
    "score": "100 x mean grader score",
    "nfe": "mean forward passes per answer",
    "tpf": "tokens per forward: answer tokens up to the first EOS / NFE (summed over rows); "
           "the speed figure papers report",
    "tpf_macro": "tpf per row, averaged over rows",
    "tokens_per_step": "generation budget (gen_length, EOS fill included) / NFE: "
                       "ParallelBench's x axis; equals k = gen_length / steps for fixed "
                       "schedules, >= tpf always",
    "tokens_per_second": "answer tokens up to EOS / wall-clock seconds",
    "order_kendall_tau": "decoding-order Kendall tau between commit order and position "
                         "(1 = left to right); not the tau parameter of a policy",
    "covers": "the tasks an overall row averages, by category (count)",
}


def setting_label(config: Mapping[str, Any]) -> str:
    """What tells configs of one method (``method_of``) apart: ``[params,steps=N] gen=G``."""
    parts = [f"{k}={v}" for k, v in sorted(config.get("params", {}).items())]
    if config.get("steps") is not None:
        parts.append(f"steps={config['steps']}")
    return f"[{','.join(parts)}] gen={config.get('gen_length')}"


def config_label(config: Mapping[str, Any]) -> str:
    """Short human label naming everything that tells configs of one sweep apart: policy,
    params, steps (fixed schedules), gen length, block length (``full`` = the generation)."""
    gen, block = config.get("gen_length"), config.get("block_length")
    block_label = "full" if block in (None, gen) else str(block)
    return f"{policy_label(config)}{setting_label(config)} block={block_label}"


def _covers(cells: Sequence[Row]) -> str:
    """``waiting_line (3), puzzle (1)``: the categories of ``cells`` with task counts."""
    counts: dict[str, int] = defaultdict(int)
    for cell in cells:
        counts[cell["category"]] += 1
    return ", ".join(f"{c} ({n})" for c, n in sorted(counts.items()))


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def cell_table(rows: Sequence[Row]) -> list[Row]:
    """One row per (config, task) with scores (percent) and speed numbers."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        groups[row["config_hash"], row["task"]].append(row)
    cells = []
    for (config_hash, task), members in sorted(groups.items()):
        config = members[0]["config"]
        nfe = [r["nfe"] for r in members]
        useful = [r["gen_tokens_useful"] for r in members]
        seconds = sum(r["wall_time_s"] for r in members)
        taus = [r["decoding_order_tau"] for r in members if r["decoding_order_tau"] is not None]
        strict = _mean(r["score_strict"] for r in members if r.get("score_strict") is not None)
        cells.append({
            "config_hash": config_hash, "task": task, "category": members[0]["category"],
            "method": method_of(config), "config": config_label(config), "n": len(members),
            "adaptive": config.get("steps") is None,
            "score": _PERCENT * _mean(r["score"] for r in members),
            "score_strict": None if strict is None else _PERCENT * strict,
            "nfe": metrics.nfe_mean(nfe),
            "tpf": metrics.tpf_micro(useful, nfe) if sum(nfe) else None,
            "tpf_macro": metrics.tpf_macro(useful, nfe) if min(nfe) > 0 else None,
            "tokens_per_step": tokens_per_step([r["gen_tokens_budget"] for r in members], nfe)
            if sum(nfe) else None,
            "tokens_per_second": sum(useful) / seconds if seconds > 0 else None,
            "order_kendall_tau": _mean(taus),
        })  # fmt: skip
    return cells


def config_table(cells: Sequence[Row], by: str = "category") -> list[Row]:
    """Unweighted task means per config, per ``category`` (or ``overall`` if ``by=None``)."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for cell in cells:
        group = cell[by] if by else "overall"
        groups[cell["config_hash"], group].append(cell)
    out = []
    for (config_hash, group), members in sorted(groups.items()):
        first = members[0]
        out.append({
            "config_hash": config_hash, "group": group, "method": first["method"],
            "config": first["config"], "adaptive": first["adaptive"], "tasks": len(members),
            **({} if by else {"covers": _covers(members)}),
            **{key: _mean(m[key] for m in members if m[key] is not None)
               for key in ("score", "score_strict", "nfe", "tpf", "tokens_per_step",
                           "tokens_per_second", "order_kendall_tau")},
        })  # fmt: skip
    return out


def pbx_table(cells: Sequence[Row], levels: Sequence[float] = metrics.PBX_LEVELS) -> list[Row]:
    """PBx per method from the overall (task-averaged) config points."""
    curves: dict[str, list[Row]] = defaultdict(list)
    for entry in config_table(cells, by=""):
        if entry["tokens_per_step"] is not None:
            curves[entry["method"]].append(entry)
    out = []
    for method, entries in sorted(curves.items()):
        points = [(e["tokens_per_step"], e["score"]) for e in entries]
        adaptive = all(e["adaptive"] for e in entries)
        row: Row = {"method": method, "configs": len(entries), "adaptive": adaptive}
        for x in levels:
            row[f"PB{x:g}"] = metrics.pbx(points, x, adaptive=adaptive)
        out.append(row)
    return out


def aup_table(cells: Sequence[Row]) -> list[Row]:
    """AUP per (method, task) on (TPF, score) points; ``y_max`` = best score of any method on
    the task. The last column ``mean`` averages the method's tasks."""
    y_max = defaultdict(float)
    for cell in cells:
        y_max[cell["task"]] = max(y_max[cell["task"]], cell["score"])
    curves: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for cell in cells:
        if cell["tpf"] is not None:
            curves[cell["method"], cell["task"]].append((cell["tpf"], cell["score"]))
    per_method: dict[str, Row] = defaultdict(dict)
    for (method, task), points in sorted(curves.items()):
        per_method[method][task] = metrics.aup(points, y_max[task]) if y_max[task] > 0 else None
    out = []
    for method, values in sorted(per_method.items()):
        mean = _mean(v for v in values.values() if v is not None)
        out.append({"method": method, **values, "mean": mean})
    return out


def qps_table(cells: Sequence[Row], baseline: str | None = None) -> list[Row]:
    """Speed-up (baseline NFE / NFE) and QPS (gamma 4) per config, averaged over tasks.

    Args:
        baseline: config hash of the reference decoding; default per task: the config with
            the most forwards (full-step decoding).
    """
    by_task: dict[str, list[Row]] = defaultdict(list)
    for cell in cells:
        by_task[cell["task"]].append(cell)
    scored: dict[str, list[Row]] = defaultdict(list)
    for members in by_task.values():
        chosen = [c for c in members if c["config_hash"] == baseline] if baseline else []
        base = chosen[0] if chosen else max(members, key=lambda c: (c["nfe"], c["score"]))
        for cell in members:
            up = metrics.speedup(base["nfe"], cell["nfe"]) if cell["nfe"] > 0 else None
            q = None
            if up is not None and base["score"] > 0:
                q = metrics.qps(up, cell["score"], base["score"])
            ratio = cell["score"] / base["score"] if base["score"] > 0 else None
            scored[cell["config_hash"]].append({**cell, "speedup": up, "qps": q, "ratio": ratio})
    out = []
    for config_hash, members in sorted(scored.items()):
        out.append({
            "config_hash": config_hash, "method": members[0]["method"],
            "config": members[0]["config"], "tasks": len(members),
            "score": _mean(m["score"] for m in members),
            "pct_of_baseline": _mean(
                _PERCENT * m["ratio"] for m in members if m["ratio"] is not None
            ),
            "speedup": _mean(m["speedup"] for m in members if m["speedup"] is not None),
            "qps": _mean(m["qps"] for m in members if m["qps"] is not None),
        })  # fmt: skip
    return out


# ---------------------------------------------------------------- output


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|")  # keep markdown cells intact


def to_markdown(table: Sequence[Row]) -> str:
    """A GitHub markdown table (columns from the first row; ``-`` for missing values)."""
    if not table:
        return "_no rows_\n"
    columns = list(dict.fromkeys(key for row in table for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in table]
    return "\n".join(lines) + "\n"


def write_table(table: Sequence[Row], stem: Path) -> None:
    """Write ``<stem>.md`` and ``<stem>.csv``."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(to_markdown(table))
    columns = list(dict.fromkeys(key for row in table for key in row))
    with stem.with_suffix(".csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)


def incomplete_note(rows: Sequence[Row], expected: Mapping[str, int] | None) -> str | None:
    """A line saying the run is incomplete, or ``None`` when it is not (as far as known).

    Args:
        rows: the run's rows.
        expected: rows expected per config hash (``rows.read_plan``: the runner's ``run.json``);
            ``None`` for runs written without one: then configs with fewer rows on a task
            than another config has are reported.
    """
    present = Counter(r["config_hash"] for r in rows)
    if expected is not None:
        total = sum(expected.values())
        have = sum(min(present.get(h, 0), n) for h, n in expected.items())
        if have >= total:
            return None
        open_configs = sum(1 for h, n in expected.items() if present.get(h, 0) < n)
        return (f"incomplete run: {have} of {total} result rows, {open_configs} of "
                f"{len(expected)} configs unfinished (interrupted or still running); the tables "
                f"cover only the rows there; the same `dllm-decode eval parallelbench` command "
                f"resumes it")
    per_task: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        per_task[row["task"]][row["config_hash"]] += 1
    short = {h for counts in per_task.values() for h, n in counts.items()
             if n < max(counts.values())}
    if not short:
        return None
    return (f"possibly incomplete run: {len(short)} config(s) have fewer rows on a task than "
            f"other configs (the run has no {PLAN_FILE} saying what it should hold)")


def analyze_rows(
    rows: Sequence[Row], out_dir: str | Path, *, baseline: str | None = None, plots: bool = True,
    incomplete: str | None = None,
) -> dict[str, list[Row]]:
    """Write every table (markdown + CSV) and, optionally, the PNG plots into ``out_dir``;
    ``incomplete`` (``incomplete_note``) heads the columns' ``README.md`` and goes into
    ``summary.json``.

    Returns:
        The tables by name: ``tasks``, ``categories``, ``overall``, ``pbx``, ``aup``, ``qps``,
        ``order`` (commit-order summaries per method, see ``eval.order``; only when rows
        recorded ``commit_steps``).
    """
    if not rows:
        raise ValueError("no result rows to analyze")
    out = Path(out_dir)
    cells = cell_table(rows)
    tables = {
        "tasks": cells,
        "categories": config_table(cells, by="category"),
        "overall": config_table(cells, by=""),
        "pbx": pbx_table(cells),
        "aup": aup_table(cells),
        "qps": qps_table(cells, baseline),
    }
    order = order_table(rows, method_of, setting_label)
    if order:  # rows that recorded commit_steps
        tables["order"] = order
    for name, table in tables.items():
        write_table(table, out / name)
    legend = "\n".join(f"- `{name}`: {text}" for name, text in COLUMNS.items())
    head = f"**{incomplete}**\n\n" if incomplete else ""
    (out / "README.md").write_text(f"{head}# Columns of these tables\n\n{legend}\n")
    if plots:
        from dllm_decode.eval.parallelbench.plots import pareto_plot, score_panels

        pareto_plot(cells, out / "pareto.png")
        score_panels(cells, out / "panels.png")
        order_plot(rows, method_of, out / "order.png", setting_label)
    (out / "summary.json").write_text(json.dumps({"rows": len(rows), "cells": len(cells),
                                                  "complete": incomplete is None,
                                                  "note": incomplete}))
    return tables


def run_analyze(args: Any) -> dict[str, list[Row]]:
    """CLI entry: ``dllm-decode eval analyze DIR`` -> ``DIR/analysis/*.{md,csv,png}``.

    Reads ``args.out`` (the run directory) and optional ``args.baseline`` / ``args.no_plots``.
    """
    run_dir = Path(args.out)
    rows = load_rows(run_dir)
    if not rows:
        raise FileNotFoundError(f"no rows*.jsonl with results in {run_dir}")
    target = run_dir / ANALYSIS_DIR
    plots = not getattr(args, "no_plots", False)
    incomplete = incomplete_note(rows, read_plan(run_dir))
    tables = analyze_rows(rows, target, baseline=getattr(args, "baseline", None), plots=plots,
                          incomplete=incomplete)
    if incomplete:
        print(incomplete)
    print(to_markdown(tables["overall"]))
    print(f"tpf = answer tokens up to EOS per forward; tokens_per_step = gen_length per forward "
          f"(EOS fill included); order_kendall_tau = commit order vs position. Columns: "
          f"{target / 'README.md'}")
    print(f"{'tables and plots' if plots else 'tables (no plots: --no-plots)'} written to "
          f"{target}")
    if incomplete:
        print(incomplete)  # last too: the line a reader sees after a long table
    return tables
