"""The decode contract, enforced on every run (not only with ``debug=True``).

What ``DiffusionSampler.generate`` guarantees, and how each part is checked:

* **finite logits**: a step whose scored positions have a non-finite probability or entropy
  (NaN or +inf anywhere in a position's logits, or every logit -inf) raises
  ``NonFiniteLogitsError`` naming the step and the rows (when no policy part reads the
  entropy it is not computed, and the log-sum-exp of the logits, finite exactly when the
  entropy is, is checked instead);
* **commits are eligible**: a selector that commits a position that is not eligible (a prompt
  token, an already committed one, a position outside the block) raises ``PolicyContractError``;
* **budgets are kept**: a budgeted selector (``Capabilities(budgeted=True)``, the default) that
  commits more than ``state.budget`` positions in a row raises ``PolicyContractError`` (its
  block ends after its scheduled steps, so the number per step is the schedule's; a rule that
  commits a varying number declares ``budgeted=False``, one that takes the schedule as its
  floor ``at_least_budget=True``);
* **edits are editable**: a selector declaring ``Capabilities(edits=True)`` may rewrite
  positions of ``StepState.editable`` (committed, generated, in the current block, fed) to a
  token other than the mask (the mask too, re-masking, with ``remasks=True``; never on a
  block's last step); anything else raises ``PolicyContractError``. Edits are bounded
  per block (``samplers.editing``: the masked phase plus at most ``max_post_steps`` post
  steps), so editing decodes terminate too;
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

Sync behaviour: the per-step checks reduce to a few 0-d device values (``flags()``: a float64
sum of the scored values, an "ineligible commit" flag, the largest idle count and block record)
that the sampler folds into the one host sync each step already makes, so a violation is
reported at the next step's sync (``raise_if``, which only then computes the rows from the
step's kept tensors), and ``finish`` makes the one sync after the loop. Normal decodes take no
extra sync and are token-for-token unchanged. Since a violation raises at the very next sync,
only the last observed step's record is kept: it is the first violating step.
"""

from __future__ import annotations

