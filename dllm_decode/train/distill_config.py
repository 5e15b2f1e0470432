"""Settings of a test-bed distillation run (``dllm-decode train testbed``; every field is a
``--flag``) and the per-task draw weights they imply."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dllm_decode.train.state import is_pickle, legacy_error
from dllm_decode.train.testbed import RANDOM_TASKS, TESTBED_TASKS

#: student families: the dense mask models, LLaDA2.x (MoE, block diffusion, token editing)
#: and DiffusionGemma (uniform noise, self-conditioning)
FAMILIES = ("llada", "dream", "sdar", "llada2", "gemma")


@dataclass(frozen=True)
class DistillConfig:
    """Settings of one distillation run (every field is a ``--flag``)."""

    family: str = "llada"
    out: str = "runs/testbed"
    steps: int = 12000
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 200
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    hidden: int = 128
    layers: int = 3
    heads: int = 4
    intermediate: int = 512
    block_size: int = 4
    suffix_frac: float = 0.4
    structure_frac: float = 0.3
    random_weight: float = 2.0
    warm_steps: int = 0
    scramble_steps: int = 0
    scramble_items: int = 4
    scramble_fixed: int = 0
    tie_embeddings: bool = False
    max_pad: int = 3
    seed: int = 0
    threads: int = 1
    log_every: int = 50
    eval_every: int = 1000
    eval_size: int = 12
    ckpt_every: int = 250
    resume: bool = False
    #: a training state (a run's ``checkpoint.safetensors``, or a file ``export_weights``
    #: wrote), or a model directory / bundled name (its exported weights) to grow from
    grow_from: str = ""
    #: start a ``grow_from`` run from that checkpoint's weight average (its ``ema`` entry, the
    #: weights it evaluated and exported) instead of its last iterate
    grow_average: bool = False
    eos_cut_frac: float = 0.0
    onpolicy_frac: float = 0.0
    #: tokens per step of the on-policy rollouts (1: one token per step; 4 / 8: the states a
    #: parallel ``low_confidence`` decode visits, where its joint commits are decided; gemma:
    #: ``gemma_renoise`` with ``16 / k`` denoising steps)
    onpolicy_k: int = 1
    #: gemma: steps served by one on-policy rollout of ``batch_size`` prompts
    #: (``train/uniform_onpolicy.py``); ``ckpt_every`` must be a multiple, so resume is exact
    rollout_every: int = 25
    #: share of the on-policy rows stopped at the rollout's first disagreement with the
    #: oracle's argmax instead of a random step (``onpolicy.first_disagreement``)
    onpolicy_hard: float = 0.0
    #: per-task draw weights overriding the defaults, ``"insert_random=8,shuffle=4"``
    task_weight: str = ""
    #: weight averaging (``train.ema``): evaluations and the exported model use the exponential
    #: moving average of the weights with this decay (0: off, the last iterate)
    ema: float = 0.0
    #: weight of ``distill_objective.support_log_error``, the squared error of the
    #: log-probabilities of each position's plausible tokens, added to the soft cross-entropy
    #: (0: off)
    log_error_weight: float = 0.0
    #: weight of ``distill_objective.support_rank_error``, the squared shortfall of the
    #: student's log-ratios on the oracle's strictly ordered plausible pairs (0: off)
    rank_error_weight: float = 0.0
    #: share of each oracle log-ratio the student must keep before that term charges it
    rank_margin: float = 0.5
    #: MoE students (llada2, gemma): routed experts, experts per token, expert MLP width
    experts: int = 8
    top_k: int = 2
    moe_intermediate: int = 128
    #: llada2: aux-loss-free balancing, the step by which a layer's expert bias moves toward
    #: under-loaded experts after each optimizer step (0: off; ``train/edit_objective.py``)
    bias_update: float = 1e-3
    #: llada2 (LLaDA2.1's editing stream, ``train/edit_objective.py``): share of rows whose
    #: visible answer tokens are corrupted with uniform random tokens at a rate drawn from
    #: U(0, ``edit_rate``), every answer position supervised
    edit_frac: float = 0.5
    edit_rate: float = 0.5
    #: llada2: share of rows that are the student's own parallel draft (``mtf_k`` tokens per
    #: step, stopped at a random step, its wrong commits kept), every position supervised
    mtf_frac: float = 0.0
    mtf_k: int = 4
    #: llada2: LLaDA2.0's mask-only objective (no editing stream, no drafts): the comparison
    no_editing: bool = False
    #: gemma (DiffusionGemma's recipe, ``train/uniform_objective.py``): share of rows whose
    #: second decoder pass is self-conditioned on the first pass's logits
    self_cond: float = 0.5
    #: gemma: weight of the encoder's causal-LM loss on the clean sequence
    encoder_loss_weight: float = 1.0
    #: gemma: share of rows whose corruption hits name positions only (list symbols and EOS
    #: stay clean: the states the re-noising sampler visits once it has accepted them; the
    #: uniform counterpart of the mask objective's ``structure`` rows); 0: the release recipe
    name_noise_frac: float = 0.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}, "
                             f"got {self.family!r}")
        if self.family in ("llada2", "gemma") and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k must lie in [1, experts={self.experts}], got {self.top_k}")
        for name in ("edit_frac", "mtf_frac", "self_cond", "name_noise_frac"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if not 0 < self.edit_rate <= 1:
            raise ValueError(f"edit_rate must lie in (0, 1], got {self.edit_rate}")
        if self.mtf_k < 1 or self.bias_update < 0 or self.encoder_loss_weight < 0:
            raise ValueError("mtf_k must be >= 1, bias_update and encoder_loss_weight >= 0")
        if self.family == "gemma" and (self.onpolicy_hard or self.eos_cut_frac):
            raise ValueError("gemma trains on uniform noise: onpolicy_hard and eos_cut_frac "
                             "(mask-model aids) do not apply")
        if not 0 <= self.suffix_frac + self.structure_frac <= 1:
            raise ValueError("suffix_frac + structure_frac must lie in [0, 1]")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")
        if not 0 <= self.eos_cut_frac <= 1:
            raise ValueError(f"eos_cut_frac must lie in [0, 1], got {self.eos_cut_frac}")
        if not 0 <= self.onpolicy_frac <= 1:
            raise ValueError(f"onpolicy_frac must lie in [0, 1], got {self.onpolicy_frac}")
        if not 0 <= self.onpolicy_hard <= 1:
            raise ValueError(f"onpolicy_hard must lie in [0, 1], got {self.onpolicy_hard}")
        if self.onpolicy_k < 1:
            raise ValueError(f"onpolicy_k must be >= 1, got {self.onpolicy_k}")
        if self.rollout_every < 1:
            raise ValueError(f"rollout_every must be >= 1, got {self.rollout_every}")
        if self.family == "gemma" and self.onpolicy_frac and self.ckpt_every % self.rollout_every:
            raise ValueError(f"ckpt_every ({self.ckpt_every}) must be a multiple of "
                             f"rollout_every ({self.rollout_every}) with gemma's on-policy rows, "
                             "so that a resumed run rolls out with the same weights")
        if not 0 <= self.ema < 1:
            raise ValueError(f"ema must lie in [0, 1) (0: off), got {self.ema}")
        if not self.log_error_weight >= 0:
            raise ValueError(f"log_error_weight must be >= 0, got {self.log_error_weight}")
        if not self.rank_error_weight >= 0:
            raise ValueError(f"rank_error_weight must be >= 0, got {self.rank_error_weight}")
        if not 0 < self.rank_margin <= 1:
            raise ValueError(f"rank_margin must lie in (0, 1], got {self.rank_margin}")
        parse_task_weights(self.task_weight)  # raises on a bad spec
        if self.grow_from:
            check_grow_source(self.grow_from, self.grow_average)
        if self.grow_average and not self.grow_from:
            raise ValueError("grow_average needs grow_from (the checkpoint whose average to use)")

    @property
    def editing(self) -> bool:
        """LLaDA2.1's mixture (mask stream + editing stream) is on: llada2 without
        ``no_editing``."""
        return self.family == "llada2" and not self.no_editing

    def task_weights(self) -> dict[str, float]:
        """Draw weight per task: ``random_weight`` for the three random tasks whose answers
        are not unique per position, 1 otherwise, then the ``task_weight`` overrides."""
        out = {t: self.random_weight if t in RANDOM_TASKS and t != "remove_random" else 1.0
               for t in TESTBED_TASKS}
        return out | parse_task_weights(self.task_weight)


def parse_task_weights(spec: str) -> dict[str, float]:
    """``"insert_random=8,shuffle=4"`` -> ``{"insert_random": 8.0, "shuffle": 4.0}``."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        task, sep, value = part.partition("=")
        if not sep or task not in TESTBED_TASKS:
            raise ValueError(f"task_weight: expected TASK=WEIGHT with TASK in "
                             f"{list(TESTBED_TASKS)}, got {part!r}")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not weight >= 0:
            raise ValueError(f"task_weight: weight of {task!r} must be a number >= 0, "
                             f"got {value!r}")
        out[task] = weight
    return out


