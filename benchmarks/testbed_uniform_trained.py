"""Does uniform noise beat masking at equal forwards? Trained test-bed students.

``bench_uniform.py`` answers the question with the exact oracle twice (a mask model and a
uniform-noise model), which measures decoding alone. This benchmark asks it of *trained*
models: a DiffusionGemma student trained on uniform noise with self-conditioning
(``testbed-gemma``, ``train/uniform_objective.py``) against the mask-trained students
(``testbed-llada``, ``testbed-llada2``), each decoding ``--n`` held-out prompts per test-bed task
(generator seed offset ``--seed``: other seeds draw prompts nobody tuned for) with a budget of
N = 16 / 8 / 4 / 2 model forwards for a 16-token answer:

* mask models: ``low_confidence`` with N steps (16 / N tokens per step, greedy) and ``eb``
  (the entropy-bound rule the re-noising sampler accepts with, gamma 0.1, at most N steps);
* the uniform-noise model: ``gemma_renoise`` with N denoising steps and no early stop (exactly
  N forwards), with the stable-and-confident early stop (at most N), and ``sticky`` (accepted
  positions final; at most N). It samples, so each cell is the mean of ``--seeds`` sampler
  seeds.

Writes ``results/testbed_uniform_trained.csv`` (per model x method x N x task: valid %, mean
NFE), draws ``results/testbed_uniform_trained.png`` and prints the markdown tables:

    OMP_NUM_THREADS=1 python benchmarks/testbed_uniform_trained.py --n 50 --seed 0 --seeds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from testbed_editing_trained import summary as editing_summary  # noqa: E402
from testbed_editing_trained import task_table  # noqa: E402

from dllm_decode.bench import write_rows  # noqa: E402
from dllm_decode.train.testbed import (  # noqa: E402
    TESTBED_GEN_LENGTH,
    TESTBED_TASKS,
    waiting_line_oracle,
)
from dllm_decode.train.testbed_eval import decode_tasks  # noqa: E402

RESULTS = Path(__file__).parent / "results"
G = TESTBED_GEN_LENGTH
FORWARDS = (16, 8, 4, 2)
MASK_MODELS = ("testbed-llada", "testbed-llada2")
UNIFORM_MODEL = "testbed-gemma"
#: (label, uniform model?, policy, parameters given the budget N)
METHODS: tuple[tuple[str, bool, str, Any], ...] = (
    ("low_confidence", False, "low_confidence", lambda n: {"steps": n}),
    ("eb", False, "eb", lambda n: {"gamma": 0.1, "max_steps_per_block": n}),
    ("renoise", True, "gemma_renoise", lambda n: {"steps": n, "early_stop": False}),
    ("renoise + early stop", True, "gemma_renoise", lambda n: {"steps": n}),
    ("renoise sticky", True, "gemma_renoise", lambda n: {"steps": n, "sticky": True}),
)


def run(mask_models: list[str], uniform_model: str, n: int, seed: int, seeds: int
        ) -> list[dict[str, Any]]:
    """One row per (model, method, budget, task): valid answers % and mean NFE."""
    from dllm_decode import load_model

    oracle = waiting_line_oracle()
    out = []
    for name in [*mask_models, uniform_model]:
        model = load_model(name)
        for method, uniform, policy, params in METHODS:
            if uniform != (name == uniform_model):
                continue
            for budget in FORWARDS:
                draws = [decode_tasks(model, oracle, n, seed=seed, policy=policy,
                                      sample_seed=s, **params(budget))
                         for s in range(seeds if uniform else 1)]
                for task in TESTBED_TASKS:
                    rows = [r for d in draws for r in d[task]]
                    out.append({"model": Path(name).name, "method": method,
                                "forwards": budget, "task": task, "n": n, "seed": seed,
                                "draws": len(draws),
                                "accuracy": round(100 * sum(r["valid"] for r in rows)
                                                  / len(rows), 1),
                                "nfe": round(sum(r["nfe"] for r in rows) / len(rows), 2)})
                print(name, method, budget, flush=True)
    return out


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, method, budget): mean valid % over the random tasks and all nine, mean NFE."""
    return editing_summary(rows, ("model", "method", "forwards"), ("nfe",))


def markdown(rows: list[dict[str, Any]]) -> str:
    """The summary table, then valid % per task."""
    lines = ["| model | method | forwards N | random tasks acc % | all 9 tasks acc % | "
             "mean NFE |", "|---|---|---|---|---|---|"]
    lines += [f"| {s['model']} | {s['method']} | {s['forwards']} | {s['random']:.1f} | "
              f"{s['all']:.1f} | {s['nfe']:.2f} |" for s in summary(rows)]
    return "\n".join([*lines, "", *task_table(rows, ("model", "method", "forwards"))])


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Random-task and all-task accuracy against the forward budget, one line per
    (model, method)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6))
    FigureCanvasAgg(fig)
    rnd, every = fig.subplots(1, 2)
    table = summary(rows)
    for m, d in dict.fromkeys((s["model"], s["method"]) for s in table):
        sel = [s for s in table if (s["model"], s["method"]) == (m, d)]
        style = "-" if d.startswith("renoise") else "--"
        budgets = [s["forwards"] for s in sel]
        rnd.plot(budgets, [s["random"] for s in sel], style, marker="o", label=f"{m}, {d}")
        every.plot(budgets, [s["all"] for s in sel], style, marker="o")
    for ax, what in ((rnd, "random tasks"), (every, "all nine tasks")):
        ax.set(xlabel="forwards per 16-token answer", ylabel=f"{what}: valid %",
               xscale="log")
        ax.minorticks_off()
        ax.set_xticks(FORWARDS, [str(f) for f in FORWARDS])
    rnd.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mask-models", nargs="+", default=list(MASK_MODELS))
    ap.add_argument("--uniform-model", default=UNIFORM_MODEL)
    ap.add_argument("--n", type=int, default=50, help="held-out prompts per task")
    ap.add_argument("--seed", type=int, default=0, help="held-out generator seed offset")
    ap.add_argument("--seeds", type=int, default=3, help="sampler seeds (uniform model)")
    ap.add_argument("--out", type=Path, default=RESULTS / "testbed_uniform_trained.csv")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = run(args.mask_models, args.uniform_model, args.n, args.seed, args.seeds)
    write_rows(rows, args.out)
    plot(rows, args.out.with_suffix(".png"))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
