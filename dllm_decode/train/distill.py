"""Distil the exact Waiting Line oracle into a tiny LLaDA / Dream / SDAR-style model, or a
student of a 2026 family (``--family llada2``: LLaDA2.1's editing mixture,
``train/edit_objective.py``; ``--family gemma``: DiffusionGemma's uniform noise,
``train/uniform_objective.py``).

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
import shlex
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dllm_decode.models.base import DecoderLM
from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.train.config import TrainConfig, build_tiny_model, parse_dataclass, untie
from dllm_decode.train.csvlog import append_row, truncate_rows
from dllm_decode.train.distill_batch import (  # noqa: F401 (re-exported: the batch builders)
    answer_masks,
    make_batch,
    scramble_batch,
)
from dllm_decode.train.distill_config import DistillConfig, saved_config
from dllm_decode.train.distill_objective import distill_loss
from dllm_decode.train.edit_objective import ExpertBalance, draft_rows, editing_rows
from dllm_decode.train.ema import WeightAverage
from dllm_decode.train.grow import grow_into
from dllm_decode.train.onpolicy import onpolicy_rows
from dllm_decode.train.state import LEGACY_FILE, STATE_FILE, load_state, save_state, state_path
from dllm_decode.train.testbed import waiting_line_oracle
from dllm_decode.train.uniform_objective import uniform_batch, uniform_loss
from dllm_decode.train.uniform_onpolicy import Rollouts

LOG_COLUMNS = ("step", "loss", "kl", "lr", "wall_s")


def lr_at(step: int, cfg: DistillConfig) -> float:
    """Linear warm-up, then cosine decay to ``lr * min_lr_ratio``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 *
                     (1 + math.cos(math.pi * progress)))


def build_student(cfg: DistillConfig, oracle: WaitingLineOracle) -> Any:
    """A fresh model of ``cfg.family`` over the oracle's vocabulary (``llada2`` / ``gemma``:
    ``train/testbed_students.py``)."""
    if cfg.family in ("llada2", "gemma"):
        from dllm_decode.train import testbed_students as ts

        sizes = (cfg.hidden, cfg.layers, cfg.heads, cfg.intermediate, cfg.experts, cfg.top_k,
                 cfg.moe_intermediate, oracle)
        if cfg.family == "gemma":
            return ts.build_gemma_student(ts.gemma_student_config(*sizes), cfg.seed)
        model = ts.build_llada2_student(ts.llada2_student_config(*sizes), cfg.seed)
        if cfg.tie_embeddings:
            ts.tie_head(model)
        return model
    tc = TrainConfig(family=cfg.family, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                     intermediate=cfg.intermediate, block_size=cfg.block_size, seed=cfg.seed,
                     tie_embeddings=cfg.tie_embeddings)
    return build_tiny_model(tc, oracle.vocab_size, oracle.mask_token_id,
                            oracle.eos_token_ids[0], oracle.pad_token_id)


