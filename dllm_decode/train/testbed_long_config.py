"""Settings of a long-answer student's training run (``dllm-decode train testbed-long``;
every field is a ``--flag``) and the fields a resumed run may change."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields

from dllm_decode.models.long_answer import LONG_TASKS
from dllm_decode.train.config import _f  # a field with its --help text


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
    tasks: str = _f(",".join(LONG_TASKS), "comma-separated tasks")
    task_weights: str = _f("", "comma-separated sampling weights in --tasks order (empty: equal)")
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
    support_mass_weight: float = _f(0.0, "weight of train.distill_objective.support_log_mass "
                                         "(minus the log of the mass on plausible tokens)")
    shuffle_regrow: str = _f("", "START:N: from step START, shuffle's lists grow again from 3 "
                                 "names to full length over N steps (empty: off)")
    shuffle_focus: int = _f(0, "from --shuffle-regrow's START on (its full-length lists "
                               "too), this many shuffle-only steps (on cut-down canvases, "
                               "~3-8x cheaper) per mixed step")
    shuffle_answers: str = _f("random", "shuffle's clean answers: random (a random permutation "
                                        "per row) | reference (prompt order, before 2026-11-29)")
    bd_targets: str = _f("clean", "block objective: the soft targets' view of the earlier "
                                  "blocks: clean (what the student sees, two streams) | noisy "
                                  "(masked like the own block: the defect of runs before "
                                  "2026-11-29 21:00, kept to reproduce their stages)")
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
        if self.bd_targets not in ("clean", "noisy"):
            raise ValueError(f"bd_targets must be clean or noisy, got {self.bd_targets!r}")
        if self.shuffle_answers not in ("random", "reference"):
            raise ValueError(f"shuffle_answers must be random or reference, got "
                             f"{self.shuffle_answers!r}")
        for name in ("log_error_weight", "support_mass_weight"):  # (NaN fails too)
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.shuffle_focus < 0:
            raise ValueError(f"shuffle_focus must be >= 0, got {self.shuffle_focus}")
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
        _ = (self.weights, self.regrow)  # parse (and so validate) both now
        if self.gen_length % self.block_size:
            raise ValueError(f"gen_length {self.gen_length} must be a multiple of block_size "
                             f"{self.block_size}")

    @property
    def task_list(self) -> tuple[str, ...]:
        return tuple(t for t in self.tasks.split(",") if t)

    @property
    def weights(self) -> tuple[float, ...]:
        """Sampling weight of each task of ``task_list``."""
        if not self.task_weights:
            return (1.0,) * len(self.task_list)
        try:
            w = tuple(float(x) for x in self.task_weights.split(","))
        except ValueError:
            raise ValueError(f"task_weights must be comma-separated numbers, got "
                             f"{self.task_weights!r}") from None
        if len(w) != len(self.task_list) or min(w) < 0 or sum(w) <= 0:
            raise ValueError(f"task_weights needs {len(self.task_list)} weights >= 0 (one per "
                             f"task of {self.tasks!r}, not all 0), got {self.task_weights!r}")
        return w

    @property
    def regrow(self) -> tuple[int, int] | None:
        """``(start, steps)`` of the shuffle list regrowth, or ``None``."""
        if not self.shuffle_regrow:
            return None
        try:
            start, n = (int(x) for x in self.shuffle_regrow.split(":"))
        except ValueError:
            raise ValueError(f"shuffle_regrow must be START:N (two ints), got "
                             f"{self.shuffle_regrow!r}") from None
        if start < 0 or n < 1:
            raise ValueError(f"shuffle_regrow needs START >= 0 and N >= 1, got "
                             f"{self.shuffle_regrow!r}")
        return start, n


#: fields that may change between invocations of one run (a new ``steps`` re-spans the cosine
#: decay from the current step on: how a run is extended or cut short across sessions)
NOT_PINNED = ("out", "resume", "export", "stop_after", "threads", "ckpt_every", "log_every",
              "steps", "semi_share", "bd_every", "log_error_weight", "support_mass_weight",
              "shuffle_answers", "task_weights", "shuffle_regrow", "shuffle_focus", "bd_targets")



def command_line(cfg: LongTrainConfig) -> str:
    """The ``dllm-decode train testbed-long`` command that builds ``cfg``: a flag for each field
    that differs from its default and ``--family``, in field order (what a model card quotes
    per stage)."""
    default = LongTrainConfig()
    parts = ["dllm-decode train testbed-long"]
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name) and f.name != "family":  # (family: always)
            continue
        flag = "--" + f.name.replace("_", "-")
        parts.append(flag if isinstance(value, bool) else f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


__all__ = ["NOT_PINNED", "LongTrainConfig", "command_line"]
