"""The decode contract, enforced on every run (not only with ``debug=True``).

What ``DiffusionSampler.generate`` guarantees, and how each part is checked:

* **finite logits**: a step whose scored positions have a non-finite probability or entropy
  (NaN or +inf anywhere in a position's logits, or every logit -inf) raises
  ``NonFiniteLogitsError`` naming the step and the rows;
* **commits are eligible**: a selector that commits a position that is not eligible (a prompt
  token, an already committed one, a position outside the block) raises ``PolicyContractError``;
* **progress**: a selector that commits nothing in a row that had eligible positions (and a
  scheduled budget > 0) for a whole block's worth of steps raises ``StalledPolicyError`` naming
  the policy (selectors declaring ``may_commit_nothing`` are exempt, e.g. Dream's ``origin``);
* **no masks returned**: a policy that under-commits its budget is *not* carried over; the
  block's last step (the scheduled one, or the ``max_steps_per_block`` cap) commits every
  eligible position the policy left, at its proposal (``force_block_end``). Masks that survive
  even that raise ``IncompleteDecodeError``. The one exception is ``allow_prompt_masks=True``
  (LLaDA infilling): prompt masks compete for every step's budget and earlier masks stay
  eligible, exactly as in LLaDA's ``generate``, which can end with masks in the answer; that
  mode keeps the reference's behaviour (no forcing, no final mask check).

Sync behaviour: the per-step checks only update small ``[B]`` device tensors; ``flag()`` is a
0-d tensor the sampler folds into the one host sync each step already makes, so a violation is
reported at the next step's sync (``raise_if``), and ``finish`` makes the one sync after the
loop. Normal decodes take no extra sync and are token-for-token unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.types import Proposal


class DecodeContractError(RuntimeError):
    """A model or a policy broke the decode contract (see ``dllm_decode.samplers.contract``)."""


class NonFiniteLogitsError(DecodeContractError):
    """The model produced NaN / inf logits (or a position with every logit -inf)."""


class PolicyContractError(DecodeContractError):
    """A selector returned a malformed commit mask or committed an ineligible position."""


class StalledPolicyError(DecodeContractError):
    """A selector committed nothing for a whole block's worth of steps."""


class IncompleteDecodeError(DecodeContractError):
    """Masks remained in the answer after decoding."""


