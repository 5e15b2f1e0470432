"""``dllm-decode train learn2pd``: EGP trajectories from prompts, then a Learn2PD filter.

Bao, Chen, Xu, Shang, arXiv 2509.25188. Prompts come from a JSONL of token-id lists or from the
clean-room ParallelBench generators (train split) through the model directory's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dllm_decode.policies.learn2pd import (
    DEFAULT_ACCEPT_THRES,
    FilterCard,
    ModelFingerprint,
    save_filter,
)
from dllm_decode.train.learn2pd import (
    PAPER_ITERS,
    PAPER_LR,
    L2PSamples,
    default_feature,
    generate_egp_samples,
    train_filter,
)


def read_prompts(path: str | Path) -> list[list[int]]:
    """JSONL: each line a list of token ids, or an object with ``prompt_ids`` / ``input_ids``."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if isinstance(row, dict):
            row = row.get("prompt_ids", row.get("input_ids"))
        if not isinstance(row, list) or not row or not all(isinstance(t, int) for t in row):
            raise ValueError(f"{path}:{n}: expected a non-empty list of token ids")
        out.append(row)
    return out


def task_prompts(model_dir: Path, n: int, seed: int = 0, tasks: Sequence[str] | None = None,
                 icl_examples: int = 1) -> list[list[int]]:
    """``n`` prompts from generated ParallelBench tasks (train split), encoded with the
    tokenizer in ``model_dir`` (round-robin over ``tasks``, default every generator task), with
    ``icl_examples`` demonstrations each (0 for the zero-shot bundled tiny checkpoints).

    A word-level test-bed checkpoint (``waiting_line_vocab.json`` beside it) gets its own
    prompt format instead: test-bed records (name pool, lists of 3-5, train split) encoded by
    its codec (default tasks: the nine it was trained on; ``icl_examples`` does not apply).
    """
    from dllm_decode.train.testbed import codec_for

    codec_tb = codec_for(model_dir)
    if codec_tb is not None:
        return _testbed_prompts(codec_tb, n, seed, tasks)
    try:
        from dllm_decode.eval.parallelbench.codec import TokenizerCodec
        from dllm_decode.eval.parallelbench.generate import TASKS, generate_task, split_seed
    except ImportError as err:
        raise ValueError(f"--task-generator needs dllm_decode.eval.parallelbench: {err}") from None
    if not (model_dir / "tokenizer.json").is_file():
        raise ValueError(f"--task-generator needs a tokenizer.json in {model_dir}; "
                         "pass --prompts FILE instead")
    from dllm_decode.tokenizer import load_tokenizer

    codec = TokenizerCodec(load_tokenizer(model_dir))
    return _round_robin(
        list(tasks or TASKS), n, codec.encode,
        lambda t, per: generate_task(t, per, split_seed(t, "train") + seed, split="train",
                                     icl_examples=icl_examples))


