"""The tiny-model training loop: warm-up + cosine LR, curriculum, resumable run directory.

Run directory (``--out``):

* ``checkpoint.safetensors``: model + optimizer state, step, RNG states, elapsed wall time,
  config (``train.state``: safetensors + JSON, never a pickle);
* ``loss.csv``: step, loss, per-token accuracy (all masked / answer text only), lr, list length;
* ``eval.csv``: held-out (validation split) accuracy with the whole answer masked, and exact
  match of one-token-per-step decoding with the library's ``DiffusionSampler``, per task;
* ``run.json``: the exact command, seed, versions, parameter count, wall time, final metrics;
* ``model/``: the exported checkpoint (``config.json``, ``model.safetensors``, tokenizer, card).

Data and masks are drawn from generators seeded by ``(seed, step)``, so ``--resume`` continues
exactly as an uninterrupted run would (bitwise on the same machine and thread count).
"""

from __future__ import annotations

import json
import math
import platform
import random
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dllm_decode.models.base import DecoderLM
from dllm_decode.tokenizer import load_tokenizer
from dllm_decode.train.config import TrainConfig, build_tiny_model, parse_args
from dllm_decode.train.csvlog import append_row, truncate_rows
from dllm_decode.train.data import TaskData, max_items_at
from dllm_decode.train.evaluate import evaluate, export_model
from dllm_decode.train.objectives import diffusion_loss, warmup_loss
from dllm_decode.train.state import LEGACY_FILE, STATE_FILE, load_state, save_state, state_path

LOSS_COLUMNS = ("step", "loss", "acc", "acc_content", "lr", "max_items", "wall_s")
#: config fields that may change when resuming (everything else must match the checkpoint)
RESUMABLE_CHANGES = frozenset({"out", "resume", "steps", "threads", "device", "log_every",
                               "eval_every", "eval_size", "ckpt_every", "export",
                               "export_dtype"})


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over ``cfg.warmup`` steps, then cosine decay to ``lr * min_lr_ratio``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def step_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of one step's masks (a function of ``(seed, step)`` only)."""
    return torch.Generator().manual_seed((seed << 32) + step)


def command_line(cfg: TrainConfig) -> str:
    """``dllm-decode train tiny ...`` with every field that differs from its default."""
    default = TrainConfig()
    flags: list[str] = []
    for name in TrainConfig.field_names():
        value = getattr(cfg, name)
        if value == getattr(default, name) and name not in ("family", "out", "steps", "seed"):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags += [flag] if value else []
        else:
            flags += [flag, str(value)]
    return "dllm-decode train tiny " + shlex.join(flags)


def make_optimizer(model: DecoderLM, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norms and biases)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def save_checkpoint(path: Path, model: DecoderLM, opt: torch.optim.Optimizer, step: int,
                    cfg: TrainConfig, wall_s: float, window: dict[str, float]) -> None:
    """Atomically write the resumable state after ``step`` completed steps."""
    state = {
        "model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
        "config": cfg.to_dict(), "wall_s": wall_s, "window": window,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    save_state(path, state)


def _load_checkpoint(path: Path, cfg: TrainConfig, model: DecoderLM,
                     opt: torch.optim.Optimizer) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}")
    state = load_state(path)
    saved = state["config"]
    diff = sorted(k for k in TrainConfig.field_names()
                  if k not in RESUMABLE_CHANGES and saved.get(k) != getattr(cfg, k))
    if diff:
        raise ValueError("--resume: the checkpoint was trained with other settings: "
                         + ", ".join(f"{k}={saved.get(k)!r} (now {getattr(cfg, k)!r})"
                                     for k in diff))
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    return state


def _new_window() -> dict[str, float]:
    return {"loss": 0.0, "n": 0, "correct": 0, "masked": 0, "correct_c": 0, "masked_c": 0}


