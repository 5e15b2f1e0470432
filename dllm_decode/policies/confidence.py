"""Fixed-budget selectors: top-k by score (LLaDA, Dream), random, and Dream's ``origin``.

References: Nie et al., "Large Language Diffusion Models", arXiv 2502.09992 (LLaDA
``low_confidence`` / ``random`` remasking, ML-GSAI/LLaDA ``generate.py``); Ye et al., "Dream 7B",
arXiv 2508.15487 (``maskgit_plus`` / ``topk_margin`` / ``entropy`` / ``origin``, ``alg_temp``).

Dream users comparing against ``diffusion_generate``: under transformers 4.46.x (the version
Dream's code needs) a call without ``generation_config`` builds it from the model config, so
every sampling argument not passed takes the legacy defaults ``temperature=1.0``,
``top_k=50``, ``top_p=1.0``, not the ``None`` / 0.0 of Dream's generation-config class. The
library never inherits them: pass ``top_k=50`` (and the temperature) to reproduce such a call.
``top_k`` filters before the softmax, so it changes every confidence and the ranking of
``entropy`` / ``topk_margin`` / ``maskgit_plus`` even at T = 0 (on the conformance Dream
checkpoint, gen 256, ``entropy``, T = 0, four random prompts: 0, 0, 11 and 99 of 256 positions
change with ``top_k=50``; the conformance cases recorded without ``top_k`` match only with it).

Deviations from the papers / released code:

* the mask token is never proposed (-inf logit); the references keep it in their softmax,
  and so does the ``rng="reference"`` confidence below (the default one drops it, which can
  move a confidence's last bits only when the mask logit is not far below the top one).
* confidences and ties, two paths. Default (``rng="compact"``): the probability is
  ``exp(z1 - lse)`` from the one-pass statistics (fused on a GPU), exact ties go to the lower
  index (``topk_mask``: a stable sort), no host sync. The references differ on both: they take
  a softmax and gather the token's entry (fp32 there can give 0.99999917 where
  ``exp(z1 - lse)`` rounds to 1.0), then ``torch.topk`` per row, whose CPU order among equal
  values is not the index order. With ``rng="reference"`` the library does what they do
  (``samplers.proposals.ProposalMaker.reference_prob``, ``policies.base.reference_topk_mask``):
  on the Gumbel path (LLaDA, Fast-dLLM) a softmax in the logits' dtype, then a gather, and for
  every budgeted top-k ``torch.topk`` over the forward span's ``[L]`` confidences with
  ``-inf`` where not eligible, one host read of the budget per step (eager only). Under
  classifier-free guidance confidences saturate at exactly 1.0 and tie, and only this path
  follows LLaDA's ``generate`` there. Fast-dLLM's float64 softmax is not reproduced (float32
  on both paths); Dream's greedy confidence stays ``exp(z1 - lse)`` (its ties: ``torch.topk``).
* LLaDA: MASK tokens inside the prompt are refused unless ``allow_prompt_masks=True`` (the
  reference silently lets them compete for commits); the EOS options are ``SamplerConfig``
  flags with the EOS / EoT ids taken from the model, not the hard-coded 126081 / 126348.
* Dream: the batch-mean budget, the first-step zero commit with ``steps == max_new_tokens``,
  ``origin``'s draws at T = 0 and ``alg_temp``'s multinomial (as an exponential race with
  the same draws) are reproduced; sampling arguments are never inherited (above).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.policies.base import budget_mask, random_scores, step_score, topk_mask
from dllm_decode.policies.capabilities import Capabilities, score_fields
from dllm_decode.policies.rows import column, per_row, uniform
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

    @property
    def capabilities(self) -> Capabilities:
        """Budgeted; reads the proposal field of ``score`` only, at eligible positions; no
        step value (per-row steps: ``row_steps``)."""
        return Capabilities(proposal_fields=score_fields(self.score), reads_masked_only=True,
                            row_steps=True)

    @property
    def reference_loop(self) -> str | None:
        """``low_confidence`` is Fast-dLLM's loops' rule (``samplers.proposals.REFERENCE_LOOPS``;
        LLaDA's ``generate`` draws as Fast-dLLM's); Dream's rules have none (categorical)."""
        return "fast_dllm" if self.score is ScoreKind.PROB and not self.alg_temp else None

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "TopK")
        if self.alg_temp is not None:
            check_range("TopK", "alg_temp", self.alg_temp, 0.0)

    def select(self, state: StepState) -> Tensor:
        score = step_score(state, self.score)
        budget = state.budget
        if not self.alg_temp:
            return budget_mask(state, score, state.eligible, budget)
        seeded = state.row_seeds is not None  # per-row draws: nothing to skip, no sync
        # sync (sampling mode only): the reference draws nothing when the budget is 0
        if not seeded and int(budget.max()) == 0:
            return torch.zeros_like(state.eligible)
        full = torch.where(state.eligible, score.float(), torch.full_like(score.float(),
                                                                         -torch.inf))
        probs = torch.softmax(full / self.alg_temp, dim=-1)
        if seeded:  # Exp(1) noise -log(u) from each row's seed
            noise = uniform(state, tuple(probs.shape)).log_().neg_().to(probs.dtype)
        else:
            noise = torch.empty_like(probs).exponential_(1, generator=state.generator)
        return topk_mask(probs / noise, state.eligible & (probs > 0), budget)


