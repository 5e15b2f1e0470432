"""Fast-dLLM v2 decoding: sub-block threshold commits with the block-level cache.

Wu et al., "Fast-dLLM v2: Efficient Block-Diffusion LLM", arXiv 2509.26328; reference
NVlabs/Fast-dLLM ``v2/generation_functions.py`` ``batch_sample`` (upstream d259b48) and the
Hugging Face ``modeling.py`` ``generate`` of ``Efficient-Large-Model/Fast_dLLM_v2_7B``.

The reference decodes each block of ``block_size`` (the model's ``bd_size``) in sub-blocks of
``small_block_size``, left to right: every forward runs the whole block against the prefix
K/V cache, and commits the current sub-block's masked positions whose probability is
``> threshold`` plus always its most probable one. A completed block is forwarded once more
to write its K/V, and the argmax of its last output (the model predicts shifted, like an AR
LM) becomes the next block's first token. In the one loop, with ``cache="block_causal"``
(the block-level cache: committed blocks' K/V are written by the next forward), that cache
forward is the next block's first step: ``SubBlockThreshold`` commits a block's first
position alone at its argmax when it is still masked (the AR token), then the sub-blocks.

The reference's ``use_block_cache=True`` (sub-block-only forwards against the block's K/V of
its last full forward) is ``cache="sub_block"`` (``dllm_decode.cache.sub_block``; approximate,
off by default as in the reference's ``eval.py``). The reference computes the prompt's complete
blocks in a prefill forward of its own; ``separate_prefill=True`` does the same and counts it
(by default the first step's forward computes them: one forward fewer when the prompt is
longer than a block and ends inside one, the same tokens).

Deviations: rows of a batch are independent (the reference moves its batch sub-block by
sub-block together, so its NFE is the batch's lockstep count; with ``use_block_cache`` it
refreshes the whole batch when one row needs it; and its top-p sampling draws for row 0 only,
a bug: batched sampling is not reproduced); the mask token is not in the sampling distribution
unless ``mask_in_softmax`` (the reference's softmax keeps it); ``batch_sample`` never checks a
block's AR token against the stop token (a bug: here an EOS there stops the row like any
other, ``block_eos_stop``; ``eos_skip_block_start`` reproduces it); the reference's in-block
forwards omit ``block_size`` and so build their block-causal mask with blocks of 32, which
equals the requested block's mask only when the block size divides 32 (the released 32, and
every recorded case); other sizes follow the model's block here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dllm_decode.kernels.reference import filter_logits
from dllm_decode.policies.base import lowest
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.rows import as_rows, constant, per_row, positions, uniform
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import Selection, StepState


@dataclass(frozen=True)
class SubBlockThreshold:
    """Fast-dLLM v2's rule: a block's masked first position alone at its argmax (the AR token
    of the previous block's cache forward); else, in each row's first sub-block of
    ``small_block_size`` (aligned inside the block) that has a mask, every masked position
    with probability ``> threshold`` (strict) plus the most probable one.

    ``block_size``: the model's block size; ``temperature``: the sampler's, both resolved at
    bind. At ``temperature > 0`` the selector samples the current sub-block itself, as the
    reference: one ``multinomial`` per row over the sub-block's rows of the sampling
    distribution (``state.model.probs``: tempered, top-p filtered), each position's
    probability being that of its drawn token; the AR token stays the argmax (no draw).
    The reference draws for batch row 0 only and gives every row its tokens (a bug, not
    reproduced: each row draws its own, in row order). ``mask_in_softmax`` reproduces the
    reference's sampling distribution, a softmax over the full vocabulary, the mask token
    included (its mass shifts the top-p cut); a drawn mask is then not committed, as writing
    it changes nothing there. **Off by default**: the mask token is never a candidate.
    """

    threshold: float = 0.9
    small_block_size: int = 8
    block_size: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    mask_in_softmax: bool = False

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive, block-causal; samples its own tokens (and reads the logits) when
        ``temperature > 0``."""
        sample = self.temperature > 0
        return Capabilities(budgeted=False, preferred_cache="block_causal",
                            requires_attention="block_causal", proposal_fields=(),
                            reads_masked_only=not sample, needs_logits=sample,
                            samples_tokens=sample, sub_block_size=self.small_block_size,
                            row_steps=True)

    def __post_init__(self) -> None:
        check_fields(self, "SubBlockThreshold")
        check_range("SubBlockThreshold", "threshold", self.threshold, 0.0, 1.0)
        check_range("SubBlockThreshold", "small_block_size", self.small_block_size, 1)

    def bind(self, model: Any, cfg: Any = None) -> SubBlockThreshold:
        """With ``block_size`` = the model's and the sampler's ``temperature``. Sub-blocks
        need not divide the block (the last one is shorter; the reference loops forever
        unless ``small_block_size`` divides ``block_size``)."""
        block = getattr(model, "block_size", None) or self.block_size
        return replace(self, block_size=block, top_p=getattr(cfg, "top_p", None),
                       temperature=float(getattr(cfg, "temperature", 0.0) or 0.0))

    def select(self, state: StepState) -> Tensor | Selection:
        """``[B, L]`` commits (the class docstring's rule); at ``temperature > 0`` a
        ``Selection`` with the drawn ``tokens`` / ``prob`` ``[B, L]`` of the current
        sub-blocks."""
        if per_row(state.block_step) or per_row(state.block_start):
            return self._select_rows(state)
        eligible, prob = state.eligible, state.proposal.prob
        block = self.block_size or (state.block_end - state.block_start)
        start = (state.block_start // block) * block  # the aligned block's first position
        if state.block_step == 0 and state.block_start == start:
            # the AR token: a block that starts after the prompt commits its first position
            # alone, at its argmax (no draw; ``state.proposal`` is greedy when this samples)
            only = torch.zeros_like(eligible)
            only[:, start] = True
            return eligible & only
        pos = torch.arange(eligible.shape[1], device=eligible.device)
        # each row's current sub-block: the one holding its first eligible position
        first = torch.where(eligible, pos, eligible.shape[1]).min(1, keepdim=True).values
        sub = self.small_block_size
        current = eligible & ((pos - start) // sub == (first - start) // sub)
        tokens = None
        if self.temperature > 0 and state.logits is not None and state.model is not None:
            first_sub = start + (first - start) // sub * sub  # [B, 1] the sub-block's start
            tokens, prob = self._sample(state, first_sub)
        best = torch.where(current, prob, lowest(prob.dtype)).argmax(-1, keepdim=True)
        commit = current & (prob > self.threshold).scatter(-1, best, True)
        if tokens is None:
            return commit
        # mask_in_softmax: a drawn mask is written as a no-op by the reference
        return Selection(commit & (tokens != state.model.mask_token_id), tokens, prob)

    def _select_rows(self, state: StepState) -> Tensor | Selection:
        """``select`` with per-row block steps / starts: the AR-token rows and the sub-block
        rows decided together, each row as ``select`` decides it alone."""
        eligible, prop = state.eligible, state.proposal
        b, length = eligible.shape
        device = eligible.device
        bs = as_rows(state.block_start, b, device)[:, None]  # [B, 1]
        step = as_rows(state.block_step, b, device)[:, None]
        block = self.block_size or (state.block_end - bs)
        lead = bs % block  # >= 0: the block start's offset in its aligned block
        start = bs - lead  # [B, 1] each aligned block's first position
        ar = (step | lead) == 0  # [B, 1] rows committing their AR token (block step 0, aligned)
        pos = positions(length, device)
        sub = self.small_block_size
        tiled = isinstance(block, int) and block % sub == 0
        if tiled:  # sub-blocks tile the canvas from 0: a position's sub-block is pos // sub
            first = torch.where(eligible, pos, length).min(1, keepdim=True).values
            first_sub = first // sub
            current = eligible & (_sub_index(length, sub, device) == first_sub)
        else:  # offsets from the aligned block's start (the first eligible one's: ``first``)
            rel = pos - start
            first = torch.where(eligible, rel, length).min(1, keepdim=True).values
            first_sub = first // sub
            current = eligible & (rel // sub == first_sub)
        tokens, prob = None, prop.prob
        if self.temperature > 0 and state.logits is not None and state.model is not None:
            at = first_sub * sub if tiled else start + first_sub * sub  # the sub-block's start
            tokens, prob = self._sample(state, at)
        best = torch.where(current, prob, lowest(prob.dtype)).argmax(-1, keepdim=True)
        commit = current & (prob > self.threshold).scatter(-1, best, True)
        commit = torch.where(ar, eligible & (pos == start), commit)
        if tokens is None:
            return commit
        # AR rows commit the proposal's (greedy) token; a drawn mask is not written
        tokens = torch.where(ar, prop.tokens, tokens)
        prob = torch.where(ar, prop.prob, prob)
        return Selection(commit & ((tokens != state.model.mask_token_id) | ar), tokens, prob)

    def _sample(self, state: StepState, sub_start: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, L]`` tokens and their probabilities: one draw per row over the rows of its
        current sub-block (starting at ``sub_start [B, 1]``; the proposal elsewhere)."""
        logits, rows = state.logits, state.rows
        b, length = state.eligible.shape
        sub = self.small_block_size
        at = sub_start + torch.arange(sub, device=sub_start.device)  # [B, S] canvas positions
        at = at.clamp(max=length - 1)
        first_row = rows[:1] if rows.dim() == 1 else rows[:, :1]
        idx = (at - first_row).clamp(0, logits.shape[1] - 1)  # [B, S] rows of the logits
        z = logits.gather(1, idx[..., None].expand(-1, -1, logits.shape[-1])).float()
        if self.mask_in_softmax and state.mask_logit is not None:
            z[..., state.model.mask_token_id] = state.mask_logit.gather(1, idx).float()
        # the reference's distribution: softmax(z / T), top-p (sorted cumulative mass), renormed
        probs = torch.softmax(filter_logits(z, self.temperature, self.top_p, None), dim=-1)
        if state.row_seeds is not None:  # Exp(1) noise -log(u) from each row's seed
            noise = uniform(state, tuple(probs.shape)).log_().neg_().to(probs.dtype)
        else:
            noise = torch.empty_like(probs).exponential_(1, generator=state.generator)
        drawn = torch.argmax(probs / noise, dim=-1)  # torch.multinomial(probs, 1) per row
        p_drawn = probs.gather(-1, drawn[..., None])[..., 0]
        tokens = state.proposal.tokens.scatter(1, at, drawn)
        prob = state.proposal.prob.scatter(1, at, p_drawn.to(state.proposal.prob.dtype))
        return tokens, prob


def _sub_index(length: int, sub: int, device: torch.device) -> Tensor:
    """``[1, L]`` int64 ``pos // sub``: a read-only ``rows.constant``."""
    return constant(("sub_index", length, sub, device), lambda: positions(length, device) // sub)


def fastdllm_v2_policy(threshold: float = 0.9, small_block_size: int = 8,
                       mask_in_softmax: bool = False) -> SubBlockThreshold:
    """The ``fastdllm_v2`` preset (``v2/eval.py`` defaults: threshold 0.9, sub-blocks of 8;
    the model's block size, 32 released), with the exact block-level cache (``block_causal``;
    ``cache="sub_block"`` is the reference's ``use_block_cache``).
    ``mask_in_softmax``: the reference's sampling distribution (see ``SubBlockThreshold``)."""
    return SubBlockThreshold(threshold=threshold, small_block_size=small_block_size,
                             mask_in_softmax=mask_in_softmax)

