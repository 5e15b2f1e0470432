"""What a served step writes: the policy's selection into the block, and the fallback after a
policy error. ``post_forward``'s rules (``samplers.step``) on one SGLang call's rows; no SGLang
import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.policies.base import top1_mask
from dllm_decode.samplers.contract import PolicyContractError, StepGuard
from dllm_decode.types import Selection, StepState


@dataclass(frozen=True)
class StepParts:
    """The bound parts of a served policy and what writing a step needs.

    Attributes:
        selector, stopper, truncator: the bound parts (``None`` where absent).
        guard: the decode contract's host-side shape check.
        name: the policy's name (for errors); mask_id: the mask token, never written.
        rows: ``[K]`` block positions; fill_id: the token after a truncation (the first EOS).
    """

    selector: Any
    stopper: Any
    truncator: Any
    guard: StepGuard
    name: str
    mask_id: int
    rows: Tensor
    fill_id: int


def write_step(parts: StepParts, state: StepState, canvas: Tensor, last: Tensor,
               lengths: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """The selector's commits (and edits, the stopper's greedy commits, the truncator's cut)
    written into ``canvas [b, K]``: commits outside ``eligible`` and edits outside ``editable``
    are dropped, the mask token is never written, and the block's last scheduled step
    (``last [b]``) or a stop commits every eligible position left (a stop with the argmax of a
    sampled proposal). Returns ``(canvas, commit, edit | None, lengths | None)``."""
    chosen = parts.selector.select(state)
    sel = chosen if isinstance(chosen, Selection) else Selection(chosen)
    eligible, prop = state.eligible, state.proposal
    parts.guard.check_shape(sel.commit, eligible)
    stop = None if parts.stopper is None else parts.stopper.should_stop(state)
    finish = last if stop is None else last | stop  # [b]: commit every eligible position
    commit = eligible & (sel.commit | finish[:, None])  # eligible = masked (and fresh)
    edit = None
    if sel.edit is not None:
        if state.editable is None:
            raise PolicyContractError(
                f"policy {parts.name!r} returned Selection.edit without declaring it: "
                "capabilities = Capabilities(edits=True)")
        parts.guard.check_shape(sel.edit, eligible)
        edit = sel.edit & state.editable
    write = commit if edit is None else commit | edit
    tokens = prop.tokens
    sampled_stop = stop is not None and prop.argmax is not None
    if sel.tokens is not None or sampled_stop:  # the selector's own writes keep its tokens
        own = eligible & (sel.commit | last[:, None]) if stop is not None else commit
        own = own if edit is None else own | edit
        if sel.tokens is not None:
            tokens = torch.where(own, sel.tokens, tokens)
        if sampled_stop:  # sampled proposals: a stop commits the argmax
            tokens = torch.where(own, tokens, prop.argmax)
    if sel.tokens is not None:  # a proposal never holds the mask token (its logit -inf)
        write = write & (tokens != parts.mask_id)
    new = torch.where(write, tokens, canvas)
    if parts.truncator is not None:
        cut = parts.truncator.truncate(state, commit).clamp(max=canvas.shape[1])
        lengths = torch.minimum(lengths, cut)
        dead = (parts.rows[None] >= lengths[:, None]) & state.fresh
        new = torch.where(dead, parts.fill_id, new)
    return new, commit, edit, lengths


def fall_back(state: StepState, canvas: Tensor, last: Tensor, mask_id: int) -> Tensor:
    """After a policy error: each row commits its single most confident eligible position
    (every eligible one at the block's last scheduled step)."""
    eligible, prop = state.eligible, state.proposal
    commit = top1_mask(prop.prob, eligible) | (eligible & last[:, None])
    write = commit & (prop.tokens != mask_id)
    return torch.where(write, prop.tokens, canvas)
