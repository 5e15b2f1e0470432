"""Train the long-answer test bed's students (``dllm-decode train testbed-long``).

The exact posterior of ``models/long_answer.py`` is distilled into a tiny model: soft
cross-entropy on masked answer positions (their mean) against the oracle's conditionals given
the noisy canvas (for the block-causal student: given the clean earlier blocks and the noisy
own block, which is what it sees when decoding). Families:

* ``llada``: a bidirectional mask model. Rows mix three masks: semi-AR (answer blocks before a
  random 32-aligned block clean, that block i.i.d. at rate t, later blocks masked;
  ``semi_share``, 50 %), content-only (only positions before EOS masked, i.i.d.; 40 % of the
  rest) and i.i.d. over the answer.
* ``sdar``: block diffusion with blocks of ``block_size`` (32), the two-stream objective of
  ``train/objectives.py`` (clean canvas + noisy answer; exact block-causal K/V).
* ``bd_warmup`` (llada): the first steps train the bidirectional model with that two-stream
  objective (the attention pattern is only a mask): measured on this test bed, the block
  student copies 128-token lists after ~500 steps where the mask objective still has names
  at chance, so its first steps warm-start the mask objective.

Shuffle's clean answers are random permutations (``shuffle_answers``): written in prompt
order, "name i is written" equals "answer slot i is visible" on every training canvas, a
shortcut both students learned and which fails on their own commits (they repeated names).
``log_error_weight`` adds ``train.distill_objective.support_log_error``; ``semi_share``,
``bd_every``, ``log_error_weight`` and ``shuffle_answers`` may change when a run is resumed
(``docs/testbeds.md``, Test bed III, lists the stages of the students' runs).

**Length curriculum on a cut-down canvas** (``../shared/research/testbed-long-feasibility.md``:
plain training at 128 + 128 tokens plateaus with names at chance): for the first
``curriculum`` steps only the columns holding content are fed (the task token, the prompt
region up to the batch's longest content + 2, ``<answer>``, the answer up to the same width),
at their true positions, so the copy offset stays fixed while attention spans tens of keys;
lists grow from 3 items to each task's full range over those steps; full canvases follow.

AdamW (betas 0.9 / 0.98, weight decay 0.01 on matrices), linear warm-up, cosine decay to
``min_lr_ratio``, gradient clip 1.0. The data, masks and weights are functions of
``(seed, step)``, so a run resumed from its state file (``--resume``, written every
``ckpt_every`` steps to ``OUT/checkpoint.safetensors``) continues exactly. ``--export DIR``
writes the fp16 checkpoint with its tokenizer, vocabulary and ``run.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from dllm_decode.eval.parallelbench.testbed_long import (
    LONG_TASKS,
    draw_items,
    is_test,
    lengths,
    long_codec,
)
from dllm_decode.models.base import DecoderLM
from dllm_decode.models.long_answer import EOS, MASK, PAD, LongCodec
from dllm_decode.train.config import TrainConfig, build_tiny_model, parse_dataclass, untie
from dllm_decode.train.distill_objective import support_log_error
from dllm_decode.train.objectives import two_stream_mask
from dllm_decode.train.state import load_state, save_state

STATE_FILE = "checkpoint.safetensors"
#: llada: the share of the non-semi-AR mask rows that mask content only (the rest: i.i.d.)
CONTENT_SHARE_OF_REST = 0.4


def _f(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"help": doc})


@dataclass(frozen=True)
class LongTrainConfig:
    """One student's training run (every field is a ``--flag``)."""

    family: str = _f("llada", "llada (bidirectional) | sdar (block diffusion)")
    out: str = _f("runs/testbed-long-llada", "run directory (state, loss.csv, run.json)")
    steps: int = _f(6000, "optimizer steps in total (the cosine schedule spans them)")
    batch_size: int = _f(32, "sequences per step")
    lr: float = _f(2e-3, "peak learning rate")
    min_lr_ratio: float = _f(0.1, "final learning rate as a fraction of --lr")
    warmup: int = _f(50, "linear warm-up steps")
    weight_decay: float = _f(0.01, "AdamW weight decay (matrices only)")
    grad_clip: float = _f(1.0, "gradient-norm clip")
    curriculum: int = _f(350, "steps of cut-down canvases with growing lists")
    tasks: str = _f(",".join(LONG_TASKS), "comma-separated tasks, equal weights")
    gen_length: int = _f(128, "answer positions")
    hidden: int = _f(192, "hidden size")
    layers: int = _f(4, "decoder layers")
    heads: int = _f(6, "attention heads")
    intermediate: int = _f(768, "SwiGLU hidden size")
    block_size: int = _f(32, "sdar: block size; llada: the semi-AR mask's block")
    semi_share: float = _f(0.5, "llada: share of semi-AR mask rows (the rest: 40 %% content-only, "
                                "60 %% i.i.d.)")
    bd_warmup: int = _f(0, "llada: first steps trained with the block-diffusion objective "
                           "(two streams, blocks of --block-size; the attention pattern is "
                           "just a mask), which learns the copy offset far faster")
    bd_every: int = _f(0, "llada: after the warm-up, every N-th step uses the block-diffusion "
                          "objective too (0: never)")
    log_error_weight: float = _f(0.0, "weight of train.distill_objective.support_log_error "
                                      "(squared log-probability error over possible tokens)")
    shuffle_answers: str = _f("random", "shuffle's clean answers: random (a random permutation "
                                        "per row) | reference (prompt order, before 2026-11-29)")
    eps: float = _f(1e-3, "mask rate floor")
    seed: int = _f(0, "seed of weights, data and masks")
    threads: int = _f(1, "torch CPU threads")
    ckpt_every: int = _f(50, "steps between state files")
    log_every: int = _f(10, "steps between loss.csv rows")
    stop_after: int = _f(0, "stop this invocation after so many steps (0: run to --steps); "
                            "resume later with --resume")
    resume: bool = _f(False, "continue the run in --out from its state file")
    export: str = _f("", "write the final (or current) model here as a checkpoint directory")

    def __post_init__(self) -> None:
        if self.family not in ("llada", "sdar"):
            raise ValueError(f"family must be llada or sdar, got {self.family!r}")
        if self.shuffle_answers not in ("random", "reference"):
            raise ValueError(f"shuffle_answers must be random or reference, got "
                             f"{self.shuffle_answers!r}")
        if not self.log_error_weight >= 0:
            raise ValueError(f"log_error_weight must be >= 0, got {self.log_error_weight}")
        if self.bd_every < 0:
            raise ValueError(f"bd_every must be >= 0, got {self.bd_every}")
        if not 0.0 <= self.semi_share <= 1.0:
            raise ValueError(f"semi_share must be in [0, 1], got {self.semi_share}")
        for name in ("steps", "batch_size", "hidden", "layers", "heads", "intermediate",
                     "block_size", "ckpt_every", "log_every", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        bad = [t for t in self.task_list if t not in LONG_TASKS]
        if bad:
            raise ValueError(f"unknown tasks {bad}; valid: {', '.join(LONG_TASKS)}")
        if self.gen_length % self.block_size:
            raise ValueError(f"gen_length {self.gen_length} must be a multiple of block_size "
                             f"{self.block_size}")

    @property
    def task_list(self) -> tuple[str, ...]:
        return tuple(t for t in self.tasks.split(",") if t)


def build_student(cfg: LongTrainConfig, codec: LongCodec) -> DecoderLM:
    """A fresh student over the codec's vocabulary (tied embeddings while training)."""
    tc = TrainConfig(family=cfg.family, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                     intermediate=cfg.intermediate, block_size=cfg.block_size, seed=cfg.seed,
                     tie_embeddings=True)
    tid = codec.token_id
    return build_tiny_model(tc, codec.vocab_size, tid[MASK], tid[EOS], tid[PAD])


def lr_at(step: int, cfg: LongTrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(
        math.pi * frac)))