@dataclass(frozen=True)
class RandomOrder:
    """LLaDA ``random`` remasking: commit ``budget`` eligible positions in uniform order.

    Draws one ``rand([B, forward_width])`` per step after the proposal's noise, like the
    reference, so seeded runs reproduce it.
    """

    #: no proposal score (tokens and prob at the commits only); per-row draws from
    #: ``row_seeds`` (``random_scores``)
    capabilities = Capabilities(proposal_fields=(), reads_masked_only=True, row_steps=True)
    #: LLaDA's / Fast-dLLM's ``remasking="random"`` (``samplers.proposals.REFERENCE_LOOPS``)
    reference_loop = "fast_dllm"

    def select(self, state: StepState) -> Tensor:
        return budget_mask(state, random_scores(state), state.eligible, state.budget)


@dataclass(frozen=True)
class Origin:
    """Dream ``origin``: each eligible position is revealed with probability ``1 - s/t``.

    On the Dream time grid ``t > s``; the last step reveals everything. Uses one ``rand`` over
    the masked positions of all rows (row-major), as the reference does. Tokens of revealed
    positions are drawn after this selection (``proposes_after_select``).
    """

    #: the reveal probability comes from Dream's time grid, whatever the model family
    capabilities = Capabilities(budgeted=False, proposes_after_select=True,
                                may_commit_nothing=True, preferred_schedule="dream",
                                proposal_fields=(), reads_masked_only=True, row_steps=True)

    def select(self, state: StepState) -> Tensor:
        if state.times is None:
            raise ValueError("origin needs the Dream time grid (schedule='dream')")
        t, s = state.times
        if per_row(t) or per_row(state.steps_left) or state.row_seeds is not None:
            return self._select_rows(state)
        p = 1.0 - s / t if state.steps_left and state.steps_left > 1 else 1.0
        n = int(state.extras["n_masked"])
        u = torch.rand(n, generator=state.generator, device=state.eligible.device)
        reveal = torch.zeros_like(state.eligible)
        reveal[state.masked] = u < p
        return reveal & state.eligible

    @staticmethod
    def _select_rows(state: StepState) -> Tensor:
        """Per-row times / steps left, or per-row draws (``row_seeds``: one uniform per canvas
        position of each row, read at its masked positions)."""
        t, s = state.times
        left = state.steps_left
        p = 1.0 - s / t  # [B] or 0-d
        if left is None:
            p = torch.ones_like(p)
        else:
            p = torch.where(torch.as_tensor(left, device=p.device) > 1, p, 1.0)
        at = column(p)  # [B, 1] or 0-d: broadcast against [B, L]
        if state.row_seeds is not None:
            u = uniform(state, tuple(state.eligible.shape))
            return state.masked & (u < at) & state.eligible
        n = int(state.extras["n_masked"])  # sync, as the shared form
        u = torch.rand(n, generator=state.generator, device=state.eligible.device)
        reveal = torch.zeros_like(state.eligible)
        reveal[state.masked] = u < at.expand(state.eligible.shape)[state.masked]
        return reveal & state.eligible
