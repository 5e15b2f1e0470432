"""Bundle a long-answer student (Test bed III) with its model card.

Exports a training run (``dllm-decode train testbed-long``) to
``dllm_decode/models/assets/NAME`` (fp16 weights, tokenizer, vocabulary, ``run.json``), decodes
``--n`` held-out prompts per task (the test split, ``--seed``) at 128 tokens in blocks of 32
with one token per step (``low_confidence_k1``) and with ``threshold`` at its default 0.9, and
writes the card: architecture (from ``config.json``), the recipe stage by stage (each
invocation's exact command with the steps and CPU seconds it added, ``stages.jsonl``), seeds,
total CPU time, the held-out table and the loss curve. The rows also go to
``benchmarks/results/testbed_long_cards.csv`` (other students' rows are kept).

    OMP_NUM_THREADS=1 python benchmarks/testbed_long_cards.py --card testbed-long-llada \\
        runs/testbed-long-llada-v3 --n 50
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_testbed_long import run_config  # noqa: E402
from bench_testbed_long_report import read_csv, summary, write_csv  # noqa: E402
from safetensors import safe_open  # noqa: E402

from dllm_decode.models.long_answer import LONG_TASKS  # noqa: E402
from dllm_decode.train.testbed_long import export_student  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "dllm_decode" / "models" / "assets"
RESULTS = Path(__file__).resolve().parent / "results" / "testbed_long_cards.csv"
#: (policy, what the card calls it)
DECODERS = (("low_confidence_k1", "one token per step (low confidence, 128 steps)"),
            ("threshold", "threshold 0.9 (the preset's default)"))
FAMILY = {"llada": ("a bidirectional LLaDA-style mask model", "none"),
          "sdar": ("an SDAR-style block-diffusion model (blocks of 32, exact block-causal K/V)",
                   "block_causal")}


def held_out(path: Path, family: str, n: int, seed: int) -> list[dict[str, Any]]:
    """The card's rows: each decoder of ``DECODERS`` x task, in the family's cache mode."""
    cache = FAMILY[family][1]
    rows = []
    for policy, _ in DECODERS:
        rows += run_config(str(path), policy, cache, LONG_TASKS, n, seed, 128, 32, n)
    bad = [r for r in rows if r["note"]]
    if bad:
        raise SystemExit(f"{path}: a decoder was refused: {bad[0]['note']}")
    return rows


def stage_lines(stages: list[dict[str, Any]]) -> list[str]:
    """One numbered line per stage: the command, the steps and CPU time it added."""
    lines = []
    for i, s in enumerate(stages, 1):
        cpu = "CPU time not recorded" if s["cpu_s"] is None else f"{s['cpu_s'] / 60:.0f} CPU-min"
        lines.append(f"{i}. `OMP_NUM_THREADS=1 {s['command']}` (steps {s['from_step']:,}-"
                     f"{s['to_step']:,}, {cpu})")
    return lines


def loss_curve(run_dir: Path, steps: int, points: int = 12) -> str:
    """``loss.csv`` up to ``steps`` (the bundled state's), subsampled to about ``points`` rows
    (soft cross-entropy on masked positions; its ideal is the posterior's entropy, not 0)."""
    with (run_dir / "loss.csv").open() as fh:
        rows = list(csv.reader(fh))
    head, body = rows[0], [r for r in rows[1:] if int(r[0]) <= steps]
    stride = max(1, len(body) // points)
    picked = body[::stride] + ([body[-1]] if (len(body) - 1) % stride else [])
    return "\n".join(",".join(r) for r in [head, *picked])


def card(name: str, run_dir: Path, directory: Path, rows: list[dict[str, Any]], n: int,
         seed: int, note: str = "") -> str:
    config = json.loads((directory / "config.json").read_text())
    run = json.loads((directory / "run.json").read_text())
    cfg = run["config"]
    kind = FAMILY[cfg["family"]]
    with safe_open(str(directory / "model.safetensors"), "pt") as fh:
        params = sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())  # noqa: SIM118
    table = ["| decoder | cache | " + " | ".join(LONG_TASKS) + " | mean | NFE | TPF |",
             "|---|---|" + "---|" * (len(LONG_TASKS) + 3)]
    entries = {e["policy"]: e for e in summary(rows)}  # task means, pooled TPF
    for policy, label in DECODERS:
        e = entries[policy]
        table.append(f"| {label} | {e['cache']} | "
                     + " | ".join(f"{100 * e['tasks'][t]:.0f} %" for t in LONG_TASKS)
                     + f" | {100 * e['accuracy']:.1f} % | {e['nfe']:.1f} | {e['tpf']:.2f} |")
    stages = run.get("stages") or []
    total_cpu = run["cpu_s"]
    lines = [
        f"# {name}",
        "",
        f"{kind[0][0].upper() + kind[0][1:]} distilled from the exact posterior of the "
        "long-answer test bed (Test bed III, `dllm_decode/models/long_answer.py`; "
        "`docs/testbeds.md`): answers of 128 tokens decoded in blocks of 32, tasks `copy` "
        "(32-60 names), `shuffle` (16-32 names, any permutation valid) and `carry` (64-126 "
        "slots). A task model for measuring decoding methods and caches, not a language "
        "model. Prompts are the codec's format (`LongCodec.encode_prompt`; the word-level "
        "`tokenizer.json` round-trips them).",
        "",
        f"* architecture: `{config['architectures'][0]}`, {cfg['layers']} layers, hidden "
        f"{cfg['hidden']}, {cfg['heads']} heads, MLP {cfg['intermediate']}, vocabulary "
        f"{config.get('vocab_size')}; {params / 1e6:.2f}M parameters, fp16 weights",
        f"* training: {run['steps_done']:,} steps, batch {cfg['batch_size']}, seed "
        f"{cfg['seed']} (weights, data and masks are functions of seed and step), "
        f"{total_cpu / 3600:.2f} CPU-hours (`cpu_s`: the process's CPU time, on a shared "
        "2-core machine, one thread unless a stage says `--threads`); soft "
        "cross-entropy against the oracle's exact conditionals, the length curriculum on "
        "cut-down canvases, then shuffle's lists regrown with shuffle-only steps "
        f"(`dllm_decode/train/testbed_long.py`).{' ' + note if note else ''}",
        "",
        "## Recipe (each stage's exact command)",
        "",
        f"Each stage ran until the next one began, the last until step {run['steps_done']:,} "
        "(`--stop-after` stops a stage at a given step count); a stage whose `--out` changes "
        "started from a copy of the previous stage's state file.",
        "",
        *(stage_lines(stages) or ["(no stages.jsonl: a run older than stage recording)"]),
        "",
        "## Held-out results",
        "",
        f"{n} held-out prompts per task (test split, record seed {seed}), greedy, 128 tokens in "
        "blocks of 32 (`python benchmarks/testbed_long_cards.py`; accuracy is exact match for "
        "copy and carry, validity for shuffle):",
        "",
        *table,
        "",
        "## Loss (soft cross-entropy on masked positions; `loss.csv` of the run)",
        "",
        "Its floor is the posterior's entropy (shuffle's open slots), so it moves with the mix "
        "of each stage (shuffle's share and list lengths) and is not comparable across stages.",
        "",
        "```",
        loss_curve(run_dir, run["steps_done"]),
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--card", required=True, help="bundled name, e.g. testbed-long-llada")
    ap.add_argument("run", type=Path, help="the training run's directory")
    ap.add_argument("--n", type=int, default=50, help="held-out prompts per task")
    ap.add_argument("--seed", type=int, default=1, help="seed of the held-out records")
    ap.add_argument("--out", type=Path, default=None, help=f"default {ASSETS}/NAME")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the rows' CSV")
    ap.add_argument("--note", default="", help="a sentence the card adds to its training line")
    ap.add_argument("--render", action="store_true",
                    help="rewrite the card of the already exported directory from the rows "
                         "recorded in --results (no export, no decoding)")
    args = ap.parse_args(argv)
    directory = args.out or ASSETS / args.card
    if args.render:
        rows = [r for r in read_csv(args.results) if r["model"] == args.card]
        if not rows or not (directory / "run.json").exists():
            raise SystemExit(f"--render needs {directory}/run.json and {args.card}'s rows in "
                             f"{args.results}")
        n, seed = rows[0]["n"], int(rows[0]["seed"])
        (directory / "README.md").write_text(card(args.card, args.run, directory, rows, n,
                                                  seed, args.note))
        print(f"rewrote {directory / 'README.md'}")
        return 0
    directory = export_student(args.run, directory)
    family = json.loads((directory / "run.json").read_text())["config"]["family"]
    rows = held_out(directory, family, args.n, args.seed)
    for r in rows:
        r["model"] = args.card
    (directory / "README.md").write_text(card(args.card, args.run, directory, rows, args.n,
                                              args.seed, args.note))
    old = args.results
    kept = [r for r in read_csv(old) if r["model"] != args.card] if old.exists() else []
    write_csv(kept + rows, old)
    print(f"wrote {directory} and {old}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
