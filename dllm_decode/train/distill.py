"""Distil the exact Waiting Line oracle into a tiny LLaDA / Dream / SDAR-style model.

The test-bed recipe (``dllm-decode train testbed``), after ``shared/research/
testbed-feasibility.md``: the oracle's word-level vocabulary (one token per name, so copying is
a one-token pointer), soft targets (the oracle's exact conditional of every masked answer
position given the visible canvas), and three masking modes per row:

* ``suffix``: every answer position from a random start on is masked (the earlier ones are
  visible): the semi-autoregressive states that break the copy plateau;
* ``structure``: list symbols and EOS visible, a random subset of the names masked: the states
  one-token-per-step decoding actually visits (structure tokens are certain, so they commit
  first), where a model must learn which names are already used;
* ``iid``: every answer position masked independently with a rate ``t ~ U(0, 1)``.

``eos_cut_frac`` of the rows (any mode) lose every position after the answer's first EOS (keys
hidden, no loss there): the shorter canvases that EoTP truncation leaves (Learn2PD, arXiv
2509.25188), which a model trained only on full-length canvases has never seen.

Loss (``train/distill_objective.py``): cross-entropy to the soft targets over masked answer
positions (= KL to the oracle plus its entropy), optionally plus the log-probability error and
rank terms (``--log-error-weight``, ``--rank-error-weight``). Block-causal (SDAR-style) models
see the answer region in their own blocks; the trainer feeds the whole canvas and the model's
block-causal mask does the rest, which matches inference exactly when earlier blocks are
complete, so ``suffix`` rows are aligned to blocks.

Everything random is a function of ``(seed, step)``, so ``--resume`` continues exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import random
import shlex
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from dllm_decode.models.base import DecoderLM
from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.train.config import TrainConfig, build_tiny_model, parse_dataclass, untie
from dllm_decode.train.csvlog import append_row, truncate_rows
from dllm_decode.train.distill_config import DistillConfig, saved_config
from dllm_decode.train.distill_objective import distill_loss
from dllm_decode.train.ema import WeightAverage
from dllm_decode.train.grow import grow_into
from dllm_decode.train.onpolicy import onpolicy_rows
from dllm_decode.train.state import LEGACY_FILE, STATE_FILE, load_state, save_state, state_path
from dllm_decode.train.testbed import (
    TESTBED_GEN_LENGTH,
    draw_training_examples,
    waiting_line_oracle,
)

LOG_COLUMNS = ("step", "loss", "kl", "lr", "wall_s")


def lr_at(step: int, cfg: DistillConfig) -> float:
    """Linear warm-up, then cosine decay to ``lr * min_lr_ratio``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 *
                     (1 + math.cos(math.pi * progress)))


def build_student(cfg: DistillConfig, oracle: WaitingLineOracle) -> DecoderLM:
    """A fresh model of ``cfg.family`` over the oracle's vocabulary."""
    tc = TrainConfig(family=cfg.family, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                     intermediate=cfg.intermediate, block_size=cfg.block_size, seed=cfg.seed,
                     tie_embeddings=cfg.tie_embeddings)
    return build_tiny_model(tc, oracle.vocab_size, oracle.mask_token_id,
                            oracle.eos_token_ids[0], oracle.pad_token_id)


def answer_masks(answers: Tensor, first_name: int, cfg: DistillConfig,
                 gen: torch.Generator) -> Tensor:
    """Masked positions ``[B, G]`` (bool, at least one per row) of the three modes."""
    b, g = answers.shape
    mode = torch.rand(b, generator=gen)
    rate = torch.rand(b, 1, generator=gen)
    draw = torch.rand(b, g, generator=gen)
    iid = draw < rate
    block = cfg.block_size if cfg.family == "sdar" else 1
    start = torch.randint(0, g, (b, 1), generator=gen) // block * block
    suffix = torch.arange(g)[None] >= start
    structure = iid & (answers >= first_name)
    suffix_rows = (mode < cfg.suffix_frac)[:, None]
    structure_rows = ((mode >= cfg.suffix_frac) &
                      (mode < cfg.suffix_frac + cfg.structure_frac))[:, None]
    masked = torch.where(suffix_rows, suffix, torch.where(structure_rows, structure, iid))
    empty = ~masked.any(-1)
    pick = torch.randint(0, g, (b,), generator=gen)
    masked[empty, pick[empty]] = True
    return masked


