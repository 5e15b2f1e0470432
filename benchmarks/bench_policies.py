"""Decoding methods on held-out ParallelBench-style tasks: accuracy, NFE, tokens per forward
(answer tokens up to EOS per forward), tokens per step (gen length / NFE), wall time.

Runs a sweep grid through the library's runner (``dllm_decode.eval.runner.run_grid``) on a
bundled checkpoint or on the exact oracle model (``--model oracle``: the exact conditional of
every masked answer token, so policy effects are isolated from model error), then writes one
summary row per (policy, params, task) to ``benchmarks/results/methods_<model>.csv`` and prints
a markdown table against the LLaDA one-token-per-step baseline.

    python benchmarks/bench_policies.py --grid benchmarks/grids/methods.yaml --model oracle

``--card`` also writes the per-task table (exact match and NFE per config) into the model
directory's ``README.md`` between the ``<!-- results -->`` markers (the bundled model cards):

    python benchmarks/bench_policies.py --grid benchmarks/grids/tiny_card.yaml \
        --model tiny-llada --tag card --card
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

from dllm_decode.eval.analyze import policy_label
from dllm_decode.eval.parallelbench.grid import load_grid
from dllm_decode.eval.runner import load_records, run_grid, sampler_decode_fn
from dllm_decode.speed import tokens_per_forward

RESULTS = Path(__file__).parent / "results"


def _model_and_codec(name: str, records: dict):
    if name == "oracle":
        from dllm_decode.eval.parallelbench.codec import ModelCodec
        from dllm_decode.models.oracle import WaitingLineOracle

        oracle = WaitingLineOracle.from_records(r for recs in records.values() for r in recs)
        return oracle, ModelCodec(oracle)
    from dllm_decode.eval.parallelbench.codec import TokenizerCodec
    from dllm_decode.models.loading import load_model, resolve_path
    from dllm_decode.tokenizer import load_tokenizer

    model = load_model(name)
    return model, TokenizerCodec(load_tokenizer(resolve_path(name)), model.eos_token_ids)


def summarise(rows_path: Path) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for line in rows_path.read_text().splitlines():
        row = json.loads(line)
        cfg = row["config"]
        params = dict(cfg["params"])
        if cfg.get("cache", "none") != "none":
            params["cache"] = cfg["cache"]
        if cfg.get("block_length") not in (None, cfg.get("gen_length")):
            params["block"] = cfg["block_length"]
        key = (policy_label(cfg), json.dumps(params, sort_keys=True), cfg["steps"], row["task"])
        groups[key].append(row)
    out = []
    for (policy, params, steps, task), rows in sorted(groups.items()):
        n = len(rows)
        nfe = sum(r["nfe"] for r in rows) / n
        out.append(dict(policy=policy, params=params, steps=steps, task=task, n=n,
                        accuracy=sum(r["score"] for r in rows) / n, nfe=nfe,
                        tpf=tokens_per_forward([r["gen_tokens_useful"] for r in rows],
                                               [r["nfe"] for r in rows]),
                        tokens_per_step=sum(r["gen_tokens_budget"] for r in rows) / n
                        / max(nfe, 1e-9),
                        wall_s=sum(r["wall_time_s"] for r in rows) / n))
    return out


def table(summary: list[dict]) -> str:
    by_cfg: dict[tuple, list[dict]] = defaultdict(list)
    for s in summary:
        by_cfg[(s["policy"], s["params"], s["steps"])].append(s)
    lines = ["| policy | params | steps | accuracy (mean over tasks) | NFE | tokens/forward "
             "| tokens/step |", "|---|---|---|---|---|---|---|"]
    for (policy, params, steps), ss in by_cfg.items():
        acc = sum(s["accuracy"] for s in ss) / len(ss)
        nfe = sum(s["nfe"] for s in ss) / len(ss)
        tpf = sum(s["tpf"] for s in ss) / len(ss)
        per_step = sum(s["tokens_per_step"] for s in ss) / len(ss)
        lines.append(f"| {policy} | {params} | {steps} | {100 * acc:.1f} | {nfe:.2f} | "
                     f"{tpf:.2f} | {per_step:.2f} |")
    return "\n".join(lines)


def _config_name(policy: str, params: str, steps: int | None, gen_length: int = 32) -> str:
    extra = ", ".join(f"{k}={v}" for k, v in json.loads(params).items())
    name = f"{policy}, {gen_length // steps} tok/step" if steps else policy
    return f"{name} ({extra})" if extra else name


def per_task_table(summary: list[dict]) -> str:
    """Tasks x configs: ``exact match % / mean NFE`` per cell, and the mean over tasks."""
    configs = list(dict.fromkeys((s["policy"], s["params"], s["steps"]) for s in summary))
    cell = {(s["policy"], s["params"], s["steps"], s["task"]): s for s in summary}
    tasks = list(dict.fromkeys(s["task"] for s in summary))
    head = "| task | " + " | ".join(_config_name(*c) for c in configs) + " |"
    lines = [head, "|---|" + "---|" * len(configs)]
    for task in tasks + ["mean"]:
        cells = []
        for c in configs:
            rows = [cell[(*c, t)] for t in tasks if (*c, t) in cell] if task == "mean" \
                else [cell[(*c, task)]] if (*c, task) in cell else []
            if not rows:
                cells.append("-")
                continue
            acc = sum(r["accuracy"] for r in rows) / len(rows)
            nfe = sum(r["nfe"] for r in rows) / len(rows)
            cells.append(f"{100 * acc:.0f} / {nfe:.1f}")
        name = task.rsplit("/", 1)[-1] if task != "mean" else "**mean**"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_card_section(readme: Path, text: str, marker: str = "results") -> None:
    """Replace (or append) the block between ``<!-- marker -->`` and ``<!-- /marker -->``."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    block = f"{start}\n{text}\n{end}"
    old = readme.read_text() if readme.is_file() else ""
    if start in old and end in old:
        new = old[:old.index(start)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=Path, default=Path(__file__).parent / "grids/methods.yaml")
    ap.add_argument("--model", default="oracle")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tag", default="methods", help="CSV name: results/<tag>_<model>.csv")
    ap.add_argument("--card", action="store_true",
                    help="write the per-task table into the model directory's README.md")
    args = ap.parse_args()
    grid = load_grid(args.grid)
    records = load_records(grid)
    model, codec = _model_and_codec(args.model, records)
    run_dir = args.out or (Path("runs") / f"{args.tag}-{Path(args.model).name}")
    run_grid(grid, records, run_dir, decode=sampler_decode_fn(model), codec=codec,
             model=args.model)
    summary = summarise(Path(run_dir) / "rows.jsonl")
    RESULTS.mkdir(exist_ok=True)
    csv_path = RESULTS / f"{args.tag}_{Path(args.model).name}.csv"
    with csv_path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    print(table(summary))
    print(per_task_table(summary))
    print(f"\nper-task rows: {csv_path}")
    if args.card:
        from dllm_decode.models.loading import resolve_path

        readme = Path(resolve_path(args.model)) / "README.md"
        n = summary[0]["n"]
        text = (f"Held-out generated prompts (test split, {n} per task, zero-shot), greedy; "
                f"cells are exact match % / mean NFE. Reproduce with\n`python "
                f"benchmarks/bench_policies.py --grid {args.grid.as_posix()} --model "
                f"{args.model} --tag {args.tag} --card`.\n\n{per_task_table(summary)}")
        write_card_section(readme, text)
        print(f"model card updated: {readme}")


if __name__ == "__main__":
    main()
