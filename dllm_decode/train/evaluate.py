"""Held-out evaluation during training, and export of a trained checkpoint with its card."""

from __future__ import annotations

import copy
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from dllm_decode.eval.parallelbench.tasks import task_spec
from dllm_decode.models.base import DecoderLM
from dllm_decode.models.loading import save_model
from dllm_decode.samplers import DiffusionSampler
from dllm_decode.tokenizer import BUNDLED_TOKENIZER
from dllm_decode.train.config import TrainConfig, untie
from dllm_decode.train.data import Example, TaskData
from dllm_decode.train.objectives import diffusion_loss

#: rows decoded per sampler call during evaluation (bounds memory, not results)
EVAL_CHUNK = 64


def _aligned_pad(prompt_length: int, block: int | None) -> int:
    """Extra left padding that makes the answer start on a block boundary."""
    return (-prompt_length) % block if block else 0


@torch.no_grad()
def exact_match(model: DecoderLM, data: TaskData, examples: list[Example],
                steps: int | None = None) -> dict[str, float]:
    """Mean grader score per task (and ``"all"``) of greedy low-confidence decoding.

    Decodes with the library's ``DiffusionSampler`` (no cache), ``steps`` steps over the
    ``G`` answer positions (default ``G``: one token per step), temperature 0, one block for
    bidirectional models and the model's own blocks for block-causal ones.
    """
    g = data.gen_length
    sampler = DiffusionSampler(model, "low_confidence")
    scores: dict[str, list[float]] = defaultdict(list)
    for lo in range(0, len(examples), EVAL_CHUNK):
        chunk = examples[lo:lo + EVAL_CHUNK]
        prompts = [data.codec.encode(task, record) for task, record in chunk]
        width = max(len(p) for p in prompts)
        width += _aligned_pad(width, model.block_size)
        ids = torch.full((len(chunk), width), data.pad_id, dtype=torch.long)
        attn = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        device = next(model.parameters()).device
        out = sampler.generate(ids.to(device), attn.to(device), gen_length=g,
                               steps=steps or g, temperature=0.0)
        for (task, record), answer in zip(chunk, out.answer.cpu().tolist(), strict=True):
            text = data.codec.decode(answer)
            scores[task].append(float(task_spec(task).grade(text, record)["score"]))
    result = {task: sum(v) / len(v) for task, v in scores.items()}
    result["all"] = sum(sum(v) for v in scores.values()) / sum(len(v) for v in scores.values())
    return result


@torch.no_grad()
def evaluate(model: DecoderLM, data: TaskData, examples: list[Example],
             cfg: TrainConfig) -> dict[str, Any]:
    """Held-out metrics: loss and per-token accuracy with the whole answer masked (one
    forward; block models: each block masked, clean blocks before it), and exact match."""
    model.eval()
    batch = data.collate(examples, extra_pad=0)
    pad = _aligned_pad(batch.prompt_length, model.block_size)
    batch = data.collate(examples, extra_pad=pad).to(cfg.device)
    res = diffusion_loss(model, batch, torch.Generator().manual_seed(0), cfg.eps, rate=1.0)
    em = exact_match(model, data, examples)
    row: dict[str, Any] = {
        "masked_loss": round(float(res.loss), 5),
        "token_acc": round(int(res.correct) / max(1, int(res.masked)), 5),
        "content_acc": round(int(res.correct_content) / max(1, int(res.masked_content)), 5),
        "exact_match": round(em.pop("all"), 5),
    }
    row.update({f"em:{task.rsplit('/', 1)[-1]}": round(v, 4) for task, v in sorted(em.items())})
    return row


def model_card(cfg: TrainConfig, summary: dict[str, Any]) -> str:
    """A short model card (markdown) for an exported tiny checkpoint."""
    ev = summary.get("final_eval") or {}
    metrics = "\n".join(f"| {k} | {v} |" for k, v in ev.items())
    kind = {"llada": "LLaDA (bidirectional, position-aligned logits)",
            "dream": "Dream (bidirectional, AR-shifted head undone in forward)",
            "sdar": f"SDAR-style block diffusion (block-causal, block size {cfg.block_size})"}
    return f"""# tiny-{cfg.family}

A {summary['parameters'] / 1e6:.2f}M-parameter {kind[cfg.family]} masked-diffusion model in
the released checkpoint format, trained from scratch by `dllm_decode.train` on the clean-room
ParallelBench-style generators (tasks: {', '.join(t.split('/')[-1] for t in cfg.task_list)};
lists of {cfg.min_items}-{cfg.max_items} people, {cfg.icl_examples} in-context example,
answers EOS-padded to {cfg.gen_length} tokens). For tests, demos and decoding-policy
experiments on CPU; it is not a general language model.

| architecture | value |
|---|---|
| hidden / layers / heads / kv heads / MLP | {cfg.hidden} / {cfg.layers} / {cfg.heads} / \
{cfg.kv_heads_resolved} / {cfg.intermediate} |
| vocabulary | {summary['vocab_size']} (byte-level BPE, `tokenizer.json`) |
| weights | {cfg.export_dtype} |

Training: {summary['steps_done']} steps, batch {cfg.batch_size}, lr {cfg.lr} (warm-up
{cfg.warmup}, cosine to {cfg.min_lr_ratio}x), seed {cfg.seed}, {summary['wall_s']} s wall on
{summary['threads']} thread(s).

    {summary['command']}

Held-out metrics at the end (validation split; exact match = one token per step, greedy,
low confidence, graded by the ParallelBench graders):

| metric | value |
|---|---|
{metrics}
"""


def export_model(model: DecoderLM, tokenizer_dir: str | Path | None, directory: Path,
                 cfg: TrainConfig, summary: dict[str, Any]) -> int:
    """Write config + weights (in ``cfg.export_dtype``), the tokenizer files and the card.

    Returns the size of ``model.safetensors`` in bytes.
    """
    dtype = {"float16": torch.float16, "float32": torch.float32}[cfg.export_dtype]
    cast = untie(copy.deepcopy(model)).to(device="cpu", dtype=dtype)
    save_model(cast, directory)
    source = Path(tokenizer_dir) if tokenizer_dir else BUNDLED_TOKENIZER
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, directory / name)
    (directory / "README.md").write_text(model_card(cfg, summary))
    return (directory / "model.safetensors").stat().st_size