def draw_batch(cfg: LongTrainConfig, codec: LongCodec, step: int
               ) -> tuple[list[tuple[str, list[str]]], float]:
    """The step's ``(task, items)`` rows (training split) and the curriculum fraction."""
    rng = random.Random(f"{cfg.seed}:{step}:long-data")
    frac = min(1.0, (step + 1) / cfg.curriculum) if cfg.curriculum else 1.0
    rows = []
    for _ in range(cfg.batch_size):
        task = rng.choice(cfg.task_list)
        lo, hi = lengths(task, cfg.gen_length)
        k_hi = max(3, round(3 + (hi - 3) * frac))
        k_lo = min(k_hi, max(3, round(3 + (lo - 3) * frac)))
        while True:
            items = draw_items(task, rng.randint(k_lo, k_hi), rng)
            if not is_test(task, items):
                break
        rows.append((task, items))
    return rows, frac


def answer_items(cfg: LongTrainConfig, task: str, items: list[str], step: int, row: int
                 ) -> list[str]:
    """The names in the order the row's clean answer writes them: for shuffle a uniformly
    random permutation (``shuffle_answers="random"``), so committed names sit anywhere and
    "not yet written" must be read from the names themselves; ``"reference"`` writes them in
    prompt order, where a student learns the shortcut "slot j's name is written iff answer
    slot j is", which fails on its own commits (measured: both students repeated names)."""
    if task != "shuffle" or cfg.shuffle_answers == "reference":
        return items
    order = list(items)
    random.Random(f"{cfg.seed}:{step}:{row}:long-order").shuffle(order)
    return order


