"""Token editing in the one decode loop: which committed positions a step may rewrite, and
when a block that has no mask left keeps running.

A selector that declares ``Capabilities(edits=True)`` may return ``Selection(commit, tokens,
edit=...)``: ``edit`` rewrites committed positions (LLaDA2.1's T2T editing; Bie et al., "LLaDA2.1:
Speeding Up Text Diffusion via Token Editing", arXiv 2602.08676; reference: the remote-code
``LLaDA2MoeModelLM.generate`` of LLaDA2.1, as copied in ZHZisZZ/dllm ``pipelines/llada21``).
The loop follows the reference's bound on edits, per row:

* while the row's current block has a mask, every step may edit (each such step also commits
  at least one mask, so this phase is bounded by the block's length);
* once the block has no mask, each further step is a **post step**: the row takes part (one
  forward, counted in its NFE) while its previous post step edited something, at most
  ``max_post_steps`` of them; a post step that edits nothing ends the row's block, and so does
  the ``max_post_steps`` bound (checked before the forward, as the reference does).

So a block runs at most ``masked + max_post_steps`` steps and every decode terminates (LLaDA2.1
can oscillate between two tokens; the bound stops it). ``StepState.editable`` is the set a step
may rewrite: generated positions of the current block that are committed, fed this step, in
rows still taking part. The contract (``samplers.contract.StepGuard.observe_edit``) rejects an
edit outside it or one that writes the mask token, at the next sync, like an ineligible commit.

Noise kinds: ``editable`` is built from the loop's ``masked`` (the positions still unknown).
A uniform-noise model (DiffusionGemma) defines unknown as "not yet accepted" instead of
"holds the mask token"; re-noising an accepted position is then an edit under the same rule.
"""

from __future__ import annotations

import torch
from torch import Tensor


class EditTracker:
    """Per-generation post-step state of an editing policy (sync-free; one per ``generate``).

    Args:
        batch: B.
        device: where the ``[B]`` records live.
        max_post_steps: the policy's ``Capabilities.max_post_steps``.
    """

    def __init__(self, batch: int, device: torch.device, max_post_steps: int) -> None:
        self.max_post_steps = max_post_steps
        self._zeros = torch.zeros(batch, dtype=torch.long, device=device)
        self._false = torch.zeros(batch, dtype=torch.bool, device=device)
        self.used = self._zeros  # [B] post steps taken in the current block
        self.done = self._false  # [B] the row's block is over (no mask, editing ended)
        self.post = self._false  # [B] this step is a post step of the row (no mask at start)
        self.rows = ~self._false  # [B] rows taking part in this step

    def start_block(self, block_masked: Tensor) -> None:
        """A new block (``block_masked [B]``: whether each row's block has a mask): no post
        step taken; a row whose block starts without a mask (its answer already ended, e.g.
        at an EOS) takes no part in it."""
        self.used, self.done = self._zeros, ~block_masked

    def begin_step(self, block_masked: Tensor) -> Tensor:
        """Before the step's sync: ``block_masked [B]`` whether each row's block has a mask.

        Returns the 0-d float64 number of rows in a post step that still take part (the
        loop's "is anything left to do in this block" besides masks; folded into the sync).
        """
        post = ~block_masked & ~self.done
        self.used = self.used + post
        self.done = self.done | (post & (self.used > self.max_post_steps))
        self.post = post & ~self.done
        self.rows = block_masked | self.post
        return self.post.sum(dtype=torch.float64)

    def editable(self, masked: Tensor, fed: Tensor, span: Tensor) -> Tensor:
        """``[B, L]`` bool: committed (``~masked``), fed this step (``fed``), inside the
        generated part of the current block (``span``), in rows taking part."""
        return ~masked & fed & span & self.rows[:, None]

    def end_step(self, edit: Tensor | None) -> None:
        """After the step: a post step that rewrote nothing ends the row's block."""
        edited = self._false if edit is None else edit.any(1)
        self.done = self.done | (self.post & ~edited)
