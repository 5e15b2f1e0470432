"""CreditDecoding: a decaying trace credit of consistently predicted tokens, fused into the logits.

Paper: "CreditDecoding: Accelerating Parallel Decoding in Diffusion Large Language Models with
Trace Credits", arXiv 2510.06133. The paper ships no code; the reference implementation here
is Ant Group's dInfer (``inclusionAI/dInfer`` @ fce4e32,
``python/dinfer/decoding/parallel_strategy.py``: ``CreditThresholdParallelDecoder``, whose
docstring calls it "EMA-based credit fusion (no CM, no pre-credit)"), run by its
``BlockWiseDiffusionLLM`` loop.

Per block, a credit ``M [B, K, V]`` (zeros at the block's first step) is updated every step::

    M <- beta * M                       (not at the block's first step)
    M[i, argmax p_i] += max(p_i)^gamma  (masked positions i only; p = softmax of the logits)
    logits' = logits + alpha * log(M + 1)

and everything downstream reads ``logits'``: the proposal (argmax, or the Gumbel sample at
``temperature > 0``), the selector, a stopper, a truncator. A token that stays on top gathers
credit and crosses the selector's threshold steps earlier; ``alpha = 0`` is the base selector.

Here the fusion is a loop-level score transform (``Capabilities.fuses_logits``): ``Credit``
wraps *any* selector (dInfer's is the threshold rule; ``frechet``, ``eb``, ``factor``,
``klass``, ... work the same), and a stopper composed with it (``--stopper sched``) reads the
fused margins too.

Deviations from dInfer (flagged in ``Credit``):

* the softmax and argmax that feed the credit see the logits with the mask token removed
  (dInfer keeps it in the softmax, and its threshold rule drops positions whose argmax is the
  mask token); EOS edits of the loop (``logits_eos_inf``) come first too;
* dInfer's threshold also commits every position within 1e-5 of the best confidence; the
  library's ``threshold`` commits the best one alone by default (Fast-dLLM's rule; ties to the
  lower index), ``tie_window=1e-5`` is dInfer's rule (a parity option);
* dInfer's ``BlockRunner`` forwards up to 4 times between "is the block done?" checks (when a
  block has >= 16 masks and ``expected_tpf = 8``), wasting forwards on a finished block; the
  one loop checks before every forward (the NFE differs only there);
* the credit is kept per block and reset at the next block (dInfer keys it by block and
  clears all when nothing is masked: the same for a left-to-right block walk);
* rows of a batch are independent; no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dllm_decode.policies.base import bind_of, init_memory_of
from dllm_decode.policies.capabilities import Capabilities, capabilities_of
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.resolve import make_policy
from dllm_decode.policies.rows import as_rows, column, per_row
from dllm_decode.policies.supervised import Supervised
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import StepState


@dataclass
class CreditMemory:
    """Credit state of one generation: ``credit [B, K, V]`` float32 of the current block
    (``None`` before its first step; B·K·V·4 bytes, e.g. 16 MB for K = 32, V = 126k),
    ``block`` its ``(start, end)``, ``steps`` the block's fused steps so far (host counter),
    ``base`` the wrapped selector's own memory. With per-row steps (``fuse_logits(...,
    block_step=)``) ``credit`` is ``[B, end, V]`` over canvas positions ``0 .. end - 1`` (zero
    before a row's block start) and ``block`` / ``steps`` are not used."""

    base: Any
    credit: Tensor | None = None
    block: tuple[int, int] | None = None
    steps: int = 0


@dataclass(frozen=True)
class Credit:
    """CreditDecoding's credit fusion (arXiv 2510.06133; dInfer's
    ``CreditThresholdParallelDecoder``) over any selector.

    Args:
        selector: the selector that reads the fused scores (dInfer: the threshold rule).
        credit_alpha: alpha, the weight of ``log(M + 1)`` in the logits (dInfer 0.7; 0: the
            base selector exactly).
        boost_gamma: gamma, the concave boost of the top-1 probability (dInfer 0.2; in (0, 1]).
        decay_beta: beta, the credit's decay per step (dInfer 0.8; in [0, 1]).

    The credit lives in ``CreditMemory`` (per generation, per block). Capabilities are the
    base selector's plus ``fuses_logits``. Reads the logits of the current block's fed
    positions only; positions outside the block keep their raw logits.
    """

    selector: Any
    credit_alpha: float = 0.7
    boost_gamma: float = 0.2
    decay_beta: float = 0.8

    def __post_init__(self) -> None:
        check_fields(self, "Credit")
        check_range("Credit", "credit_alpha", self.credit_alpha, 0.0)
        check_range("Credit", "boost_gamma", self.boost_gamma, 0.0, 1.0, lo_open=True)
        check_range("Credit", "decay_beta", self.decay_beta, 0.0, 1.0)
        if not callable(getattr(self.selector, "select", None)):
            raise TypeError(f"Credit wraps a selector (with select(state)), got "
                            f"{type(self.selector).__name__}")
        base = capabilities_of(self.selector)
        if base.edits or base.samples_tokens or base.fuses_logits:
            raise ValueError(f"Credit cannot wrap {type(self.selector).__name__}: it edits "
                             "committed tokens, samples its own or fuses logits itself (the "
                             "credit fuses the proposal's logits)")

    @property
    def capabilities(self) -> Capabilities:
        """The base selector's, plus ``fuses_logits``."""
        return replace(capabilities_of(self.selector), fuses_logits=True, noise_kinds=("mask",))

    def bind(self, model: Any, cfg: Any = None) -> Credit:
        """A copy with the base selector bound (unchanged if it binds to itself)."""
        sel = bind_of(self.selector, model, cfg)
        return self if sel is self.selector else replace(self, selector=sel)

    def init_memory(self, batch: int, length: int, device: torch.device) -> CreditMemory:
        return CreditMemory(base=init_memory_of(self.selector, batch, length, device))

    def fuse_logits(self, logits: Tensor, rows: Tensor, masked: Tensor, memory: CreditMemory,
                    block: tuple[int | Tensor, int], block_step: Tensor | None = None) -> Tensor:
        """Update the block's credit from this step's logits and return the fused logits.

        Args:
            logits: ``[B, R, V]`` (mask token at -inf) of the canvas positions ``rows``
                (``[R]`` shared, or ``[B, R]`` per row); written in place and returned.
            masked: ``[B, L]`` bool before this step's commits (only masked positions
                gather credit).
            memory: the generation's ``CreditMemory``; block: the current ``(start, end)``.
            block_step: per-row steps (``Capabilities.row_steps``): the rows' ``[B]`` int64
                step in their blocks (their credit restarts at 0), ``start`` an int or ``[B]``
                int64; ``None``: the rows share the block and the host counters.

        No host sync (the block bookkeeping is on host integers).
        """
        if block_step is not None:
            return self._fuse_rows(logits, rows, masked, memory, block, block_step)
        start, end = block
        if per_row(start):
            raise ValueError("Credit.fuse_logits: per-row block starts need the rows' block "
                             "steps too: fuse_logits(..., block_step=[B] int64)")
        b, _, v = logits.shape
        k = end - start
        if memory.block != block or memory.credit is None or memory.credit.shape != (b, k, v):
            memory.credit = torch.zeros(b, k, v, dtype=torch.float32, device=logits.device)
            memory.block, memory.steps = block, 0
        credit = memory.credit
        if memory.steps > 0:
            credit.mul_(self.decay_beta)
        memory.steps += 1
        # where each block position sits among the fed rows (absent: not fed this step); the
        # row index is 0 where a position is not fed, and its update there is zero
        pos = torch.arange(start, end, device=logits.device)
        shared = rows.dim() == 1  # one row set for the batch: [K] indices, no [B, K, V] index
        hit = (rows[None, :] == pos[:, None] if shared  # [K, R]
               else rows[:, None, :] == pos[None, :, None])  # [B, K, R]
        fed = hit.any(-1).expand(b, -1)  # [B, K]
        at = hit.int().argmax(-1)  # [K] or [B, K]
        if shared:
            block_logits = logits.index_select(1, at)  # [B, K, V]
        else:
            at_v = at[..., None].expand(-1, -1, v)
            block_logits = logits.gather(1, at_v)
        top_p, top_i = torch.softmax(block_logits.float(), dim=-1).max(-1)
        gain = top_p.pow(self.boost_gamma) * (fed & masked[:, start:end])
        credit.scatter_add_(2, top_i[..., None], gain[..., None])
        bonus = (self.credit_alpha * torch.log(credit + 1.0) * fed[..., None]).to(logits.dtype)
        if shared:
            return logits.index_add_(1, at, bonus)
        return logits.scatter_add_(1, at_v, bonus)

    def _fuse_rows(self, logits: Tensor, rows: Tensor, masked: Tensor, memory: CreditMemory,
                   block: tuple[int | Tensor, int], block_step: Tensor) -> Tensor:
        """``fuse_logits`` with per-row block starts and steps: the credit spans canvas
        positions ``[0, end)``, a row's positions before its block start gather nothing (so
        add nothing), and a row at its block's first step starts from zero credit. Each row
        gets exactly the fused logits of a call on it alone. No host sync."""
        start, end = block
        b, _, v = logits.shape
        device = logits.device
        if memory.credit is None or memory.credit.shape != (b, end, v):
            memory.credit = torch.zeros(b, end, v, dtype=torch.float32, device=device)
        first = (block_step == 0)[:, None, None]
        # decay, or a fresh block's zeros (the shared form's reset), per row
        credit = torch.where(first, 0.0, memory.credit * self.decay_beta)
        pos = torch.arange(end, device=device)
        shared = rows.dim() == 1
        hit = (rows[None, :] == pos[:, None] if shared
               else rows[:, None, :] == pos[None, :, None])  # [end, R] or [B, end, R]
        fed = hit.any(-1).expand(b, -1)  # [B, end]
        at = hit.int().argmax(-1)
        if shared:
            block_logits = logits.index_select(1, at)
        else:
            at_v = at[..., None].expand(-1, -1, v)
            block_logits = logits.gather(1, at_v)
        in_block = fed & (pos[None] >= column(as_rows(start, b, device)))
        top_p, top_i = torch.softmax(block_logits.float(), dim=-1).max(-1)
        gain = top_p.pow(self.boost_gamma) * (in_block & masked[:, :end])
        credit.scatter_add_(2, top_i[..., None], gain[..., None])
        memory.credit = credit
        bonus = (self.credit_alpha * torch.log(credit + 1.0) * in_block[..., None]).to(
            logits.dtype)
        if shared:
            return logits.index_add_(1, at, bonus)
        return logits.scatter_add_(1, at_v, bonus)

    def select(self, state: StepState) -> Any:
        """The base selector on the (already fused) step, with its own memory."""
        mem = state.memory
        own = mem.base if isinstance(mem, CreditMemory) else mem
        return self.selector.select(replace(state, memory=own))


def credit_policy(base: str | Any = "threshold", credit_alpha: float = 0.7,
                  boost_gamma: float = 0.2, decay_beta: float = 0.8, **params: Any) -> Policy:
    """The ``credit`` preset: ``Credit`` over ``base`` (a preset name or a selector; dInfer's
    decoder is ``threshold``, 0.9 here as the library's threshold default; dInfer's guide runs
    0.8, the paper's settings are not public). Other parameters go to the base preset; a base
    with a stopper keeps it, and the stopper reads the fused scores."""
    if not isinstance(base, str) and params:
        raise ValueError(f"parameters {sorted(params)} given for a base selector object")
    built = make_policy(base, **params)
    inner = built.selector
    if isinstance(inner, Supervised):  # Policy re-pairs the stopper around the Credit
        inner = inner.selector
    fused = Credit(inner, credit_alpha=credit_alpha, boost_gamma=boost_gamma,
                   decay_beta=decay_beta)
    return Policy(selector=fused, stopper=built.stopper, truncator=built.truncator,
                  name="credit" if base == "threshold" else f"credit+{built.name}")

