"""The tables of ``bench_testbed_long.py``: its CSV, the Markdown table (task means per
model x policy x cache, the Pareto front of accuracy vs TPF, the refusals), the best TPF at
>= 99 % of one-token-per-step accuracy, and the plot (accuracy vs TPF, accuracy vs positions
computed). Reads only rows: ``bench_testbed_long.py --render`` redraws from a CSV."""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_testbed as bt  # noqa: E402

#: one token per step (low confidence, steps = gen length): every table's baseline
BASELINE: Final = "low_confidence_k1"
#: the cache modes of the frontier, in the plot's colour order
CACHES: Final = ("none", "prefix", "dual", "block_causal", "dllm_cache", "window")


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a results CSV, figures as numbers (refused rows keep empty strings)."""
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["n"] = int(r["n"])
        for key in ("accuracy", "nfe", "tpf", "rounds", "positions", "wall_s_per_answer",
                    "cpu_s_per_answer"):
            r[key] = float(r[key]) if r[key] != "" else ""
    return rows


# ---- tables -------------------------------------------------------------------------------
def summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (model, policy, cache): task-mean accuracy, pooled TPF, mean NFE,
    positions and wall time (weighted by n), per-task accuracy, the note of a refusal."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["model"], r["policy"], r["cache"])
        s = out.setdefault(key, {"model": key[0], "policy": key[1], "cache": key[2],
                                 "tasks": {}, "note": r["note"], "_rows": []})
        if r["n"]:
            s["_rows"].append(r)
            s["tasks"][r["task"]] = r["accuracy"]
    for s in out.values():
        got = s.pop("_rows")
        if not got:
            continue
        n = sum(r["n"] for r in got)
        nfe = sum(r["nfe"] * r["n"] for r in got)
        s |= {"accuracy": sum(r["accuracy"] for r in got) / len(got), "nfe": nfe / n,
              "tpf": sum(r["tpf"] * r["nfe"] * r["n"] for r in got) / nfe,
              "positions": sum(r["positions"] * r["n"] for r in got) / n,
              "wall": sum(r["wall_s_per_answer"] * r["n"] for r in got) / n}
    return list(out.values())


def baseline_of(entries: Sequence[dict[str, Any]], model: str) -> dict[str, Any] | None:
    """The model's ``low_confidence_k1`` entry without a cache (else with any)."""
    found = [e for e in entries if e["model"] == model and e["policy"] == BASELINE
             and "accuracy" in e]
    return next((e for e in found if e["cache"] == "none"), found[0] if found else None)


def pareto(entries: Sequence[dict[str, Any]]) -> set[tuple[str, str]]:
    """(policy, cache) of the entries no other beats in both accuracy and TPF."""
    pts = [e for e in entries if "accuracy" in e]
    return {(e["policy"], e["cache"]) for e in pts if not any(
        o["accuracy"] >= e["accuracy"] and o["tpf"] >= e["tpf"] and
        (o["accuracy"] > e["accuracy"] or o["tpf"] > e["tpf"]) for o in pts)}


def best_lines(entries: Sequence[dict[str, Any]], share: float = 0.99) -> list[str]:
    """Per model: the best TPF at >= ``share`` of ``low_confidence_k1``'s accuracy, overall
    and per cache mode (with the positions it computes against the baseline's)."""
    lines = []
    for model in dict.fromkeys(e["model"] for e in entries):
        base = baseline_of(entries, model)
        if base is None:
            lines.append(f"- {model}: no {BASELINE} row (the bar is its accuracy)")
            continue
        bar = share * base["accuracy"]
        ok = [e for e in entries if e["model"] == model and "accuracy" in e
              and e["accuracy"] >= bar - 1e-12]
        head = (f"- **{model}** ({BASELINE} {base['accuracy']:.3f} at {base['tpf']:.2f} TPF; "
                f"bar {bar:.3f}):")
        top = max(ok, key=lambda e: e["tpf"])
        lines.append(f"{head} best **{top['policy']}** / {top['cache']}: {top['tpf']:.2f} TPF, "
                     f"accuracy {top['accuracy']:.3f}, positions x"
                     f"{top['positions'] / base['positions']:.3f} of the baseline's")
        for cache in dict.fromkeys(e["cache"] for e in ok):
            e = max((e for e in ok if e["cache"] == cache), key=lambda e: e["tpf"])
            rel = e["positions"] / base["positions"]
            lines.append(f"  - {cache}: {e['policy']} {e['tpf']:.2f} TPF, accuracy "
                         f"{e['accuracy']:.3f}, positions x{rel:.3f}")
    return lines


