"""The test-bed training batches (``dllm-decode train testbed``; recipe in ``train/distill.py``
and ``train/README.md``): the three masking modes of a mask-model batch and the
scrambled-copy warm-up. Every draw is a function of ``(seed, step)``, so ``--resume`` continues
exactly."""

from __future__ import annotations

import dataclasses
import random

import torch
from torch import Tensor
from torch.nn import functional as F

from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.train.distill_config import DistillConfig
from dllm_decode.train.testbed import TESTBED_GEN_LENGTH, draw_training_examples
from dllm_decode.train.testbed_students import LLADA2_BLOCK


def left_padded(prompts: list[list[int]], region: Tensor, width: int, pad_id: int
                ) -> tuple[Tensor, Tensor]:
    """``(tokens [B, width + G], valid [B, width + G])``: each prompt right-aligned at
    ``width`` behind ``pad_id`` left padding (``valid`` False there), then the answer region
    ``region [B, G]``."""
    b, g = region.shape
    tokens = torch.full((b, width + g), pad_id, dtype=torch.long)
    valid = torch.zeros(b, width + g, dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):width] = torch.tensor(p)
        valid[i, width - len(p):] = True
    tokens[:, width:] = region
    return tokens, valid


def batch_prompts(tokens: Tensor, valid: Tensor, width: int,
                  rows: Tensor | None = None) -> list[list[int]]:
    """The prompts of a ``left_padded`` batch (its inverse): the valid ids before ``width`` of
    ``tokens [B, width + G]`` (``valid [B, width + G]``), of the rows ``rows`` (default: all)."""
    picked = range(tokens.shape[0]) if rows is None else rows.tolist()
    return [tokens[i, :width][valid[i, :width]].tolist() for i in picked]


def draw_answers(cfg: DistillConfig, oracle: WaitingLineOracle, step: int, rng: random.Random
                 ) -> tuple[list[list[int]], list[Tensor], Tensor]:
    """One step's training prompts (``draw_training_examples``), their answer tables and one
    answer per row drawn from its table by ``rng``: ``(prompts, tables [n_i, G], answers
    [B, G])``."""
    examples = draw_training_examples(cfg.seed, step, cfg.batch_size, cfg.task_weights())
    prompts = [oracle.encode_prompt(task, rec) for task, rec in examples]
    tables = [oracle.answer_table(p, TESTBED_GEN_LENGTH) for p in prompts]
    answers = torch.stack([t[rng.randrange(len(t))] for t in tables])
    return prompts, tables, answers


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
    rng = random.Random(f"{cfg.seed}:{step}:answer")
    gen = torch.Generator().manual_seed((cfg.seed << 32) + step)
    prompts, tables, answers = draw_answers(cfg, oracle, step, rng)
    masked = answer_masks(answers, oracle._first_name, cfg, gen)
    region = torch.where(masked, oracle.mask_token_id, answers)
    targets = torch.cat([oracle.marginals(t, r[None]) for t, r in zip(tables, region,
                                                                      strict=True)]).float()
    width = max(len(p) for p in prompts) + rng.randint(0, cfg.max_pad)
    if cfg.family == "llada2":  # prompt and answer inside one released-size block
        width = max(min(width, LLADA2_BLOCK - g), max(len(p) for p in prompts))
    if cfg.family == "sdar":  # answers start on a block boundary, as the sampler aligns them
        width += (-width) % cfg.block_size
    b = len(prompts)
    tokens, valid = left_padded(prompts, region, width, oracle.pad_token_id)
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
    copy_id, answer_id = oracle.token_id["<copy>"], oracle.token_id["<answer>"]
    prompts = [[copy_id, *answers[i, :n].tolist(), answer_id]
               for i, n in enumerate(lengths.tolist())]
    masked = answer_masks(answers, first, cfg, gen)
    width = g
    tokens, valid = left_padded(prompts, torch.where(masked, oracle.mask_token_id, answers),
                                width, oracle.pad_token_id)
    targets = F.one_hot(answers, oracle.vocab_size).float()
    return tokens, valid, masked, targets, width
