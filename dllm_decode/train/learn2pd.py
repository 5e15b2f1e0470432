"""Learn2PD filter training: EGP oracle trajectories and the filter trainer (arXiv 2509.25188).

Data (the paper's "Extremely Greedy Parallel" oracle): decode each prompt with greedy
``low_confidence`` to get the reference ``y``; decode again with ``EGPOracle``, which commits
exactly the masked block positions whose current argmax equals ``y``. Every step records, per
row still decoding the block, the filter feature ``[K]`` and the labels ``argmax == y`` ``[K]``.
Stall guard: if the block's argmax vector repeats the previous step's, ``y`` is copied into the
block. The oracle is an ordinary selector run through ``DiffusionSampler``; ``on_step`` collects.

Training (the paper's notebook): shuffle, split 80/10/10, ``BCEWithLogits`` over all K
positions, AdamW lr 3e-3, full batch, 40,000 iterations; validation false positives at 0.9
(false positives / predicted positives).

CLI: ``dllm-decode train learn2pd --model NAME_OR_DIR (--prompts FILE | --task-generator)
--n-prompts N --gen-length G --block-length K --iters I --out DIR``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.learn2pd import (
    L2PFilter,
    block_features,
)
from dllm_decode.samplers.sampler import DiffusionSampler
from dllm_decode.types import Selection, StepState

#: ``state.extras`` key of the oracle's per-step record (``EGPStep``)
EGP_KEY: Final = "learn2pd_egp"
#: the paper's filter-training constants
PAPER_ITERS: Final = 40_000
PAPER_LR: Final = 3e-3
SPLIT: Final = (0.8, 0.1, 0.1)
#: threshold of the paper's validation false-positive metric
FP_THRESHOLD: Final = 0.9


@dataclass(frozen=True)
class EGPStep:
    """One oracle step: ``features``/``labels`` ``[B, K]``, ``active``/``stalled`` ``[B]``."""

    features: Tensor
    labels: Tensor
    active: Tensor
    stalled: Tensor
    step_in_block: int


@dataclass
class EGPMemory:
    """Per-generation oracle memory: the block being decoded and its previous argmax."""

    block: int = -1
    steps: int = 0
    prev: Tensor | None = None


@dataclass(frozen=True)
class EGPOracle:
    """EGP selector: commit masked block positions whose argmax equals the reference.

    Args:
        reference: ``[B, L]`` canvas of the reference decode (same prompts and padding).
        block_length: K (the filter width); the feature window is ``filter_window``'s.
        feature: filter feature name (``FEATURES``).

    Writes ``EGPStep`` to ``state.extras[EGP_KEY]``. Stall guard rows commit every masked block
    position with the reference token (returned as a ``Selection`` with those tokens).
    """

    reference: Tensor
    block_length: int
    feature: str = "llada_prob_all"
    #: adaptive; an unproductive step (no argmax equals y) commits nothing, the guard fires
    #: on the next step
    capabilities = Capabilities(budgeted=False, may_commit_nothing=True)

    def init_memory(self, batch: int, length: int, device: torch.device) -> EGPMemory:
        return EGPMemory()

    def select(self, state: StepState) -> Selection:
        mem: EGPMemory = state.memory
        if mem.block != state.block:
            mem.block, mem.steps, mem.prev = state.block, 0, None
        feats, start = block_features(state, self.feature, self.block_length)
        end = start + self.block_length
        ref = self.reference.to(state.canvas.device)
        greedy = state.proposal.greedy
        pad = (0, max(end - greedy.shape[1], 0))  # partial last block: no such positions
        argmax = torch.nn.functional.pad(greedy, pad, value=-1)[:, start:end]
        labels = argmax == torch.nn.functional.pad(ref, pad, value=-2)[:, start:end]  # [B, K]
        in_block = torch.zeros_like(state.eligible)
        in_block[:, state.block_start:state.block_end] = True
        active = (state.masked & in_block).any(1)
        stalled = torch.zeros_like(active) if mem.prev is None else (
            active & (argmax == mem.prev).all(1))
        state.extras[EGP_KEY] = EGPStep(feats, labels, active, stalled, mem.steps)
        mem.prev, mem.steps = argmax, mem.steps + 1
        correct = (greedy == ref) & in_block
        forced = state.eligible & stalled[:, None]
        tokens = torch.where(forced, ref, state.proposal.tokens)
        return Selection(state.eligible & (correct | forced), tokens)


@dataclass
class L2PSamples:
    """Filter training data: ``features`` ``[N, K]`` float32, ``labels`` ``[N, K]`` float32 (0/1),
    ``step`` ``[N]`` int64 (step within the block)."""

    features: Tensor
    labels: Tensor
    step: Tensor

    def __len__(self) -> int:
        return self.features.shape[0]

    def subset(self, idx: Tensor) -> L2PSamples:
        return L2PSamples(self.features[idx], self.labels[idx], self.step[idx])

    def split(self, seed: int = 0) -> tuple[L2PSamples, L2PSamples, L2PSamples]:
        """Shuffle and split 80/10/10 (train, validation, test)."""
        n = len(self)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        a = int(n * SPLIT[0])
        b = a + int(n * SPLIT[1])
        return self.subset(perm[:a]), self.subset(perm[a:b]), self.subset(perm[b:])

    def save(self, path: str | Path) -> None:
        save_file({"features": self.features, "labels": self.labels, "step": self.step},
                  str(path))

    @classmethod
    def load(cls, path: str | Path) -> L2PSamples:
        t = load_file(str(path))
        return cls(t["features"], t["labels"], t["step"])


def default_feature(model: Any) -> str:
    """The feature the paper's data generation uses for the model's family."""
    return "dream_negent_masked" if getattr(model, "family", "") == "dream" else "llada_prob_all"


def pad_left(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Ragged prompts -> left-padded ``[B, P]`` ids and attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


def generate_egp_samples(model: Any, prompts: Sequence[Sequence[int]], *, gen_length: int,
                         block_length: int, steps: int | None = None, feature: str | None = None,
                         batch_size: int = 8, cache: str = "none",
                         reference_policy: str = "low_confidence", schedule: str | None = None
                         ) -> tuple[L2PSamples, dict[str, Any]]:
    """Reference decode + EGP replay for every prompt; returns the samples and statistics.

    ``schedule`` is the reference decode's budget rule (``None``: the family's; ``"llada"``
    gives a Dream-family model exactly ``block_length / steps`` commits per step).

    Raises ``RuntimeError`` if a replay does not reproduce its reference (an oracle bug).
    """
    feature = feature or default_feature(model)
    spec = getattr(model, "spec", None)
    pad_id = getattr(spec, "pad_token_id", None)
    pad_id = int(pad_id if pad_id is not None else model.eos_token_ids[0])
    common = dict(gen_length=gen_length, block_length=block_length, temperature=0.0)
    ref_sampler = DiffusionSampler(model, reference_policy, cache=cache, steps=steps,
                                   schedule=schedule, **common)
    feats: list[Tensor] = []
    labels: list[Tensor] = []
    step_ids: list[Tensor] = []
    stats = {"prompts": 0, "blocks": 0, "stalls": 0, "egp_forwards": 0, "reference_forwards": 0}

    def collect(state: StepState, commit: Tensor) -> None:
        rec: EGPStep = state.extras[EGP_KEY]
        rows = rec.active.cpu()
        feats.append(rec.features.cpu()[rows])
        labels.append(rec.labels.cpu()[rows].float())
        step_ids.append(torch.full((int(rows.sum()),), rec.step_in_block, dtype=torch.long))
        stats["stalls"] += int(rec.stalled.sum())
        if rec.step_in_block == 0:
            stats["blocks"] += int(rows.sum())

    for lo in range(0, len(prompts), batch_size):
        ids, mask = pad_left(prompts[lo:lo + batch_size], pad_id)
        ref = ref_sampler.generate(ids, mask)
        oracle = EGPOracle(ref.tokens, block_length, feature)
        egp = DiffusionSampler(model, oracle, cache=cache, **common).generate(
            ids, mask, on_step=collect, max_steps_per_block=4 * block_length + 4)
        if not torch.equal(egp.tokens, ref.tokens):
            raise RuntimeError("EGP replay did not reproduce the reference decode")
        stats["prompts"] += ids.shape[0]
        stats["egp_forwards"] += egp.forwards
        stats["reference_forwards"] += ref.forwards
    samples = L2PSamples(torch.cat(feats), torch.cat(labels), torch.cat(step_ids))
    stats["samples"] = len(samples)
    stats["mean_steps_per_block"] = len(samples) / max(stats["blocks"], 1)
    stats["positive_rate"] = float(samples.labels.mean()) if len(samples) else 0.0
    return samples, stats


def filter_metrics(logits: Tensor, labels: Tensor, threshold: float = FP_THRESHOLD
                   ) -> dict[str, float]:
    """BCE loss, accuracy, false positives (FP / predicted positives, the paper's metric) and
    false negatives (FN / predicted negatives) at ``sigmoid > threshold``."""
    if labels.numel() == 0:
        return {}
    pred = torch.sigmoid(logits) > threshold
    truth = labels > 0.5
    n_pos = int(pred.sum())
    n_neg = pred.numel() - n_pos
    return {
        "loss": float(nn.functional.binary_cross_entropy_with_logits(logits, labels)),
        "accuracy": float((pred == truth).float().mean()),
        "false_positive": float((pred & ~truth).sum()) / n_pos if n_pos else 0.0,
        "false_negative": float((~pred & truth).sum()) / n_neg if n_neg else 0.0,
        "predicted_positive_rate": n_pos / pred.numel(),
    }


def train_filter(samples: L2PSamples, *, iters: int = PAPER_ITERS, lr: float = PAPER_LR,
                 seed: int = 0, activation: str = "relu", eval_every: int = 500,
                 log: Any = None) -> tuple[L2PFilter, dict[str, Any]]:
    """Full-batch BCE training of an ``L2PFilter`` on the 80 % split (float32, CPU or wherever
    ``samples`` live). Returns the filter (eval mode) and a report with the split sizes, the
    loss curve every ``eval_every`` iterations and final validation / test metrics."""
    train, val, test = samples.split(seed)
    if len(train) == 0:
        raise ValueError(f"no training samples (got {len(samples)} in all)")
    k = samples.features.shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = L2PFilter(k, activation).to(samples.features.device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    history = []
    first_loss = None
    for it in range(iters):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(train.features), train.labels)
        loss.backward()
        opt.step()
        if it == 0:
            first_loss = float(loss.detach())
        if (it + 1) % eval_every == 0 or it + 1 == iters:
            with torch.no_grad():
                row = {"iter": it + 1, "train_loss": float(loss.detach()),
                       **{f"val_{k_}": v for k_, v in
                          filter_metrics(model(val.features), val.labels).items()}}
            history.append(row)
            if log is not None:
                log(json.dumps(row))
    model.eval()
    with torch.no_grad():
        final = {"train": filter_metrics(model(train.features), train.labels),
                 "validation": filter_metrics(model(val.features), val.labels),
                 "test": filter_metrics(model(test.features), test.labels)}
    report = {"iters": iters, "lr": lr, "seed": seed, "activation": activation,
              "optimizer": "AdamW", "loss": "BCEWithLogits", "full_batch": True,
              "split": {"train": len(train), "validation": len(val), "test": len(test)},
              "first_train_loss": first_loss, "metrics_threshold": FP_THRESHOLD,
              "final": final, "history": history}
    return model, report
