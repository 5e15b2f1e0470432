"""Calibration knobs that make the exact oracle's logits behave like a real model's.

The exact oracle (``oracle.py``) returns ``log p`` of the true conditional and ``-1e9`` for
impossible tokens, so every top-2 margin is either ~0 or ~1e9 and margin- or entropy-based
methods (SchED, Prophet, KLASS, dParallel, ETE) can only switch at one point. A
:class:`Calibration` turns the conditional ``p [.., V]`` of every *masked answer position*
into finite logits, all seeded and deterministic:

1. ``confusion`` c: a share c of each name's probability moves to a plausible wrong name (same
   first name, the next last name of the vocabulary's pool, cyclically): errors a model that
   keys on the first name makes, which even one-token-per-step decoding cannot avoid;
2. ``floor`` f: ``p <- max(p, f)`` (impossible tokens get ``log f``, e.g. ``log 1e-6 = -13.8``:
   the logit margin of a certain position is ~13.8 nats instead of 1e9);
3. ``temperature`` T: logits ``= log p / T`` (T > 1: under-confident, T < 1: over-confident);
4. ``noise`` s: ``+ s * eps`` with ``eps ~ N(0, 1)`` per (prompt, position, token), drawn from
   a generator seeded by ``(seed, prompt ids)``: a fixed miscalibration of each instance that
   does not change between steps or with batching.

Committed and prompt positions keep a point mass on their own token (``log 1`` vs ``log f``).
``Calibration()`` (all defaults) is the identity on the exact oracle: floor 0 keeps its
``-1e9`` logits, so the closed-form curves hold exactly.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

#: log-probability of impossible tokens when ``floor == 0`` (the exact oracle's)
NEG_LOGIT = -1.0e9


@dataclass(frozen=True)
class Calibration:
    """Knobs of a calibrated oracle (see the module docstring); defaults = exact oracle."""

    floor: float = 0.0
    temperature: float = 1.0
    noise: float = 0.0
    confusion: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = (("floor", self.floor, lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
                  ("temperature", self.temperature, lambda v: v > 0, "> 0"),
                  ("noise", self.noise, lambda v: v >= 0, ">= 0"),
                  ("confusion", self.confusion, lambda v: 0.0 <= v < 1.0, "in [0, 1)"))
        for name, value, ok, allowed in checks:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or not ok(value):
                raise ValueError(f"calibration {name} must be a finite number {allowed}, "
                                 f"got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"calibration seed must be an int, got {self.seed!r}")

    @property
    def exact(self) -> bool:
        return (self.floor == 0 and self.temperature == 1 and self.noise == 0
                and self.confusion == 0)

    def confuse(self, probs: Tensor, names: Tensor, partner: Tensor) -> Tensor:
        """Move ``confusion`` of each name's mass to its partner. probs ``[..., V]`` float64;
        names ``[K]`` ids of the names, partner ``[K]`` the id each one is confused with."""
        if self.confusion == 0:
            return probs
        moved = probs[..., names] * self.confusion
        out = probs.clone()
        out[..., names] -= moved
        return out.index_add_(-1, partner, moved)

    def logits(self, probs: Tensor, masked: Tensor, prompt: Sequence[int]) -> Tensor:
        """Logits ``[R, G, V]`` float64 from conditionals ``probs [R, G, V]``.

        ``masked [R, G]``: positions the noise applies to; ``prompt``: the prompt ids the
        noise is keyed on (rows sharing a prompt share their noise).
        """
        if self.floor > 0:
            logits = probs.clamp_min(self.floor).log()
        else:
            logits = torch.where(probs > 0, probs.log(), torch.full_like(probs, NEG_LOGIT))
        if self.temperature != 1:
            logits = logits / self.temperature
        if self.noise > 0:
            eps = _noise(self.seed, tuple(prompt), tuple(probs.shape[1:]))
            logits = logits + torch.where(masked[..., None], self.noise * eps.to(probs.device),
                                          torch.zeros((), dtype=logits.dtype,
                                                      device=logits.device))
        return logits


@lru_cache(maxsize=2048)
def _noise(seed: int, prompt: tuple[int, ...], shape: tuple[int, ...]) -> Tensor:
    """Standard normal noise ``shape`` (float64) drawn from a generator keyed on
    ``(seed, prompt)``: the same for every step, row and batch that shares the prompt."""
    key = hashlib.sha256(f"{seed}:{list(prompt)}".encode()).hexdigest()
    gen = torch.Generator().manual_seed(int(key[:15], 16))
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def confusion_partners(vocab: Sequence[str], first_name: int) -> tuple[Tensor, Tensor]:
    """``(names [K], partner [K])``: each full name "F L" is paired with the next name of the
    vocabulary that has the same first name F (cyclically; itself if F is unique)."""
    by_first: dict[str, list[int]] = {}
    for i in range(first_name, len(vocab)):
        by_first.setdefault(vocab[i].split(" ")[0], []).append(i)
    names, partner = [], []
    for ids in by_first.values():
        for k, i in enumerate(ids):
            names.append(i)
            partner.append(ids[(k + 1) % len(ids)])
    return torch.tensor(names, dtype=torch.long), torch.tensor(partner, dtype=torch.long)