def _round_robin(names: Sequence[str], n: int, encode: Callable[[str, Any], list[int]],
                 draw: Callable[[str, int], list[Any]]) -> list[list[int]]:
    """``n`` prompts ``encode(task, record)``, taken round-robin over ``names`` from
    ``draw(task, per)`` (``per`` records drawn per task)."""
    per = -(-n // len(names))
    records = {t: draw(t, per) for t in names}
    order = [(t, i) for i in range(per) for t in names][:n]
    return [encode(t, records[t][i]) for t, i in order]


def _testbed_prompts(codec: Any, n: int, seed: int, tasks: Sequence[str] | None
                     ) -> list[list[int]]:
    """``n`` word-level prompts, round-robin over test-bed ``tasks`` (train split)."""
    from dllm_decode.eval.parallelbench.generate import split_seed
    from dllm_decode.train.testbed import TESTBED_TASKS, waiting_line_records

    names = [t.removeprefix("waiting_line/") for t in (tasks or TESTBED_TASKS)]
    unknown = sorted(set(names) - set(TESTBED_TASKS))
    if unknown:
        raise ValueError(f"test-bed checkpoint: unknown task(s) {unknown}; "
                         f"allowed: {list(TESTBED_TASKS)}")
    return _round_robin(
        names, n, codec.encode_prompt,
        lambda t, per: waiting_line_records(t, per, split_seed(f"waiting_line/{t}", "train")
                                            + seed, split="train"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dllm-decode train learn2pd``."""
    a = parser.add_argument
    a("--model", required=True, help="model directory or bundled name")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help="JSONL of token-id lists (or {prompt_ids: [...]})")
    src.add_argument("--task-generator", action="store_true",
                     help="generated ParallelBench tasks (train split; needs tokenizer.json)")
    src.add_argument("--samples", help="reuse EGP samples saved by an earlier run")
    a("--tasks", nargs="*", default=None, help="task names for --task-generator")
    a("--n-prompts", type=int, default=None, help="cap on the number of prompts")
    a("--icl-examples", type=int, default=1,
      help="demonstrations per --task-generator prompt (bundled tiny checkpoints: 0)")
    a("--gen-length", type=int, default=256)
    a("--block-length", type=int, default=32)
    a("--steps", type=int, default=None, help="reference decode steps (default: gen length)")
    a("--schedule", choices=("llada", "dream"), default=None,
      help="reference budget rule (default: the family's; llada: an even split per step)")
    a("--feature", default=None, help="llada_prob_all | dream_negent_masked (default: family)")
    a("--iters", type=int, default=PAPER_ITERS)
    a("--lr", type=float, default=PAPER_LR)
    a("--activation", default="relu")
    a("--accept-thres", type=float, default=DEFAULT_ACCEPT_THRES)
    a("--batch-size", type=int, default=8)
    a("--seed", type=int, default=0)
    a("--save-samples", default=None, help="also write the EGP samples here (safetensors)")
    a("--out", required=True, help="output directory")


def run(args: argparse.Namespace) -> int:
    """Generate (or load) EGP samples, train, save ``learn2pd_k{K}`` + its sidecar in ``--out``."""
    from dllm_decode.models.loading import load_model, resolve_path

    directory = resolve_path(args.model)
    model = load_model(directory)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    feature = args.feature or default_feature(model)
    k = args.block_length
    t0 = time.perf_counter()
    if args.samples:
        samples, stats = L2PSamples.load(args.samples), {"samples_from": args.samples}
    else:
        prompts = (read_prompts(args.prompts) if args.prompts else
                   task_prompts(directory, args.n_prompts or 64, args.seed, args.tasks,
                                args.icl_examples))
        prompts = prompts[:args.n_prompts] if args.n_prompts else prompts
        fits = [p for p in prompts if len(p) + args.gen_length <= model.max_length]
        if not fits:
            raise ValueError(f"no prompt fits the model's max length {model.max_length} with "
                             f"gen length {args.gen_length}")
        samples, stats = generate_egp_samples(
            model, fits, gen_length=args.gen_length, block_length=k, steps=args.steps,
            feature=feature, batch_size=args.batch_size, schedule=args.schedule)
        stats["skipped_too_long"] = len(prompts) - len(fits)
        if args.save_samples:
            samples.save(args.save_samples)
    stats["data_seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps({"data": stats}), file=sys.stderr)
    t1 = time.perf_counter()
    module, report = train_filter(samples, iters=args.iters, lr=args.lr, seed=args.seed,
                                  activation=args.activation,
                                  log=lambda s: print(s, file=sys.stderr))
    report["seconds"] = round(time.perf_counter() - t1, 2)
    training = {"data": {**stats, "gen_length": args.gen_length, "block_length": k,
                         "steps": args.steps or args.gen_length, "reference": "low_confidence",
                         "schedule": args.schedule or "family default"},
                **report, "command": "dllm-decode train learn2pd "
                + shlex.join(getattr(args, "argv", None) or sys.argv[1:])}
    card = FilterCard(block_length=k, feature=feature, fingerprint=ModelFingerprint.of(model),
                      accept_threshold=args.accept_thres, activation=args.activation,
                      model_name=directory.name, training=training)
    path = save_filter(module, card, out)
    final = report["final"]
    print(json.dumps({"filter": str(path), "samples": len(samples),
                      "val_false_positive@0.9": final["validation"].get("false_positive"),
                      "test": final["test"]}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dllm-decode train learn2pd",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def train_learn2pd_main(argv: Sequence[str] | None = None) -> int:
    """CLI entry (``dllm-decode train learn2pd ...``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return run(args)


__all__ = ["add_arguments", "build_parser", "read_prompts", "run", "task_prompts",
           "train_learn2pd_main"]


if __name__ == "__main__":
    raise SystemExit(train_learn2pd_main())