def make_batch(cfg: DistillConfig, oracle: WaitingLineOracle, step: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """``(tokens [B, L], valid [B, L], masked [B, G], targets [B, G, V] float32, P)``.

    During the first ``cfg.warm_steps`` steps every row is a ``suffix`` row (a semi-
    autoregressive warm-up: clean left context is what forms the copying circuit).
    """
    g = TESTBED_GEN_LENGTH
    if step < cfg.scramble_steps:
        return scramble_batch(cfg, oracle, step)
    if step < cfg.warm_steps:
        cfg = dataclasses.replace(cfg, suffix_frac=1.0, structure_frac=0.0)
    examples = draw_training_examples(cfg.seed, step, cfg.batch_size, cfg.task_weights())
    rng = random.Random(f"{cfg.seed}:{step}:answer")
    gen = torch.Generator().manual_seed((cfg.seed << 32) + step)
    prompts = [oracle.encode_prompt(task, rec) for task, rec in examples]
    tables = [oracle.answer_table(p, g) for p in prompts]
    answers = torch.stack([t[rng.randrange(len(t))] for t in tables])
    masked = answer_masks(answers, oracle._first_name, cfg, gen)
    region = torch.where(masked, oracle.mask_token_id, answers)
    targets = torch.cat([oracle.marginals(t, r[None]) for t, r in zip(tables, region,
                                                                      strict=True)]).float()
    width = max(len(p) for p in prompts) + rng.randint(0, cfg.max_pad)
    if cfg.family == "sdar":  # answers start on a block boundary, as the sampler aligns them
        width += (-width) % cfg.block_size
    b = len(prompts)
    tokens = torch.full((b, width + g), oracle.pad_token_id, dtype=torch.long)
    valid = torch.zeros(b, width + g, dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):width] = torch.tensor(p)
        valid[i, width - len(p):] = True
    tokens[:, width:] = region
    if cfg.eos_cut_frac:  # canvases cut after the answer's first EOS, as EoTP leaves them
        pos = torch.arange(g)
        first = torch.where(answers == oracle.eos_token_ids[0], pos, g).min(1).values
        cut = torch.rand(b, generator=gen) < cfg.eos_cut_frac
        dead = (pos[None] > first[:, None]) & cut[:, None]
        valid[:, width:] &= ~dead
        masked = masked & ~dead
    return tokens, valid, masked, targets, width


def scramble_batch(cfg: DistillConfig, oracle: WaitingLineOracle, step: int
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """A scrambled-copy warm-up batch: ``<copy> x1 .. xn <answer>`` -> ``x1 .. xn <eos>..``
    with random name tokens and no list symbols (nothing in the copied span is predictable
    from its position, so the only way down is to copy; see ``train/README.md``)."""
    g = TESTBED_GEN_LENGTH
    gen = torch.Generator().manual_seed((cfg.seed << 32) + step)
    b, first = cfg.batch_size, oracle._first_name
    lengths = (torch.full((b,), cfg.scramble_items) if step < cfg.scramble_fixed else
               torch.randint(3, g - 3, (b,), generator=gen))
    names = torch.randint(first, oracle.vocab_size, (b, g), generator=gen)
    keep = torch.arange(g)[None] < lengths[:, None]
    answers = torch.where(keep, names, oracle.eos_token_ids[0])
    width = g
    tokens = torch.full((b, width + g), oracle.pad_token_id, dtype=torch.long)
    valid = torch.zeros(b, width + g, dtype=torch.bool)
    copy_id, answer_id = oracle.token_id["<copy>"], oracle.token_id["<answer>"]
    for i, n in enumerate(lengths.tolist()):
        tokens[i, width - n - 2:width] = torch.tensor([copy_id, *answers[i, :n].tolist(),
                                                       answer_id])
        valid[i, width - n - 2:] = True
    masked = answer_masks(answers, first, cfg, gen)
    tokens[:, width:] = torch.where(masked, oracle.mask_token_id, answers)
    targets = F.one_hot(answers, oracle.vocab_size).float()
    return tokens, valid, masked, targets, width


def command_line(cfg: DistillConfig) -> str:
    """``dllm-decode train testbed ...`` with every non-default field."""
    default = DistillConfig()
    flags: list[str] = []
    for f in dataclasses.fields(DistillConfig):
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name) and f.name not in ("family", "out", "steps"):
            continue
        flag = "--" + f.name.replace("_", "-")
        flags += ([flag] if value else []) if isinstance(value, bool) else [flag, str(value)]
    return "dllm-decode train testbed " + shlex.join(flags)