def refusal_lines(mine: Sequence[dict[str, Any]]) -> list[str]:
    """One model's refusals, compact: a cache mode (then a policy) refused whole on one line,
    the rest grouped by reason."""
    out, left = [], [e for e in mine if "accuracy" not in e]
    for axis, other in (("cache", "policy"), ("policy", "cache")):
        for value in dict.fromkeys(e[axis] for e in mine):
            at = [e for e in mine if e[axis] == value]
            if len(at) > 1 and all("accuracy" not in e for e in at):
                out.append(f"- {axis} {value}: every {other} — {at[0]['note'][:200]}")
                left = [e for e in left if e[axis] != value]
    grouped: dict[str, list[str]] = {}
    for e in left:
        grouped.setdefault(e["note"], []).append(f"{e['policy']}/{e['cache']}")
    return out + [f"- {', '.join(which)}: {note[:200]}" for note, which in grouped.items()]


def markdown(rows: Sequence[dict[str, Any]], command: str) -> str:
    entries = summary(rows)
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    lines = [command, "", "Best TPF at >= 99 % of one-token-per-step accuracy:", "",
             *best_lines(entries), ""]
    for model in dict.fromkeys(e["model"] for e in entries):
        mine = [e for e in entries if e["model"] == model]
        front, base = pareto(mine), baseline_of(mine, model)
        lines += [f"### {model}", "", "| policy | cache | accuracy | "
                  + " | ".join(tasks) + " | NFE | TPF | positions | vs k1 | s/answer | note |",
                  "|---|---|---|" + "---|" * len(tasks) + "---|---|---|---|---|---|"]
        for e in (e for e in mine if "accuracy" in e):
            rel = f"{e['positions'] / base['positions']:.3f}" if base else ""
            star = " ★" if (e["policy"], e["cache"]) in front else ""
            cells = [f"{e['accuracy']:.3f}{star}",
                     *(f"{e['tasks'].get(t, float('nan')):.2f}" for t in tasks),
                     f"{e['nfe']:.1f}", f"{e['tpf']:.2f}", f"{e['positions']:.0f}", rel,
                     f"{e['wall']:.3f}", e["note"]]
            lines.append(f"| {e['policy']} | {e['cache']} | " + " | ".join(cells) + " |")
        refused = refusal_lines(mine)
        if refused:
            lines += ["", f"Refused by {model} (no figures; the CSV has every row):", "",
                      *refused]
        lines.append("")
    lines.append("★: on the model's Pareto front of accuracy (task mean) vs TPF.")
    return "\n".join(lines) + "\n"


def pareto_plot(rows: Sequence[dict[str, Any]], path: Path) -> Any:
    """Per model (columns): accuracy vs TPF (top) and accuracy vs positions computed relative
    to ``low_confidence_k1`` without a cache (bottom); colour and marker per cache mode, the
    Pareto front of accuracy vs TPF joined and labelled with its policies."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    entries = [e for e in summary(rows) if "accuracy" in e and e["tpf"] > 0]  # log axes
    models = list(dict.fromkeys(e["model"] for e in entries))
    styles = bt.method_styles(list(CACHES) + sorted({e["cache"] for e in entries} - set(CACHES)))
    fig = Figure(figsize=(6 * len(models) + 2, 9), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(models), squeeze=False)
    for col, model in enumerate(models):
        mine = [e for e in entries if e["model"] == model]
        base = baseline_of(mine, model)
        front = sorted((e for e in mine if (e["policy"], e["cache"]) in pareto(mine)),
                       key=lambda e: e["tpf"])
        top, bottom = axes[0][col], axes[1][col]
        for cache in dict.fromkeys(e["cache"] for e in mine):
            pts = [e for e in mine if e["cache"] == cache]
            colour, marker = styles[cache]
            top.scatter([e["tpf"] for e in pts], [e["accuracy"] for e in pts], color=colour,
                        marker=marker, s=22, label=cache, alpha=0.8)
            if base:
                bottom.scatter([e["positions"] / base["positions"] for e in pts],
                               [e["accuracy"] for e in pts], color=colour, marker=marker, s=22,
                               label=cache, alpha=0.8)
        top.plot([e["tpf"] for e in front], [e["accuracy"] for e in front], color="0.4", lw=0.8)
        for e in front:
            top.annotate(f"{e['policy']}/{e['cache']}", (e["tpf"], e["accuracy"]), fontsize=6,
                         xytext=(3, -8), textcoords="offset points")
        top.set(title=model, xlabel="tokens per forward (answer tokens up to EOS / NFE)")
        bottom.set(title=f"{model}: positions saved",
                   xlabel=f"positions computed per answer / {BASELINE}'s (cache none)")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.set(ylabel="accuracy (mean over tasks)", ylim=(-0.03, 1.03))
            ax.grid(alpha=0.3)
    handles = {lab: h for ax in axes.flat for h, lab in zip(*ax.get_legend_handles_labels(),
                                                             strict=True)}
    fig.legend(list(handles.values()), list(handles), loc="outside right upper",
               title="cache mode", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return fig


def render(rows: Sequence[dict[str, Any]], out: Path, command: str, best: bool) -> None:
    """The Markdown table and the plot beside ``out``; ``best`` prints the summary."""
    out.with_suffix(".md").write_text(markdown(rows, command))
    pareto_plot(rows, out.with_name(out.stem + "_pareto.png"))
    if best:
        print("\n".join(best_lines(summary(rows))))
