"""The parallel-decoding effect on the test bed: learned checkpoints vs the exact oracle.

For each model, ``--n`` held-out prompts (test split, generator seed offset ``--seed``) per
test-bed task are decoded with LLaDA's ``low_confidence`` at k = 1, 4 and 8 tokens per step
(fixed steps = 16 / k with the even split, i.e. exactly k per step for both families, one block,
greedy); the exact oracle (the distillation teacher) is decoded
on the same prompts, once as is (ties between equal marginals break toward the lowest id, so
parallel commits of a random task pick the same name and collide) and once with ties broken at
random (0.01 seeded logit noise on the same conditionals, mean of 5 seeds: what a model whose ties
break arbitrarily should get). Writes ``results/testbed_parallel.csv`` and prints the table of
the model cards, with the test-bed targets checked against either oracle: k = 1 accuracy >= 90 %
on every task; at k = 4 and 8 random tasks within 10 points of the oracle, deterministic tasks
within 5 points of k = 1.

    python benchmarks/testbed_parallel.py --models testbed-llada testbed-dream --n 50

``--draws 8`` instead decodes the random tasks at k = 4 / 8 on eight draws of ``--n`` prompts
(seeds ``--seed`` .. ``--seed + 7``) and counts the draws within 10 points of the oracle;
``--fit`` and ``--slots`` measure why a cell lands where it does.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import torch

from dllm_decode.train.testbed import (
    DETERMINISTIC_TASKS,
    RANDOM_TASKS,
    TESTBED_TASKS,
    waiting_line_oracle,
)
from dllm_decode.train.testbed_eval import (
    ambiguous_state_fit,
    decode_tasks,
    insert_slot_calibration,
)

RESULTS = Path(__file__).parent / "results"
KS = (1, 4, 8)
TIE_NOISE, TIE_SEEDS = 0.01, (0, 1, 2, 3, 4)


def accuracy(model: Any, n: int, seed: int, k: int,
             tasks: tuple[str, ...] = TESTBED_TASKS) -> dict[str, float]:
    """Valid answers % per task at ``k`` tokens per step on ``n`` held-out prompts."""
    oracle = waiting_line_oracle()
    rows = decode_tasks(model, oracle, n, seed=seed, steps=16 // k, tasks=tasks)
    return {t: 100 * sum(r["valid"] for r in v) / len(v) for t, v in rows.items()}


def named_model(name: str) -> Any:
    """``load_model(name)``, or the exact oracle for ``"oracle"`` (one thread for timings)."""
    from dllm_decode import load_model

    torch.set_num_threads(1)
    return waiting_line_oracle() if name == "oracle" else load_model(name)


def target_met(row: dict[str, Any], oracle: str, deterministic: bool) -> bool:
    """k = 1 >= 90 %; at k = 4 / 8 within 5 points of k = 1 (deterministic tasks) or within 10
    of the oracle column ``{oracle}{k}`` (random tasks)."""
    return row["k1"] >= 90 and all(
        abs(row[f"k{k}"] - (row["k1"] if deterministic else row[f"{oracle}{k}"]))
        <= (5 if deterministic else 10) for k in KS[1:])


def tie_oracles() -> list[Any]:
    """The random-ties references: the exact conditionals plus ``TIE_NOISE`` seeded logit noise,
    one oracle per ``TIE_SEEDS`` seed, so tied marginals break at random instead of toward the
    lowest id."""
    return [waiting_line_oracle().calibrated(noise=TIE_NOISE, seed=s) for s in TIE_SEEDS]


def tie_accuracy(oracles: list[Any], n: int, seed: int, k: int,
                 tasks: tuple[str, ...] = TESTBED_TASKS) -> dict[str, float]:
    """The random-ties reference on one draw: :func:`accuracy` averaged over ``oracles``."""
    per = [accuracy(o, n, seed, k, tasks) for o in oracles]
    return {t: sum(d[t] for d in per) / len(per) for t in tasks}


def table(models: list[str], n: int, seed: int) -> list[dict[str, Any]]:
    teacher = {k: accuracy(named_model("oracle"), n, seed, k) for k in KS}
    # the exact oracle breaks tied marginals toward the lowest id, so parallel commits of a
    # random task collide by construction; the same conditionals with ties broken by tiny seeded
    # noise (mean of TIE_SEEDS draws) predict what a model with arbitrary tie-breaking gets
    shaken = tie_oracles()
    ties = {k: tie_accuracy(shaken, n, seed, k) for k in KS[1:]}
    out = []
    for name in models:
        model = named_model(name)
        mine = {k: accuracy(model, n, seed, k) for k in KS}
        for task in TESTBED_TASKS:
            row: dict[str, Any] = {"model": name, "task": task, "n": n, "seed": seed}
            for k in KS:
                row[f"k{k}"] = round(mine[k][task], 1)
                row[f"oracle_k{k}"] = round(teacher[k][task], 1)
            for k in KS[1:]:
                row[f"oracle_ties_k{k}"] = round(ties[k][task], 1)
            det = task in DETERMINISTIC_TASKS
            row["target_met"] = target_met(row, "oracle_k", det)
            row["target_met_random_ties"] = target_met(row, "oracle_ties_k", det)
            out.append(row)
    return out


def fit_rows(models: list[str], n: int, seed: int) -> list[dict[str, Any]]:
    """``ambiguous_state_fit`` of each model (``oracle``: the exact oracle) on the random tasks:
    why its parallel cells land where they do."""
    oracle = waiting_line_oracle()
    out = []
    for name in models:
        model = named_model(name)
        for task in RANDOM_TASKS:
            fit = ambiguous_state_fit(model, oracle, n, task, seed=seed)
            out.append({"model": name, "task": task, "n": n, "seed": seed,
                        **{k: round(v, 4) for k, v in fit.items()}})
    return out


def fit_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | task | masked positions / prompt | KL(oracle, model) nats | "
             "argmax not the oracle's % | prompts with one % |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['task']} | {r['positions']:.2f} | {abs(r['kl']):.3f} | "
              f"{100 * r['argmax_miss']:.1f} | {100 * r['prompts_missed']:.0f} |" for r in rows]
    return "\n".join(lines)


def draw_rows(models: list[str], n: int, seed: int, draws: int) -> list[dict[str, Any]]:
    """The random tasks' parallel cells on ``draws`` independent draws of ``n`` prompts
    (generator seeds ``seed .. seed + draws - 1``): one row per (model, task, k) with the
    accuracy of every draw, the exact oracle's on the same draws, and how many draws sit
    within 10 points of it; the same against the random-ties oracle (the mean of the
    ``TIE_SEEDS`` tie-breaking oracles of :func:`table`, per draw), which differs from the exact
    one only where the marginals tie (shuffle). The target is checked on prompts nobody tuned
    for, so one draw is not enough: at 50 prompts a 6 % cell has a binomial spread of about
    +- 3.4 points."""
    seeds = range(seed, seed + draws)

    def cells(model: Any, k: int) -> dict[str, list[float]]:
        per = [accuracy(model, n, s, k, RANDOM_TASKS) for s in seeds]
        return {t: [d[t] for d in per] for t in RANDOM_TASKS}

    teacher = {k: cells(named_model("oracle"), k) for k in KS[1:]}
    shaken = tie_oracles()
    ties = {k: [tie_accuracy(shaken, n, s, k, RANDOM_TASKS) for s in seeds] for k in KS[1:]}
    out = []
    for name in models:
        model = named_model(name)
        for k in KS[1:]:
            mine = teacher[k] if name == "oracle" else cells(model, k)
            for task in RANDOM_TASKS:
                gaps = [abs(a - b) for a, b in zip(mine[task], teacher[k][task], strict=True)]
                tied = [d[task] for d in ties[k]]
                tie_gaps = [abs(a - b) for a, b in zip(mine[task], tied, strict=True)]
                out.append({"model": name, "task": task, "k": k, "n": n, "seeds":
                            f"{seed}-{seed + draws - 1}", "mean": round(sum(mine[task]) / draws, 2),
                            "min": min(mine[task]), "max": max(mine[task]),
                            "oracle_mean": round(sum(teacher[k][task]) / draws, 2),
                            "within_10": sum(g <= 10 for g in gaps), "draws": draws,
                            "oracle_ties_mean": round(sum(tied) / draws, 2),
                            "within_10_ties": sum(g <= 10 for g in tie_gaps),
                            "per_draw": " ".join(f"{v:.0f}" for v in mine[task]),
                            "per_draw_ties": " ".join(f"{v:.1f}" for v in tied)})
    return out


def draw_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | task | k | mean % (min-max) | oracle mean % | draws within 10 points | "
             "oracle, random ties, mean % | draws within 10 of it | per draw |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['task']} | {r['k']} | {r['mean']:.1f} ({r['min']:.0f}-"
              f"{r['max']:.0f}) | {r['oracle_mean']:.1f} | {r['within_10']} / {r['draws']} | "
              f"{r['oracle_ties_mean']:.1f} | {r['within_10_ties']} / {r['draws']} | "
              f"{r['per_draw']} |" for r in rows]
    return "\n".join(lines)


def slot_rows(models: list[str], n: int, seed: int) -> list[dict[str, Any]]:
    """``insert_slot_calibration`` of each model (``oracle``: the exact oracle)."""
    oracle = waiting_line_oracle()
    out = []
    for name in models:
        model = named_model(name)
        for row in insert_slot_calibration(model, oracle, n, seed=seed):
            out.append({"model": name, "n": n, "seed": seed,
                        **{k: round(v, 4) for k, v in row.items()}})
    return out


def slot_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | list length | slot | prompts | inserted name: model / oracle | left "
             "neighbour | right neighbour | model argmax = inserted % |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['length']} | {r['slot']} | {r['prompts']:.0f} | "
              f"{r['model_x']:.2f} / {r['oracle_x']:.2f} | {r['model_left']:.2f} / "
              f"{r['oracle_left']:.2f} | {r['model_right']:.2f} / {r['oracle_right']:.2f} | "
              f"{100 * r['argmax_x']:.0f} |" for r in rows]
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | task | k=1 | k=4 | k=8 | oracle k=1 / 4 / 8 | oracle, random ties, "
             "k=4 / 8 | target (exact oracle) | target (random ties) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['task']} | {r['k1']:.0f} | {r['k4']:.0f} | "
                     f"{r['k8']:.0f} | {r['oracle_k1']:.0f} / {r['oracle_k4']:.0f} / "
                     f"{r['oracle_k8']:.0f} | {r['oracle_ties_k4']:.0f} / "
                     f"{r['oracle_ties_k8']:.0f} | {'met' if r['target_met'] else 'MISSED'} | "
                     f"{'met' if r['target_met_random_ties'] else 'MISSED'} |")
    return "\n".join(lines)


def model_card(name: str, run_dirs: list[Path], rows: list[dict[str, Any]]) -> str:
    """The checkpoint's README: architecture, exact commands, time, curves, the table above.

    ``run_dirs``: the training stages, oldest first (a grown model lists the run it grew from
    before its own; ``--grow-from`` names the earlier stage's checkpoint).
    """
    import json

    runs = [json.loads((d / "run.json").read_text()) for d in run_dirs]
    run, cfg = runs[-1], runs[-1]["config"]
    stages = [f"{i + 1}. `{r['command']}` ({r['steps_done']} steps, {r['config']['layers']} "
              f"layers x {r['config']['hidden']}, {r['wall_s'] / 60:.0f} min)"
              for i, r in enumerate(runs)]
    curves: list[str] = []
    for i, d in enumerate(run_dirs):
        loss = (d / "loss.csv").read_text().splitlines()
        evals = (d / "eval.csv").read_text().splitlines()
        rows_at = list(range(1, len(loss), max(1, len(loss) // 12)))
        if rows_at and rows_at[-1] != len(loss) - 1:  # the last row once, stride hit or not
            rows_at.append(len(loss) - 1)
        picked = [loss[0]] + [loss[j] for j in rows_at]
        curves += [f"Stage {i + 1}: loss (soft cross-entropy) and KL to the oracle:", "", "```",
                   *picked, "```", "", f"Stage {i + 1}: held-out validity during training "
                   f"({runs[i]['config']['eval_size']} prompts per task, k = 1):", "", "```",
                   *evals, "```", ""]
    mine = [r for r in rows if r["model"] == name]
    minutes = sum(r["wall_s"] for r in runs) / 60
    return "\n".join([
        f"# {name}", "",
        f"A {cfg['family']}-family masked-diffusion model distilled from the exact Waiting Line "
        "oracle on the word-level test bed (`dllm_decode.train.testbed`: one token per name, "
        "500 names, lists of 3-5, answers of 16 positions). It is a task model for measuring "
        "decoding policies, not a language model: prompts are the oracle's format, e.g. "
        "`<copy> [ Amelia Abbott , Bruno Adler , Carl Bell ] <fill> <fill> <fill> <fill> "
        "<answer>` (the list region padded with `<fill>` to five slots).", "",
        f"* architecture: {cfg['layers']} layers, hidden {cfg['hidden']}, {cfg['heads']} heads, "
        f"MLP {cfg['intermediate']}, vocabulary {run['vocab_size']}; "
        f"{run['parameters'] / 1e6:.2f}M parameters, fp16 weights",
        f"* training: {sum(r['steps_done'] for r in runs)} steps in {len(runs)} stage(s), batch "
        f"{cfg['batch_size']}, {minutes:.0f} min on 1 CPU thread of a shared 2-core machine; "
        "soft targets (the oracle's exact conditionals); later stages start from the previous "
        "stage's checkpoint grown in depth / width with its function kept "
        "(`dllm_decode/train/grow.py`). Stages (exact commands):", "", *stages, "",
        "## Held-out results (test split, low_confidence, greedy, one block)", "",
        "`python benchmarks/testbed_parallel.py` (50 prompts per task; k = tokens per step, "
        "exactly k at every step: the even split `schedule=\"llada\"` for both families; the "
        "oracle columns decode the same prompts with the exact oracle, which breaks tied "
        "marginals toward the lowest id, and with the same conditionals plus 0.01 seeded logit "
        "noise that breaks ties at random, mean of 5 seeds):", "",
        markdown(mine), "",
        "## Training curves", "", *grid_note(cfg["family"], runs), *curves])


def grid_note(family: str, runs: list[dict[str, Any]]) -> list[str]:
    """The Dream card's warning about stages whose held-out validity was logged on Dream's own
    time grid (their ``run.json`` predates ``eval_schedule``, the even split)."""
    old = [i + 1 for i, r in enumerate(runs) if "eval_schedule" not in r]
    if family != "dream" or not old:
        return []
    names = ", ".join(map(str, old))
    return [f"The held-out validity logged during stage(s) {names} was measured on Dream's own "
            "time grid (then the evaluation default), which at 16 steps commits nothing in the "
            "first step and two tokens in the last: two names at once on a random task, so "
            "their shuffle / insert_random / replace_random columns read low. The other stages "
            "and the table above commit exactly one token per step.", ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["testbed-llada", "testbed-dream"])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="testbed_parallel")
    ap.add_argument("--card", nargs=2, action="append", default=[], metavar=("MODEL", "RUNS"),
                    help="write MODEL's card (README.md in its directory) from its training "
                         "run dirs RUNS (comma-separated, oldest stage first)")
    ap.add_argument("--fit", action="store_true",
                    help="instead: each model's fit to the oracle at the random tasks' ambiguous "
                         "states (train.testbed_eval.ambiguous_state_fit; 'oracle' names the "
                         "exact oracle), written to results/TAG_fit.csv")
    ap.add_argument("--slots", action="store_true",
                    help="instead: insert_random's ambiguous state per list length and slot "
                         "(train.testbed_eval.insert_slot_calibration), results/TAG_slots.csv")
    ap.add_argument("--draws", type=int, default=0,
                    help="instead: the random tasks at k = 4 / 8 on DRAWS draws of --n prompts "
                         "(seeds --seed ..), per draw and against the oracle, "
                         "results/TAG_draws.csv")
    args = ap.parse_args(argv)
    if args.draws:
        draws = draw_rows(args.models, args.n, args.seed, args.draws)
        write_rows(draws, RESULTS / f"{args.tag}_draws.csv")
        print(draw_markdown(draws))
        return 0
    if args.slots:
        slots = slot_rows(args.models, args.n, args.seed)
        write_rows(slots, RESULTS / f"{args.tag}_slots.csv")
        print(slot_markdown(slots))
        return 0
    if args.fit:
        fits = fit_rows(args.models, args.n, args.seed)
        write_rows(fits, RESULTS / f"{args.tag}_fit.csv")
        print(fit_markdown(fits))
        return 0
    rows = table(args.models, args.n, args.seed)
    for name, run_dir in args.card:
        from dllm_decode.models.loading import resolve_path

        dirs = [Path(d) for d in run_dir.split(",")]
        (resolve_path(name) / "README.md").write_text(model_card(name, dirs, rows))
    write_rows(rows, RESULTS / f"{args.tag}.csv")
    print(markdown(rows))
    return 0


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """``rows`` as a CSV at ``path`` (replaced), columns in the first row's order."""
    path.parent.mkdir(exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    raise SystemExit(main())
