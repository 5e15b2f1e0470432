"""Scripted ``DiffusionLM`` for exact policy tests: logits come from a Python script.

A script maps a ``Call`` (the fed tokens, their canvas positions and the forward's index) to
logits ``[B, N, V]``. With ``cache="none"`` (the only mode the mock supports) every forward
feeds the whole canvas, so ``Call.step`` is the sampler's step index and ``Call.tokens`` is the
canvas: a script can key its logits on the step, the position, or what is committed.

Helpers build common scripts: ``peaked`` (a row with a known top-2 logit gap), ``from_probs``
(a row with known probabilities), ``constant`` and ``by_step`` (canvas-independent tables).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

#: logit of every token that is neither the top nor the runner-up in ``peaked`` rows
FLOOR = -30.0


@dataclass(frozen=True)
class Call:
    """One forward as a script sees it: tokens / positions ``[B, N]`` (positions are canvas
    indices: the mock has no left padding offsets), ``step`` = forwards before this one."""

    tokens: Tensor
    positions: Tensor
    step: int
    mask_token_id: int

    @property
    def masked(self) -> Tensor:
        """``[B, N]`` bool: positions still masked in the fed canvas."""
        return self.tokens == self.mask_token_id


Script = Callable[[Call], Tensor]


@pytest.fixture(autouse=True, scope="module")
def single_thread() -> Iterator[None]:
    """Run a test module's tiny decodes on one intra-op thread (much faster on a few shared
    cores); import it into a test module to enable it there. Restores the count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class ScriptedLM:
    """A ``DiffusionLM`` whose logits are ``script(Call)``; no weights, no cache.

    Defaults: vocabulary 16, mask id ``V - 1``, EOS ``V - 2``. ``calls`` counts forwards
    (``reset()`` sets it back to 0 before reusing the mock for another ``generate``). The
    script's output is copied, so the sampler's in-place edits never reach a stored table.
    """

    attention = "bidirectional"
    block_size = None
    family = "mock"

    def __init__(self, script: Script, *, vocab_size: int = 16, mask_token_id: int | None = None,
                 eos_token_ids: tuple[int, ...] | None = None, max_length: int = 256,
                 logit_shift: int = 0) -> None:
        self.script = script
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1 if mask_token_id is None else mask_token_id
        self.eos_token_ids = (vocab_size - 2,) if eos_token_ids is None else eos_token_ids
        self.max_length = max_length
        self.logit_shift = logit_shift
        self.calls = 0

    def reset(self) -> ScriptedLM:
        self.calls = 0
        return self

    def rope_positions(self, valid: Tensor) -> Tensor:
        b, length = valid.shape
        return torch.arange(length, device=valid.device).expand(b, length)

    def new_cache(self, batch_size: int, max_len: int) -> None:
        raise ValueError("ScriptedLM has no KV cache; use cache='none'")

    def forward(self, tokens: Tensor, positions: Tensor, *, cache: object = None,
                slots: Tensor | None = None, mask: Tensor | None = None, store: bool = True,
                hidden_rows: Tensor | None = None) -> Tensor:
        """tokens ``[B, N]`` -> logits ``[B, N, V]`` float32 (or rows ``hidden_rows``)."""
        if cache is not None:
            raise ValueError("ScriptedLM has no KV cache; use cache='none'")
        logits = self.script(Call(tokens, positions, self.calls, self.mask_token_id))
        self.calls += 1
        expected = (*tokens.shape, self.vocab_size)
        if tuple(logits.shape) != expected:
            raise ValueError(f"script returned {tuple(logits.shape)}, expected {expected}")
        logits = logits.float().clone()
        return logits if hidden_rows is None else logits[:, hidden_rows]

    __call__ = forward


def peaked(top: Tensor | int, gap: Tensor | float, vocab: int,
           runner_up: Tensor | int | None = None) -> Tensor:
    """Logit rows ``[..., V]`` with ``top`` at ``gap``, the runner-up at 0 and the rest at
    ``FLOOR``: the top-2 logit margin is exactly ``gap`` (> 0). The default runner-up is
    ``(top + 1) % (V - 1)``, never the default mask id ``V - 1``."""
    top = torch.as_tensor(top, dtype=torch.long)
    gap = torch.as_tensor(gap, dtype=torch.float32)
    top, gap = torch.broadcast_tensors(top, gap)
    second = (top + 1) % (vocab - 1) if runner_up is None else torch.as_tensor(runner_up)
    second = second.expand_as(top)
    out = torch.full((*top.shape, vocab), FLOOR)
    out.scatter_(-1, second[..., None], 0.0)
    out.scatter_(-1, top[..., None], gap[..., None])
    return out


def from_probs(probs: Tensor) -> Tensor:
    """Logits whose softmax is ``probs [..., V]`` (rows normalised; zeros become -1e4)."""
    probs = probs / probs.sum(-1, keepdim=True)
    return torch.log(probs.clamp_min(1e-30)).clamp_min(-1e4)


def constant(rows: Tensor) -> Script:
    """Script returning ``rows [L, V]`` (indexed by canvas position) at every step."""
    def script(call: Call) -> Tensor:
        return rows[call.positions]
    return script


def by_step(tables: Sequence[Tensor]) -> Script:
    """Script returning ``tables[step] [L, V]`` (the last table repeats)."""
    def script(call: Call) -> Tensor:
        return tables[min(call.step, len(tables) - 1)][call.positions]
    return script
