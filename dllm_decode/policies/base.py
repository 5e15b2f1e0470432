"""Policy protocols and the shared selection helpers.

An ``UnmaskPolicy`` maps a ``StepState`` to a commit mask ``[B, L]`` (a subset of
``state.eligible`` with at least one commit in every row that has an eligible position, ties to
the lower index). A ``Stopper`` may end decoding early (remaining masks take their argmax); a
``Truncator`` shortens rows (EoTP). Policies are frozen dataclasses: per-generation memory
lives in the object returned by ``init_memory`` and handed back through ``state.memory``.

Two top-k selections (``budget_mask`` picks one per step):

* ``topk_mask`` (default): a stable sort, exact ties to the lower index, no host sync (graph
  and compile safe). This is *not* the references' order: their ``torch.topk`` on a CPU runs
  ``std::nth_element`` / ``std::partial_sort``, whose order among equal scores depends on the
  row's length, ``k`` and the values around them.
* ``reference_topk_mask`` (``StepState.reference_order``, i.e. ``rng="reference"``): what
  LLaDA's ``generate``, Fast-dLLM and Dream run — ``torch.topk`` with a host ``k`` per row over
  the confidences of the span the reference's forward covered, ``-inf`` where not eligible — so
  exact ties (confidences that saturate at 1.0 in fp32, e.g. under classifier-free guidance)
  are broken as the reference breaks them (the same order under every ``ATEN_CPU_CAPABILITY``:
  the CPU kernel is scalar). One host read of the budget per step.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from dllm_decode.policies.rows import uniform
from dllm_decode.types import ScoreKind, StepState


@runtime_checkable
class UnmaskPolicy(Protocol):
    """Selects which eligible positions to commit this step.

    What it needs from the loop (budgeted or adaptive, logits, cache preference, ...) it
    declares as ``capabilities = Capabilities(...)`` (``policies.capabilities``; optional,
    default ``Capabilities()``). Optional hooks: ``init_memory(batch, length, device)``
    (per-generation state, handed back as ``state.memory``) and ``bind(model, cfg)`` (a copy
    checked against / adapted to the model).
    """

    def select(self, state: StepState) -> Tensor:
        """``state`` -> commit mask ``[B, L]`` bool."""
        ...


@runtime_checkable
class LogitsFuser(Protocol):
    """A selector that declares ``Capabilities(fuses_logits=True)``: the loop hands it each
    step's logits before anything is proposed (CreditDecoding's credit fusion)."""

    def fuse_logits(self, logits: Tensor, rows: Tensor, masked: Tensor, memory: Any,
                    block: tuple[int, int], block_step: Tensor | None = None) -> Tensor:
        """Logits ``[B, R, V]`` (mask token at -inf) of the canvas positions ``rows`` (``[R]``
        or ``[B, R]``), ``masked [B, L]`` before this step's commits, the selector's memory
        and the block ``(start, end)`` -> the fused logits ``[B, R, V]`` (may be written in
        place). No host sync. Per-row steps (``Capabilities.row_steps``): ``block_step`` is
        the rows' ``[B]`` int64 step in their blocks and ``start`` may be ``[B]`` int64;
        ``None`` (the library's loop): the rows share the block and its step."""
        ...


@runtime_checkable
class Stopper(Protocol):
    def should_stop(self, state: StepState) -> Tensor:
        """``state`` -> ``[B]`` bool: commit every remaining mask at its argmax now."""
        ...


@runtime_checkable
class Truncator(Protocol):
    def truncate(self, state: StepState, commit: Tensor) -> Tensor:
        """``state``, this step's commit mask -> new canvas length per row ``[B]`` (int64)."""
        ...


#: ``lowest(dtype)`` of the float dtypes, looked up once (``torch.finfo`` costs a few µs a call)
_LOWEST = {dt: torch.finfo(dt).min for dt in (torch.float16, torch.bfloat16, torch.float32,
                                               torch.float64)}


def lowest(dtype: torch.dtype) -> float:
    """The fill that ranks below every eligible score of ``dtype``: the dtype's finite minimum
    (``-2**62`` for integer scores)."""
    low = _LOWEST.get(dtype)
    if low is not None:
        return low
    return torch.finfo(dtype).min if dtype.is_floating_point else -(2**62)


def random_scores(state: StepState) -> Tensor:
    """``[B, L]`` float32 uniforms for this step (zero outside the fed span).

    One ``torch.rand([B, forward_width])`` (float32) from ``state.generator``, as LLaDA's and
    Fast-dLLM's ``remasking="random"`` draw it (``torch.rand`` of the x0 shape, i.e. the span
    the reference forward covered, after that forward's Gumbel noise): with ``rng="reference"``
    a seeded run reproduces the reference draws. Every call draws. With ``state.row_seeds``
    the same shape comes from ``kernels.row_uniform`` instead (per row, batch-invariant),
    rounded to float32.
    """
    b, length = state.eligible.shape
    if state.row_seeds is not None:
        u = uniform(state, (b, state.forward_width)).float()
    else:
        u = torch.rand((b, state.forward_width), generator=state.generator,
                       device=state.eligible.device)
    score = torch.zeros((b, length), device=u.device, dtype=u.dtype)
    score[:, state.forward_start:state.forward_start + state.forward_width] = u
    return score


def step_score(state: StepState, kind: ScoreKind | str) -> Tensor:
    """The ``[B, L]`` score of ``kind`` this step: a proposal field, or for ``random`` fresh
    uniforms (``random_scores``; call it once per step, every call draws)."""
    if kind is ScoreKind.PROB:  # the common case, without the enum lookup
        return state.proposal.prob
    kind = ScoreKind(kind)
    if kind is ScoreKind.RANDOM:
        return random_scores(state)
    return state.proposal.score(kind)


def rank_desc(score: Tensor, eligible: Tensor) -> Tensor:
    """Rank ``[B, L]`` of each eligible position by descending score (0 = best).

    Ties go to the lower index (stable sort); ineligible positions rank after all eligible.
    """
    key = torch.where(eligible, score, lowest(score.dtype))
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    ranks = torch.argsort(order, dim=-1)  # the inverse permutation (exact, no ties)
    # ineligible entries sorted among -inf/min ties: push them behind every eligible one
    return torch.where(eligible, ranks, order.shape[-1])


def topk_mask(score: Tensor, eligible: Tensor, k: Tensor) -> Tensor:
    """Commit the ``k [B]`` best eligible positions per row (no host sync)."""
    order = torch.sort(torch.where(eligible, score, lowest(score.dtype)), dim=-1,
                       descending=True, stable=True).indices
    # rank < k in sorted order, scattered back through the permutation ``order`` (every
    # position is written, so the scatter's input values do not matter): one sort, not two;
    # ranks as in ``rank_desc``, whose push of ineligible entries is moot under ``& eligible``
    take = _row_positions(order.shape[-1], order.device) < k[:, None]  # [B, L] rank < k
    return eligible & take.scatter(-1, order, take)


_ROW_POSITIONS: dict[tuple[int, torch.device], Tensor] = {}


def _row_positions(length: int, device: torch.device) -> Tensor:
    """``[1, length]`` int64 ``0 .. length - 1``: cached in eager mode (a read-only constant),
    built in place under ``torch.compile`` (which folds it)."""
    if torch.compiler.is_compiling():
        return torch.arange(length, device=device)[None]
    out = _ROW_POSITIONS.get((length, device))
    if out is None:
        if len(_ROW_POSITIONS) > 64:
            _ROW_POSITIONS.clear()
        out = _ROW_POSITIONS[(length, device)] = torch.arange(length, device=device)[None]
    return out


def reference_topk_mask(score: Tensor, eligible: Tensor, k: Tensor, start: int,
                        width: int) -> Tensor:
    """The ``k [B]`` best eligible positions per row as the reference decoders pick them.

    ``torch.topk(row, k_row)`` over each row's ``[width]`` confidences of the canvas span
    ``[start, start + width)`` (the span the reference's forward covered: the whole canvas for
    LLaDA's ``generate`` and Dream, the suffix or block of Fast-dLLM's cached forwards), with
    ``-inf`` at the positions that are not eligible, as LLaDA's ``generate`` builds
    ``confidence`` — so exact ties fall as they fall there. ``score [B, L]``, ``eligible
    [B, L]`` (inside the span), ``k [B]`` int64 -> commit mask ``[B, L]``.
    """
    span = slice(start, start + width)
    conf = torch.where(eligible[:, span], score[:, span], -torch.inf)
    # sync (rng="reference" only): torch.topk takes k on the host, as the references call it;
    # one topk per distinct k over the whole batch (rows are processed independently, so a
    # row's result is its own topk's)
    ks = k.tolist()
    take = torch.zeros_like(conf, dtype=torch.bool)
    for value in sorted(set(ks) - {0}):
        picked = torch.zeros_like(take).scatter_(
            -1, torch.topk(conf, min(value, width), dim=-1).indices, True)
        take |= picked & (k == value)[:, None]
    out = torch.zeros_like(eligible)
    out[:, span] = take
    return out & eligible


def budget_mask(state: StepState, score: Tensor, eligible: Tensor, k: Tensor) -> Tensor:
    """Commit the ``k [B]`` best ``eligible [B, L]`` positions of ``score [B, L]``: in the
    references' order with ``state.reference_order`` (``reference_topk_mask``), else by
    ``topk_mask`` (ties to the lower index, no host sync)."""
    if state.reference_order:
        return reference_topk_mask(score, eligible, k, state.forward_start, state.forward_width)
    return topk_mask(score, eligible, k)


def to_canvas(x: Tensor, rows: Tensor, length: int, fill: float = 0.0) -> Tensor:
    """Per-fed-row values ``x [B, R]`` at the canvas positions ``rows`` (``StepState.rows``:
    ``[R]`` shared or ``[B, R]`` per row; repeated padding entries carry the same value) ->
    ``[B, L]`` in ``x``'s dtype, ``fill`` elsewhere. No host sync."""
    out = torch.full((x.shape[0], length), fill, dtype=x.dtype, device=x.device)
    return out.scatter_(1, rows.expand(x.shape[0], -1), x)


def top1_mask(score: Tensor, eligible: Tensor) -> Tensor:
    """The single best eligible position of each row that has one (ties -> lowest index, as
    ``topk_mask`` with ``k = 1``; one argmax, no sort)."""
    best = torch.where(eligible, score, lowest(score.dtype)).argmax(-1, keepdim=True)  # first max
    return eligible & torch.zeros_like(eligible).scatter_(-1, best, True)


def check_commit(state: StepState, commit: Tensor, *, allow_empty: bool = False) -> None:
    """Assert the commit contract: subset of eligible; >= 1 per row with an eligible position
    (unless the scheduled budget is 0, or ``allow_empty`` for policies such as Dream's
    ``origin`` whose random reveal may pick nothing).

    Used by the tests and by ``DiffusionSampler(debug=True)``; raises ``AssertionError``.
    """
    if commit.shape != state.eligible.shape or commit.dtype != torch.bool:
        raise AssertionError(f"commit must be bool {tuple(state.eligible.shape)}, got "
                             f"{commit.dtype} {tuple(commit.shape)}")
    if (commit & ~state.eligible).any():
        raise AssertionError("policy committed a position that is not eligible")
    if allow_empty:
        return
    stalled = state.eligible.any(1) & ~commit.any(1)
    if state.budget is not None:
        stalled &= state.budget > 0
    if stalled.any():
        raise AssertionError(f"rows {stalled.nonzero().flatten().tolist()} have eligible "
                             "positions but nothing was committed")


def init_memory_of(policy: Any, batch: int, length: int, device: torch.device) -> Any:
    """The policy's per-generation memory, or ``None`` if it keeps none."""
    init = getattr(policy, "init_memory", None)
    return init(batch, length, device) if init is not None else None


def bind_of(component: Any, model: Any, cfg: Any = None) -> Any:
    """``component.bind(model, cfg)`` if it has one, else ``component`` itself.

    Wrappers (``Supervised``, ``FullSpan``) bind what they wrap with this and return a copy of
    *themselves*, so the sampler never swaps a wrapper for its bound inner selector (which
    would lose the wrapper's memory and attributes).
    """
    bind = getattr(component, "bind", None)
    return component if bind is None else bind(model, cfg)
