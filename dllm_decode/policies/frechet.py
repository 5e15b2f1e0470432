"""Fast-dLLM++: Fréchet profile decoding, a drop-in replacement of the threshold / factor rule.

Paper: "Fast-dLLM++: ... Fréchet profile decoding", arXiv 2606.02955 (Alg. 1, Cor. 4.2,
Prop. 4.3); code ``Ringo-Star/FastdLLM_plusplus`` @ 29fd034, ``v1/llada/generate.py``
``get_transfer_index_frechet_profile``.

With the eligible confidences sorted ``c_(1) >= c_(2) >= ...``, the Fréchet-Hoeffding
(Bonferroni) lower bound on the probability that the n leading argmaxes are jointly right is
``L_n = max(0, S_n - (n - 1))`` (``S_n = sum_{j <= n} c_(j)``) and the upper bound on any
competing tuple is ``U_n = 1 - c_(n)``; the rule commits the largest prefix with
``L_n - U_n > delta``. With equal confidences it is Fast-dLLM's factor rule with
``f = 1 - delta`` (strict); a heterogeneous profile earns the bonus
``B_n = sum_{j < n} (c_(j) - c_(n))``.

Deviations from the released code (all flagged in ``Frechet``):

* the code omits the ``max(0, .)`` clamp; for ``delta >= 0`` (the only values allowed here)
  both commit the same prefix;
* ``n*`` counts every n with ``G_n > delta``, as the code does (``G_n`` is non-increasing, so
  the count is the largest valid prefix);
* ``remasking="random"`` (float64 uniforms as confidences) is not provided;
* confidences are the proposal's float32 probabilities of the logits with the mask token
  removed (the code: float64 softmax with the mask token kept), as for ``threshold`` /
  ``factor``; ties go to the lower index (the code's ``torch.sort`` order is unspecified);
  rows are independent and there is no host sync.

Loops: the code's ``generate`` / ``generate_with_prefix_cache`` / ``generate_with_dual_cache``
are the library's ``cache="none"`` / ``"prefix"`` / ``"dual"`` (``reference_loop`` is
``"fast_dllm_pp"``). Its prefix loop draws one Gumbel tensor per forward, unlike Fast-dLLM's,
which draws a second one per cached step and discards it: ``rng="reference"`` keeps that quirk
for the Fast-dLLM presets only (``samplers.proposals.PREFIX_DOUBLE_DRAW``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.policies.adaptive import ranked_adaptive
from dllm_decode.policies.base import rank_desc, step_score
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import ScoreKind, StepState

#: scores that are probabilities of the proposal, for which the Fréchet bound is defined
_PROBABILITY_SCORES = (ScoreKind.PROB, ScoreKind.MARGIN)


def frechet_gaps(sorted_conf: Tensor) -> Tensor:
    """``G_n = (S_n - (n - 1)) - (1 - c_(n))`` for confidences sorted descending.

    Args:
        sorted_conf: ``[B, N]`` float64, each row sorted descending (entries past a row's
            eligible count are ignored by the caller).

    Returns:
        ``[B, N]`` float64 ``G_n`` with ``G_1 = +inf`` (rank 1 always commits). No host sync.
    """
    n_minus_1 = torch.arange(sorted_conf.shape[-1], device=sorted_conf.device,
                             dtype=sorted_conf.dtype)
    gap = (torch.cumsum(sorted_conf, -1) - n_minus_1) - (1.0 - sorted_conf)
    # rank 1 by a select: ``gap[..., 0] = inf`` reads as a host constant made in the step to
    # the CPU replay check of a captured step (``samplers.graph_check``)
    return torch.where(n_minus_1 > 0, gap, torch.inf)


@dataclass(frozen=True)
class Frechet:
    """Fréchet profile decoding (Fast-dLLM++, arXiv 2606.02955, Alg. 1): commit the largest
    prefix of the eligible positions, sorted by confidence, with
    ``sum_{j <= n} c_(j) - (n - 1) - (1 - c_(n)) > delta`` (at least one).

    ``delta = 0.25`` is the paper's operating point (main tables, against factor 0.75 and
    threshold 0.9); the repo's ``eval_gsm8k.sh`` runs 0.02. ``delta`` must lie in [0, 1]
    (the paper sweeps 0-0.30; above 1 nothing but rank 1 ever passes). ``score`` is ``prob``
    (the paper's and the code's ``remasking="low_confidence"``) or ``margin`` (the top-2
    probability gap, a lower bound of ``prob``: a more cautious profile).

    Adaptive (open-ended steps); no state, no extra forwards: it composes with every cache
    mode, stopper and truncator, and with ``credit`` as a fused score underneath.
    Ties go to the lower index. No host sync.
    """

    delta: float = 0.25
    score: ScoreKind = ScoreKind.PROB
    #: Fast-dLLM++'s loops (``samplers.proposals.REFERENCE_LOOPS``): one draw per forward
    reference_loop = "fast_dllm_pp"

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; reads the proposal field of ``score`` only, at eligible positions."""
        return ranked_adaptive(self.score)

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "Frechet")
        if self.score not in _PROBABILITY_SCORES:
            raise ValueError(f"Frechet: score must be a probability, one of "
                             f"{[s.value for s in _PROBABILITY_SCORES]}, got "
                             f"{self.score.value!r}")
        check_range("Frechet", "delta", self.delta, 0.0, 1.0)

    def select(self, state: StepState) -> Tensor:
        """Commit mask ``[B, L]``: the ``n*`` highest-scored eligible positions per row."""
        score = step_score(state, self.score).double()  # the reference sums float64
        eligible = state.eligible
        length = score.shape[-1]
        ranks = rank_desc(score, eligible)
        # scores in rank order; ranks past a row's eligible count hold 0 and are cut below
        in_order = torch.zeros_like(score).scatter_(
            -1, ranks.clamp(max=length - 1), torch.where(eligible, score, 0.0))
        n_elig = eligible.sum(-1, keepdim=True)
        cols = torch.arange(length, device=score.device)
        passes = (frechet_gaps(in_order) > self.delta) & (cols < n_elig)
        count = passes.sum(-1, keepdim=True).clamp(min=1)
        return eligible & (ranks < count)