def train(cfg: TrainConfig, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run (or resume) a training run described by ``cfg``; returns the ``run.json`` dict.

    ``cfg.threads`` applies for the duration of the call (the previous setting is restored).
    """
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, argv)
    finally:
        torch.set_num_threads(threads)


def _step_loss(cfg: TrainConfig, model: Any, data: TaskData, warm_data: TaskData, step: int,
               cur_max: int) -> Any:
    """Step ``step``'s batch (the scrambled copy warm-up first, then the curriculum's tasks;
    SDAR rows shifted by a random block offset) and its loss (the block-diffusion warm-up
    loss first, then the masked-diffusion loss)."""
    warm = step < cfg.scramble_steps
    examples = (warm_data.draw(cfg.seed, step, cfg.batch_size, cfg.scramble_items,
                               cfg.scramble_items) if warm else
                data.draw(cfg.seed, step, cfg.batch_size, cfg.min_items, cur_max))
    jitter = random.Random(f"{cfg.seed}:{step}:align").randrange(cfg.block_size) \
        if cfg.family == "sdar" else 0
    scramble = random.Random(f"{cfg.seed}:{step}:scramble") if warm else None
    batch = data.collate(examples, extra_pad=jitter, scramble=scramble).to(cfg.device)
    if step < cfg.bd_warmup_steps:
        return warmup_loss(model, batch, step_generator(cfg.seed, step), cfg.eps,
                           cfg.ar_fraction, block_size=cfg.block_size)
    return diffusion_loss(model, batch, step_generator(cfg.seed, step), cfg.eps,
                          cfg.ar_fraction, semi_ar=cfg.semi_ar, semi_ar_block=cfg.block_size)


def _train(cfg: TrainConfig, argv: Sequence[str] | None) -> dict[str, Any]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / STATE_FILE
    for existing in (ckpt, out / LEGACY_FILE):
        if existing.exists() and not cfg.resume:
            raise FileExistsError(f"{existing} exists: pass --resume to continue, or a new --out")
    tok = load_tokenizer(cfg.tokenizer or None)
    data = TaskData(tok, cfg.task_list, cfg.gen_length, cfg.icl_examples)
    warm_data = TaskData(tok, ["waiting_line/copy"], cfg.gen_length, cfg.icl_examples)
    model = build_tiny_model(cfg, len(tok), tok.mask_token_id, data.eos_id, data.pad_id)
    model.to(cfg.device)
    opt = make_optimizer(model, cfg)
    start, wall_before, window = 0, 0.0, _new_window()
    if cfg.resume:
        state = _load_checkpoint(state_path(out), cfg, model, opt)
        start, wall_before, window = state["step"], state["wall_s"], state["window"]
        truncate_rows(out / "loss.csv", start)
        truncate_rows(out / "eval.csv", start)
    (out / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    eval_set = data.eval_examples(cfg.eval_size, max(cfg.min_items, 3), cfg.max_items,
                                  seed=cfg.seed)
    t0 = time.perf_counter()
    params = sum(p.numel() for p in model.parameters())
    print(f"[train] {cfg.family}: {params / 1e6:.2f}M parameters, vocab {len(tok)}, "
          f"steps {start}..{cfg.steps}, batch {cfg.batch_size}, threads "
          f"{torch.get_num_threads()}", flush=True)

    def wall() -> float:
        return wall_before + time.perf_counter() - t0

    last_eval: dict[str, Any] = {}
    model.train()
    for step in range(start, cfg.steps):
        lr = lr_at(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        cur_max = max_items_at(step, cfg.steps, cfg.min_items, cfg.max_items, cfg.curriculum)
        res = _step_loss(cfg, model, data, warm_data, step, cur_max)
        opt.zero_grad(set_to_none=True)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window["loss"] += float(res.loss.detach())
        window["n"] += 1
        for key, value in (("correct", res.correct), ("masked", res.masked),
                           ("correct_c", res.correct_content), ("masked_c", res.masked_content)):
            window[key] += int(value)
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            row = {"step": done, "loss": round(window["loss"] / window["n"], 5),
                   "acc": round(window["correct"] / max(1, window["masked"]), 5),
                   "acc_content": round(window["correct_c"] / max(1, window["masked_c"]), 5),
                   "lr": f"{lr:.3e}", "max_items": cur_max, "wall_s": round(wall(), 1)}
            append_row(out / "loss.csv", row, LOSS_COLUMNS)
            print(f"[train] step {done} loss {row['loss']} acc {row['acc']} "
                  f"acc_content {row['acc_content']} lr {row['lr']} wall {row['wall_s']}s",
                  flush=True)
            window = _new_window()
        if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
            last_eval = {"step": done, "wall_s": round(wall(), 1)}
            last_eval |= evaluate(model, data, eval_set, cfg)
            append_row(out / "eval.csv", last_eval)
            print(f"[eval] {json.dumps(last_eval)}", flush=True)
            model.train()
        if done % cfg.ckpt_every == 0 or done == cfg.steps:
            save_checkpoint(ckpt, model, opt, done, cfg, wall(), window)

    if not last_eval:  # resumed a run that had already finished its steps
        last_eval = {"step": cfg.steps, "wall_s": round(wall(), 1)}
        last_eval |= evaluate(model, data, eval_set, cfg)
    return _finish(cfg, argv, model, params, len(tok), round(wall(), 1), last_eval)


def _finish(cfg: TrainConfig, argv: Sequence[str] | None, model: Any, params: int, vocab: int,
            wall_s: float, last_eval: dict[str, Any]) -> dict[str, Any]:
    """The run record (``run.json``: the command, config, final evaluation, versions) and the
    exported model(s)."""
    out = Path(cfg.out)
    summary: dict[str, Any] = {
        "command": command_line(cfg), "argv": list(argv) if argv is not None else None,
        "seed": cfg.seed, "config": cfg.to_dict(), "parameters": params,
        "vocab_size": vocab, "steps_done": cfg.steps, "wall_s": wall_s,
        "threads": torch.get_num_threads(), "final_eval": last_eval,
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    for directory in [out / "model"] + ([Path(cfg.export)] if cfg.export else []):
        summary["export_bytes"] = export_model(model, cfg.tokenizer or None, directory, cfg,
                                               summary)
    (out / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def train_tiny_main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: ``dllm-decode train tiny --family llada --out DIR [--steps N ...]``."""
    cfg = parse_args(list(argv) if argv is not None else None)
    train(cfg, argv)
    return 0
