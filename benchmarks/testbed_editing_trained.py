"""Does trained token editing repair parallel decoding? LLaDA2.x students on the test bed.

Two LLaDA2.x-architecture students distilled from the exact oracle with the same recipe and
steps, one with LLaDA2.1's editing stream (``testbed-llada2``: masks plus random-token
corruptions, every answer position supervised) and one without it (the LLaDA2.0 mask-only
objective, ``--no-editing``: ``benchmarks/training/testbed-llada2-noedit/model``). For each,
``--n`` held-out prompts per test-bed task (generator seed offset ``--seed``: any other seed draws
prompts nobody tuned for) are decoded at k = 1, 4 and 8 tokens per step by

* ``llada2``: LLaDA2.0's threshold rule (``MinimalTopK``: every masked position with p > 0.95,
  at least the k most probable; the reference's schedule over a 32-block cannot give k = 1 for
  a 16-token answer, its ``steps = min(steps, gen_length)`` caps it at 2 per step, so k is
  the fixed minimum, as LLaDA2.1's ``num_to_transfer``);
* ``llada21`` ``quality`` (mask threshold 0.95, edit threshold 0.9) and ``speed`` (0.7 / 0.5):
  LLaDA2.1's rule with ``num_to_transfer = k`` and token editing (``max_post_steps`` 16),

and the test bed's plain ``low_confidence`` (exactly k per step, no threshold, no editing),
greedy, one block. Per (model, decoder, k, task) it writes valid answers %, mean NFE and mean
edits per answer (committed positions rewritten) to ``results/testbed_editing_trained.csv``,
draws ``results/testbed_editing_trained.png`` and prints the markdown tables:

    OMP_NUM_THREADS=1 python benchmarks/testbed_editing_trained.py --n 50 --seed 0
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from dllm_decode.bench import write_rows
from dllm_decode.policies.editing import MinimalTopK
from dllm_decode.train.testbed import (
    RANDOM_TASKS,
    TESTBED_GEN_LENGTH,
    TESTBED_TASKS,
    waiting_line_oracle,
)
from dllm_decode.train.testbed_eval import decode_tasks

ROOT = Path(__file__).parent
RESULTS = ROOT / "results"
KS = (1, 4, 8)
#: the editing-free comparison student (trained by the same recipe with ``--no-editing``)
NOEDIT = str(ROOT / "training" / "testbed-llada2-noedit" / "model")
MODELS = {"testbed-llada2": "editing-trained", NOEDIT: "editing-free"}
#: (label, preset, parameters given k)
DECODERS: tuple[tuple[str, str, Any], ...] = (
    ("low_confidence", "low_confidence", lambda k: {"steps": TESTBED_GEN_LENGTH // k}),
    ("llada2", "minimal_topk", lambda k: {"min_commit": k}),
    ("llada21 quality", "llada21", lambda k: {"mode": "quality", "num_to_transfer": k}),
    ("llada21 speed", "llada21", lambda k: {"mode": "speed", "num_to_transfer": k}),
)


def label(name: str) -> str:
    return MODELS.get(name, name)


def run(models: list[str], n: int, seed: int) -> list[dict[str, Any]]:
    from dllm_decode import load_model

    oracle = waiting_line_oracle()
    out = []
    for name in models:
        model = load_model(name)
        for dec, preset, params in DECODERS:
            for k in KS:
                policy: Any = preset
                kwargs = params(k)
                if preset == "minimal_topk":  # LLaDA2.0's rule with a fixed minimum
                    policy, kwargs = MinimalTopK(threshold=0.95, **kwargs), {}
                rows = decode_tasks(model, oracle, n, seed=seed, policy=policy, **kwargs)
                for task in TESTBED_TASKS:
                    r = rows[task]
                    out.append({"model": label(name), "decoder": dec, "k": k, "task": task,
                                "n": n, "seed": seed,
                                "accuracy": round(100 * sum(x["valid"] for x in r) / n, 1),
                                "nfe": round(sum(x["nfe"] for x in r) / n, 2),
                                "edits": round(sum(x["edits"] for x in r) / n, 2)})
                print(label(name), dec, k, flush=True)
    return out


def summary(rows: list[dict[str, Any]], keys: tuple[str, ...] = ("model", "decoder", "k"),
            means: tuple[str, ...] = ("nfe", "edits")) -> list[dict[str, Any]]:
    """Per distinct ``keys`` of ``rows`` (default: model, decoder, k): mean accuracy over the
    random (dependent) tasks (``random``), over all nine (``all``), and the mean of each of
    ``means`` (default: NFE and edits per answer)."""
    out = []
    for key in dict.fromkeys(tuple(r[k] for k in keys) for r in rows):
        sel = [r for r in rows if tuple(r[k] for k in keys) == key]
        rnd = [r["accuracy"] for r in sel if r["task"] in RANDOM_TASKS]
        out.append({**dict(zip(keys, key, strict=True)), "random": sum(rnd) / len(rnd),
                    "all": sum(r["accuracy"] for r in sel) / len(sel),
                    **{m: sum(r[m] for r in sel) / len(sel) for m in means}})
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The summary table, then the per-task accuracy table."""
    lines = ["| model | decoder | k | random tasks acc % | all 9 tasks acc % | mean NFE | "
             "edits / answer |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {s['model']} | {s['decoder']} | {s['k']} | {s['random']:.1f} | "
              f"{s['all']:.1f} | {s['nfe']:.2f} | {s['edits']:.2f} |" for s in summary(rows)]
    return "\n".join([*lines, "", *task_table(rows, ("model", "decoder", "k"))])


def task_table(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[str]:
    """Markdown lines: valid answers % per task, one line per distinct ``keys`` of ``rows``
    (each row one task's ``accuracy``)."""
    lines = ["| " + " | ".join(keys) + " | " + " | ".join(TESTBED_TASKS) + " |",
             "|" + "---|" * (len(keys) + len(TESTBED_TASKS))]
    by = {(*(r[k] for k in keys), r["task"]): r for r in rows}
    for key in dict.fromkeys(tuple(r[k] for k in keys) for r in rows):
        cells = [f"{by[(*key, t)]['accuracy']:.0f}" for t in TESTBED_TASKS]
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Random-task accuracy and NFE against k, one line per (model, decoder)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6))
    FigureCanvasAgg(fig)
    acc, nfe = fig.subplots(1, 2)
    for s_model in dict.fromkeys(r["model"] for r in rows):
        for dec, *_ in DECODERS:
            sel = [s for s in summary(rows) if s["model"] == s_model and s["decoder"] == dec]
            style = "-" if s_model == "editing-trained" else "--"
            ks = [s["k"] for s in sel]
            acc.plot(ks, [s["random"] for s in sel], style, marker="o",
                     label=f"{s_model}, {dec}")
            nfe.plot(ks, [s["nfe"] for s in sel], style, marker="o")
    acc.set(xlabel="tokens per step k", ylabel="random tasks: valid %", xticks=KS)
    nfe.set(xlabel="tokens per step k", ylabel="mean NFE (16-token answer)", xticks=KS)
    acc.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--n", type=int, default=50, help="held-out prompts per task")
    ap.add_argument("--seed", type=int, default=0, help="held-out generator seed offset")
    ap.add_argument("--out", type=Path, default=RESULTS / "testbed_editing_trained.csv")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = run(args.models, args.n, args.seed)
    write_rows(rows, args.out)
    plot(rows, args.out.with_suffix(".png"))
    print(markdown(rows))


if __name__ == "__main__":
    main()