class StepGuard:
    """Per-generation contract state; every method but ``raise_if`` / ``finish`` is sync-free.

    Args:
        batch: B.
        device: where the tracking tensors live.
        policy: the policy's name (for messages).
        exempt_stall: skip the progress check (``may_commit_nothing`` selectors).
    """

    def __init__(self, batch: int, device: torch.device, policy: str, *,
                 exempt_stall: bool = False) -> None:
        self.policy = policy
        self.exempt_stall = exempt_stall
        none = torch.full((batch,), -1, dtype=torch.long, device=device)
        self.nonfinite_at = none.clone()  # [B] first step with non-finite scores (-1: none)
        self.ineligible_at = none.clone()  # [B] first step with an ineligible commit
        self.stalled_at = none.clone()  # [B] step at which the row was declared stalled
        self.idle = torch.zeros(batch, dtype=torch.long, device=device)  # steps w/o commits
        self.block_expected = torch.zeros(batch, dtype=torch.bool, device=device)
        self.block_did = torch.zeros(batch, dtype=torch.bool, device=device)

    def start_block(self) -> None:
        """Reset the per-block progress record (sync-free)."""
        self.block_expected.zero_()
        self.block_did.zero_()

    # ---- in the step loop (no sync) ---------------------------------------------------------
    def check_shape(self, commit: Any, eligible: Tensor) -> None:
        """Host-side (metadata only): ``commit`` must be a bool tensor shaped like eligible."""
        if not isinstance(commit, Tensor) or commit.dtype != torch.bool or \
                commit.shape != eligible.shape:
            got = (f"{commit.dtype} {tuple(commit.shape)}" if isinstance(commit, Tensor)
                   else type(commit).__name__)
            raise PolicyContractError(
                f"policy {self.policy!r}: select() must return a bool commit mask "
                f"{tuple(eligible.shape)} (or a types.Selection), got {got}")

    def observe(self, step: int, prop: Proposal, live: Tensor | None, eligible: Tensor,
                budget: Tensor | None, commit: Tensor, block_steps: int, last: bool) -> None:
        """Record this step's violations.

        Args:
            step: global step index.
            prop: the scored proposal ``[B, R]``.
            live: ``[B, R]`` bool, scored entries that are real (``None``: all).
            eligible: ``[B, L]`` bool.
            budget: ``[B]`` int64 scheduled commits, or ``None`` (adaptive).
            commit: ``[B, L]`` bool, the selector's own commit mask (before forcing).
            block_steps: a whole block's worth of steps (the stall limit).
            last: this is the block's last step: a row that was expected to commit in the
                block and never did is stalled, however few steps the block had.
        """
        bad = ~(torch.isfinite(prop.prob) & torch.isfinite(prop.neg_entropy))
        if live is not None:
            bad &= live
        self._first(self.nonfinite_at, bad.any(1), step)
        self._first(self.ineligible_at, (commit & ~eligible).any(1), step)
        if self.exempt_stall:
            return
        expected = eligible.any(1)
        if budget is not None:
            expected &= budget > 0
        did = commit.any(1)
        self.idle = torch.where(did, 0, self.idle + expected.long())
        self.block_expected |= expected
        self.block_did |= did
        stalled = self.idle >= block_steps
        if last:
            stalled |= self.block_expected & ~self.block_did
        self._first(self.stalled_at, stalled, step)

    @staticmethod
    def _first(at: Tensor, now: Tensor, step: int) -> None:
        at.copy_(torch.where(now & (at < 0), step, at))

    def flag(self) -> Tensor:
        """0-d int64: number of rows with a violation so far (fold into the step's sync)."""
        return ((self.nonfinite_at >= 0) | (self.ineligible_at >= 0) |
                (self.stalled_at >= 0)).sum()

    # ---- host side --------------------------------------------------------------------------
    def raise_if(self, n_bad: int) -> None:
        """``n_bad``: the synced ``flag()``; if nonzero, sync the details and raise."""
        if not n_bad:
            return
        nonfinite = _rows(self.nonfinite_at)
        if nonfinite:
            raise NonFiniteLogitsError(
                f"the model returned non-finite logits (NaN, +inf, or all -inf at a position) "
                f"at step {_first_step(self.nonfinite_at)} in rows {nonfinite}; check the "
                f"checkpoint (load_model(..., check_finite=True)), the dtype (fp16 overflow) "
                f"and any logits processing")
        ineligible = _rows(self.ineligible_at)
        if ineligible:
            raise PolicyContractError(
                f"policy {self.policy!r} committed positions that were not eligible (not masked "
                f"or outside the block) at step {_first_step(self.ineligible_at)} in rows "
                f"{ineligible}; select() must return a subset of state.eligible")
        stalled = _rows(self.stalled_at)
        if stalled:
            raise StalledPolicyError(
                f"policy {self.policy!r} committed nothing for a whole block's worth of steps "
                f"(until step {_first_step(self.stalled_at)}) in rows {stalled} although they "
                f"had eligible positions; select() must commit at least one eligible position "
                f"per row when the budget is > 0 (declare capabilities = Capabilities("
                f"may_commit_nothing=True) for random "
                f"reveals that end with a full reveal)")

    def finish(self, answer: Tensor, mask_id: int, *, check_masks: bool = True) -> None:
        """The one sync after the loop: last step's violations, then no masks in ``answer``.

        Args:
            answer: ``[B, G]`` the generated region of the final canvas.
            mask_id: the model's mask token id.
            check_masks: raise if masks remain (off only for ``allow_prompt_masks``).
        """
        left = (answer == mask_id).sum(1) * check_masks
        n_bad, n_left = torch.stack([self.flag(), left.sum()]).tolist()
        self.raise_if(n_bad)
        if n_left:
            rows = (left > 0).nonzero().flatten().tolist()
            raise IncompleteDecodeError(
                f"policy {self.policy!r} left {n_left} masked position(s) in rows {rows} at the "
                f"end of decoding (positions that were never eligible with a fresh proposal, "
                f"e.g. outside a cache window); raise max_steps_per_block or use another cache "
                f"mode")


def force_block_end(commit: Tensor, eligible: Tensor, block: tuple[int, int]) -> Tensor:
    """At a block's last step: ``commit`` plus every eligible position of ``block``
    (``[start, end)``; lookahead positions past it are left to their policy). Sync-free; a
    no-op for policies that honour their budget or finish the block within the step cap."""
    pos = torch.arange(eligible.shape[1], device=eligible.device)
    return commit | (eligible & ((pos >= block[0]) & (pos < block[1]))[None])


def _rows(at: Tensor) -> list[int]:
    return (at >= 0).nonzero().flatten().tolist()


def _first_step(at: Tensor) -> int:
    return int(at[at >= 0].min())
