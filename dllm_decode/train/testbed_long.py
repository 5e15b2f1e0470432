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
Shuffle's "uniform over the prompt's names not yet written" is what the students learn last:
which names the prompt holds (an attention spread over every name of the list, where copy's
fixed-offset attention is found in ~500 steps) and, slower still, which of them the answer
already holds. ``task_weights`` draws shuffle more often and ``shuffle_regrow START:N`` grows
its lists again from 3 names over N steps, with ``shuffle_focus`` shuffle-only steps on
cut-down canvases per mixed step (from START on, full-length lists included, until the flag
is set to 0): measured, that teaches the first (a fresh shuffle-only student stayed at chance
for 700 steps on lists of 6-20 names, and learns when its lists start at 3 and grow), and
grown slowly (+1 name per ~1,000 steps) the second. ``log_error_weight`` adds
``train.distill_objective.support_log_error``, ``support_mass_weight`` its
``support_log_mass`` (the leak off the plausible tokens: a shuffle slot's mass on names already
written). Every field in
``testbed_long_config.NOT_PINNED`` may change when a run is resumed (``docs/testbeds.md``,
Test bed III, lists the stages of the students' runs and what each measured).

**Length curriculum on a cut-down canvas** (``../shared/research/testbed-long-feasibility.md``:
plain training at 128 + 128 tokens plateaus with names at chance): for the first
``curriculum`` steps only the columns holding content are fed (the task token, the prompt
region up to the batch's longest content + 2, ``<answer>``, the answer up to the same width),
at their true positions, so the copy offset stays fixed while attention spans tens of keys;
lists grow from 3 items to each task's full range over those steps; full canvases follow.

AdamW (betas 0.9 / 0.98, weight decay 0.01 on matrices), linear warm-up, cosine decay to
``min_lr_ratio``, gradient clip 1.0. The data, masks and weights are functions of
``(seed, step)``, so a run resumed from its state file (``--resume``, written every
``ckpt_every`` steps to ``OUT/checkpoint.safetensors``) continues exactly. ``run.json`` reports
``cpu_s`` (the process's CPU time in steps: what a card quotes, immune to pauses and load)
beside ``wall_s``; ``stages.jsonl`` records each invocation's command (``command_line``), so
the export's ``run.json`` lists the recipe stage by stage. ``--export DIR`` writes the fp16
checkpoint with its tokenizer, vocabulary and ``run.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from dllm_decode.eval.parallelbench.testbed_long import (
    draw_items,
    is_test,
    lengths,
    long_codec,
)
from dllm_decode.models.base import DecoderLM
from dllm_decode.models.long_answer import EOS, MASK, PAD, LongCodec
from dllm_decode.train.config import TrainConfig, build_tiny_model, parse_dataclass, untie
from dllm_decode.train.distill_objective import support_log_error, support_log_mass
from dllm_decode.train.objectives import two_stream_mask
from dllm_decode.train.state import load_state, save_state
from dllm_decode.train.testbed_long_config import NOT_PINNED, LongTrainConfig, command_line

STATE_FILE = "checkpoint.safetensors"
#: one JSON line per invocation that trains: its command, first step, CPU time and start date
STAGES_FILE = "stages.jsonl"
#: llada: the share of the non-semi-AR mask rows that mask content only (the rest: i.i.d.)
CONTENT_SHARE_OF_REST = 0.4


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
               ) -> tuple[list[tuple[str, list[str]]], bool]:
    """The step's ``(task, items)`` rows (training split) and whether they are fed as a
    cut-down canvas: during the curriculum, and on the shuffle-only steps of ``shuffle_focus``
    (from the regrowth's start on, its full-length lists included; ``--shuffle-focus 0``
    ends them)."""
    rng = random.Random(f"{cfg.seed}:{step}:long-data")
    frac = min(1.0, (step + 1) / cfg.curriculum) if cfg.curriculum else 1.0
    regrow, shuffle_frac = cfg.regrow, frac
    focus = False
    if regrow is not None and step >= regrow[0]:
        shuffle_frac = min(frac, (step - regrow[0] + 1) / regrow[1])
        focus = (step - regrow[0]) % (cfg.shuffle_focus + 1) < cfg.shuffle_focus
    rows = []
    for _ in range(cfg.batch_size):
        if focus:
            task = "shuffle"
        elif cfg.task_weights:
            task = rng.choices(cfg.task_list, cfg.weights)[0]
        else:  # (the draw of runs before the weights existed)
            task = rng.choice(cfg.task_list)
        lo, hi = lengths(task, cfg.gen_length)
        f = shuffle_frac if task == "shuffle" else frac
        k_hi = max(3, round(3 + (hi - 3) * f))
        k_lo = min(k_hi, max(3, round(3 + (lo - 3) * f)))
        while True:
            items = draw_items(task, rng.randint(k_lo, k_hi), rng)
            if not is_test(task, items):
                break
        rows.append((task, items))
    return rows, frac < 1 or focus


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
    rows, cut_down = draw_batch(cfg, codec, step)
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
        for b0 in range(0, g, block_size):  # the block's view: earlier blocks clean (the
            view = noisy[r].clone()         # two streams' context), later blocks unseen
            if cfg.bd_targets == "clean":
                view[:b0] = answers[r, :b0]
            view[b0 + block_size:] = codec.token_id[MASK]
            targets[r, b0:b0 + block_size] = codec.conditionals(
                task, items, view[None])[0, b0:b0 + block_size].float()
    width = int(max(len(codec.region(t, i)) for t, i in rows)) + 2
    return {"prompts": prompts, "answers": answers, "noisy": noisy, "masked": masked,
            "targets": targets, "cut_down": torch.tensor(cut_down),
            "width": torch.tensor(width if cut_down else g)}


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
    if cfg.support_mass_weight:
        ce = ce + cfg.support_mass_weight * support_log_mass(logp, targets)
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
    step, wall, cpu = 0, 0.0, 0.0
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
        cpu = float(state.get("cpu_s", wall))  # states before cpu_s: their wall time
    elif state_file.exists():
        raise FileExistsError(f"{state_file} exists; pass --resume to continue that run or "
                              "choose another --out")
    end = cfg.steps if not cfg.stop_after else min(cfg.steps, step + cfg.stop_after)
    if step < end:
        with (out / STAGES_FILE).open("a") as fh:
            fh.write(json.dumps({"from_step": step, "cpu_s": round(cpu, 1),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                                 "command": command_line(cfg)}) + "\n")
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
            start, start_cpu = time.perf_counter(), time.process_time()
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss = step_loss(model, cfg, codec, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            wall += time.perf_counter() - start
            cpu += time.process_time() - start_cpu  # immune to pauses (SIGSTOP) and load
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
                                        "wall_s": wall, "cpu_s": cpu, "config": asdict(cfg)})
    summary = {"family": cfg.family, "steps_done": step, "wall_s": round(wall, 1),
               "cpu_s": round(cpu, 1),
               "threads": cfg.threads, "config": asdict(cfg),
               "parameters": sum(q.numel() for q in untie(model).parameters())}
    (out / "run.json").write_text(json.dumps(summary, indent=1) + "\n")
    if cfg.export:
        export_student(out, cfg.export)
    return summary


def read_stages(run_dir: str | Path, step: int, cpu_s: float) -> list[dict[str, Any]]:
    """The run's stages from ``stages.jsonl``: each invocation's command with the steps and CPU
    seconds it added to the state (``to_step`` / the CPU of the next invocation's start, the
    state's ``step`` / ``cpu_s`` for the last); an invocation stopped before its first state
    file added nothing and is left out. Empty for runs older than the file."""
    path = Path(run_dir) / STAGES_FILE
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    stages = []
    for i, rec in enumerate(records):
        nxt = records[i + 1] if i + 1 < len(records) else {"from_step": step, "cpu_s": cpu_s}
        if nxt["from_step"] > rec["from_step"]:
            cpu = None if rec["cpu_s"] is None or nxt["cpu_s"] is None else round(
                nxt["cpu_s"] - rec["cpu_s"], 1)
            stages.append({"command": rec["command"], "from_step": rec["from_step"],
                           "to_step": nxt["from_step"], "cpu_s": cpu,
                           "started": rec.get("started")})
    return stages


def export_student(run_dir: str | Path, directory: str | Path) -> Path:
    """Write the run's current weights as a checkpoint directory: fp16 ``model.safetensors``,
    ``config.json``, the word-level tokenizer and ``long_answer_vocab.json``, ``run.json``
    (steps, CPU time, the settings and the stages of ``read_stages``)."""
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
    cpu = round(float(state.get("cpu_s", state["wall_s"])), 1)
    summary = {"steps_done": state["step"], "wall_s": round(float(state["wall_s"]), 1),
               "cpu_s": cpu, "config": state["config"],
               "stages": read_stages(run_dir, int(state["step"]), cpu)}
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


__all__ = ["LongTrainConfig", "build_student", "export_student", "make_batch", "read_stages",
           "step_loss", "train", "train_long_main"]
