"""WINO, LoPA and dLLM-Cache on the word-level test bed, beside their bases.

The protocol of ``bench_testbed.py`` (``--n`` held-out prompts per task of the nine test-bed
Waiting Line tasks, gen length 16, one block, greedy; mean accuracy with a 95 % bootstrap
interval, paired interval of the difference to one token per step, AUP per method family),
with more columns per config: ``rounds`` (decoding rounds per prompt, ``Generation.steps``:
the papers' denominator of tokens per forward), ``tokens_per_round`` (16 / rounds),
``positions`` (token positions per prompt the model ran: extra forwards included, dLLM-Cache's
recomputed positions averaged over layers; the batch's left padding included) and
``positions_vs_k1`` (that over the one-token-per-step baseline's). ``tokens_per_step`` is
16 / NFE as in ``bench_testbed.py``, NFE counting every forward a prompt took part in (WINO's
shadow forward, LoPA's branch forward). ``--render-only`` rebuilds the table and the plot from
an existing CSV.

Models: ``testbed-llada`` and ``testbed-dream`` (WINO needs position-aligned logits: LLaDA
only; its drafting rule ``wide_in`` runs on both); the calibrated oracle only for the pure
selectors (it reads every fed sequence as a canvas: no extra forwards, no layers to cache).

    OMP_NUM_THREADS=1 python benchmarks/bench_testbed_wino_lopa_cache.py \
        --models testbed-llada testbed-dream --n 50 --tag testbed_wino_lopa_cache
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_testbed as bt  # noqa: E402

from dllm_decode.train.testbed import TESTBED_TASKS, waiting_line_oracle  # noqa: E402

G = bt.G
#: dLLM-Cache at the authors' LLaDA GSM8K settings (K_p 50, K_r 7, rho 0.25) and a denser one
CACHE = {"cache": "dllm_cache"}
DENSE = {"cache": "dllm_cache", "prompt_refresh_every": 4, "refresh_every": 2}

# (family, label, policy, kwargs); the first row is the baseline
CONFIGS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("low_confidence", "k=1", "low_confidence", {"steps": 16}),
    ("low_confidence", "k=4", "low_confidence", {"steps": 4}),
    ("threshold", "tau=0.9", "threshold", {"tau": 0.9}),
    ("threshold", "tau=0.7", "threshold", {"tau": 0.7}),
    ("wide_in", "tau1=0.9", "wide_in", {"threshold": 0.9}),
    ("wide_in", "tau1=0.6", "wide_in", {"threshold": 0.6}),
    ("wide_in", "tau1=0.3", "wide_in", {"threshold": 0.3}),
    ("wino", "tau1=0.9", "wino", {"threshold": 0.9}),
    ("wino", "tau1=0.6 (GSM8K)", "wino", {"threshold": 0.6}),
    ("wino", "tau1=0.3", "wino", {"threshold": 0.3}),
    ("lopa", "k=0 (its base)", "lopa", {"branches": 0}),
    ("lopa", "k=2", "lopa", {"branches": 2}),
    ("lopa", "k=7", "lopa", {"branches": 7}),
    ("lopa", "k=14 (GSM8K)", "lopa", {"branches": 14}),
    ("lopa", "tau=0.7, k=2", "lopa", {"threshold": 0.7, "branches": 2}),
    ("dllm_cache", "k=1, 50/7/0.25", "low_confidence", {"steps": 16, **CACHE}),
    ("dllm_cache", "k=1, 4/2/0.25", "low_confidence", {"steps": 16, **DENSE}),
    ("dllm_cache", "k=4, 50/7/0.25", "low_confidence", {"steps": 4, **CACHE}),
    ("dllm_cache+threshold", "tau=0.9, 50/7/0.25", "threshold", {"tau": 0.9, **CACHE}),
    ("dllm_cache+threshold", "tau=0.9, 4/2/0.25", "threshold", {"tau": 0.9, **DENSE}),
    ("dllm_cache+wino", "tau1=0.6, 50/7/0.25", "wino", {"threshold": 0.6, **CACHE}),
]


def skip_reason(model: Any, policy: str, kwargs: dict[str, Any]) -> str | None:
    """Why a config does not apply to ``model`` (``None``: it does)."""
    layered = hasattr(model, "layers")
    if (policy in ("wino", "lopa") or "cache" in kwargs) and not layered:
        return ("the oracle refuses extra forwards (LoPA's branches, WINO's shadow block) and "
                "has no layers to cache")
    if policy == "wino" and getattr(model, "logit_shift", 0):
        return "WINO's shadow block needs position-aligned logits (Dream-family shifts them)"
    return None


def run(models: list[str], n: int, seed: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    oracle = waiting_line_oracle()
    out: list[dict[str, Any]] = []
    total, done, start = len(models) * len(CONFIGS), 0, time.perf_counter()
    for name in models:
        model = bt.load(name)
        base = base_positions = None
        for family, label, policy, kwargs in CONFIGS:
            done += 1
            head = f"{bt.progress(done, total, start)} {name:14s} {family:22s} {label:20s}"
            reason = skip_reason(model, policy, kwargs)
            if reason is not None:
                print(f"{head} skipped: {reason}", flush=True)
                continue
            rows, seconds = bt.decode_config(model, oracle, policy, kwargs, n, seed)
            s = bt.summarise(rows, base)
            base = s["valid"] if base is None else base
            flat = [r for t in TESTBED_TASKS for r in rows[t]]
            steps = sum(r["steps"] for r in flat) / len(flat)
            positions = sum(r["positions"] for r in flat) / len(flat)
            base_positions = base_positions or positions
            out.append(bt.result_row(name, family, label, kwargs, n, seed, s, seconds, extra={
                "rounds": round(steps, 3), "tokens_per_round": round(G / steps, 3),
                "positions": round(positions, 1),
                "positions_vs_k1": round(positions / base_positions, 3)}))
            r = out[-1]
            print(f"{head} acc {r['acc']:6.2f} [{r['ci_lo']:.1f}, {r['ci_hi']:.1f}] NFE "
                  f"{r['nfe']:5.2f} rounds {r['rounds']:5.2f} positions x{r['positions_vs_k1']:.2f}"
                  f"{' *' if r['significant'] else ''}", flush=True)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    aups = bt.aup_table(rows)
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += [f"### {model}", "",
                  "| method | config | accuracy % [95 % CI] | NFE | tokens per step | rounds "
                  "| tokens per round | positions vs k=1 | vs k=1 (Δ 95 % CI) | family AUP |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        seen: set[str] = set()
        mine = [r for r in rows if r["model"] == model]
        for r in mine:
            fam_aup = "" if r["family"] in seen else f"{aups[model, r['family']]:.1f}"
            seen.add(r["family"])
            delta = ("baseline" if r is mine[0] else f"[{r['diff_lo']:+.1f}, "
                     f"{r['diff_hi']:+.1f}]{' **sig.**' if r['significant'] else ''}")
            lines.append(f"| {r['family']} | {r['config']} | {r['acc']:.1f} [{r['ci_lo']:.1f},"
                         f" {r['ci_hi']:.1f}] | {r['nfe']:.2f} | {r['tokens_per_step']:.2f} | "
                         f"{r['rounds']:.2f} | {r['tokens_per_round']:.2f} | "
                         f"{r['positions_vs_k1']:.2f} | {delta} | {fam_aup} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["testbed-llada", "testbed-dream"])
    ap.add_argument("--n", type=int, default=50, help="held-out prompts per task")
    ap.add_argument("--seed", type=int, default=0, help="offset of the record generator seed")
    ap.add_argument("--tag", default="testbed_wino_lopa_cache")
    ap.add_argument("--render-only", action="store_true",
                    help="rebuild results/<tag>.md and the plot from results/<tag>.csv")
    args = ap.parse_args(argv)
    csv_path, md = bt.RESULTS / f"{args.tag}.csv", bt.RESULTS / f"{args.tag}.md"
    if args.render_only:  # the command that decoded stays the table's first line
        rows = bt.read_rows(csv_path)
        for r in rows:
            for key in ("rounds", "tokens_per_round", "positions_vs_k1"):
                r[key] = float(r[key])
        command = md.read_text().splitlines()[0]
    else:
        rows = run(args.models, args.n, args.seed)
        bt.RESULTS.mkdir(exist_ok=True)
        with csv_path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        command = ("`OMP_NUM_THREADS=1 python benchmarks/bench_testbed_wino_lopa_cache.py "
                   + " ".join(sys.argv[1:] if argv is None else argv) + "`")
    md.write_text(f"{command}\n\n" + markdown(rows))
    bt.pareto_plot(rows, bt.RESULTS / f"{args.tag}_pareto.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
