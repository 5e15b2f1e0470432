"""The one decode loop: blocks -> steps -> forward -> propose -> select -> stop -> commit.

``decode_loop`` is the loop ``DiffusionSampler.generate`` runs for every model, policy and
cache mode; ``decode_step`` is its step. What a noise kind changes is handed to it as a
per-generation ``DecodeRun`` (``samplers.noise``: one per ``generate``, holding every tensor
of the generation; nothing lives in module attributes):

* **mask** (``samplers.mask_run.MaskRun``): the canvas starts as mask tokens; eligible =
  still masked; a commit writes a token for good (editing policies may rewrite committed
  positions, ``samplers.editing``); a block ends when no mask is left in it (plus post steps);
* **uniform** (``samplers.uniform.UniformRun``, DiffusionGemma): a block is one canvas of
  random tokens, started by the encoder-decoder cache plan (``cache.canvas.CanvasPlan``:
  the encoder appends the prompt or the previous canvas to the K/V cache); eligible = not yet
  accepted (a pending set); a commit is an acceptance, and every position left unaccepted
  is re-noised (an edit declared through ``Capabilities(edits=True)``); a block ends when
  every row is accepted or stable, or at the step budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from dllm_decode.types import Generation


class DecodeRun(Protocol):
    """A generation's state and the noise kind's parts of the loop.

    ``n_blocks`` blocks run left to right. ``start_block(blk)`` does the block's setup (budget
    schedule / time grid, the cache plan's block action) and returns its step cap;
    ``sync(i)`` is the one host sync per step and says whether step ``i`` runs (the
    termination contract); ``forward(i)`` runs the cache plan's forward over the fed span and
    ``post(fed, i)`` the work after it (propose -> select -> the contract -> stop -> commit);
    ``end_block(blk)`` returns ``True`` when every row is finished; ``finish()`` assembles
    the ``Generation``."""

    n_blocks: int

    def start_block(self, blk: int) -> int: ...

    def sync(self, i: int) -> bool: ...

    def forward(self, i: int) -> Any: ...

    def post(self, fed: Any, i: int) -> None: ...

    def end_block(self, blk: int) -> bool: ...

    def finish(self) -> Generation: ...


def decode_step(run: DecodeRun, i: int) -> None:
    """Step ``i`` of the current block: the cache plan's forward, then propose -> select ->
    stop -> commit (the noise kind's ``post``)."""
    fed = run.forward(i)
    run.post(fed, i)


def run_blocks(run: DecodeRun) -> Iterator[tuple[int, int | None]]:
    """The loop itself, as a generator: every block, every step of it until the noise kind's
    termination contract says the block is done (the step cap bounds it). Yields
    ``(blk, i)`` after step ``i`` of block ``blk`` and ``(blk, None)`` once the block has ended
    (``end_block`` ran); stops after the last block or the block that finished every row.
    ``decode_loop`` runs it through, ``samplers.stream`` turns it into events."""
    for blk in range(run.n_blocks):
        n_iter = run.start_block(blk)
        for i in range(n_iter):
            if not run.sync(i):  # the one host sync per step
                break
            decode_step(run, i)
            yield blk, i
        ended = run.end_block(blk)
        yield blk, None
        if ended:
            return


def decode_loop(run: DecodeRun) -> Generation:
    """Run a generation to its end (``run_blocks``), then the ``Generation``."""
    for _ in run_blocks(run):
        pass
    return run.finish()
