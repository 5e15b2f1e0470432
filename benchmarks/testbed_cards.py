"""Model cards of the 2026-family test-bed checkpoints (``testbed-llada2``, ``testbed-gemma``).

Each card states the architecture (from the checkpoint's ``config.json``), the exact training
command of every stage with its steps, CPU and wall time (``run.json``), the data, the held-out
evaluation and the training curves. The held-out tables:

* LLaDA2 (mask) students: ``testbed_parallel.table`` (``low_confidence`` at k = 1 / 4 / 8
  against the exact oracle, the test bed's targets), and the family default (``llada2``) and
  ``llada21`` (quality, speed) at one token per step;
* the DiffusionGemma (uniform) student: ``gemma_renoise`` as released (48 steps, early stop) and
  at budgets of N = 16 / 8 / 4 / 2 forwards without the early stop, mean of ``--seeds``
  sampler seeds.

    OMP_NUM_THREADS=1 python benchmarks/testbed_cards.py --card testbed-llada2 \\
        benchmarks/training/testbed-llada2 --n 50
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from testbed_parallel import markdown as parallel_markdown  # noqa: E402
from testbed_parallel import table as parallel_table  # noqa: E402

from dllm_decode.bench import write_rows  # noqa: E402
from dllm_decode.train.testbed import RANDOM_TASKS, TESTBED_TASKS, waiting_line_oracle  # noqa: E402
from dllm_decode.train.testbed_eval import decode_tasks  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PROMPT = ("<copy> [ Amelia Abbott , Bruno Adler , Carl Bell ] <fill> <fill> <fill> <fill> "
          "<answer>")


def preset_rows(name: str, model: Any, n: int, seed: int, seeds: int) -> list[dict[str, Any]]:
    """Valid answers % per task of the family default and its alternatives (module doc)."""
    oracle = waiting_line_oracle()
    uniform = getattr(model, "noise_kind", "mask") == "uniform"
    settings: list[tuple[str, str | None, dict[str, Any]]]
    if uniform:
        settings = [("family default: gemma_renoise (48 steps, early stop)", None,
                     {"steps": None})]
        settings += [(f"gemma_renoise, N = {b} forwards, no early stop", "gemma_renoise",
                      {"steps": b, "early_stop": False}) for b in (16, 8, 4, 2)]
    else:
        settings = [("family default: llada2 (p > 0.95, else 1 per step)", None,
                     {"steps": None}),
                    ("llada21 quality, 1 per step", "llada21", {"mode": "quality"}),
                    ("llada21 speed, 1 per step", "llada21", {"mode": "speed"})]
    out = []
    for label, policy, params in settings:
        runs = [decode_tasks(model, oracle, n, seed=seed, policy=policy,
                             sample_seed=s if uniform else None, **params)
                for s in range(seeds if uniform else 1)]
        row: dict[str, Any] = {"model": name, "decoder": label, "n": n, "seed": seed}
        for task in TESTBED_TASKS:
            row[task] = round(sum(100 * sum(r["valid"] for r in run[task]) / n
                                  for run in runs) / len(runs), 1)
        row["nfe"] = round(sum(sum(r["nfe"] for r in run[t]) / n for run in runs
                               for t in TESTBED_TASKS) / (len(runs) * len(TESTBED_TASKS)), 2)
        out.append(row)
    return out


def preset_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| decoder | " + " | ".join(TESTBED_TASKS) + " | random tasks | NFE |",
             "|---|" + "---|" * (len(TESTBED_TASKS) + 2)]
    for r in rows:
        rnd = sum(r[t] for t in RANDOM_TASKS) / len(RANDOM_TASKS)
        lines.append(f"| {r['decoder']} | " + " | ".join(f"{r[t]:.0f}" for t in TESTBED_TASKS)
                     + f" | {rnd:.1f} | {r['nfe']:.2f} |")
    return "\n".join(lines)


def architecture(config: dict[str, Any]) -> str:
    if "text_config" in config:
        t = config["text_config"]
        kinds = ", ".join(t["layer_types"])
        return (f"DiffusionGemma (`DiffusionGemmaForBlockDiffusion`): {t['num_hidden_layers']} "
                f"layers ({kinds}; sliding window {t['sliding_window']}), hidden "
                f"{t['hidden_size']}, {t['num_attention_heads']} heads (head dim "
                f"{t['head_dim']}, full layer {t['global_head_dim']} with "
                f"{t['num_global_key_value_heads']} K = V head), dense GeGLU MLP "
                f"{t['intermediate_size']} beside {t['num_experts']} experts of "
                f"{t['moe_intermediate_size']} (top-{t['top_k_experts']}), self-conditioning, "
                f"tied head, soft-cap 30; one canvas of {config['canvas_length']}; vocabulary "
                f"{t['vocab_size']}")
    return (f"LLaDA2.x (`LLaDA2MoeModelLM`): {config['num_hidden_layers']} layers (the first "
            f"dense, MLP {config['intermediate_size']}; then {config['num_experts']} experts of "
            f"{config['moe_intermediate_size']}, top-{config['num_experts_per_tok']} in "
            f"{config['topk_group']} of {config['n_group']} groups, sigmoid router with expert "
            f"bias, scaling {config['routed_scaling_factor']}, one shared expert), hidden "
            f"{config['hidden_size']}, {config['num_attention_heads']} heads / "
            f"{config['num_key_value_heads']} K/V heads, q/k norms, partial RoPE "
            f"{config['partial_rotary_factor']}, block-causal attention in blocks of "
            f"{config['block_size']}; vocabulary {config['vocab_size']}")


def curves(run_dirs: list[Path]) -> list[str]:
    out: list[str] = []
    for i, d in enumerate(run_dirs):
        loss = (d / "loss.csv").read_text().splitlines()
        picked = [loss[0]] + loss[1::max(1, len(loss) // 14)]
        if picked[-1] != loss[-1]:
            picked.append(loss[-1])
        evals = (d / "eval.csv").read_text().splitlines()
        out += [f"Stage {i + 1}: loss and KL to the targets:", "", "```", *picked, "```", "",
                f"Stage {i + 1}: held-out validity during training:", "", "```", *evals,
                "```", ""]
    return out


def card(name: str, directory: Path, run_dirs: list[Path], parallel: str,
         presets: str) -> str:
    config = json.loads((directory / "config.json").read_text())
    runs = [json.loads((d / "run.json").read_text()) for d in run_dirs]
    uniform = "text_config" in config
    stages = [f"{i + 1}. `{r['command']}` ({r['steps_done']} steps"
              + (f" of its {r['config']['steps']}-step schedule: stopped there, the next stage "
                 "grew from this state" if r["steps_done"] < r["config"]["steps"] else "")
              + ", " + (f"{r['cpu_s'] / 60:.0f} CPU min, " if "cpu_s" in r else "")
              + f"{r['wall_s'] / 60:.0f} wall min)" for i, r in enumerate(runs)]
    cpu = sum(r.get("cpu_s", r["wall_s"]) for r in runs) / 60
    params = runs[-1]["parameters"] / 1e6
    recipe = ("DiffusionGemma's recipe (`dllm_decode/train/uniform_objective.py`): uniform "
              "random-token corruption at a level t ~ U(0.001, 1), the flat cross-entropy over "
              "the whole canvas to the exact posterior of the clean answer, two-pass "
              "self-conditioning (probability 0.5), the encoder's causal-LM loss on the clean "
              "sequence" + (f"; on {nn:.0%} of the rows the corruption hits name positions "
                            "only (list symbols and EOS clean, `--name-noise-frac`: the states "
                            "the sampler visits once it has accepted the list symbols)"
                            if (nn := runs[-1]["config"].get("name_noise_frac", 0.0)) else "")
              + (f"; on {op:.0%} of the rows the canvases the student's own `gemma_renoise` "
                 "decode of training prompts fed it, the exact posterior as target (on-policy, "
                 "`dllm_decode/train/uniform_onpolicy.py`)"
                 if (op := runs[-1]["config"].get("onpolicy_frac", 0.0)) else "")
              if uniform else
              "LLaDA2.1's mixture (`dllm_decode/train/edit_objective.py`): the mask stream "
              "(soft targets: the oracle's exact conditionals) plus, unless `--no-editing`, the "
              "editing stream (visible answer tokens replaced by random tokens, every position "
              "supervised toward the exact posterior of the clean answer)"
              + (f", and on {mtf:.0%} of the rows the student's own parallel drafts (MTF)"
                 if (mtf := runs[-1]["config"].get("mtf_frac", 0.0)) else ""))
    if not uniform and runs[-1]["config"].get("no_editing"):
        recipe = ("LLaDA2.0's mask objective alone (`--no-editing`: soft targets, the oracle's "
                  "exact conditionals; no corruption, no drafts)")
    use = (f"from dllm_decode import DiffusionSampler, generate_text, load_model, "
           f"load_tokenizer\n\nmodel, tok = load_model(\"{name}\"), load_tokenizer(\"{name}\")\n"
           f"sampler = DiffusionSampler(model, gen_length=16)  # the family default preset\n"
           f"print(generate_text(sampler, tok, \"{PROMPT}\").texts[0])\n"
           f"# [\"Amelia Abbott\", \"Bruno Adler\", \"Carl Bell\"]")
    return "\n".join([
        f"# {name}", "",
        f"A tiny {'uniform-noise' if uniform else 'masked block-diffusion'} model of the "
        f"{'DiffusionGemma' if uniform else 'LLaDA2.x'} architecture, in its released config "
        "and tensor format, distilled from the exact Waiting Line oracle on the word-level test "
        "bed (`dllm_decode.train.testbed`: one token per name, 500 names, lists of 3-5, answers "
        "of 16 positions). A task model for measuring decoding methods, not a language model: "
        f"prompts are the oracle's format, e.g. `{PROMPT}`.", "",
        "```python", use, "```", "",
        f"`dllm-decode generate \"{PROMPT}\" --model {name}` prints the same (answers of 16 "
        "positions by default for test-bed checkpoints).", "",
        f"* architecture: {architecture(config)}; {params:.2f}M parameters, fp16 weights",
        f"* data: the nine test-bed tasks drawn fresh every step from the training split "
        f"(held-out evaluation: the test split), random tasks weighted "
        f"{runs[-1]['config']['random_weight']}x; {recipe}",
        f"* training: {sum(r['steps_done'] for r in runs)} steps, batch "
        f"{runs[-1]['config']['batch_size']}, {cpu:.0f} CPU minutes on one thread of a shared "
        "2-core machine (wall time longer: the machine was shared); exact commands:", "",
        *stages, "",
        "## Held-out results (test split, greedy unless stated)", "", parallel, "", presets, "",
        "## Training curves", "", *curves(run_dirs)])


def main(argv: list[str] | None = None) -> int:
    from dllm_decode import load_model
    from dllm_decode.models.loading import resolve_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--card", nargs=2, action="append", required=True, metavar=("MODEL", "RUNS"),
                    help="MODEL (bundled name or directory) and its training run dirs RUNS "
                         "(comma-separated, oldest stage first)")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=3, help="sampler seeds (uniform models)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for name, runs in args.card:
        model = load_model(name)
        uniform = getattr(model, "noise_kind", "mask") == "uniform"
        parallel = ""
        if not uniform:
            rows = parallel_table([name], args.n, args.seed)
            parallel = ("`python benchmarks/testbed_parallel.py` (50 prompts per task, "
                        "`low_confidence`, exactly k tokens per step; the oracle columns decode "
                        "the same prompts with the exact oracle):\n\n" + parallel_markdown(rows))
        presets = preset_rows(name, model, args.n, args.seed, args.seeds)
        tag = Path(name).name
        write_rows(presets, RESULTS / f"card_{tag}.csv")
        text = ("The family default and its alternatives (valid answers %, mean NFE"
                + (f"; mean of {args.seeds} sampler seeds" if uniform else "") + "):\n\n"
                + preset_markdown(presets))
        directory = resolve_path(name)
        (directory / "README.md").write_text(
            card(name, directory, [Path(d) for d in runs.split(",")], parallel, text) + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
