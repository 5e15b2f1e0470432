"""Does token editing repair the collisions of parallel commits? Test-bed measurement.

On the random test-bed tasks (shuffle, insert_random, replace_random), committing k names per
step from marginals makes two positions pick the same name (a collision) where the task needs
distinct ones. LLaDA2.1's token editing (``policies.editing.TokenEditing``) rewrites a committed
position whose proposal changed with probability above ``editing_threshold``, and a finished
block runs up to ``max_post_steps`` more steps while it edits. This script decodes ``--n``
held-out prompts per task at k = 4 and 8 tokens per step (LLaDA ``low_confidence``, fixed
steps = 16 / k, one block, greedy) without and with editing over the same base, on the
calibrated oracle (the exact conditionals with model-like floor logits) and the test-bed
checkpoints, and writes accuracy (valid answers %) and mean NFE per cell:

    OMP_NUM_THREADS=1 python benchmarks/bench_editing.py --n 100

to ``results/testbed_editing.csv``, printing a markdown table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from dllm_decode.bench import write_rows
from dllm_decode.train.testbed import RANDOM_TASKS, TESTBED_GEN_LENGTH, waiting_line_oracle
from dllm_decode.train.testbed_eval import decode_tasks

RESULTS = Path(__file__).parent / "results"
KS = (4, 8)
#: (label, editing_threshold) settings; ``None``: no editing (the base alone)
SETTINGS: tuple[tuple[str, float | None], ...] = (("none", None), ("edit 0.9", 0.9),
                                                   ("edit 0.5", 0.5))
MAX_POST_STEPS = 16


def named_model(name: str) -> Any:
    """``oracle_calibrated`` (the calibrated exact oracle) or a checkpoint name."""
    from dllm_decode import load_model

    if name == "oracle_calibrated":
        return waiting_line_oracle().calibrated()
    return load_model(name)


def cell(model: Any, n: int, seed: int, k: int, editing: float | None) -> dict[str, Any]:
    """Accuracy % and mean NFE per random task for one (model, k, setting)."""
    oracle = waiting_line_oracle()
    params: dict[str, Any] = {"steps": TESTBED_GEN_LENGTH // k}
    policy = "low_confidence"
    if editing is not None:
        policy = "edit"
        params |= {"base": "low_confidence", "editing_threshold": editing,
                   "max_post_steps": MAX_POST_STEPS}
    rows = decode_tasks(model, oracle, n, seed=seed, tasks=RANDOM_TASKS, policy=policy,
                        **params)
    return {t: (100 * sum(r["valid"] for r in v) / len(v), sum(r["nfe"] for r in v) / len(v))
            for t, v in rows.items()}


def run(models: list[str], n: int, seed: int) -> list[dict[str, Any]]:
    out = []
    for name in models:
        model = named_model(name)
        for k in KS:
            for label, editing in SETTINGS:
                res = cell(model, n, seed, k, editing)
                for task in RANDOM_TASKS:
                    acc, nfe = res[task]
                    out.append({"model": name, "task": task, "k": k, "editing": label,
                                "accuracy": round(acc, 1), "nfe": round(nfe, 2), "n": n,
                                "seed": seed})
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    labels = [label for label, _ in SETTINGS]
    head = "| model | task | k | " + " | ".join(f"{x}: acc % / NFE" for x in labels) + " |"
    lines = [head, "|---|---|---|" + "---|" * len(labels)]
    keys = sorted({(r["model"], r["task"], r["k"]) for r in rows},
                  key=lambda t: (t[0], t[1], t[2]))
    by = {(r["model"], r["task"], r["k"], r["editing"]): r for r in rows}
    for m, t, k in keys:
        cells = [f"{by[m, t, k, x]['accuracy']:.1f} / {by[m, t, k, x]['nfe']:.1f}"
                 for x in labels]
        lines.append(f"| {m} | {t} | {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+",
                    default=["oracle_calibrated", "testbed-llada", "testbed-dream"])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "testbed_editing.csv"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = run(args.models, args.n, args.seed)
    write_rows(rows, Path(args.out))
    print(markdown(rows))


if __name__ == "__main__":
    main()
