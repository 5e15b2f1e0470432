"""What a policy sees inside SGLang besides the proposal: watched states, the step model, and
the row helpers of ``block``.

``Watched`` (with ``WatchedExtras``) records which per-row step values a policy read, so that
rows at different steps of their blocks can share one call when it reads none of them;
``ServedStepModel`` is ``StepState.model`` without extra forwards. No SGLang import.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.integrations.sglang.spec import ServedModel
from dllm_decode.samplers.proposals import ProposalMaker
from dllm_decode.types import Proposal, StepState

#: ``StepState`` host fields that differ between rows at different steps of their blocks (or
#: with different prompt tails)
STEP_FIELDS = frozenset({"step", "block_step", "steps_left", "progress", "times",
                         "block_start", "gen_start"})


@dataclass
class Watched(StepState):
    """A ``StepState`` that records which of ``STEP_FIELDS`` a policy read."""

    reads: set[str] = field(default_factory=set, repr=False, compare=False)

    def __getattribute__(self, name: str) -> Any:
        if name in STEP_FIELDS:
            object.__getattribute__(self, "reads").add(name)
        return object.__getattribute__(self, name)


@dataclass
class RowsState(StepState):
    """A ``StepState`` whose per-row values that few parts read (``progress``, ``refreshed``)
    are made on first read: ``lazy`` maps a field to the function that makes it (no tensor op
    for a part that never reads it)."""

    lazy: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __getattribute__(self, name: str) -> Any:
        if name in LAZY_FIELDS:
            make = object.__getattribute__(self, "lazy").pop(name, None)
            if make is not None:
                object.__setattr__(self, name, make())
        return object.__getattribute__(self, name)


#: ``StepState`` fields ``RowsState`` may make on first read
LAZY_FIELDS = frozenset({"progress", "refreshed"})


class WatchedExtras(dict):
    """``StepState.extras`` of a watched state: reading ``total_steps`` (a row's schedule
    length, like ``progress``) is recorded as reading ``progress``."""

    def __init__(self, reads: set[str], items: dict[str, Any]) -> None:
        super().__init__(items)
        self._reads = reads

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def _note(self, key: str) -> None:
        if key == "total_steps":
            self._reads.add("progress")


class ServedStepModel:
    """``StepState.model`` inside SGLang: the sampling distribution; no extra forwards (those
    policies are refused at server start)."""

    def __init__(self, served: ServedModel, maker: ProposalMaker) -> None:
        self.mask_token_id, self.eos_token_ids = served.mask_token_id, served.eos_token_ids
        self.block_size, self._maker = served.block_size, maker

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise ValueError("extra model forwards are not available inside SGLang (one forward "
                         "per step); decode this policy with DiffusionSampler")

    @property
    def positions(self) -> Tensor:
        raise ValueError("StepState.model.positions is not available inside SGLang")

    valid = positions

    def probs(self, logits: Tensor) -> Tensor:
        return self._maker.distribution(logits)


def request_seed(base: int, rid: str, block_start: int) -> int:
    """A request's seed for the block at ``block_start``: a stable 63-bit hash of the config's
    seed, the request id and the block position (the same on every rank and in any batch)."""
    text = f"{base}:{rid}:{block_start}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def take_rows(prop: Proposal, idx: Tensor | None) -> Proposal:
    """The rows ``idx`` of a ``Proposal`` (every field it has)."""
    if idx is None:
        return prop

    def t(x: Tensor | None) -> Tensor | None:
        return None if x is None else x.index_select(0, idx)

    return Proposal(t(prop.tokens), t(prop.prob), t(prop.get("margin")),
                    t(prop.get("logit_margin")), t(prop.get("neg_entropy")), t(prop.argmax),
                    t(prop.lse))


def unscored(prop: Proposal, canvas: Tensor, fresh: Tensor) -> Proposal:
    """A block-wide ``[b, K]`` proposal with the unscored positions (``~fresh``: the prompt
    tail) as ``samplers.proposals.widen`` leaves them: the canvas token, 0 (the LSE dropped);
    one ``where`` per field instead of widen's scatters (the proposal already spans the block).
    """
    names = prop.computed()
    floats = [torch.where(fresh, prop.prob, 0.0)] + [
        torch.where(fresh, prop.get(n), 0.0) for n in names]
    tokens = torch.where(fresh, prop.tokens, canvas)
    argmax = None if prop.argmax is None else torch.where(fresh, prop.argmax, canvas)
    extra = dict(zip(names, floats[1:], strict=True))
    return Proposal(tokens, floats[0], extra.get("margin"), extra.get("logit_margin"),
                    extra.get("neg_entropy"), argmax)