def step_loss(model: Any, cfg: DistillConfig, oracle: WaitingLineOracle, step: int,
              balance: ExpertBalance | None = None, rollouts: Rollouts | None = None
              ) -> tuple[Tensor, Tensor]:
    """One step's ``(loss, KL to the targets)``: the family's batch and objective (the mask
    families' soft targets, LLaDA2.1's editing mixture, DiffusionGemma's uniform noise;
    ``rollouts``: its on-policy canvases, ``train/uniform_onpolicy.py``)."""
    if cfg.family == "gemma":
        onpolicy = None
        if rollouts is not None and step >= cfg.scramble_steps:  # --onpolicy-frac > 0
            rollouts.refresh(model, cfg, oracle, step)
            onpolicy = rollouts.draw(round(cfg.onpolicy_frac * cfg.batch_size), cfg, step)
        batch = uniform_batch(cfg, oracle, step, onpolicy)
        return uniform_loss(model, *batch, encoder_loss_weight=cfg.encoder_loss_weight)
    tokens, valid, masked, targets, p = make_batch(cfg, oracle, step)
    if cfg.onpolicy_frac and step >= cfg.scramble_steps:  # the student's own states
        tokens, valid, masked, targets = onpolicy_rows(
            model, oracle, cfg.onpolicy_frac, (cfg.seed << 32) + step, tokens, valid,
            masked, targets, p, per_step=cfg.onpolicy_k, hard=cfg.onpolicy_hard)
    if cfg.editing and step >= cfg.scramble_steps:  # LLaDA2.1's editing stream, drafts
        tokens, masked, targets = editing_rows(cfg, oracle, tokens, valid, masked, targets, p,
                                               step)
        tokens, valid, masked, targets = draft_rows(model, cfg, oracle, tokens, valid, masked,
                                                    targets, p, step)
    if balance is not None:
        balance.reset()  # count the training forward's routing only
    return distill_loss(model, tokens, valid, masked, targets, p, cfg.log_error_weight,
                        cfg.rank_error_weight, cfg.rank_margin)


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
    params = [p for p in model.parameters() if p.requires_grad]  # frozen layer scalars out
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(0.9, 0.98))
    start, wall_before, cpu_before = 0, 0.0, 0.0
    state: dict[str, Any] = {}
    if cfg.resume and state_path(out).exists():
        state = load_state(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, wall_before = state["step"], state["wall_s"]
        cpu_before = float(state.get("cpu_s", 0.0))  # older checkpoints did not record it
        for name in ("loss.csv", "eval.csv"):  # drop rows logged after the checkpoint
            truncate_rows(out / name, start)
    elif cfg.grow_from:
        grow_into(model, _grow_weights(cfg))
    ema = WeightAverage(model, cfg.ema) if cfg.ema else None
    if ema is not None and state.get("ema") is not None:  # resumed
        ema.load_state_dict(state["ema"])
    averaged = ema.applied if ema is not None else contextlib.nullcontext
    balance = ExpertBalance(model, cfg.bias_update) if cfg.family == "llada2" and \
        cfg.bias_update else None
    rollouts = Rollouts() if cfg.family == "gemma" and cfg.onpolicy_frac else None
    (out / "distill_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    params = sum(p.numel() for p in model.parameters())
    print(f"[testbed] {cfg.family}: {params / 1e6:.2f}M parameters, vocab "
          f"{oracle.vocab_size}, steps {start}..{cfg.steps}", flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    window: list[tuple[float, float]] = []
    model.train()
    for step in range(start, cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, kl = step_loss(model, cfg, oracle, step, balance, rollouts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if balance is not None:
            balance.update()
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
                              "cpu_s": cpu_before + time.process_time() - c0,
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
                              threads=torch.get_num_threads(), eval_schedule=EVEN_SPLIT,
                              cpu_s=cpu_before + time.process_time() - c0)


def _write_run_summary(run_dir: Path, cfg: DistillConfig, *, parameters: int, vocab_size: int,
                       steps_done: int, wall_s: float, threads: int,
                       eval_schedule: str | None, cpu_s: float | None = None
                       ) -> dict[str, Any]:
    """Write ``run_dir / "run.json"`` (the one place its fields are named; ``eval_schedule``
    and ``cpu_s``, the process CPU time, omitted when unknown) and return it."""
    summary: dict[str, Any] = {
        "command": command_line(cfg), "config": dataclasses.asdict(cfg),
        "parameters": parameters, "vocab_size": vocab_size, "steps_done": steps_done,
        "wall_s": round(wall_s, 1), "threads": threads}
    if cpu_s is not None:  # on a shared machine the CPU time, not the wall, is the cost
        summary["cpu_s"] = round(cpu_s, 1)
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
                              eval_schedule=schedule, cpu_s=state.get("cpu_s"))


def parse_args(argv: list[str] | None) -> DistillConfig:
    parser = argparse.ArgumentParser(
        prog="dllm-decode train testbed",
        description="Distil the exact Waiting Line oracle into a tiny diffusion LM.")
    return parse_dataclass(DistillConfig, parser, argv)


def distill_main(argv: list[str] | None = None) -> int:
    """CLI entry: ``dllm-decode train testbed --family llada --out DIR [--resume]``."""
    distill(parse_args(argv))
    return 0
