"""Logit drift of the approximate caches (prefix, dual, sub_block) on the bundled trained
checkpoints.

Decodes held-out zero-shot Waiting Line prompts with each cache mode and compares every cached
step's logits with a full recomputation of the same canvas
(``dllm_decode.diagnostics.drift.measure_drift``).
Writes ``benchmarks/results/drift.csv`` and prints a markdown table.

    python benchmarks/drift_table.py --models tiny-llada tiny-dream
    python benchmarks/drift_table.py --models tiny-sdar --modes sub_block \
        --out benchmarks/results/drift_sub_block.csv

``sub_block`` (Fast-dLLM v2's block-level cache) decodes with ``fastdllm_v2`` in sub-blocks of
``--sub-block`` positions on the model's own blocks.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch

from dllm_decode.diagnostics.drift import measure_drift
from dllm_decode.eval.runner import left_pad
from dllm_decode.models.loading import load_model
from dllm_decode.tokenizer import load_tokenizer
from dllm_decode.train.config import WAITING_LINE
from dllm_decode.train.data import TaskData

RESULTS = Path(__file__).parent / "results"


def prompts(n_per_task: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Held-out (validation split) zero-shot prompts, left-padded to one width."""
    data = TaskData(load_tokenizer(), WAITING_LINE, 32, icl_examples=0)
    examples = data.eval_examples(n_per_task * len(WAITING_LINE), 3, 6, seed=99)
    return left_pad([data.codec.encode(t, r) for t, r in examples], data.pad_id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny-llada", "tiny-dream"])
    ap.add_argument("--modes", nargs="+", default=["prefix", "dual"])
    ap.add_argument("--per-task", type=int, default=1)
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--block-length", type=int, default=8)
    ap.add_argument("--sub-block", type=int, default=2, help="sub_block: sub-block size")
    ap.add_argument("--out", type=Path, default=RESULTS / "drift.csv")
    args = ap.parse_args()
    ids, attn = prompts(args.per_task)
    rows = []
    for name in args.models:
        model = load_model(name).float()
        for mode in args.modes:
            for row in range(ids.shape[0]):  # one row at a time: no padding in the comparison
                keep = attn[row].bool()
                extra = {}
                if mode == "sub_block":  # a sub-block policy on the model's own blocks
                    extra = dict(policy="fastdllm_v2", small_block_size=args.sub_block,
                                 block_length=None)
                res = measure_drift(model, ids[row:row + 1, keep], mode=mode,
                                    gen_length=args.gen_length,
                                    **{"block_length": args.block_length, **extra})
                rows.append(dict(model=name, mode=mode, prompt=row, **res))
    args.out.parent.mkdir(exist_ok=True)
    with args.out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("| model | cache | prompts | max abs logit drift | mean abs drift | argmax agreement "
          "| max diff right after refresh |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        for mode in args.modes:
            sel = [r for r in rows if r["model"] == name and r["mode"] == mode]
            agg = {"mean_abs_logit_drift": sum(r["mean_abs_logit_drift"] for r in sel) / len(sel),
                   # weighted by the eligible rows compared (a prompt may have none stale)
                   "argmax_agreement": sum(r["argmax_agreement"] * r["compared"] for r in sel)
                   / max(sum(r["compared"] for r in sel), 1)}
            print(f"| {name} | {mode} | {len(sel)} | "
                  f"{max(r['max_abs_logit_drift'] for r in sel):.3f} | "
                  f"{agg['mean_abs_logit_drift']:.4f} | {agg['argmax_agreement']:.3f} | "
                  f"{max(r['refresh_max_abs'] for r in sel):.1e} |")
    print(f"\nrows: {args.out}")


if __name__ == "__main__":
    main()
