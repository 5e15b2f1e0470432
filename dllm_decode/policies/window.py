"""Window-Diffusion presets: selection rules that run on the ``cache="window"`` planner.

F. Zuo et al., "Window-Diffusion: Accelerating Diffusion Language Model Inference with Windowed
Token Pruning and Caching", arXiv 2601.20332 (``vhicrgit/Window-Diffusion``). The planner
(``dllm_decode.cache.window``) decides which positions are fed and eligible; these rules pick
among them:

* ``window`` (LLaDA family): top-k by confidence over the eligible positions (every masked
  position on a full step, the active ones on a pruned step); use ``steps = gen_length``.
* ``window_dream`` (Dream family): on a row's full step commit its leftmost masked position
  (AR-like), on pruned steps the top-k by negative entropy (Dream's schedule); with
  ``early_stop`` one token per pruned step and the row is cut right after its first EOS
  (later steps are full steps on the shortened canvas).

Both prefer ``cache="window"``; window sizes and the refresh cycle are ``SamplerConfig``
fields (``window_tokens``, ``active_tokens``, ``refresh_every``).

Deviations from the paper / released code (planner details in ``dllm_decode.cache.window``):
rows keep their own phases (the LLaDA code is batch 1); the Dream active set excludes positions
decoded before the phase; a block's last scheduled step ends generation with a full step when
masks would be left; the script defaults (W 64 / A 16 / R 32 LLaDA, o 128 / i 16 / R 32 Dream)
are used, not the function-signature defaults; the mask token is never proposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.policies.base import step_score, topk_mask
from dllm_decode.policies.capabilities import Capabilities, score_fields
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.rows import per_row
from dllm_decode.types import ScoreKind, StepState


@dataclass(frozen=True)
class WindowTopK:
    """Commit the ``budget`` best eligible positions by ``score`` (LLaDA low-confidence); on
    the block's last scheduled step every eligible position (pruned steps may have committed
    less than scheduled)."""

    score: ScoreKind = ScoreKind.PROB

    @property
    def capabilities(self) -> Capabilities:
        """The window planner, bidirectional models; reads ``score``'s proposal field."""
        return Capabilities(preferred_cache="window", requires_attention="bidirectional",
                            proposal_fields=score_fields(self.score), reads_masked_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))

    def select(self, state: StepState) -> Tensor:
        if state.steps_left == 1:  # the block's last step: finish it
            return state.eligible
        return topk_mask(step_score(state, self.score), state.eligible, state.budget)


@dataclass(frozen=True)
class WindowDream:
    """Leftmost eligible position on a row's full step, top-``budget`` by ``score`` on pruned
    steps (``early_stop``: exactly one), every eligible position on the block's last scheduled
    step. Rows without ``state.refreshed`` count as full."""

    score: ScoreKind = ScoreKind.NEG_ENTROPY
    early_stop: bool = False

    @property
    def capabilities(self) -> Capabilities:
        """The window planner, bidirectional models; reads ``score``'s proposal field; a full
        step commits one position whatever the budget (Dream's grid may schedule none)."""
        return Capabilities(preferred_cache="window", requires_attention="bidirectional",
                            proposal_fields=score_fields(self.score), reads_masked_only=True,
                            at_least_budget=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))

    def select(self, state: StepState) -> Tensor:
        eligible = state.eligible
        b, length = eligible.shape
        idx = torch.arange(length, device=eligible.device)
        first = torch.where(eligible.any(1), eligible.long().argmax(1), length)
        leftmost = eligible & (idx[None] == first[:, None])
        budget = state.budget
        if budget is None or self.early_stop:
            budget = torch.ones(b, dtype=torch.long, device=eligible.device)
        ranked = topk_mask(step_score(state, self.score), eligible, budget)
        if state.steps_left == 1:
            return eligible
        full = state.refreshed
        if full is None:
            full = torch.ones(b, dtype=torch.bool, device=eligible.device)
        return torch.where(full[:, None], leftmost, ranked)


@dataclass(frozen=True)
class EosCut:
    """Truncator: cut each row right after its first EOS (generation region), as Window-
    Diffusion's Dream ``early_stop`` does; rows without EOS keep their length."""

    #: the proposal's tokens at the commits only; per-row ``gen_start`` (``row_steps``)
    capabilities = Capabilities(proposal_fields=(), reads_masked_only=True, row_steps=True)

    def truncate(self, state: StepState, commit: Tensor) -> Tensor:
        if per_row(state.gen_start):
            return self._truncate_rows(state, commit)
        model = state.model
        gen = torch.where(commit, state.proposal.tokens, state.canvas)[:, state.gen_start:]
        g = gen.shape[1]
        if model is None or not model.eos_token_ids:
            return torch.full((gen.shape[0],), g, dtype=torch.long, device=gen.device)
        is_eos = gen == model.eos_token_ids[0]  # host ints as scalars: no copy to the device
        for eos in model.eos_token_ids[1:]:
            is_eos = is_eos | (gen == eos)
        first = is_eos.long().argmax(1)
        return torch.where(is_eos.any(1), first + 1, g)

    @staticmethod
    def _truncate_rows(state: StepState, commit: Tensor) -> Tensor:
        """``truncate`` with per-row generation starts ``g0 [B]``: lengths count from each
        row's own start (``L - g0`` without an EOS)."""
        model = state.model
        tokens = torch.where(commit, state.proposal.tokens, state.canvas)
        length = tokens.shape[1]
        g0 = state.gen_start
        if model is None or not model.eos_token_ids:
            return length - g0
        is_eos = tokens == model.eos_token_ids[0]
        for eos in model.eos_token_ids[1:]:
            is_eos = is_eos | (tokens == eos)
        pos = torch.arange(length, device=tokens.device)
        is_eos = is_eos & (pos[None] >= g0[:, None])
        first = torch.where(is_eos, pos, length).min(1).values
        return torch.where(is_eos.any(1), first + 1 - g0, length - g0)


def window_dream(*, early_stop: bool = False, score: ScoreKind = ScoreKind.NEG_ENTROPY) -> Policy:
    """The Dream-family Window-Diffusion preset (``early_stop`` adds the EOS cut)."""
    return Policy(selector=WindowDream(score=score, early_stop=early_stop),
                  truncator=EosCut() if early_stop else None, name="window_dream")

