"""``dllm-decode eval ...`` subcommands: parallelbench sweeps, analysis, data generation, lm-eval.

``add_eval_subcommands(subparsers)`` adds an ``eval`` command to the top-level subparsers; each
leaf sets ``func`` (called as ``func(args)``, returns an exit code).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _cmd_parallelbench(args: argparse.Namespace) -> int:
    from dllm_decode.eval.runner import run_sweep

    try:
        run_sweep(args)
    except KeyboardInterrupt:  # every finished row is on disk (flushed as written)
        print(interrupted_line(args.out), file=sys.stderr)
        return 130
    return 0


def interrupted_line(out: str) -> str:
    """What an interrupted sweep kept in ``out`` and how to resume it (one line)."""
    from pathlib import Path

    from dllm_decode.eval.parallelbench.rows import load_rows

    kept = len(load_rows(Path(out)))  # deduplicated over the merged and per-rank files
    return (f"interrupted: {kept} result rows kept in {out}; run the same command again to "
            f"resume (rows already there are skipped), or `dllm-decode eval analyze {out}` to "
            f"look at them")


def _cmd_analyze(args: argparse.Namespace) -> int:
    from dllm_decode.eval.analyze import run_analyze

    run_analyze(args)
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from dllm_decode.eval.parallelbench.generate import TASKS
    from dllm_decode.eval.parallelbench.loader import write_generated_tree

    tasks = args.tasks or list(TASKS)
    root = write_generated_tree(args.out, tasks, args.n, split=args.split, seed_offset=args.seed)
    print(f"wrote {len(tasks)} tasks x {args.n} records ({args.split} split) to {root}")
    return 0


def _cmd_lm_eval(args: argparse.Namespace) -> int:
    from dllm_decode.eval.lm_eval import main

    return int(main(args.lm_eval_args) or 0)


def add_eval_subcommands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval {parallelbench, analyze, generate, lm-eval}`` to an argparse subparsers."""
    evaluate = subparsers.add_parser("eval", help="ParallelBench sweeps, analysis, lm-eval")
    sub = evaluate.add_subparsers(dest="eval_command", required=True)

    sweep = sub.add_parser("parallelbench", help="run a decoding-config grid on ParallelBench")
    sweep.add_argument("--grid", required=True, help="grid YAML (see benchmarks/grids/)")
    sweep.add_argument("--out", required=True, help="run directory (resumable)")
    sweep.add_argument("--model", default=None, help="checkpoint dir / bundled name (or grid)")
    sweep.add_argument("--data", default=None, help="released ParallelBench test directory")
    sweep.add_argument("--tokenizer", default=None, help="tokenizer path (default: model dir)")
    sweep.add_argument("--limit", type=int, default=None, help="first N docs per task")
    sweep.add_argument("--batch-size", type=int, default=None)
    sweep.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK if available")
    sweep.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16", "float16"],
        help="default: bfloat16 on GPU, float32 on CPU",
    )  # fmt: skip
    sweep.add_argument("--no-progress", action="store_true")
    sweep.set_defaults(func=_cmd_parallelbench)

    analyze = sub.add_parser("analyze", help="tables and plots from a run directory")
    analyze.add_argument("out", help="run directory with rows*.jsonl")
    analyze.add_argument("--baseline", default=None, help="config hash of the QPS baseline")
    analyze.add_argument("--no-plots", action="store_true")
    analyze.set_defaults(func=_cmd_analyze)

    generate = sub.add_parser("generate", help="write clean-room ParallelBench-style sets")
    generate.add_argument("--out", required=True)
    generate.add_argument("--tasks", nargs="*", default=None, help="default: every generator")
    generate.add_argument("--n", type=int, default=100, help="records per task")
    generate.add_argument("--split", default="test", choices=["train", "validation", "test"])
    generate.add_argument("--seed", type=int, default=0, help="offset added to the split seed")
    generate.set_defaults(func=_cmd_generate)

    # prefix_chars="+": every "--flag" after "lm-eval" is passed through to lm-eval verbatim.
    harness = sub.add_parser(
        "lm-eval", help="lm-evaluation-harness with the dllm_decode model registered",
        add_help=False, prefix_chars="+",
    )  # fmt: skip
    harness.add_argument("lm_eval_args", nargs=argparse.REMAINDER)
    harness.set_defaults(func=_cmd_lm_eval)
    return evaluate