import math
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

    A step's checks reduce to a few 0-d device values (``flags``) that the sampler stacks into
    the one host sync it makes anyway; the per-row details are computed from the step's kept
    tensors only when a value says something is wrong (``raise_if``).

    Args:
        batch: B.
        device: where the tracking tensors live.
        policy: the policy's name (for messages).
        exempt_stall: skip the progress check (``may_commit_nothing`` selectors).
        remasks: edits may write the mask token (``Capabilities.remasks``, re-masking).
        budgeted: the selector is budgeted and not ``at_least_budget``: committing more than
            ``state.budget`` in a row is a violation (counted with the ineligible commits).
    """

    #: the "committed in this block" reset of the block record (any row that committed sits far
    #: below 1 for the rest of the block, whatever it is expected to do afterwards)
    _DID = -float(1 << 40)

    def __init__(self, batch: int, device: torch.device, policy: str, *,
                 exempt_stall: bool = False, budgeted: bool = False,
                 remasks: bool = False) -> None:
        self.policy = policy
        self.exempt_stall = exempt_stall
        self.budgeted = budgeted
        self.remasks = remasks
        # [2, B] progress record: row 0 the steps without a commit since the last one in which
        # the row was expected to commit (``idle``; a stall at ``>= block_steps``), row 1 the
        # same count since the block started, or ``_DID`` once the row committed in it (``>= 1``
        # at the block's last step: expected in the block and never committed). float64 like
        # every synced value (one dtype keeps the sync's stack cheap; counts stay exact)
        self._track = torch.zeros((2, batch), dtype=torch.float64, device=device)
        self._reset = torch.tensor([[0.0], [self._DID]], dtype=torch.float64, device=device)
        self._keep_idle = torch.tensor([[1.0], [0.0]], dtype=torch.float64, device=device)
        self._zero = torch.zeros((), dtype=torch.float64, device=device)
        self._flags: list[Tensor] = []
        self._limits: tuple[int, bool] = (0, False)  # the observed step's stall limit, last
        self._last_step: tuple[Any, ...] = ()  # the observed step's tensors
        self._bad_edit: Tensor | None = None  # the observed step's invalid edits [B, L]

    def start_block(self) -> None:
        """Reset the per-block progress record (sync-free; a new tensor: the last step's record
        may still be read by ``raise_if``)."""
        self._track = self._track * self._keep_idle

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
                expected: Tensor, commit: Tensor, block_steps: int, last: bool,
                at: Tensor | None = None, budget: Tensor | None = None) -> None:
        """Record this step's checks (0-d values for the next sync; see ``flags``).

        Args:
            step: global step index.
            prop: the scored proposal ``[B, R]``, or ``[K]`` at the flattened canvas
                positions ``at`` (masked-rows scoring).
            live: ``[B, R]`` bool, scored entries that are real (``None``: all).
            eligible: ``[B, L]`` bool.
            expected: ``[B]`` bool, rows expected to commit this step: an eligible position
                and, for scheduled policies, a budget > 0 (``expected_rows``).
            commit: ``[B, L]`` bool, the selector's own commit mask (before forcing).
            block_steps: a whole block's worth of steps (the stall limit).
            last: this is the block's last step: a row that was expected to commit in the
                block and never did is stalled, however few steps the block had.
            at: ``[K]`` indices into the flattened ``[B * L]`` canvas of a 1-D ``prop``.
            budget: ``[B]`` int64 the step's scheduled commits (``None``: adaptive); checked
                for budgeted selectors.
        """
        # prob and entropy are both finite iff their sum is (|prob| <= 1, |H| <= log V); when
        # the entropy was not computed, the LSE stands in: it is finite iff the entropy is
        # (a NaN or +inf logit, or every logit -inf, make both non-finite). Their float64 sum
        # over the step is finite iff every term is (fp32 terms cannot overflow it).
        check = prop.get("neg_entropy")
        if check is None:
            check = prop.lse
        scores = prop.prob if check is None else prop.prob + check
        if live is not None:
            scores = torch.where(live, scores, 0.0)
        f64 = torch.float64  # every synced value (the sampler's counts too): one dtype
        bad = (commit > eligible).sum(dtype=f64)  # commit & ~eligible
        if budget is None or not self.budgeted:
            budget = None
        else:  # more commits than scheduled: folded into the same flag
            bad = bad + (commit.sum(1) > budget).sum(dtype=f64)
        flags = [scores.sum(dtype=f64), bad]
        track = None
        if not self.exempt_stall:
            track = self._track = torch.where(commit.any(1), self._reset,
                                              self._track + expected)
            flags += track.amax(1).unbind()
        self._flags = flags
        self._limits = (block_steps, last)
        self._last_step = (step, scores, live, at, commit, eligible, track, budget)
        self._bad_edit = None

    def observe_edit(self, edit: Tensor, editable: Tensor, tokens: Tensor,
                     mask_id: int) -> None:
        """After ``observe``: record this step's invalid edits (sync-free), folded into the
        "ineligible" flag: ``edit [B, L]`` outside ``editable [B, L]`` or writing ``mask_id``
        (``tokens [B, L]``: the tokens written) unless the policy declared ``remasks``."""
        bad = edit & ~editable if self.remasks else edit & (~editable | (tokens == mask_id))
        self._bad_edit = bad
        self._flags[1] = self._flags[1] + bad.sum(dtype=torch.float64)

    def observe_fused(self, step: int, check: Tensor, commit: Tensor, eligible: Tensor,
                      expected: Tensor, block_steps: int, at: Tensor | None = None) -> None:
        """``observe`` for the fused step's selections (``samplers.fused``: a top-k of the
        budget, or a threshold plus the best position, over ``eligible``): the commit is a
        subset of eligible by construction, and every expected row commits (an eligible
        position, and for the top-k a budget > 0, give at least one), so the progress
        record's update is a select and its values cannot grow (the flags report 0 for both;
        the previous step's values were checked at this step's sync).

        Args:
            check: ``[B, R]`` the proposal's LSE (finite iff the row's logits are usable; its
                probability is then finite too), or the probability where no LSE was made;
                ``[K]`` at the flattened canvas positions ``at`` (masked-rows scoring).
            commit, eligible: ``[B, R]`` bool on the fed span (``[B, L]`` with ``at``);
            expected: ``[B]`` bool.
            block_steps: the stall limit (as ``observe``; never the block's last step).
        """
        zero = self._zero
        flags = [check.sum(dtype=torch.float64), zero]
        track = None
        if not self.exempt_stall:
            track = self._track = torch.where(expected, self._reset, self._track)
            flags += [zero, zero]
        self._flags = flags
        self._limits = (block_steps, False)
        self._last_step = (step, check, None, at, commit, eligible, track, None)
        self._bad_edit = None

    def flags(self) -> list[Tensor]:
        """The last observed step's 0-d check values, to stack into the step's sync (in order;
        ``raise_if`` takes their host values): the float64 sum of the scored values, whether
        ineligible commits, and (unless exempt) the largest idle count and block record (all
        float64 0-d tensors)."""
        return self._flags

    # ---- host side --------------------------------------------------------------------------
    def raise_if(self, values: list[float]) -> None:
        """``values``: the synced ``flags()``; raise if they show a violation (the per-row
        details are computed from the observed step's tensors only then)."""
        if not values:
            return
        block_steps, last = self._limits
        bad_score = not math.isfinite(values[0])
        stalled_any = len(values) > 2 and (values[2] >= block_steps or (last and values[3] >= 1))
        if not (bad_score or values[1] or stalled_any):
            return
        step, scores, live, at, commit, eligible, track, budget = self._last_step
        if bad_score:
            bad = ~torch.isfinite(scores)
            if live is not None:
                bad &= live
            rows = (at[bad] // eligible.shape[1]).unique().tolist() if at is not None else \
                _rows(bad.any(1))
            raise NonFiniteLogitsError(
                f"the model returned non-finite logits (NaN, +inf, or all -inf at a position) "
                f"at step {step} in rows {rows}; check the "
                f"checkpoint (load_model(..., check_finite=True)), the dtype (fp16 overflow) "
                f"and any logits processing")
        bad_edit = self._bad_edit
        if values[1] and bad_edit is not None and bool(bad_edit.any()):
            raise PolicyContractError(
                f"policy {self.policy!r} edited positions outside state.editable (masked, "
                f"prompt, outside the current block, or in a row whose block is over) or wrote "
                f"the mask token at step {step} in rows {_rows(bad_edit.any(1))}; "
                f"Selection.edit must be a subset of state.editable")
        if values[1] and bool((commit > eligible).any()):
            raise PolicyContractError(
                f"policy {self.policy!r} committed positions that were not eligible (not masked "
                f"or outside the block) at step {step} in rows "
                f"{_rows((commit > eligible).any(1))}; select() must return a subset of "
                f"state.eligible")
        if values[1] and budget is not None:
            over = commit.sum(1) > budget
            raise PolicyContractError(
                f"policy {self.policy!r} committed {commit.sum(1)[over].tolist()} positions at "
                f"step {step} in rows {_rows(over)}, more than state.budget "
                f"{budget[over].tolist()}; a budgeted selector commits state.budget positions "
                f"per row (e.g. topk_mask(score, state.eligible, state.budget)); one that "
                f"commits a varying number declares capabilities = "
                f"Capabilities(budgeted=False), one whose floor is the budget "
                f"Capabilities(at_least_budget=True)")
        stalled = track[0] >= block_steps
        if last:
            stalled |= track[1] >= 1
        raise StalledPolicyError(
            f"policy {self.policy!r} committed nothing for a whole block's worth of steps "
            f"(until step {step}) in rows {_rows(stalled)} although they "
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
        *values, n_left = torch.stack([*self.flags(), left.sum(dtype=torch.float64)]).tolist()
        self.raise_if(values)
        if n_left:
            rows = (left > 0).nonzero().flatten().tolist()
            raise IncompleteDecodeError(
                f"policy {self.policy!r} left {int(n_left)} masked position(s) in rows {rows} at "
                f"the end of decoding (positions that were never eligible with a fresh proposal, "
                f"e.g. outside a cache window); raise max_steps_per_block or use another cache "
                f"mode")


def expected_rows(active: Tensor, budget: Tensor | None,
                  positive: Tensor | None = None) -> Tensor:
    """``[B]`` rows expected to commit at a step: ``active`` (an eligible position) and, for
    scheduled policies, a budget > 0 (``positive``: ``budget > 0`` if the caller has it)."""
    if budget is None:
        return active
    return active & (budget > 0 if positive is None else positive)


def force_block_end(commit: Tensor, eligible: Tensor, block: tuple[int, int]) -> Tensor:
    """At a block's last step: ``commit`` plus every eligible position of ``block``
    (``[start, end)``; lookahead positions past it are left to their policy). Sync-free; a
    no-op for policies that honour their budget or finish the block within the step cap."""
    pos = torch.arange(eligible.shape[1], device=eligible.device)
    return commit | (eligible & ((pos >= block[0]) & (pos < block[1]))[None])


def _rows(now: Tensor) -> list[int]:
    return now.nonzero().flatten().tolist()