def saved_config(data: dict) -> DistillConfig:
    """The config a training state recorded, as it was: its ``grow_from`` source is history
    (it may be gone, or an old ``checkpoint.pt`` since converted), so it is not checked."""
    source, average = data.get("grow_from", ""), data.get("grow_average", False)
    cfg = DistillConfig(**{**data, "grow_from": "", "grow_average": False})
    object.__setattr__(cfg, "grow_from", source)  # frozen: set past the validation
    object.__setattr__(cfg, "grow_average", average)
    return cfg


def check_grow_source(source: str, average: bool) -> None:
    """``ValueError`` unless ``source`` is a training state file, or (without ``average``) a
    model directory or bundled model name; ``LegacyCheckpointError`` for a pickle file."""
    from dllm_decode.models.loading import ASSETS

    path = Path(source)
    if path.is_file():
        if is_pickle(path):
            raise legacy_error(path)
        return
    model_dir = (path / "config.json").is_file() or (ASSETS / source / "config.json").is_file()
    if not model_dir:
        raise ValueError(f"grow_from must be a training state (a run's checkpoint.safetensors) "
                         f"or a model directory / bundled model name, got {source!r}")
    if average:
        raise ValueError(f"grow_average: {source} is a model directory, whose weights are the "
                         "exported ones (already the average of a run trained with --ema); "
                         "drop --grow-average")
