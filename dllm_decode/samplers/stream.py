"""Streaming one generation: ``DiffusionSampler.stream`` yields an event per decode step.

The loop is ``samplers.loop.run_blocks``, the generator ``decode_loop`` runs through: the
same ``DecodeRun`` (``samplers.noise``), the same blocks and steps in the same order, so the
tokens equal ``generate``'s. After every step it yields a ``StreamEvent`` (nothing becomes final
there), after every block one that carries the tokens that became final, and a last one
(``done``) with the ``Generation``.

What is final when (answer positions, one prompt row):

* mask models: a block's tokens once the loop leaves the block (its steps are over and
  ``end_block`` ran: the EOS fill of ``block_eos_stop`` is applied), up to its first position
  still masked (a block left with a mask, which a later step may still fill, is final only up
  to it). Editing policies (LLaDA2.1) rewrite committed tokens of the current block only, so
  their blocks too are final when left, never before.
* uniform-noise models (DiffusionGemma): a canvas once its last step ran (per canvas).
* at the end: every position not yet final, from the ``Generation``.

Host syncs: one ``tolist`` per block (the final tokens), none per step. ``provisional`` is
opt-in: it needs the step's proposal (an ``on_step`` hook on mask models, which turns the
fused and static-buffer steps off, tokens unchanged); each event then holds a device snapshot
of the block and converts it to ids only when ``StreamEvent.provisional`` is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dllm_decode.samplers.loop import DecodeRun, run_blocks
from dllm_decode.samplers.uniform import UniformRun
from dllm_decode.types import Generation, StepState


@dataclass(frozen=True)
class StreamEvent:
    """One event of ``DiffusionSampler.stream`` (answer positions count from 0 = the first
    generated token).

    step: decode steps run so far (all blocks); block: the current block (canvas) index.
    start: the answer position of ``final[0]``; final: token ids that became final with this
        event (append-only over the stream: ``start`` is the previous ``start + len(final)``).
    block_start / block_end: the current block's answer span ``[block_start, block_end)``.
    done: the last event; generation: the ``Generation`` (last event only, else ``None``).
    """

    step: int
    block: int
    start: int
    final: tuple[int, ...]
    block_start: int
    block_end: int
    done: bool = False
    generation: Generation | None = None
    _snapshot: Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def provisional(self) -> tuple[int, ...] | None:
        """The current block's canvas ``[block_end - block_start]`` ids: committed tokens plus
        the argmax of the masked positions (uniform: the canvas's current argmax). ``None``
        unless the stream was started with ``provisional=True``; one host sync per read."""
        return None if self._snapshot is None else tuple(self._snapshot.tolist())


def _spans(run: DecodeRun, g: int) -> tuple[int, int]:
    """The current block's answer span, clipped to ``[0, g)``."""
    p = run.p  # type: ignore[attr-defined]
    return max(run.bs - p, 0), min(run.be - p, g)  # type: ignore[attr-defined]


def _tokens(run: DecodeRun) -> Tensor:
    """The run's whole ``[B, L]`` token canvas (prompt and answer)."""
    return run.tokens if isinstance(run, UniformRun) else run.canvas  # type: ignore[attr-defined]


class _Proposals:
    """An ``on_step`` hook keeping the step's canvas-wide argmax ``[B, L]`` (mask models)."""

    def __init__(self) -> None:
        self.argmax: Tensor | None = None

    def __call__(self, state: StepState, commit: Tensor) -> None:
        prop = state.proposal
        self.argmax = prop.argmax if prop.argmax is not None else prop.tokens


def _snapshot(run: DecodeRun, hook: _Proposals | None, g: int) -> Tensor:
    """Device copy of the current block's provisional ids over its answer span (no host
    sync)."""
    p = run.p  # type: ignore[attr-defined]
    lo, hi = _spans(run, g)
    if isinstance(run, UniformRun):  # the canvas [B, C] starts at the block start
        off = run.bs - p
        ids = (torch.where(run.pending, run.argmax, run.canvas) if run.selector.sticky
               else run.argmax)
        return ids[0, lo - off:hi - off].clone()
    block = run.canvas[0, p + lo:p + hi]  # type: ignore[attr-defined]
    if hook is None or hook.argmax is None:
        return block.clone()
    return torch.where(block == run.mask_id, hook.argmax[0, p + lo:p + hi],  # type: ignore
                       block)


def stream_loop(run: DecodeRun, g: int, *, mask_id: int | None,
                hook: _Proposals | None = None,
                provisional: bool = False) -> Iterator[StreamEvent]:
    """The loop (``run_blocks``) of one row (``run`` of batch 1, ``g`` answer positions kept)
    as events: yields a ``StreamEvent`` after every step, after every block (with the
    tokens that became final) and at the end (``done``, with the ``Generation``)."""
    start = 0  # answer positions [0, start) are final

    def make(blk: int, final: tuple[int, ...], *, done: bool = False,
             out: Generation | None = None) -> StreamEvent:
        bs, be = _spans(run, g)
        shot = _snapshot(run, hook, g) if provisional else None
        return StreamEvent(step=run.step, block=blk, start=start, final=final,  # type: ignore
                           block_start=bs, block_end=be, done=done, generation=out,
                           _snapshot=shot)

    blk = 0
    for blk, i in run_blocks(run):  # the one loop (its one host sync per step)
        if i is not None:  # after a step: nothing final yet
            yield make(blk, ())
            continue
        _, be = _spans(run, g)  # the block ended
        if be > start:  # one host read per block: the block's tokens
            ids = _tokens(run)[0, run.p + start:run.p + be].tolist()  # type: ignore[attr-defined]
            if mask_id is not None and mask_id in ids:
                ids = ids[:ids.index(mask_id)]  # a later step may still fill the mask
            event = make(blk, tuple(ids))
            start += len(ids)
            yield event
    out = run.finish()
    rest = tuple(out.answer[0, start:g].tolist())
    yield make(blk, rest, done=True, out=out)


def stream_hook(run_kind: str, provisional: bool) -> _Proposals | None:
    """The ``on_step`` hook a stream needs (mask models with ``provisional`` only)."""
    return _Proposals() if provisional and run_kind == "mask" else None