def distill(cfg: DistillConfig) -> dict[str, Any]:
    """Run or resume a distillation run; returns the ``run.json`` summary."""
    from dllm_decode.train.testbed_eval import EVEN_SPLIT, evaluate_testbed, export_testbed

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / STATE_FILE
    for existing in (ckpt, out / LEGACY_FILE):
        if existing.exists() and not cfg.resume:
            raise FileExistsError(f"{existing} exists: pass --resume to continue, or a new --out")
    oracle = waiting_line_oracle()
    model = build_student(cfg, oracle)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(0.9, 0.98))
    start, wall_before = 0, 0.0
    state: dict[str, Any] = {}
    if cfg.resume and state_path(out).exists():
        state = load_state(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, wall_before = state["step"], state["wall_s"]
        for name in ("loss.csv", "eval.csv"):  # drop rows logged after the checkpoint
            truncate_rows(out / name, start)
    elif cfg.grow_from:
        grow_into(model, _grow_weights(cfg))
    ema = WeightAverage(model, cfg.ema) if cfg.ema else None
    if ema is not None and state.get("ema") is not None:  # resumed
        ema.load_state_dict(state["ema"])
    averaged = ema.applied if ema is not None else contextlib.nullcontext
    (out / "distill_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    params = sum(p.numel() for p in model.parameters())
    print(f"[testbed] {cfg.family}: {params / 1e6:.2f}M parameters, vocab "
          f"{oracle.vocab_size}, steps {start}..{cfg.steps}", flush=True)
    t0 = time.perf_counter()
    window: list[tuple[float, float]] = []
    model.train()
    for step in range(start, cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        tokens, valid, masked, targets, p = make_batch(cfg, oracle, step)
        if cfg.onpolicy_frac and step >= cfg.scramble_steps:  # the student's own states
            tokens, valid, masked, targets = onpolicy_rows(
                model, oracle, cfg.onpolicy_frac, (cfg.seed << 32) + step, tokens, valid,
                masked, targets, p, per_step=cfg.onpolicy_k, hard=cfg.onpolicy_hard)
        loss, kl = distill_loss(model, tokens, valid, masked, targets, p, cfg.log_error_weight,
                                cfg.rank_error_weight, cfg.rank_margin)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if ema is not None:
            ema.update(model)
        window.append((float(loss.detach()), float(kl.detach())))
        done = step + 1
        wall = wall_before + time.perf_counter() - t0
        if done % cfg.log_every == 0:
            row = {"step": done, "loss": round(sum(w[0] for w in window) / len(window), 5),
                   "kl": round(sum(w[1] for w in window) / len(window), 5),
                   "lr": f"{lr_at(step, cfg):.3e}", "wall_s": round(wall, 1)}
            append_row(out / "loss.csv", row, LOG_COLUMNS)
            print(f"[testbed] {json.dumps(row)}", flush=True)
            window = []
        if done % cfg.ckpt_every == 0 or done == cfg.steps:
            save_state(ckpt, {"model": model.state_dict(), "opt": opt.state_dict(),
                              "step": done, "wall_s": wall, "config": dataclasses.asdict(cfg),
                              "ema": None if ema is None else ema.state_dict(),
                              "eval_schedule": EVEN_SPLIT})
        if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
            model.eval()
            with averaged(model):
                scores = evaluate_testbed(model, oracle, cfg.eval_size, seed=cfg.seed)
            model.train()
            append_row(out / "eval.csv", {"step": done, "wall_s": round(wall, 1), **scores})
            print(f"[eval] step {done} {json.dumps(scores)}", flush=True)
    wall = wall_before + time.perf_counter() - t0
    model.eval()
    with averaged(model):
        export_testbed(untie(model), oracle, out / "model")
    return _write_run_summary(out, cfg, parameters=params, vocab_size=oracle.vocab_size,
                              steps_done=cfg.steps, wall_s=wall,
                              threads=torch.get_num_threads(), eval_schedule=EVEN_SPLIT)


def _write_run_summary(run_dir: Path, cfg: DistillConfig, *, parameters: int, vocab_size: int,
                       steps_done: int, wall_s: float, threads: int,
                       eval_schedule: str | None) -> dict[str, Any]:
    """Write ``run_dir / "run.json"`` (the one place its fields are named; ``eval_schedule``
    omitted when unknown) and return it."""
    summary: dict[str, Any] = {
        "command": command_line(cfg), "config": dataclasses.asdict(cfg),
        "parameters": parameters, "vocab_size": vocab_size, "steps_done": steps_done,
        "wall_s": round(wall_s, 1), "threads": threads}
    if eval_schedule is not None:
        summary["eval_schedule"] = eval_schedule
    summary["versions"] = {"torch": torch.__version__}
    (run_dir / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def averaged_weights(state: dict[str, Any]) -> dict[str, Tensor]:
    """A training checkpoint's weights with the run's weight average (``ema``) in place of the
    last iterate where it has one: the weights the run evaluates and exports."""
    weights = dict(state["model"])
    if state.get("ema") is not None:
        weights.update(state["ema"])
    return weights


def _grow_weights(cfg: DistillConfig) -> dict[str, Tensor]:
    """The weights a ``grow_from`` run starts from: the training state's last iterate, or with
    ``grow_average`` its weight average over it; or a model directory's (exported) weights."""
    if not Path(cfg.grow_from).is_file():  # a model directory or bundled name
        from dllm_decode.models.loading import load_model

        return load_model(cfg.grow_from, dtype=torch.float32).state_dict()
    source = load_state(cfg.grow_from)
    if not cfg.grow_average:
        return source["model"]
    if source.get("ema") is None:
        raise ValueError(f"grow_average: {cfg.grow_from} holds no weight average (train it "
                         "with --ema, or drop --grow-average)")
    return averaged_weights(source)


def evaluated_student(state: dict[str, Any], oracle: WaitingLineOracle) -> DecoderLM:
    """The model a training checkpoint evaluates and exports (``averaged_weights``)."""
    model = build_student(saved_config(state["config"]), oracle)
    model.load_state_dict(averaged_weights(state))
    return model


def export_weights(run_dir: str | Path, path: str | Path) -> None:
    """Save a run's evaluated weights (``evaluated_student``) in fp16, weights only
    (``{model, step, wall_s, config}``, a ``train.state`` file): equal to the exported model
    and loadable by ``--grow-from``."""
    state = load_state(state_path(Path(run_dir)))
    model = evaluated_student(state, waiting_line_oracle())
    save_state(path, {"model": {k: v.half() for k, v in model.state_dict().items()},
                      "step": state["step"], "wall_s": state["wall_s"],
                      "config": state["config"]})


def export_checkpoint(run_dir: str | Path, directory: str | Path) -> dict[str, Any]:
    """Export a run's latest ``checkpoint.safetensors`` (finished or not) as a checkpoint directory,
    and write ``run.json`` for it; returns that summary.

    ``eval_schedule`` (the schedule the run's logged held-out validity was measured on) comes
    from the checkpoint, or else from the ``run.json`` already there; a run that records
    neither (its checkpoints predate the key) gets none, so model cards keep treating it as
    evaluated on its family's own grid."""
    from dllm_decode.train.testbed_eval import export_testbed

    run_dir = Path(run_dir)
    state = load_state(state_path(run_dir))
    previous = run_dir / "run.json"
    schedule = state.get("eval_schedule") or (
        json.loads(previous.read_text()).get("eval_schedule") if previous.exists() else None)
    cfg, oracle = saved_config(state["config"]), waiting_line_oracle()
    model = evaluated_student(state, oracle)
    export_testbed(untie(model).eval(), oracle, directory)
    return _write_run_summary(run_dir, cfg,
                              parameters=sum(p.numel() for p in untie(model).parameters()),
                              vocab_size=oracle.vocab_size, steps_done=state["step"],
                              wall_s=state["wall_s"], threads=cfg.threads,
                              eval_schedule=schedule)


def parse_args(argv: list[str] | None) -> DistillConfig:
    parser = argparse.ArgumentParser(
        prog="dllm-decode train testbed",
        description="Distil the exact Waiting Line oracle into a tiny diffusion LM.")
    return parse_dataclass(DistillConfig, parser, argv)


def distill_main(argv: list[str] | None = None) -> int:
    """CLI entry: ``dllm-decode train testbed --family llada --out DIR [--resume]``."""
    distill(parse_args(argv))
    return 0
