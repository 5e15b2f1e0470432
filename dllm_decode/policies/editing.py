"""LLaDA2.x threshold decoding and token editing (T2T), as selectors of the one loop.

* LLaDA2.0 (inclusionAI, "LLaDA2.0: Scaling Up Diffusion Language Models to 100B", the
  remote-code ``LLaDA2MoeModelLM.generate``; read from the copy in ZHZisZZ/dllm
  ``pipelines/llada2``): per block, commit every masked position whose probability is
  ``> threshold`` when there are at least ``k`` of them, else the ``k`` most probable, with
  ``k`` the block's even split of ``block_length`` over ``steps = min(steps, gen_length //
  minimal_topk)`` (``MinimalTopK``; preset ``llada2``).
* LLaDA2.1 (Bie et al., "LLaDA2.1: Speeding Up Text Diffusion via Token Editing", arXiv
  2602.08676; remote-code ``generate`` of LLaDA2.1, ZHZisZZ/dllm ``pipelines/llada21``): the
  same mask-to-token rule with a fixed ``k = num_to_transfer``, plus token-to-token editing:
  every committed, generated position of the block whose proposal differs from its token
  with probability ``> editing_threshold`` is rewritten; a block with no mask left runs on
  while it edits, at most ``max_post_steps`` steps (``TokenEditing``; preset ``llada21``, its
  two published modes as ``mode="quality" | "speed"``).
* ``TokenEditing`` wraps any selector (``edit`` preset: ``base="threshold"`` by default), so
  editing composes with the existing rules on any mask model.

Reference quirks, reproduced only behind options that are off by default (the conformance
harness turns them on): LLaDA2's canvas is rounded up to whole blocks and the padding positions
of its last block are decoded too, costing steps (``SamplerConfig.decode_block_padding``);
LLaDA2.0 stops after any block that holds an EOS (``block_eos_stop``), and its
``eos_early_stop`` checks only steps that commit an EOS (``eos_stop_on_commit``). LLaDA2.1's
edits can oscillate between two tokens: the reference's own ``max_post_steps`` bound, kept
here, is what ends such a block.

Deviations from the references (every recorded case still matches): the mask token is never a
candidate (its logit is -inf before scoring; the references keep it in the softmax); rows of a
batch are independent (the references decode one row); ties go to the lower index.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.adaptive import Threshold
from dllm_decode.policies.base import bind_of, init_memory_of, topk_mask
from dllm_decode.policies.capabilities import Capabilities, capabilities_of
from dllm_decode.policies.resolve import make_policy
from dllm_decode.policies.rows import lookup, per_row, table
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import Selection, StepState

#: LLaDA2.1's two published decoding modes. ``quality``: the remote-code ``generate``
#: defaults (conservative thresholds); ``speed``: the low mask threshold that relies on
#: editing, as diffusers' ``LLaDA2Pipeline`` documents it (the report names the modes, its
#: numbers were not published in a readable form)
LLADA21_MODES: Final[dict[str, dict[str, float]]] = {
    "quality": {"threshold": 0.95, "editing_threshold": 0.9},
    "speed": {"threshold": 0.7, "editing_threshold": 0.5},
}


#: LLaDA2's ``generate`` default steps per block
LLADA2_STEPS: Final = 32


def llada2_schedule(block_length: int, steps: int) -> list[int]:
    """LLaDA2's ``_get_num_transfer_tokens``: ``block_length`` split evenly over ``steps``, the
    remainder to the first steps (``[]`` for 0 steps)."""
    if steps <= 0:
        return []
    base, rem = divmod(block_length, steps)
    return [base + (i < rem) for i in range(steps)]


@dataclass(frozen=True)
class MinimalTopK:
    """LLaDA2's mask-to-token rule: masked positions with probability ``> threshold`` (strict)
    if there are at least ``k`` of them, else the ``k`` most probable.

    ``k`` is ``min_commit`` when given (LLaDA2.1's ``num_to_transfer``), else the LLaDA2.0
    schedule: entry ``state.block_step`` of ``llada2_schedule(block_length, steps')`` with
    ``steps' = min(block_steps, gen_length // minimal_topk)`` (0 past its end).
    ``block_steps``, ``block_length`` and ``gen_length`` come from the sampler at bind when
    unset: ``cfg.steps`` (as in LLaDA2's ``generate``, the steps **per block**; ``None``: 32),
    ``cfg.block_length`` (else the model's block size) and ``cfg.gen_length``.
    """

    threshold: float = 0.95
    block_steps: int | None = None
    minimal_topk: int = 1
    min_commit: int | None = None
    block_length: int | None = None
    gen_length: int | None = None
    decode_block_padding: bool = False
    #: per-row ``block_step``: the schedule looked up per row (``row_steps``)
    capabilities = Capabilities(budgeted=False, proposal_fields=(), reads_masked_only=True,
                                row_steps=True)

    def __post_init__(self) -> None:
        check_fields(self, "MinimalTopK")
        check_range("MinimalTopK", "threshold", self.threshold, 0.0, 1.0)
        for name in ("block_steps", "minimal_topk", "min_commit", "block_length", "gen_length"):
            value = getattr(self, name)
            if value is not None:
                check_range("MinimalTopK", name, value, 1)

    def bind(self, model: Any, cfg: Any = None) -> MinimalTopK:
        """With ``block_steps`` / ``block_length`` / ``gen_length`` taken from the config (or
        the model) where unset."""
        block = self.block_length or getattr(cfg, "block_length", None) or getattr(
            model, "block_size", None) or getattr(cfg, "gen_length", None)
        steps = self.block_steps or getattr(cfg, "steps", None) or LLADA2_STEPS
        padding = self.decode_block_padding or bool(getattr(cfg, "decode_block_padding", False))
        return replace(self, block_length=block, block_steps=steps,
                       gen_length=self.gen_length or getattr(cfg, "gen_length", None),
                       decode_block_padding=padding)

    def schedule(self) -> list[int]:
        """The per-block minimum commit counts (``llada2_schedule`` of the bound sizes).

        An answer shorter than the block (``gen_length < block_length``) without
        ``decode_block_padding``: the split is of the positions decoded, ``gen_length``, not of
        the block. The reference decodes the padding positions too, so its schedule splits the
        whole block (2 commits a step for 16 tokens in LLaDA2's block of 32: two dependent
        positions committed together); with ``decode_block_padding`` (the reference's quirk)
        the block's split is kept."""
        block = self.block_length or 1
        gen = self.gen_length or block
        if not self.decode_block_padding:
            block = min(block, gen)
        steps = self.block_steps or LLADA2_STEPS
        return llada2_schedule(block, min(steps, gen // self.minimal_topk))

    def k(self, block_step: int) -> int:
        """The step's minimum commit count (host int: the schedule is fixed per block)."""
        if self.min_commit is not None:
            return self.min_commit
        sched = self.schedule()
        return sched[block_step] if block_step < len(sched) else 0

    def k_rows(self, block_step: Tensor) -> Tensor:
        """``k`` of per-row block steps ``[B]`` int64 -> ``[B]`` int64. No host sync."""
        if self.min_commit is not None:
            return torch.full_like(block_step, self.min_commit)
        sched = table(tuple(self.schedule()), torch.long, block_step.device)
        return lookup(sched, block_step, 0)

    def select(self, state: StepState) -> Tensor:
        """``[B, L]`` commits: eligible positions with probability ``> threshold`` in rows
        that have at least ``k(state.block_step)`` of them, else each row's ``k`` most probable
        eligible positions."""
        prob, eligible = state.proposal.prob, state.eligible
        high = eligible & (prob > self.threshold)
        if per_row(state.block_step):
            need = self.k_rows(state.block_step)
        else:
            k = self.k(state.block_step)
            need = torch.full((eligible.shape[0],), k, dtype=torch.long, device=eligible.device)
        enough = high.sum(1) >= need
        return torch.where(enough[:, None], high, topk_mask(prob, eligible, need))


@dataclass(frozen=True)
class TokenEditing:
    """Token-to-token editing over any selector (LLaDA2.1 T2T; ``samplers.editing``).

    Each step: ``base`` selects the mask commits; every ``state.editable`` position whose
    proposal differs from its current token with probability ``> editing_threshold`` is
    rewritten to the proposal. A block whose masks are all committed runs on while its rows
    edit, at most ``max_post_steps`` steps (the reference's bound; its edits can oscillate).
    ``base`` must not draw tokens after selection (Dream ``origin``) or look past the block.
    """

    base: Any = field(default_factory=Threshold)
    editing_threshold: float = 0.9
    max_post_steps: int = 16

    def __post_init__(self) -> None:
        check_fields(self, "TokenEditing")
        check_range("TokenEditing", "editing_threshold", self.editing_threshold, 0.0, 1.0)
        check_range("TokenEditing", "max_post_steps", self.max_post_steps, 0)
        if not hasattr(self.base, "select"):
            raise TypeError(f"TokenEditing.base must be a selector (select(state)), got "
                            f"{type(self.base).__name__}")
        inner = capabilities_of(self.base)
        if inner.edits or inner.proposes_after_select or inner.lookahead:
            raise ValueError(f"TokenEditing cannot wrap {type(self.base).__name__}: it already "
                             "edits, draws tokens after selection, or commits past the block")

    @property
    def capabilities(self) -> Capabilities:
        """The base's, plus edits (committed positions are read: not masked-only)."""
        inner = capabilities_of(self.base)
        return replace(inner, edits=True, max_post_steps=self.max_post_steps,
                       reads_masked_only=False)

    def bind(self, model: Any, cfg: Any = None) -> TokenEditing:
        bound = bind_of(self.base, model, cfg)
        return self if bound is self.base else replace(self, base=bound)

    def init_memory(self, batch: int, length: int, device: torch.device) -> Any:
        return init_memory_of(self.base, batch, length, device)

    def select(self, state: StepState) -> Selection:
        """The base's ``Selection`` plus ``edit [B, L]``: ``state.editable`` positions whose
        proposal (probability ``> editing_threshold``) differs from the canvas token; the
        edited positions take the proposal's token."""
        chosen = self.base.select(state)
        sel = chosen if isinstance(chosen, Selection) else Selection(chosen)
        prop = state.proposal
        editable = state.editable
        if editable is None:  # a hand-built state: nothing may be edited
            return sel
        edit = editable & (prop.prob > self.editing_threshold) & (prop.tokens != state.canvas)
        tokens = None if sel.tokens is None else torch.where(edit, prop.tokens, sel.tokens)
        return Selection(sel.commit, tokens, sel.prob, edit)


def llada2_policy(threshold: float = 0.95, minimal_topk: int = 1) -> MinimalTopK:
    """The ``llada2`` preset: LLaDA2.0's block threshold decoding (``MinimalTopK``; the
    remote-code ``generate`` defaults: threshold 0.95, minimal_topk 1, and the sampler's
    ``steps`` as steps per block, 32 when unset)."""
    return MinimalTopK(threshold=threshold, minimal_topk=minimal_topk)


def llada21_policy(mode: str = "quality", threshold: float | None = None,
                   editing_threshold: float | None = None, max_post_steps: int = 16,
                   num_to_transfer: int = 1) -> TokenEditing:
    """The ``llada21`` preset: LLaDA2.1's mask-to-token threshold rule with a minimum of
    ``num_to_transfer`` commits per step, plus token editing (``TokenEditing``).

    ``mode``: ``"quality"`` (threshold 0.95, editing 0.9: the remote-code defaults) or
    ``"speed"`` (0.7 / 0.5: the low mask threshold that relies on editing); ``threshold`` /
    ``editing_threshold`` override the mode's values.
    """
    if mode not in LLADA21_MODES:
        raise ValueError(f"llada21 mode must be one of {sorted(LLADA21_MODES)}, got {mode!r}")
    preset = LLADA21_MODES[mode]
    base = MinimalTopK(threshold=preset["threshold"] if threshold is None else threshold,
                       min_commit=num_to_transfer)
    return TokenEditing(base=base, max_post_steps=max_post_steps,
                        editing_threshold=(preset["editing_threshold"]
                                           if editing_threshold is None else editing_threshold))


def edit_policy(base: str | Any = "threshold", editing_threshold: float = 0.9,
                max_post_steps: int = 16, **params: Any) -> TokenEditing:
    """The ``edit`` preset: token editing over ``base`` (a preset name with ``params``, or a
    selector), e.g. ``make_policy("edit", base="threshold", tau=0.7)``."""
    if isinstance(base, str):
        built = make_policy(base, **params)
        if built.stopper is not None or built.truncator is not None:
            raise ValueError(f"edit: base {base!r} has a stopper or truncator; compose it as "
                             "Policy(TokenEditing(selector), stopper=...) instead")
        base = built.selector
    elif params:
        raise ValueError(f"edit: parameters {sorted(params)} need a preset name as base")
    return TokenEditing(base=base, editing_threshold=editing_threshold,
                        max_post_steps=max_post_steps)

