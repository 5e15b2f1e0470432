"""Selectors that read previous steps: KLASS and CCD-DS.

* KLASS: Kim, Hong et al., "KL-Adaptive Stability Sampling for Fast Inference in Masked
  Diffusion Models", arXiv 2511.05664 (``shkim0116/KLASS``).
* CCD / CCD-DS: Chen, Liu et al., "Beyond Confidence: Adaptive and Coherent Decoding for
  Diffusion Language Models", arXiv 2512.02044 (``tonyckc/CCD-DLM-code``, Dream).

Both keep explicit per-generation memory (``init_memory``), updated in place each step; both are
budgeted: when their own rule does not fire they commit the schedule's top-k.

Deviations from the papers / released code (details in the class docstrings):

* KLASS: the previous distribution is kept as float32 log-probabilities (the code keeps fp64
  probabilities); at T > 0 KL and confidence are noise-free (the code uses Gumbel-noised
  logits); a KL needs a fresh score at the previous step too (under ``dual`` a block's first
  step has none); the block's last scheduled step commits every eligible position.
* CCD-DS: the paper's sliding-window average over d contexts is not in the released code and
  not here; the code's no-op "draft size 2V" and overridden buffer reset are omitted; the
  released code is Dream-only, the rule runs on any family here.
* both: the mask token is never proposed; rows are independent; ties go to the lower index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.policies.base import lowest, step_score, topk_mask
from dllm_decode.policies.capabilities import Capabilities, score_fields
from dllm_decode.policies.rows import last_step, per_row
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import ScoreKind, StepState

#: added inside the logs of the KL, as the reference does (keeps 0 * log 0 finite)
KL_EPS = 1e-12
_STRATEGIES = ("all", "max_conf", "min_kl")


@dataclass
class KLASSMemory:
    """KLASS state. ``log_prev`` ``[B, L, V]`` float32 ``log(p + 1e-12)`` of each position's
    last fresh distribution (allocated at the first step, when V is known: B·L·V·4 bytes, e.g.
    0.2 GB for L = 400, V = 126k; the reference keeps fp64). ``fresh_prev`` ``[B, L]``: scored
    at the previous step. ``kl`` ``[B, L, h]``: the last h KLs (+inf = none). ``block`` /
    ``block_step``: host counters for the in-block warm-up (no sync; with per-row steps the
    warm-up reads ``state.block_step`` and these are not used)."""

    kl: Tensor
    fresh_prev: Tensor
    log_prev: Tensor | None = None
    block: int = -1
    block_step: int = 0


@dataclass(frozen=True)
class KLASS:
    """KL-adaptive stability sampling (KLASS, arXiv 2511.05664).

    Each step, for every scored position, ``KL_t = sum_v p_t (log(p_t + e) - log(p_{t-1} + e))``
    (e = 1e-12) against the distribution of the previous step, kept in a history of ``history``
    values. ``ready = eligible & all(last h KL < kl_threshold) & conf > conf_threshold``, checked
    from the h-th step of a block on (``step_in_block >= h - 1``, as the reference). A row with
    ready positions commits them (``unmask_strategy``: ``all``, or the single ``max_conf`` /
    ``min_kl`` one); otherwise it commits the schedule's top-k by confidence.

    ``p_t`` is the softmax of the step's raw logits (mask token at -inf); ``conf`` is the
    proposal's probability. Deviations (flagged): at T > 0 the reference computes both from
    Gumbel-noised logits, here they are noise-free; a KL counts only when the position was also
    scored at the previous step (always true without a cache, since ``full_span`` asks for the
    whole canvas; under ``dual`` a block's first step has no KL), otherwise it is +inf; and at
    the last scheduled step of a block every eligible position is committed, where the reference
    can leave masks behind when ready sets were smaller than the budget.

    Defaults are the function defaults of the code (0.9, 0.01, 2); the LLaDA GSM8K script uses
    ``conf_threshold=0.6, kl_threshold=0.015, history=2``.
    """

    conf_threshold: float = 0.9
    kl_threshold: float = 0.01
    history: int = 2
    unmask_strategy: str = "all"
    capabilities = Capabilities(needs_logits=True, full_span=True, proposal_fields=(),
                                reads_masked_only=True, at_least_budget=True, row_steps=True)

    def __post_init__(self) -> None:
        check_fields(self, "KLASS")
        # > 1 is allowed: no position is ever "ready" (the baseline top-k), as the tests use
        check_range("KLASS", "conf_threshold", self.conf_threshold, 0.0)
        check_range("KLASS", "kl_threshold", self.kl_threshold, 0.0)
        if self.history < 1:
            raise ValueError(f"history must be >= 1, got {self.history}")
        if self.unmask_strategy not in _STRATEGIES:
            raise ValueError(f"unmask_strategy must be one of {_STRATEGIES}, got "
                             f"{self.unmask_strategy!r}")

    def init_memory(self, batch: int, length: int, device: torch.device) -> KLASSMemory:
        return KLASSMemory(kl=torch.full((batch, length, self.history), torch.inf, device=device),
                           fresh_prev=torch.zeros(batch, length, dtype=torch.bool,
                                                  device=device))

    def kl_step(self, state: StepState) -> Tensor:
        """Advance the memory by this step's logits ``[B, R, V]`` (canvas positions
        ``state.rows [R]``); returns ``KL_t`` ``[B, L]`` (+inf where the position was not scored
        at the previous step, 0 where it is not scored now). No host sync."""
        mem: KLASSMemory = state.memory
        logits = state.logits
        if logits is None:
            raise ValueError("KLASS needs the step's logits (capabilities.needs_logits)")
        b, r, v = logits.shape
        length = state.fresh.shape[1]
        rows = state.rows
        if rows is None:  # a contiguous span [lo, lo + R), located without a host sync
            rows = state.fresh[0].int().argmax() + torch.arange(r, device=logits.device)
        if rows.dim() != 1:
            raise ValueError("KLASS needs logits rows shared by the batch; per-row (pruned) "
                             "forwards such as cache='window' are not supported")
        if mem.log_prev is None:
            mem.log_prev = torch.zeros(b, length, v, device=logits.device)
        p = torch.softmax(logits if logits.dtype == torch.float32 else logits.float(), dim=-1)
        log_p = torch.log(p + KL_EPS)
        kl_rows = (p * (log_p - mem.log_prev.index_select(1, rows))).sum(-1)  # [B, R]
        kl_rows = torch.where(mem.fresh_prev.index_select(1, rows), kl_rows, torch.inf)
        # ``base.to_canvas`` for shared rows, one op fewer
        kl = kl_rows.new_zeros((b, length)).index_copy_(1, rows, kl_rows)
        mem.log_prev.index_copy_(1, rows, log_p)
        # the history advances only at scored positions (written in place: out= reads each
        # element before writing it)
        h = mem.kl.shape[-1]
        if h == 1:
            rolled = kl[..., None]
        elif h == 2:
            rolled = torch.stack([mem.kl[..., 1], kl], dim=-1)
        else:
            rolled = torch.cat([mem.kl[..., 1:], kl[..., None]], dim=-1)
        torch.where(state.fresh[..., None], rolled, mem.kl, out=mem.kl)
        mem.fresh_prev.copy_(state.fresh)
        return kl

    def select(self, state: StepState) -> Tensor:
        """Commit mask ``[B, L]``: the ready set, else top-``budget`` by confidence."""
        mem: KLASSMemory = state.memory
        kl = self.kl_step(state)
        rows = per_row(state.block_step)  # per row: the warm-up reads the rows' block steps
        if not rows and state.block != mem.block:
            mem.block, mem.block_step = state.block, 0
        elif not rows:
            mem.block_step += 1
        conf, eligible = state.proposal.prob, state.eligible
        stable = (mem.kl < self.kl_threshold).all(-1)
        ready = eligible & (conf > self.conf_threshold) & stable
        if rows:
            ready = ready & (state.block_step >= self.history - 1)[:, None]
        elif mem.block_step < self.history - 1:  # the reference's in-block warm-up
            ready = torch.zeros_like(ready)
        if self.unmask_strategy != "all":  # a single ready position per row
            one = torch.ones_like(conf[:, 0], dtype=torch.long)
            ready = topk_mask(conf if self.unmask_strategy == "max_conf" else -kl, ready, one)
        fallback = topk_mask(conf, eligible, state.budget)
        commit = torch.where(ready.any(1, keepdim=True), ready, fallback)
        if per_row(state.steps_left):  # a row's last scheduled step commits what is left
            commit = torch.where(last_step(state)[:, None], eligible, commit)
        elif state.steps_left == 1:
            commit = eligible.clone()
        return commit


@dataclass
class CCDMemory:
    """CCD state: ``buffer`` ``[B, L]`` bool, the next candidates recorded at the previous step
    (never committed positions); ``prev_argmax`` ``[B, L]`` int64, the previous step's argmax
    at every position scored then."""

    buffer: Tensor
    prev_argmax: Tensor


@dataclass(frozen=True)
class CCD:
    """CCD-DS as released: the two-step consistency rule (CCD, arXiv 2512.02044).

    With k = the step's budget, ``V_max = k + floor(k * expand_ratio)`` and a candidate width
    ``V = 1`` that grows by one per step from step ``warm_up - 1`` on (clipped to ``V_max``):

    * before ``warm_up``: commit the baseline top-k by ``score`` (Dream ``entropy``);
    * from ``warm_up`` on: if the baseline top-k meets the previous step's buffer, take the
      current top-V positions that were in the buffer *and* kept their argmax token; if there
      are at least k of them commit them all (``seek_mode``, CCD-DS; otherwise only the best
      k), else commit the baseline top-k;
    * every step the buffer becomes the V best-ranked eligible positions not committed now.

    ``expand_ratio=0`` keeps V <= k, so a consistent set can only be the baseline's top-k: the
    output equals the baseline token for token. The paper's sliding-window average over d
    contexts is not in the released code and not here. The code's "draft size 2V" and its
    late-stage buffer reset (overridden by the next branch) have no effect and are omitted.
    """

    expand_ratio: float = 4.0
    warm_up: int = 5
    seek_mode: bool = True
    score: ScoreKind = ScoreKind.NEG_ENTROPY

    @property
    def capabilities(self) -> Capabilities:
        """Budgeted, the budget a floor (a consistent set may be larger); reads the proposal
        field of ``score`` (and the greedy token) at masked positions; per-row ``step``
        (``row_steps``)."""
        return Capabilities(proposal_fields=score_fields(self.score), reads_masked_only=True,
                            at_least_budget=True, row_steps=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "score", ScoreKind(self.score))
        check_fields(self, "CCD")
        check_range("CCD", "expand_ratio", self.expand_ratio, 0.0)
        if self.expand_ratio < 0 or self.warm_up < 1:
            raise ValueError("expand_ratio must be >= 0 and warm_up >= 1")

    def init_memory(self, batch: int, length: int, device: torch.device) -> CCDMemory:
        return CCDMemory(buffer=torch.zeros(batch, length, dtype=torch.bool, device=device),
                         prev_argmax=torch.full((batch, length), -1, device=device))

    def width(self, step: int | Tensor, k: Tensor, length: int | None = None) -> Tensor:
        """``[B]`` candidate width V at global ``step`` (shared, or ``[B]`` per row) for
        budgets ``k [B]`` (``length``: the canvas's, which bounds ``k``)."""
        v_max = self._v_max(k, length)
        if per_row(step):
            return torch.minimum(v_max, (step + (3 - self.warm_up)).clamp(min=1))
        grown = 1 if step < self.warm_up - 1 else step - self.warm_up + 3
        return v_max.clamp(max=grown)

    def _v_max(self, k: Tensor, length: int | None) -> Tensor:
        """``V_max = k + floor(k * expand_ratio)`` (int64, ``k``'s shape)."""
        ratio = self.expand_ratio
        if float(ratio).is_integer() and length is not None and length * (ratio + 1) < 2**24:
            # k + floor(k * ratio + 1e-9) in float32 is exactly k * (ratio + 1) there (k <= L)
            return k * int(ratio + 1)
        return k + torch.floor(k * ratio + 1e-9).long()

    def select(self, state: StepState) -> Tensor:
        """Commit mask ``[B, L]``; updates the buffer and the argmax record. No host sync."""
        mem: CCDMemory = state.memory
        k, eligible = state.budget, state.eligible
        score, greedy = step_score(state, self.score), state.proposal.greedy
        ranks = _ranks(score, eligible)  # read only at eligible positions
        kc = k[:, None]  # [B, 1], as every per-row value below
        top = eligible & (ranks < kc)
        step = state.step
        rows = per_row(step)
        if rows:  # ``width`` on [B, 1] columns
            step = step[:, None]
            v = self._v_max(kc, eligible.shape[1])
            v = torch.minimum(v, (step + (3 - self.warm_up)).clamp(min=1))
        else:
            v = self.width(step, k, eligible.shape[1])[:, None]
        commit = top
        if rows or step >= self.warm_up:
            buffer = mem.buffer & eligible
            kept = buffer & (ranks < v) & (greedy == mem.prev_argmax)
            n_kept = kept.sum(1, keepdim=True)
            if not self.seek_mode:
                kept = topk_mask(score, kept, k)
            # (k = 0: the top-k is empty, so it meets no buffer)
            early = (top & buffer).any(1, keepdim=True) & (n_kept >= kc)
            if rows:  # the rule applies from each row's own warm-up step on
                early = early & (step >= self.warm_up)
            commit = torch.where(early, kept, top)
        rest = eligible > commit  # eligible & ~commit (commit is a subset of eligible)
        torch.logical_and(rest, _ranks(score, rest) < v, out=mem.buffer)
        torch.where(state.fresh, greedy, mem.prev_argmax, out=mem.prev_argmax)
        return commit


def _ranks(score: Tensor, eligible: Tensor) -> Tensor:
    """``base.rank_desc`` at the ``eligible`` positions (descending score, ties to the lower
    index); any rank elsewhere (one op fewer: callers read it under ``& eligible``)."""
    key = torch.where(eligible, score, lowest(score.dtype))
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    return torch.argsort(order, dim=-1)

