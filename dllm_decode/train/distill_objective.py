"""The test-bed distillation loss: soft cross-entropy to the oracle plus two optional terms.

* ``support_log_error``: squared error of the log-probabilities of each position's plausible
  tokens (``--log-error-weight``);
* ``support_rank_error``: a one-sided penalty on plausible-token pairs whose order the student
  is about to flip (``--rank-error-weight``, ``--rank-margin``);
* ``support_log_mass``: minus the log of the mass on each position's plausible tokens (the long
  bed's ``--support-mass-weight``), the share of the cross-entropy that keeps names out.

The first two act on the quantities a greedy parallel decode compares (log-ratios between the
names a slot may hold), which the KL's ``p - q`` gradient weighs by probability and so
under-serves.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from dllm_decode.models.base import DecoderLM
from dllm_decode.models.functional import block_causal_mask

#: oracle log-probabilities closer than this (nats) are a tie: no order to keep
RANK_TIE_NATS = 1e-3
#: plausible tokens per position that ``support_rank_error`` compares (the largest targets)
RANK_TOP = 8


def support_log_error(logp: Tensor, targets: Tensor, log_targets: Tensor | None = None
                      ) -> Tensor:
    """Mean squared error of the log-probabilities of each position's plausible tokens ``[B, G]``.

    With ``S = {v : targets[v] > 0}``: the mean over ``S`` of ``(logp_v - log targets_v)^2``.
    It fits the log-ratios between the tokens the answer may hold, which decide every argmax
    (a 0.2-probability name against a 0.4 one): the KL's gradient on a token's logit is
    ``p - q``, which weighs those errors by probability and leaves per-prompt errors of ~0.5
    nat on the unlikely side, while this term weighs every plausible token alike. It is not
    centred, so mass moved onto impossible tokens (which lowers every ``logp_v`` on ``S``) is
    penalised too: a centred version let 16 % of the mass leak there at weight 20. Zero where
    the answer is certain and predicted so. logp, targets ``[B, G, V]``; ``log_targets``, when
    the caller already has it, is ``log(targets)`` with zeros clamped to 1e-30.
    """
    if log_targets is None:
        log_targets = targets.clamp_min(1e-30).log()
    support = targets > 0
    d = torch.where(support, logp - log_targets, 0.0)
    return d.square().sum(-1) / support.sum(-1).clamp_min(1)


def support_log_mass(logp: Tensor, targets: Tensor) -> Tensor:
    """Minus the log of the student's mass on each position's plausible tokens ``[B, G]``.

    ``-log sum_{v : targets[v] > 0} p_v``: 0 when no mass leaves the support, whatever its
    split inside it; the cross-entropy to a one-hot target. The soft cross-entropy already
    holds this term once (``CE(q, p) = -log m + CE(q, p / m)`` with ``m`` the mass on the
    support), weighted against fitting the split inside the support; a greedy decoder's
    validity depends on the leak alone (a shuffle slot's argmax on a name already written),
    so a weight on it spends more of the gradient there. logp, targets ``[B, G, V]``.
    """
    return -logp.masked_fill(targets <= 0, float("-inf")).logsumexp(-1)


def support_rank_error(logp: Tensor, targets: Tensor, margin: float = 0.5) -> Tensor:
    """Squared shortfall of the student's log-ratios on strictly ordered plausible pairs ``[B, G]``.

    For each position, over the pairs ``(i, j)`` of its ``RANK_TOP`` most likely plausible
    tokens with ``log q_i > log q_j`` (ties, within ``RANK_TIE_NATS``, excluded): the mean of
    ``relu(margin * (log q_i - log q_j) - (log p_i - log p_j))^2``. Zero while the student keeps
    at least ``margin`` of every oracle log-ratio; it grows only on the pairs a greedy parallel
    commit is about to get wrong (the inserted name overtaking an original neighbour at one
    slot of ``insert_random``: a 0.7-1.1 nat error on a few prompts), where the symmetric
    ``support_log_error`` spends its gradient on every small deviation alike. Positions with
    fewer than two ordered plausible tokens give 0. logp, targets ``[B, G, V]``.
    """
    if not 0 < margin <= 1:
        raise ValueError(f"margin must lie in (0, 1], got {margin}")
    q, index = targets.topk(min(RANK_TOP, targets.shape[-1]), dim=-1)
    log_q = q.clamp_min(1e-30).log()
    log_p = logp.gather(-1, index)
    gap_q = log_q[..., :, None] - log_q[..., None, :]  # [B, G, K, K]: i over j
    gap_p = log_p[..., :, None] - log_p[..., None, :]
    plausible = q > 0
    ordered = plausible[..., :, None] & plausible[..., None, :] & (gap_q > RANK_TIE_NATS)
    short = F.relu(margin * gap_q - gap_p).where(ordered, 0.0)
    return short.square().sum((-1, -2)) / ordered.sum((-1, -2)).clamp_min(1)


def distill_loss(model: DecoderLM, tokens: Tensor, valid: Tensor, masked: Tensor,
                 targets: Tensor, prompt_length: int, log_error_weight: float = 0.0,
                 rank_error_weight: float = 0.0, rank_margin: float = 0.5
                 ) -> tuple[Tensor, Tensor]:
    """``(soft cross-entropy [+ log_error_weight * support_log_error] [+ rank_error_weight *
    support_rank_error], KL to the targets)`` averaged over the supervised answer positions.

    tokens, valid ``[B, L]``; masked ``[B, G]`` (answer rows ``prompt_length..L``): the
    supervised positions (the masked ones; with LLaDA2.1's editing stream also visible ones);
    targets ``[B, G, V]``. Block-causal models attend in their own blocks (aligned to position
    0, as they decode), with padding keys hidden.
    """
    positions = model.rope_positions(valid)
    rows = torch.arange(prompt_length, tokens.shape[1])
    mask = valid
    if model.attention == "block_causal":  # the model's own blocks, padding keys hidden
        mask = block_causal_mask(positions, positions, model.block_size) & valid[:, None, :]
    logits = model(tokens, positions, mask=mask, hidden_rows=rows).float()
    logp = logits.log_softmax(-1)
    log_q = targets.clamp_min(1e-30).log()  # once per step: the entropy and the log-error term
    ce = -(targets * logp).sum(-1)
    entropy = -(targets * log_q).sum(-1)
    n = masked.sum().clamp_min(1)
    loss = ce
    if log_error_weight:
        loss = loss + log_error_weight * support_log_error(logp, targets, log_q)
    if rank_error_weight:
        loss = loss + rank_error_weight * support_rank_error(logp, targets, rank_margin)
    return (loss * masked).sum() / n, ((ce - entropy) * masked).sum() / n
