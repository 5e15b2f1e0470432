"""``TrainConfig``: every knob of a tiny-model training run, and the model it builds.

One frozen dataclass, validated in ``__post_init__``; the CLI (``train_tiny_main``) is generated
from its fields, so a flag and a field are the same thing (``--batch-size`` = ``batch_size``).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from dllm_decode.models.base import DecoderLM, ModelSpec
from dllm_decode.models.block import sdar_config
from dllm_decode.models.dream import dream_config
from dllm_decode.models.llada import llada_config
from dllm_decode.models.loading import build_model

FAMILIES: Final = ("llada", "dream", "sdar")
#: the ten Waiting Line tasks, the default training mixture
WAITING_LINE: Final = tuple(f"waiting_line/{op}" for op in (
    "copy", "reverse", "sort", "shuffle", "insert_index", "insert_random",
    "remove_index", "remove_random", "replace_index", "replace_random"))


def _f(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"help": doc})


@dataclass(frozen=True)
class TrainConfig:
    """A tiny masked-diffusion training run (see ``dllm_decode/train/README.md``)."""

    family: str = _f("llada", "model family: llada | dream | sdar")
    out: str = _f("runs/tiny", "run directory (checkpoint, loss.csv, eval.csv, run.json)")
    steps: int = _f(3000, "optimizer steps in total")
    batch_size: int = _f(32, "sequences per step")
    lr: float = _f(1e-3, "peak learning rate (AdamW)")
    min_lr_ratio: float = _f(0.1, "final learning rate as a fraction of --lr (cosine)")
    warmup: int = _f(200, "linear warm-up steps")
    weight_decay: float = _f(0.01, "AdamW weight decay (matrices only)")
    grad_clip: float = _f(1.0, "gradient-norm clip")
    seed: int = _f(0, "seed of the initial weights, the data stream and the masks")
    resume: bool = _f(False, "continue the run in --out from its checkpoint")
    threads: int = _f(0, "torch CPU threads (0: torch default)")
    device: str = _f("cpu", "torch device")
    tasks: str = _f(",".join(WAITING_LINE), "comma-separated generator task ids")
    gen_length: int = _f(32, "G: answer + EOS padding length (ParallelBench: 32)")
    min_items: int = _f(2, "shortest list length")
    max_items: int = _f(6, "longest list length once the curriculum is over")
    curriculum: float = _f(0.4, "fraction of steps over which the longest length grows "
                                "from min_items + 1 to max_items")
    scramble_steps: int = _f(0, "warm-up steps of copy-only batches whose list tokens are "
                                "scrambled (random name tokens, same in prompt and answer)")
    scramble_items: int = _f(3, "list length of the scrambled warm-up copies (one length: the "
                                "copy offset is fixed, which forms the circuit fastest)")
    icl_examples: int = _f(1, "in-context demonstrations per prompt (released data: 1)")
    eps: float = _f(1e-3, "mask rate floor: p = (1 - eps) t + eps")
    hidden: int = _f(256, "hidden size")
    layers: int = _f(4, "decoder layers")
    heads: int = _f(4, "attention heads")
    kv_heads: int = _f(0, "K/V heads (0: heads for llada, heads // 2 for dream and sdar)")
    intermediate: int = _f(640, "SwiGLU hidden size")
    rope_theta: float = _f(10000.0, "RoPE base")
    tie_embeddings: bool = _f(False, "share the input embedding and the LM head while training "
                                     "(copying names becomes a pass-through); exported untied")
    block_size: int = _f(4, "sdar: block size of block-causal attention")
    bd_warmup_steps: int = _f(0, "llada/dream: first steps trained autoregressively: llada "
                                 "with the block-diffusion objective (two streams, "
                                 "--block-size, --ar-fraction), dream as a causal LM")
    semi_ar: float = _f(0.0, "llada/dream: fraction of rows with a clean answer prefix, a "
                             "partly masked block of --block-size and a masked suffix")
    ar_fraction: float = _f(0.25, "sdar: share of steps trained in block-size-1 (AR) mode")
    log_every: int = _f(10, "steps between loss.csv rows")
    eval_every: int = _f(500, "steps between held-out evaluations (0: only at the end)")
    eval_size: int = _f(40, "held-out records per evaluation (validation split)")
    ckpt_every: int = _f(100, "steps between checkpoints")
    tokenizer: str = _f("", "tokenizer directory (default: the bundled tiny tokenizer)")
    export: str = _f("", "also write the final model + tokenizer + card here")
    export_dtype: str = _f("float16", "dtype of exported weights: float16 | float32")

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        need(self.family in FAMILIES, f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in ("steps", "batch_size", "gen_length", "min_items", "hidden", "layers",
                     "heads", "intermediate", "block_size", "log_every", "ckpt_every",
                     "eval_size"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(self.max_items >= self.min_items,
             f"max_items ({self.max_items}) must be >= min_items ({self.min_items})")
        need(self.lr > 0 and 0 <= self.min_lr_ratio <= 1,
             f"need lr > 0 and 0 <= min_lr_ratio <= 1, got {self.lr}, {self.min_lr_ratio}")
        need(0 <= self.warmup <= self.steps, f"warmup must be in [0, steps], got {self.warmup}")
        need(0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps}")
        need(0 <= self.curriculum <= 1, f"curriculum must be in [0, 1], got {self.curriculum}")
        need(0 <= self.ar_fraction < 1, f"ar_fraction must be in [0, 1), got {self.ar_fraction}")
        need(0 <= self.semi_ar <= 1, f"semi_ar must be in [0, 1], got {self.semi_ar}")
        need(self.hidden % self.heads == 0 and (self.hidden // self.heads) % 2 == 0,
             f"hidden ({self.hidden}) / heads ({self.heads}) must be an even integer")
        need(self.heads % self.kv_heads_resolved == 0,
             f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads_resolved})")
        need(self.export_dtype in ("float16", "float32"),
             f"export_dtype must be float16 or float32, got {self.export_dtype!r}")
        need(self.threads >= 0 and self.eval_every >= 0 and self.icl_examples >= 0
             and self.scramble_steps >= 0 and self.bd_warmup_steps >= 0,
             "threads, eval_every, icl_examples, scramble_steps, bd_warmup_steps must be >= 0")
        need(bool(self.task_list), "tasks must name at least one task")

    @property
    def task_list(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.tasks.split(",") if t.strip())

    @property
    def kv_heads_resolved(self) -> int:
        if self.kv_heads:
            return self.kv_heads
        return self.heads if self.family == "llada" else max(1, self.heads // 2)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


def model_spec(cfg: TrainConfig, vocab_size: int, mask_id: int, eos_id: int,
               pad_id: int) -> ModelSpec:
    """The architecture of ``cfg`` with the tokenizer's vocabulary and special ids."""
    family_fields: dict[str, Any] = {
        "llada": {},
        "dream": {"qkv_bias": True, "logit_shift": 1},
        "sdar": {"qk_norm": True, "attention": "block_causal", "block_size": cfg.block_size},
    }[cfg.family]
    return ModelSpec(
        family=cfg.family, vocab_size=vocab_size, hidden_size=cfg.hidden,
        num_layers=cfg.layers, num_heads=cfg.heads, num_kv_heads=cfg.kv_heads_resolved,
        head_dim=cfg.hidden // cfg.heads, intermediate_size=cfg.intermediate,
        rope_theta=cfg.rope_theta, norm_eps=1e-5 if cfg.family == "llada" else 1e-6,
        max_length=1024, mask_token_id=mask_id, eos_token_ids=(eos_id,), pad_token_id=pad_id,
        **family_fields,
    )


