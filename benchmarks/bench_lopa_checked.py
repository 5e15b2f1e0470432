"""LoPA's ``checked=True`` guards on the trained test bed, beside ``threshold`` 0.9 and ``lopa``.

``testbed-llada`` (bundled) decodes ``--n`` held-out prompts (the test split, generator seed
offset by each of ``--seeds``: other seeds draw prompts nobody tuned for) of each of copy,
shuffle, replace_random and insert_random at gen length 16, one block, greedy
(``train.testbed_eval.decode_tasks``, graded by ``train.testbed.grade``), with

* ``threshold`` tau = 0.9 (the base rule LoPA's anchor runs, Fast-dLLM's threshold);
* ``lopa``: the paper's GSM8K preset (threshold 0.9, 14 lookahead branches), the authors' rule;
* ``lopa checked=True``: the same with the two guards (``policies/lopa.py``: an empty-window
  lookahead cannot win; a lookahead's token must equal the anchor's argmax at its position);
* for context: ``lopa`` with no branch (its anchor alone) and with one branch, plain and checked.

Per (config, seed) one CSV row, then one row per config over all seeds (``seed`` = ``all``):
``accuracy`` (valid answers %), per-task accuracy, ``rounds`` (decoding rounds per prompt, one
after the last commit: LoPA's packed branch forward runs inside its round), ``nfe`` (forwards a
prompt took part in, LoPA's branch forward counted), ``vs_threshold`` (accuracy over
``threshold``'s on the same prompts) and ``target_met`` (the issue's target for ``checked``:
>= 0.9 of threshold's accuracy in fewer rounds), with the device and versions. Written with
``dllm_decode.bench.write_rows`` to ``results/lopa_checked.csv``:

    OMP_NUM_THREADS=1 python benchmarks/bench_lopa_checked.py --n 12 --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from dllm_decode.bench import environment, write_rows
from dllm_decode.train.testbed import waiting_line_oracle
from dllm_decode.train.testbed_eval import decode_tasks
from dllm_decode.version import __version__

RESULTS = Path(__file__).parent / "results"
#: the issue's tasks (issue 52 "Why" 1)
TASKS = ("copy", "shuffle", "replace_random", "insert_random")
#: (label, preset, parameters); the first row is the reference the target is measured against
CONFIGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("threshold tau=0.9", "threshold", {"tau": 0.9}),
    ("lopa (paper, k=14)", "lopa", {}),
    ("lopa checked (k=14)", "lopa", {"checked": True}),
    ("lopa anchor only (k=0)", "lopa", {"branches": 0}),
    ("lopa k=1", "lopa", {"branches": 1}),
    ("lopa checked k=1", "lopa", {"branches": 1, "checked": True}),
)


def measure(model: Any, n: int, seed: int, tasks: tuple[str, ...] = TASKS
            ) -> dict[str, dict[str, Any]]:
    """Per config label: ``valid``, ``rounds`` and ``nfe`` lists over ``n`` held-out prompts
    per task (in ``tasks`` order) and ``tasks`` (valid % per task)."""
    oracle = waiting_line_oracle()
    out: dict[str, dict[str, Any]] = {}
    for label, preset, params in CONFIGS:
        rows = decode_tasks(model, oracle, n, seed=seed, tasks=tasks, policy=preset, **params)
        flat = [r for t in tasks for r in rows[t]]
        out[label] = {"valid": [bool(r["valid"]) for r in flat],
                      "rounds": [int(r["steps"]) for r in flat],
                      "nfe": [int(r["nfe"]) for r in flat],
                      "tasks": {t: 100 * sum(r["valid"] for r in rows[t]) / n for t in tasks}}
    return out


def summary_row(label: str, seed: Any, n: int, m: dict[str, Any], ref: dict[str, Any],
                env: Any) -> dict[str, Any]:
    """One CSV row of ``m`` (a ``measure`` entry, or several seeds' concatenated) against the
    reference config's ``ref`` on the same prompts."""
    count = len(m["valid"])
    acc = 100 * sum(m["valid"]) / count
    rounds, nfe = sum(m["rounds"]) / count, sum(m["nfe"]) / count
    ref_acc = 100 * sum(ref["valid"]) / count
    ref_rounds = sum(ref["rounds"]) / count
    ratio = acc / ref_acc if ref_acc else float("nan")
    preset, params = next((p, kw) for lab, p, kw in CONFIGS if lab == label)
    return {"model": "testbed-llada", "config": label, "policy": preset,
            "params": json.dumps(params), "seed": seed, "n_per_task": n, "prompts": count,
            "accuracy": round(acc, 2), "rounds": round(rounds, 3), "nfe": round(nfe, 3),
            **{f"acc_{t}": round(v, 1) for t, v in m["tasks"].items()},
            "vs_threshold": round(ratio, 3),
            "target_met": bool(ratio >= 0.9 and rounds < ref_rounds),
            "device": env.device, "torch": torch.__version__, "dllm_decode": __version__,
            "python": platform.python_version(), "commit": env.commit,
            "timestamp": env.timestamp}


def run(n: int, seeds: list[int]) -> list[dict[str, Any]]:
    from dllm_decode import load_model

    torch.set_num_threads(1)
    model, env = load_model("testbed-llada"), environment()
    ref = CONFIGS[0][0]
    per_seed = {}
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        t0 = time.perf_counter()
        per_seed[seed] = got = measure(model, n, seed)
        rows += [summary_row(label, seed, n, got[label], got[ref], env) for label in got]
        print(f"seed {seed}: {time.perf_counter() - t0:.1f} s", flush=True)
    for label, *_ in CONFIGS:  # every seed's prompts together
        both = {key: [x for s in seeds for x in per_seed[s][label][key]]
                for key in ("valid", "rounds", "nfe")}
        both["tasks"] = {t: sum(per_seed[s][label]["tasks"][t] for s in seeds) / len(seeds)
                         for t in TASKS}
        base = {key: [x for s in seeds for x in per_seed[s][ref][key]]
                for key in ("valid", "rounds", "nfe")}
        rows.append(summary_row(label, "all", n, both, base, env))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=12, help="held-out prompts per task")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                    help="held-out generator seed offsets")
    ap.add_argument("--out", type=Path, default=RESULTS / "lopa_checked.csv")
    args = ap.parse_args(argv)
    rows = run(args.n, args.seeds)
    write_rows(rows, args.out)
    for r in rows:
        print(f"{r['config']:24s} seed {r['seed']!s:4s} acc {r['accuracy']:6.2f} rounds "
              f"{r['rounds']:5.2f} NFE {r['nfe']:5.2f} vs thr {r['vs_threshold']:.3f}"
              f"{'  target met' if r['target_met'] else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