def make_batch(cfg: LongTrainConfig, codec: LongCodec, step: int, block_size: int | None
               ) -> dict[str, Tensor]:
    """Clean canvases ``[B, P + G]``, the noisy answer ``[B, G]``, the masked positions and the
    exact soft targets ``[B, G, V]`` (the student sees them ``block_size``-causally when set)."""
    rows, frac = draw_batch(cfg, codec, step)
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    g = codec.gen_length
    prompts = torch.tensor([codec.encode_prompt({"task": t, "items": i}) for t, i in rows])
    answers = torch.tensor([codec.reference_answer({"task": t, "items": answer_items(
        cfg, t, i, step, r)}) for r, (t, i) in enumerate(rows)])
    content = answers != codec.token_id[EOS]
    t = (1 - cfg.eps) * torch.rand(len(rows), generator=gen) + cfg.eps
    masked = torch.rand(len(rows), g, generator=gen) < t[:, None]
    if block_size is None:  # llada: semi-AR and content-only rows
        mode = torch.rand(len(rows), generator=gen)
        block = torch.randint(0, g // cfg.block_size, (len(rows),), generator=gen)
        col_block = (torch.arange(g) // cfg.block_size)[None]
        semi = torch.where(col_block < block[:, None], False,
                           torch.where(col_block > block[:, None], True, masked))
        content_share = cfg.semi_share + CONTENT_SHARE_OF_REST * (1 - cfg.semi_share)
        masked = torch.where((mode < cfg.semi_share)[:, None], semi,
                             torch.where((mode < content_share)[:, None], masked & content,
                                         masked))
    noisy = answers.masked_fill(masked, codec.token_id[MASK])
    targets = torch.empty(len(rows), g, codec.vocab_size, dtype=torch.float32)
    for r, (task, items) in enumerate(rows):
        if block_size is None or task != "shuffle":
            targets[r] = codec.conditionals(task, items, noisy[r][None])[0].float()
            continue
        for b0 in range(0, g, block_size):  # the block's view: later blocks unseen
            view = noisy[r].clone()
            view[b0 + block_size:] = codec.token_id[MASK]
            targets[r, b0:b0 + block_size] = codec.conditionals(
                task, items, view[None])[0, b0:b0 + block_size].float()
    width = int(max(len(codec.region(t, i)) for t, i in rows)) + 2
    return {"prompts": prompts, "answers": answers, "noisy": noisy, "masked": masked,
            "targets": targets, "frac": torch.tensor(frac),
            "width": torch.tensor(width if frac < 1 else g)}


def columns(codec: LongCodec, width: int) -> Tensor:
    """Canvas columns fed: the task token, ``width`` region slots, ``<answer>``, ``width``
    answer positions (all of them when ``width >= gen_length``)."""
    p, g = codec.prompt_length, codec.gen_length
    width = min(width, g)
    region = torch.arange(0, min(1 + width, p - 1))
    return torch.cat([region, torch.tensor([p - 1]), torch.arange(p, p + width)])


def step_loss(model: DecoderLM, cfg: LongTrainConfig, codec: LongCodec, step: int
              ) -> Tensor:
    """The step's loss: soft cross-entropy on masked answer positions (their mean)."""
    sdar = (cfg.family == "sdar" or step < cfg.bd_warmup
            or (cfg.bd_every > 0 and step % cfg.bd_every == 0))
    batch = make_batch(cfg, codec, step, cfg.block_size if sdar else None)
    p = codec.prompt_length
    cols = columns(codec, int(batch["width"]))
    n_prompt = int((cols < p).sum())
    answer_cols = cols[n_prompt:] - p
    clean = torch.cat([batch["prompts"], batch["answers"]], dim=1)[:, cols]
    pos = cols[None].expand(clean.shape[0], -1)
    noisy = batch["noisy"][:, answer_cols]
    if sdar:
        valid = torch.ones_like(clean, dtype=torch.bool)
        mask = two_stream_mask(pos, valid, n_prompt, cfg.block_size)
        tokens = torch.cat([clean, noisy], dim=1)
        positions = torch.cat([pos, pos[:, n_prompt:]], dim=1)
        rows = torch.arange(clean.shape[1], tokens.shape[1])
        logits = model(tokens, positions, mask=mask, hidden_rows=rows)
    else:
        tokens = torch.cat([clean[:, :n_prompt], noisy], dim=1)
        logits = model(tokens, pos, hidden_rows=torch.arange(n_prompt, tokens.shape[1]))
    masked = batch["masked"][:, answer_cols]
    targets = batch["targets"][:, answer_cols]
    logp = F.log_softmax(logits.float(), dim=-1)
    ce = -(targets * logp).sum(-1)
    if cfg.log_error_weight:
        ce = ce + cfg.log_error_weight * support_log_error(logp, targets)
    return (ce * masked).sum() / masked.sum().clamp_min(1)


def make_optimizer(model: DecoderLM, cfg: LongTrainConfig) -> torch.optim.AdamW:
    decay = [q for q in model.parameters() if q.dim() >= 2]
    rest = [q for q in model.parameters() if q.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr,
                             betas=(0.9, 0.98))


def train(cfg: LongTrainConfig) -> dict[str, Any]:
    """Run (or resume) training; returns the run summary (also ``OUT/run.json``)."""
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    codec = long_codec(cfg.gen_length)
    model = build_student(cfg, codec)
    opt = make_optimizer(model, cfg)
    step, wall = 0, 0.0
    state_file = out / STATE_FILE
    if cfg.resume:
        state = load_state(state_file)
        defaults = asdict(LongTrainConfig())  # fields newer than the run keep their defaults
        saved = {k: state["config"].get(k, v) for k, v in defaults.items()
                 if k not in NOT_PINNED}
        mine = {k: v for k, v in asdict(cfg).items() if k not in NOT_PINNED}
        if saved != mine:
            diff = sorted(k for k in mine if saved.get(k) != mine[k])
            raise ValueError(f"--resume with other settings than the run in {out}: {diff}")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, wall = int(state["step"]), float(state["wall_s"])
    elif state_file.exists():
        raise FileExistsError(f"{state_file} exists; pass --resume to continue that run or "
                              "choose another --out")
    end = cfg.steps if not cfg.stop_after else min(cfg.steps, step + cfg.stop_after)
    log = out / "loss.csv"
    new_log = not log.exists() or not cfg.resume
    if not new_log:  # rows past the state file's step were logged by a run stopped before
        keep = [r for r in log.read_text().splitlines(keepends=True)
                if not r[:1].isdigit() or int(r.split(",", 1)[0]) <= step]
        log.write_text("".join(keep))
    with log.open("w" if new_log else "a", newline="") as fh:
        writer = csv.writer(fh)
        if new_log:
            writer.writerow(["step", "loss", "lr", "curriculum", "wall_s"])
        model.train()
        window: list[float] = []
        while step < end:
            start = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss = step_loss(model, cfg, codec, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            wall += time.perf_counter() - start
            window.append(float(loss.detach()))
            if step % cfg.log_every == 0 or step == end:
                frac = min(1.0, step / cfg.curriculum) if cfg.curriculum else 1.0
                writer.writerow([step, f"{sum(window) / len(window):.5f}",
                                 f"{lr_at(step - 1, cfg):.6f}", f"{frac:.3f}", f"{wall:.1f}"])
                fh.flush()
                window = []
            if step % cfg.ckpt_every == 0 or step == end:
                save_state(state_file, {"model": model.state_dict(),
                                        "optimizer": opt.state_dict(), "step": step,
                                        "wall_s": wall, "config": asdict(cfg)})
    summary = {"family": cfg.family, "steps_done": step, "wall_s": round(wall, 1),
               "threads": cfg.threads, "config": asdict(cfg),
               "parameters": sum(q.numel() for q in untie(model).parameters())}
    (out / "run.json").write_text(json.dumps(summary, indent=1) + "\n")
    if cfg.export:
        export_student(out, cfg.export)
    return summary


#: fields that may change between invocations of one run (a new ``steps`` re-spans the cosine
#: decay from the current step on: how a run is extended or cut short across sessions)
NOT_PINNED = ("out", "resume", "export", "stop_after", "threads", "ckpt_every", "log_every",
              "steps", "semi_share", "bd_every", "log_error_weight", "shuffle_answers")


def export_student(run_dir: str | Path, directory: str | Path) -> Path:
    """Write the run's current weights as a checkpoint directory: fp16 ``model.safetensors``,
    ``config.json``, the word-level tokenizer and ``long_answer_vocab.json``, ``run.json``."""
    from dllm_decode.models.loading import save_model

    state = load_state(Path(run_dir) / STATE_FILE)
    known = asdict(LongTrainConfig())
    cfg = LongTrainConfig(**{k: v for k, v in state["config"].items() if k in known})
    codec = long_codec(cfg.gen_length)
    model = build_student(cfg, codec)
    model.load_state_dict(state["model"])
    directory = Path(directory)
    save_model(untie(model).eval().to(torch.float16), directory)
    codec.write_vocab(directory)
    summary = {"steps_done": state["step"], "wall_s": round(float(state["wall_s"]), 1),
               "config": state["config"]}
    (directory / "run.json").write_text(json.dumps(summary, indent=1) + "\n")
    return directory


def parse_args(argv: list[str] | None) -> LongTrainConfig:
    parser = argparse.ArgumentParser(
        prog="dllm-decode train testbed-long",
        description="Distil the long-answer oracle into a tiny LLaDA- or SDAR-style student "
                    "(length curriculum on cut-down canvases, then full canvases).")
    return parse_dataclass(LongTrainConfig, parser, argv)


def train_long_main(argv: list[str] | None = None) -> int:
    """CLI entry: ``dllm-decode train testbed-long --family llada --out DIR [--resume]``."""
    cfg = parse_args(argv)
    summary = train(cfg)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    return 0


__all__ = ["LongTrainConfig", "build_student", "export_student", "make_batch", "step_loss",
           "train", "train_long_main"]
