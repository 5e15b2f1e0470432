"""The decode contract, enforced on every run (not only with ``debug=True``).

What ``DiffusionSampler.generate`` guarantees, and how each part is checked:

* **finite logits**: a step whose scored positions have a non-finite probability or entropy
  (NaN or +inf anywhere in a position's logits, or every logit -inf) raises
  ``NonFiniteLogitsError`` naming the step and the rows (when no policy part reads the
  entropy it is not computed, and the log-sum-exp of the logits, finite exactly when the
  entropy is, is checked instead);
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
loop. Normal decodes take no extra sync and are token-for-token unchanged. Since a violation
raises at the very next sync, only the last observed step's record is kept: it is the first
violating step.
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
        # [3, B] the last observed step's violations per row (one stack per step): non-finite
        # scores, an ineligible commit, a stalled row; ``_step`` is that step
        self._now = torch.zeros((3, batch), dtype=torch.bool, device=device)
        self._step = -1
        self.idle = torch.zeros(batch, dtype=torch.long, device=device)  # steps w/o commits
        self._block = torch.zeros(2, batch, dtype=torch.bool, device=device)  # one reset
        self.block_expected, self.block_did = self._block.unbind(0)

    def start_block(self) -> None:
        """Reset the per-block progress record (sync-free)."""
        self._block.zero_()

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
                budget: Tensor | None, commit: Tensor, block_steps: int, last: bool,
                expected: Tensor | None = None) -> None:
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
            expected: ``eligible.any(1)`` if the caller has it (saves the reduction).
        """
        # prob and entropy are both finite iff their sum is (|prob| <= 1, |H| <= log V); when
        # the entropy was not computed, the LSE stands in: it is finite iff the entropy is
        # (a NaN or +inf logit, or every logit -inf, make both non-finite)
        check = prop.get("neg_entropy")
        if check is None:
            check = prop.lse
        ok = torch.isfinite(prop.prob if check is None else prop.prob + check)
        if live is not None:
            ok |= ~live
        nonfinite = ~ok.all(1)
        ineligible = (commit > eligible).any(1)  # commit & ~eligible, one op
        if self.exempt_stall:
            self._first(torch.stack([nonfinite, ineligible, torch.zeros_like(nonfinite)]), step)
            return
        if expected is None:
            expected = eligible.any(1)
        if budget is not None:
            expected = expected & (budget > 0)
        did = commit.any(1)
        self.idle = torch.where(did, 0, self.idle + expected)
        self.block_expected |= expected
        self.block_did |= did
        stalled = self.idle >= block_steps
        if last:
            stalled |= self.block_expected & ~self.block_did
        self._first(torch.stack([nonfinite, ineligible, stalled]), step)

    def _first(self, now: Tensor, step: int) -> None:
        """Keep ``now [3, B]`` as step ``step``'s record. Nothing was recorded before: a
        violation raises at the next step's sync (``raise_if``), before the next ``observe``,
        so a recorded step is the first violating one."""
        self._now, self._step = now, step

    def flag(self) -> Tensor:
        """0-d int64: how many violations the last observed step recorded (fold into the
        step's sync; ``raise_if`` takes its value)."""
        return self._now.sum()

    # ---- host side --------------------------------------------------------------------------
    def raise_if(self, n_bad: int) -> None:
        """``n_bad``: the synced ``flag()``; if > 0, sync the details and raise."""
        if n_bad <= 0:
            return
        nonfinite, ineligible, stalled = (_rows(now) for now in self._now)
        step = self._step
        if nonfinite:
            raise NonFiniteLogitsError(
                f"the model returned non-finite logits (NaN, +inf, or all -inf at a position) "
                f"at step {step} in rows {nonfinite}; check the "
                f"checkpoint (load_model(..., check_finite=True)), the dtype (fp16 overflow) "
                f"and any logits processing")
        if ineligible:
            raise PolicyContractError(
                f"policy {self.policy!r} committed positions that were not eligible (not masked "
                f"or outside the block) at step {step} in rows "
                f"{ineligible}; select() must return a subset of state.eligible")
        if stalled:
            raise StalledPolicyError(
                f"policy {self.policy!r} committed nothing for a whole block's worth of steps "
                f"(until step {step}) in rows {stalled} although they "
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


def _rows(now: Tensor) -> list[int]:
    return now.nonzero().flatten().tolist()
