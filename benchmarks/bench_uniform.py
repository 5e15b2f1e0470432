"""Re-noising (uniform noise, DiffusionGemma's sampler) vs masked decoding at equal forwards.

The test bed's exact oracle twice: as a mask model (``WaitingLineOracle``: the exact
conditionals given the committed tokens) and as a uniform-noise model (``UniformOracle``: the
exact posterior marginals over a random-token canvas, ``models/uniform_oracle.py``). On the nine
test-bed Waiting Line tasks (lists of 3-5 names, G = 16, one canvas / block), ``--n`` held-out
prompts per task are decoded with a budget of N = 16 / 8 / 4 / 2 model forwards:

* ``masked low_confidence``: LLaDA top-k, 16 / N tokens per step (greedy; N forwards);
* ``masked eb``: the same entropy-bound rule as the re-noising sampler's acceptance, on the
  mask model (EB-sampler, gamma 0.1, greedy), capped at N steps (the block's last step commits
  what is left; at most N forwards);
* ``renoise``: ``gemma_renoise`` with N denoising steps and no early stop (exactly N forwards;
  entropy bound 0.1, t 0.8 -> 0.4, the reference's defaults), one canvas;
* ``renoise + early stop``: the same with the stable-and-confident stop (at most N forwards);
* ``renoise sticky``: accepted positions are final (the masked-decoding analogue of the
  acceptance rule; at most N forwards).

Uniform-noise decoding samples; each of its cells is the mean over ``--seeds`` sampler seeds.
Writes ``results/testbed_uniform.csv`` (one row per method x N x task, plus the task mean) and
prints a markdown table:

    OMP_NUM_THREADS=1 python benchmarks/bench_uniform.py --n 50 --seeds 3
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dllm_decode import DiffusionSampler
from dllm_decode.bench import write_rows
from dllm_decode.eval.runner import left_pad
from dllm_decode.models.uniform_oracle import UniformOracle
from dllm_decode.train.testbed import TESTBED_GEN_LENGTH, TESTBED_TASKS, grade, waiting_line_oracle
from dllm_decode.train.testbed_eval import held_out_prompts

RESULTS = Path(__file__).parent / "results"
G = TESTBED_GEN_LENGTH
FORWARDS = (16, 8, 4, 2)
#: (label, uniform model?, policy, parameters given the budget N)
METHODS: list[tuple[str, bool, str, Any]] = [
    ("masked low_confidence", False, "low_confidence", lambda n: {"steps": n}),
    ("masked eb", False, "eb", lambda n: {"gamma": 0.1, "max_steps_per_block": n}),
    ("renoise", True, "gemma_renoise", lambda n: {"steps": n, "early_stop": False}),
    ("renoise + early stop", True, "gemma_renoise", lambda n: {"steps": n}),
    ("renoise sticky", True, "gemma_renoise", lambda n: {"steps": n, "sticky": True}),
]


def cell(model: Any, oracle: Any, policy: str, params: dict[str, Any], task: str, n: int,
         seed: int) -> tuple[float, float]:
    """(share of valid answers, mean NFE) of ``n`` held-out prompts of ``task``."""
    records, prompts = held_out_prompts(oracle, task, n)
    ids, attn = left_pad(prompts, oracle.pad_token_id)
    extra = {"schedule": "llada"} if not isinstance(model, UniformOracle) else {}
    out = DiffusionSampler(model, policy, gen_length=G, **params, **extra).generate(
        ids, attn, seed=seed)
    valid = [grade(task, rec, oracle.decode(ans))
             for rec, ans in zip(records, out.answer.tolist(), strict=True)]
    return sum(valid) / n, float(out.nfe.double().mean())


def run(n: int, seeds: int) -> list[dict[str, Any]]:
    oracle = waiting_line_oracle()
    uniform = UniformOracle(oracle, canvas_length=G)
    rows = []
    for label, is_uniform, policy, params in METHODS:
        model = uniform if is_uniform else oracle
        for budget in FORWARDS:
            accs, nfes = [], []
            for task in TESTBED_TASKS:
                runs = [cell(model, oracle, policy, params(budget), task, n, s)
                        for s in range(seeds if is_uniform else 1)]
                acc = sum(r[0] for r in runs) / len(runs)
                nfe = sum(r[1] for r in runs) / len(runs)
                rows.append({"method": label, "forwards": budget, "task": task, "n": n,
                             "seeds": len(runs), "accuracy": round(100 * acc, 1),
                             "mean_nfe": round(nfe, 2)})
                accs.append(acc)
                nfes.append(nfe)
            rows.append({"method": label, "forwards": budget, "task": "mean", "n": n,
                         "seeds": seeds if is_uniform else 1,
                         "accuracy": round(100 * sum(accs) / len(accs), 1),
                         "mean_nfe": round(sum(nfes) / len(nfes), 2)})
            print(label, budget, rows[-1]["accuracy"], rows[-1]["mean_nfe"], flush=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """Mean accuracy (mean NFE) per method and forward budget, plus the random tasks."""
    random_tasks = ("shuffle", "insert_random", "replace_random", "remove_random")
    head = "| method | forwards | mean acc % | random tasks acc % | mean NFE |"
    lines = [head, "|---|---|---|---|---|"]
    for label, *_ in METHODS:
        for budget in FORWARDS:
            sel = [r for r in rows if r["method"] == label and r["forwards"] == budget]
            mean = next(r for r in sel if r["task"] == "mean")
            rnd = [r["accuracy"] for r in sel if r["task"] in random_tasks]
            lines.append(f"| {label} | {budget} | {mean['accuracy']:.1f} | "
                         f"{sum(rnd) / len(rnd):.1f} | {mean['mean_nfe']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50, help="held-out prompts per task")
    ap.add_argument("--seeds", type=int, default=3, help="sampler seeds (uniform methods)")
    ap.add_argument("--out", type=Path, default=RESULTS / "testbed_uniform.csv")
    args = ap.parse_args()
    rows = run(args.n, args.seeds)
    write_rows(rows, args.out)
    print(markdown(rows))


if __name__ == "__main__":
    main()
