"""``Supervised``: a selector that carries its stopper's per-generation memory.

The sampler initialises memory only for the *selector*; a stopper with memory (SchED) is paired
with the base selector in a ``Supervised`` wrapper, which owns both memories (``PairedMemory``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dllm_decode.policies.base import bind_of, init_memory_of
from dllm_decode.policies.capabilities import Capabilities, capabilities_of
from dllm_decode.types import StepState


@dataclass
class PairedMemory:
    """Memory of a ``Supervised`` selector: the base selector's and the stopper's."""

    selector: Any
    stopper: Any


@dataclass(frozen=True)
class Supervised:
    """A selector that also owns its stopper's memory (the sampler initialises only the
    selector's). ``select`` runs the base selector with its own memory; the stopper finds its
    memory at ``state.memory.stopper``. Any other attribute is the base selector's.
    The base sees the sampler's per-row budgets: stops are per row, so rows diverge.
    ``bind`` binds the base and the stopper and returns a ``Supervised`` again, whatever the
    base's ``bind`` returns, so the paired memory survives any base (Learn2PD, EoTP, ...).
    """

    selector: Any
    stopper: Any

    def bind(self, model: Any, cfg: Any = None) -> Supervised:
        """A copy with the base selector and the stopper bound to ``model`` / ``cfg``."""
        sel, stop = bind_of(self.selector, model, cfg), bind_of(self.stopper, model, cfg)
        if sel is self.selector and stop is self.stopper:
            return self
        return replace(self, selector=sel, stopper=stop)

    @property
    def capabilities(self) -> Capabilities:
        """The base selector's."""
        return capabilities_of(self.selector)

    def __getattr__(self, name: str) -> Any:
        # any other attribute (a hook or parameter of the base) is the base selector's
        if name.startswith("__") or name in ("selector", "stopper"):
            raise AttributeError(name)
        return getattr(self.selector, name)

    def init_memory(self, batch: int, length: int, device: torch.device) -> PairedMemory:
        init = getattr(self.stopper, "init_memory", None)
        return PairedMemory(selector=init_memory_of(self.selector, batch, length, device),
                            stopper=init(batch, length, device) if init else None)

    def fuse_logits(self, logits: Tensor, rows: Tensor, masked: Tensor, memory: Any,
                    block: tuple[Any, int], block_step: Tensor | None = None) -> Tensor:
        """The base selector's score transform (``Capabilities.fuses_logits``, declared by the
        base) with the base's own memory (``block_step``: per-row steps, passed on)."""
        own = memory.selector if isinstance(memory, PairedMemory) else memory
        if block_step is None:
            return self.selector.fuse_logits(logits, rows, masked, own, block)
        return self.selector.fuse_logits(logits, rows, masked, own, block,
                                         block_step=block_step)

    def select(self, state: StepState) -> Tensor:
        """The base selector's result (a commit mask ``[B, L]`` or a ``Selection``)."""
        mem = state.memory
        own = mem.selector if isinstance(mem, PairedMemory) else mem
        return self.selector.select(replace(state, memory=own))
