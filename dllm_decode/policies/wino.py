"""WINO: wide-in, narrow-out revokable decoding, as a selector of the one loop.

Hong et al., "Wide-In, Narrow-Out: Revokable Decoding for Efficient and Effective DLLMs",
arXiv 2507.18578 (ICLR 2026; journal version arXiv 2605.16941); reference ``decoding_wino``
in Feng-Hong/WINO-DLLM ``LLaDA/decoding.py`` @ 9549a1d. Each step of a block:

1. **wide-in** (``WideIn``): commit every masked position of the block whose probability is
   strictly above ``threshold`` (tau_1), at most ``max_accept = min(max(int(0.7 * n), 5), 20)``
   of them (``n`` the block's masked count; the most probable kept), or the single most
   probable one when none passes;
2. **narrow-out** (``Wino``): in a step that commits more than one token, every position the
   block had already committed is verified by a *shadow block*: the block's positions fed
   again as mask tokens, each seeing the whole canvas except its own position (and the whole
   shadow block). A committed token whose shadow probability is below ``threshold_back``
   (tau_2) is re-masked; when at least ``last_accept`` (the previous step's commit count, 30 at
   a block's start) fail, only the ``last_accept - 1`` least probable are. Tokens committed in
   this step are first verified at the next step, as in the reference.

Re-masking goes through the loop's editing capability (``Capabilities(edits=True,
remasks=True)``: ``Selection.edit`` with the mask token; the contract allows exactly the
block's committed generated positions and never re-masks on a block's last step). Each row
terminates within the block's length: a step re-masks at most ``last_accept - 1`` positions, so
the block's committed count grows by at least one per step.

Deviations from the reference, each documented where it lives:

* **the shadow block is an extra forward**: the reference appends it to the step's forward
  (one call over prompt + answer + shadow); here it is ``state.model.forward`` after the
  step's own forward, against the same keys (without a cache: the canvas recomputed beside
  the shadow rows, the reference's exact layout; with a cache: the shadow rows alone against
  the plan's K/V). It counts one forward and its positions (``Generation.positions``), so NFE
  is about twice the reference's step count (``Generation.steps``); it is skipped at a block's
  first step, where nothing is committed yet to verify (the reference's shadow rows are idle
  there).
* the mask token is never a candidate, in drafting and verification alike (the reference's
  float64 softmax keeps it); verification probabilities are float64 as in the reference;
* rows of a batch are independent (the reference decodes one row); ties go to the lower index;
* models with shifted logits (Dream-family) are refused: the shadow row of a position must
  predict that position itself.

Block-diffusion models (SDAR): the shadow rows see the prefix and the current block (minus
their own position), as block-causal attention allows; the authors did not test this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.base import topk_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import Selection, StepState

#: the reference's initial ``last_accept``; it never binds (a block's first step has nothing
#: committed to verify), kept for the record
LAST_ACCEPT_INIT: Final = 30

#: tau_1 of the authors' LLaDA-8B-Instruct configs (``LLaDA/configs/*.yaml``); tau_2 is 0.9 in
#: every one of them
WINO_TASKS: Final[dict[str, float]] = {"gsm8k": 0.6, "math500": 0.7, "humaneval": 0.7,
                                       "mbpp": 0.8, "arc_c": 0.5, "countdown": 0.5,
                                       "sudoku": 0.7}


@dataclass(frozen=True)
class WideIn:
    """WINO's drafting rule: masked block positions with probability ``> threshold`` (strict),
    at most ``clamp(int(accept_ratio * n), accept_min, accept_max)`` of them (``n``: the row's
    eligible count; the most probable kept, ties to the lower index), else the most probable
    one. The reference's cap (0.7, 5, 20) is hard-coded; here they are parameters."""

    threshold: float = 0.6
    accept_ratio: float = 0.7
    accept_min: int = 5
    accept_max: int = 20
    #: no step value (``row_steps``)
    capabilities = Capabilities(budgeted=False, proposal_fields=(), reads_masked_only=True,
                                row_steps=True)

    def __post_init__(self) -> None:
        check_fields(self, "WideIn")
        check_range("WideIn", "threshold", self.threshold, 0.0, 1.0)
        check_range("WideIn", "accept_ratio", self.accept_ratio, 0.0, 1.0)
        check_range("WideIn", "accept_min", self.accept_min, 1)
        check_range("WideIn", "accept_max", self.accept_max, self.accept_min)

    def cap(self, n: Tensor) -> Tensor:
        """``[B]`` int64 ``max_accept`` for ``n [B]`` eligible positions (the reference's
        ``int(n * 0.7)``: a float32 product, truncated)."""
        return (n * self.accept_ratio).long().clamp(self.accept_min, self.accept_max)

    def select(self, state: StepState) -> Tensor:
        """``[B, L]`` commits (see the class docstring)."""
        prob, eligible = state.proposal.prob, state.eligible
        n = eligible.sum(1)
        high = eligible & (prob > self.threshold)
        count = high.sum(1)
        k = torch.where(count > self.cap(n), self.cap(n), count.clamp(min=1))
        # topk over the eligible: the capped rows keep their best, rows with none take the best
        return topk_mask(prob, eligible, k)


@dataclass
class WinoMemory:
    """Per-generation WINO state: ``last_accept [B]`` int64, each row's commit count at the
    previous step of the block (the cap on the next step's re-masks)."""

    last_accept: Tensor


