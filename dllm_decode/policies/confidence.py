"""Fixed-budget selectors: top-k by score (LLaDA, Dream), random, and Dream's ``origin``.

References: Nie et al., "Large Language Diffusion Models", arXiv 2502.09992 (LLaDA
``low_confidence`` / ``random`` remasking, ML-GSAI/LLaDA ``generate.py``); Ye et al., "Dream 7B",
arXiv 2508.15487 (``maskgit_plus`` / ``topk_margin`` / ``entropy`` / ``origin``, ``alg_temp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.policies.base import topk_mask
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import ScoreKind, StepState


@dataclass(frozen=True)
class TopK:
    """Commit the ``budget`` highest-scoring eligible positions per row.

    ``score=prob`` is LLaDA ``low_confidence`` and Dream ``maskgit_plus``; ``margin`` is Dream
    ``topk_margin``; ``neg_entropy`` is Dream ``entropy``. With ``alg_temp > 0`` (Dream) the
    positions are sampled without replacement from ``softmax(score / alg_temp)`` over the row,
    by torch's own exponential race (``argtopk(p / E)``, E ~ Exp(1)), so a seeded run draws the
    same numbers as ``torch.multinomial`` in the reference.
    """

    score: ScoreKind = ScoreKind.PROB
    alg_temp: float | None = None
    budgeted: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "TopK")
        if self.alg_temp is not None:
            check_range("TopK", "alg_temp", self.alg_temp, 0.0)

    def select(self, state: StepState) -> Tensor:
        score = state.proposal.score(self.score)
        budget = state.budget
        if not self.alg_temp:
            return topk_mask(score, state.eligible, budget)
        # sync (sampling mode only): the reference draws nothing when the budget is 0
        if int(budget.max()) == 0:
            return torch.zeros_like(state.eligible)
        full = torch.where(state.eligible, score.float(), torch.full_like(score.float(),
                                                                         -torch.inf))
        probs = torch.softmax(full / self.alg_temp, dim=-1)
        race = probs / torch.empty_like(probs).exponential_(1, generator=state.generator)
        return topk_mask(race, state.eligible & (probs > 0), budget)


@dataclass(frozen=True)
class RandomOrder:
    """LLaDA ``random`` remasking: commit ``budget`` eligible positions in uniform order.

    Draws one ``rand([B, forward_width])`` per step after the proposal's noise, like the
    reference, so seeded runs reproduce it.
    """

    budgeted: bool = True

    def select(self, state: StepState) -> Tensor:
        b, length = state.eligible.shape
        u = torch.rand((b, state.forward_width), generator=state.generator,
                       device=state.eligible.device)
        score = torch.zeros((b, length), device=u.device, dtype=u.dtype)
        score[:, state.forward_start:state.forward_start + state.forward_width] = u
        return topk_mask(score, state.eligible, state.budget)


@dataclass(frozen=True)
class Origin:
    """Dream ``origin``: each eligible position is revealed with probability ``1 - s/t``.

    On the Dream time grid ``t > s``; the last step reveals everything. Uses one ``rand`` over
    the masked positions of all rows (row-major), as the reference does. Tokens of revealed
    positions are drawn after this selection (``proposes_after_select``).
    """

    budgeted: bool = False
    proposes_after_select: bool = True
    may_commit_nothing: bool = True

    def select(self, state: StepState) -> Tensor:
        if state.times is None:
            raise ValueError("origin needs the Dream time grid (schedule='dream')")
        t, s = state.times
        p = 1.0 - s / t if state.steps_left and state.steps_left > 1 else 1.0
        n = int(state.extras["n_masked"])
        u = torch.rand(n, generator=state.generator, device=state.eligible.device)
        reveal = torch.zeros_like(state.eligible)
        reveal[state.masked] = u < p
        return reveal & state.eligible