def release_config(spec: ModelSpec) -> dict[str, Any]:
    """The release-style ``config.json`` dict of a spec (LLaDA / Dream / SDAR writers)."""
    writer = {"llada": llada_config, "dream": dream_config, "sdar": sdar_config}[spec.family]
    return writer(spec)


def trained_config(cfg: TrainConfig, spec: ModelSpec) -> dict[str, Any]:
    """``release_config`` plus what the training states: an SDAR student trained with
    block-size-1 (AR) steps runs with causal attention inside a block (S2D2's verifier,
    ``draft_causal``), one trained without them does not (``supports_causal_in_block``)."""
    config = release_config(spec)
    if cfg.family == "sdar":
        config["supports_causal_in_block"] = cfg.ar_fraction > 0
    return config


def build_tiny_model(cfg: TrainConfig, vocab_size: int, mask_id: int, eos_id: int,
                     pad_id: int) -> DecoderLM:
    """A freshly initialised model of ``cfg`` (weights from ``cfg.seed``), in train mode."""
    spec = model_spec(cfg, vocab_size, mask_id, eos_id, pad_id)
    model = build_model(trained_config(cfg, spec), seed=cfg.seed).train()
    if cfg.tie_embeddings:  # one parameter in two places; ``untie`` before saving
        model.head.weight = model.embed.weight
    return model


def untie(model: DecoderLM) -> DecoderLM:
    """Give ``model.head`` its own copy of a shared weight (the release formats save both)."""
    head = getattr(model, "head", None)  # DiffusionGemma has none: its head is the embedding
    if head is not None and head.weight is model.embed.weight:
        model.head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())
    return model


def parse_args(argv: list[str] | None) -> TrainConfig:
    """``TrainConfig`` from command-line flags (one flag per field, dashes for underscores)."""
    parser = argparse.ArgumentParser(
        prog="dllm-decode train tiny",
        description="Train a tiny masked-diffusion LM (LLaDA / Dream / SDAR-style) on "
                    "ParallelBench-style generated tasks.")
    return parse_dataclass(TrainConfig, parser, argv)


def parse_dataclass(cls: type[Any], parser: argparse.ArgumentParser,
                    argv: list[str] | None) -> Any:
    """``cls`` from flags: one ``--flag`` per dataclass field (dashes for underscores; bools
    are switches; ``help`` from the field's metadata when present); a ``ValueError`` raised by
    ``cls`` becomes a usage error."""
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        text = f.metadata.get("help", "")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", help=text)
        else:
            kind = {"int": int, "float": float, "str": str}[str(f.type)]
            parser.add_argument(flag, type=kind, default=f.default,
                                help=f"{text} (default: {f.default})".strip())
    ns = parser.parse_args(argv)
    try:
        return cls(**vars(ns))
    except ValueError as err:
        parser.error(str(err))
        raise  # unreachable: parser.error exits