@dataclass(frozen=True)
class Wino:
    """WINO (see the module docstring): ``draft`` (``WideIn``) commits, the shadow block
    verifies the block's earlier commits and re-masks those below ``threshold_back``.

    ``verify=False`` turns verification off: no shadow forward, exactly ``draft``.
    """

    draft: WideIn = field(default_factory=WideIn)
    threshold_back: float = 0.9
    verify: bool = True

    def __post_init__(self) -> None:
        check_fields(self, "Wino")
        check_range("Wino", "threshold_back", self.threshold_back, 0.0, 1.0)
        if not isinstance(self.draft, WideIn):
            raise TypeError(f"Wino.draft must be a WideIn, got {type(self.draft).__name__}")

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; re-masks through editing (no post steps); the shadow block is an extra
        forward; scores committed positions too (``reads_masked_only=False``)."""
        if not self.verify:
            return self.draft.capabilities
        return Capabilities(budgeted=False, proposal_fields=(), edits=True, remasks=True,
                            extra_forwards=True, needs_logits=False)

    def bind(self, model: Any, cfg: Any = None) -> Wino:
        """Refuse models with shifted logits (their row at a position predicts the next one:
        a shadow row could not verify its own position)."""
        if self.verify and getattr(model, "logit_shift", 0):
            raise ValueError("wino's shadow block needs position-aligned logits (LLaDA, SDAR); "
                             f"this model ({type(model).__name__}) predicts each position from "
                             "the one before it (Dream-family): use wino with verify=False or "
                             "another policy")
        return self

    def init_memory(self, batch: int, length: int, device: torch.device) -> WinoMemory:
        return WinoMemory(torch.full((batch,), LAST_ACCEPT_INIT, dtype=torch.long,
                                     device=device))

    def select(self, state: StepState) -> Tensor | Selection:
        """Draft commits, plus ``Selection.edit`` re-masking the failed verifications."""
        commit = self.draft.select(state)
        if not self.verify:
            return commit
        memory: WinoMemory = state.memory
        accepted = commit.sum(1)
        if state.block_step == 0:  # a block's first step: nothing in it to verify yet
            memory.last_accept = accepted
            return commit
        editable = state.editable
        if editable is None:  # a hand-built state without editing: drafting only
            return commit
        verify = shadow_probs(state)  # [B, L] float64, +inf outside the block's committed
        verify = torch.where(editable, verify, torch.inf)
        fail = editable & (verify < self.threshold_back) & (accepted > 1)[:, None]
        limit = memory.last_accept
        capped = topk_mask(-verify, fail, (limit - 1).clamp(min=0))
        remask = torch.where((fail.sum(1) >= limit)[:, None], capped, fail)
        memory.last_accept = accepted
        mask_id = state.model.mask_token_id
        tokens = torch.where(remask, mask_id, state.proposal.tokens)
        return Selection(commit, tokens, None, remask)


def shadow_probs(state: StepState) -> Tensor:
    """``[B, L]`` float64: for each position of the current block, the probability of its
    canvas token under the shadow block's prediction (the block's positions fed as mask
    tokens, each seeing every valid key but its own position, and the whole shadow block;
    on block-causal models only keys before the block's end). NaN outside the block.

    One extra forward (``state.model.forward``), counted in NFE.
    """
    model = state.model
    bs, be = state.block_start, state.block_end
    b, length = state.canvas.shape
    k = be - bs
    device = state.canvas.device
    keys = torch.arange(length, device=device)
    own = keys[None, :] == torch.arange(bs, be, device=device)[:, None]  # [K, L]
    visible = model.valid[:, None, :] & ~own[None]
    if model.block_size:  # block-causal: nothing past the current block
        visible = visible & (keys < be)[None, None, :]
    mask = torch.cat([visible, torch.ones(b, k, k, dtype=torch.bool, device=device)], dim=2)
    tokens = torch.full((b, k), model.mask_token_id, dtype=torch.long, device=device)
    logits = model.forward(tokens, model.positions[:, bs:be], mask)
    logits = logits.double()
    logits[..., model.mask_token_id] = -torch.inf  # never a candidate (as the proposals)
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.gather(-1, state.canvas[:, bs:be, None]).squeeze(-1).exp()
    out = torch.full((b, length), torch.nan, dtype=torch.float64, device=device)
    out[:, bs:be] = probs
    return out


def wino_policy(threshold: float | None = None, threshold_back: float = 0.9,
                task: str = "gsm8k", verify: bool = True, accept_ratio: float = 0.7,
                accept_min: int = 5, accept_max: int = 20) -> Wino:
    """The ``wino`` preset: the authors' LLaDA-8B-Instruct settings (``task`` picks tau_1 from
    ``WINO_TASKS``: GSM8K 0.6 by default; ``threshold`` overrides it; tau_2 0.9). The authors
    decode 256 tokens in blocks of 128 (``gen_length=256, block_length=128``)."""
    if task not in WINO_TASKS:
        raise ValueError(f"wino task must be one of {sorted(WINO_TASKS)}, got {task!r}")
    tau = WINO_TASKS[task] if threshold is None else threshold
    return Wino(draft=WideIn(threshold=tau, accept_ratio=accept_ratio, accept_min=accept_min,
                             accept_max=accept_max),
                threshold_back=threshold_back, verify=verify)


def wide_in_policy(threshold: float = 0.6, accept_ratio: float = 0.7, accept_min: int = 5,
                   accept_max: int = 20) -> WideIn:
    """The ``wide_in`` preset: WINO's drafting rule alone (``WideIn``)."""
    return WideIn(threshold=threshold, accept_ratio=accept_ratio, accept_min=accept_min,
                  accept_max=accept_max)
