"""The work of one decode step after the model forward, as one function a compiler can capture.

``post_forward`` runs: propose (one pass over V for the fed rows) -> widen to the canvas ->
``StepState`` -> select -> the decode contract (``samplers.contract``: recorded on device,
raised at the next sync; the block's last step commits what a policy left) -> stop ->
commit -> the per-generation records. It makes no host sync
and branches only on host values fixed before it is called (the step's integers, the parts'
declared capabilities), so ``torch.compile(post_forward, fullgraph=True)`` captures it whole
for the common presets (``DiffusionSampler(compile=True)``; on a GPU with
``mode="reduce-overhead"``, i.e. a CUDA graph per shape). The sampler keeps the forward, the
one host sync per step and the optional truncation / EOS fill / callbacks around it.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.fed import Fed
from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.samplers.contract import PolicyContractError, StepGuard
from dllm_decode.samplers.proposals import ProposalMaker, widen, widen_at
from dllm_decode.types import Selection, StepState


@dataclass(frozen=True)
class StepParts:
    """What ``post_forward`` needs that is fixed for a generation.

    Args:
        maker: the ``ProposalMaker``.
        selector, stopper: the bound policy parts (``stopper`` may be ``None``).
        guard: the generation's ``samplers.contract.StepGuard``.
        needs_logits: hand the step's logits to the policy (``StepState.logits``).
        after_select: tokens of committed positions are drawn after selection (Dream origin).
        fuse_logits: the selector's ``fuse_logits`` (``Capabilities.fuses_logits``: a score
            transform applied to the logits before the proposal), else ``None``.
    """

    maker: ProposalMaker
    selector: Any
    stopper: Any
    guard: StepGuard
    needs_logits: bool
    after_select: bool
    fuse_logits: Any = None


@dataclass
class StepOut:
    """``post_forward``'s result: the new canvas ``[B, L]``, the commit mask ``[B, L]`` (with
    the stopper's greedy commits), the selector's own mask ``selected [B, L]``, the updated
    ``commit_prob [B, L]``, the step's ``StepState``, ``commit_at [B, L]`` (the argument,
    written in place; a new tensor under ``torch.compile``) and the step's edits ``[B, L]``
    (``None``: the policy does not edit, or returned no ``Selection.edit``)."""

    canvas: Tensor
    commit: Tensor
    selected: Tensor
    commit_prob: Tensor
    state: StepState
    commit_at: Tensor
    edit: Tensor | None = None


def post_forward(parts: StepParts, fed: Fed, logits: Tensor, rows: Tensor, live: Tensor | None,
                 canvas: Tensor, masked: Tensor, fresh: Tensor, eligible: Tensor,
                 budget: Tensor | None, commit_at: Tensor, commit_prob: Tensor,
                 info: dict[str, Any], ctl: dict[str, Any]) -> StepOut:
    """One step after the forward. No host sync (except in ``rng="reference"`` modes that
    draw data-dependent shapes, which the compiled path refuses).

    Args:
        parts: the generation's ``StepParts``.
        fed: the plan's ``Fed`` (for the reference RNG shapes); ``logits [B, R, V]`` its
            logits after CFG (edited in place eagerly, copied under ``torch.compile``: the
            mask token becomes -inf; ``StepState.logits`` sees the edit either way).
        rows, live: the scored canvas positions ``[R]`` / ``[B, R]`` and their live flags.
        canvas, masked, fresh, eligible: ``[B, L]`` this step's tensors.
        budget: ``[B]`` int64 scheduled commits or ``None``.
        commit_at: ``[B, L]`` int64 step of each commit (-1: none), written in place (under
            ``torch.compile`` a new tensor is returned instead: a compiled step mutates none
            of its inputs, which would make Inductor skip CUDA graphs).
        commit_prob: ``[B, L]`` float64 probability each position was committed with.
        info: the remaining ``StepState`` fields (``step``, ``block``, ... ``model``).
        ctl: ``n_masked`` (int, masked positions of the batch), ``in_rows`` (int masked
            positions of the fed rows when the host knows it, else ``None``), and the
            contract's inputs: ``expected`` (``[B]`` rows expected to commit,
            ``contract.expected_rows``),
            ``last`` (the block's last step), ``stall_limit`` (a block's worth of steps),
            ``force_end`` (``[B, L]`` bool block mask on a last step that commits every
            eligible position left, else ``None``), ``editable`` (``[B, L]`` bool, for
            editing policies, ``samplers.editing``; absent otherwise) and ``mask_id``.
    """
    maker = parts.maker
    # the mask token (and EOS) removed: in place eagerly, a new tensor under torch.compile
    logits = maker.edit(logits)
    if parts.fuse_logits is not None:  # a score transform: every part sees the fused scores
        logits = parts.fuse_logits(logits, rows, masked, info["memory"],
                                   (info["block_start"], info["block_end"]))
    masked_rows = maker.masked_rows(logits, fed, live, masked, ctl.get("in_rows"))
    if masked_rows is None:
        prop = maker.propose(logits, fed, rows, masked, ctl["n_masked"], edited=True)
        full_prop = widen(prop, canvas, rows, live, span=fed.span, span_mask=fresh)
        checked, checked_live = prop, live
    else:  # masked-only policies: the masked rows alone are scored (and fresh)
        checked = maker.propose_rows(logits, masked_rows[0], edited=True)
        full_prop = widen_at(checked, canvas, masked_rows[1])
        fresh = masked & fresh
        checked_live = None
    editable = ctl.get("editable")
    state = StepState(proposal=full_prop, eligible=eligible, masked=masked, fresh=fresh,
                      canvas=canvas, budget=budget, rows=rows,
                      logits=logits if parts.needs_logits else None, editable=editable,
                      mask_logit=maker.mask_logit if maker.greedy else None, **info)
    chosen = parts.selector.select(state)
    sel = chosen if isinstance(chosen, Selection) else Selection(chosen)
    commit = sel.commit
    guard = parts.guard
    guard.check_shape(commit, eligible)
    guard.observe(info["step"], checked, checked_live, eligible, ctl["expected"], commit,
                  ctl["stall_limit"], last=ctl["last"],
                  at=None if masked_rows is None else masked_rows[1], budget=budget)
    if ctl["force_end"] is not None:  # force_block_end (prompt masks: LLaDA's carry-over)
        commit = commit | (eligible & ctl["force_end"])
    selected = commit
    edit = sel.edit if editable is not None else None
    if sel.edit is not None and editable is None:
        raise PolicyContractError(f"policy {guard.policy!r} returned Selection.edit without "
                                  "declaring it: capabilities = Capabilities(edits=True)")
    if edit is not None:
        guard.check_shape(edit, editable)
    write = commit if edit is None else commit | edit
    tokens, prob = full_prop.tokens, full_prop.prob
    if sel.tokens is not None:
        tokens = torch.where(write, sel.tokens, tokens)
    if sel.prob is not None:
        prob = torch.where(commit, sel.prob.to(prob.dtype), prob)
    if parts.after_select:
        tokens = maker.resample_committed(logits, rows, commit, tokens)
    stop = None if parts.stopper is None else parts.stopper.should_stop(state)
    if edit is not None and guard.remasks and (ctl["last"] or stop is not None):
        # re-masks (``Capabilities.remasks``) never on a block's last step nor in a row that
        # stops: those commit everything left, and the block must end
        kept = edit & (tokens != ctl["mask_id"])
        if not ctl["last"]:
            kept = torch.where(stop[:, None], kept, edit)
        edit, write = kept, commit | kept
    if stop is not None:
        greedy = stop[:, None] & masked & fresh
        if full_prop.argmax is not None:  # sampled proposals: stops take the argmax
            tokens = torch.where(greedy & ~commit, full_prop.argmax, tokens)
        commit = commit | greedy
        write = write | greedy
    if edit is not None:
        guard.observe_edit(edit, editable, tokens, ctl["mask_id"])
    canvas = torch.where(write, tokens, canvas)
    if torch.compiler.is_compiling():
        commit_at = torch.where(commit, info["step"], commit_at)
    else:
        commit_at.masked_fill_(commit, info["step"])
    commit_prob = torch.where(commit, prob, commit_prob)
    return StepOut(canvas, commit, selected, commit_prob, state, commit_at, edit)


def compile_step(device: torch.device, backend: str = "inductor") -> Any:
    """``torch.compile(post_forward, fullgraph=True)``; on CUDA with Inductor
    ``mode="reduce-overhead"`` (CUDA graphs). ``backend``: any ``torch.compile`` backend
    (``"eager"`` checks the capture without code generation)."""
    mode = "reduce-overhead" if device.type == "cuda" and backend == "inductor" else None
    # a fresh code object per sampler: Dynamo's recompile budget (and cache) is per code
    # object, and every sampler (policy x cache mode) needs a few graphs of its own
    fn = types.FunctionType(post_forward.__code__.replace(), post_forward.__globals__,
                            "post_forward")
    return torch.compile(fn, fullgraph=True, backend=backend, mode=mode)


class SpanMasks:
    """Per-generation memo of ``[B, L]`` masks of canvas spans ``[lo, hi)`` and of ``[B]``
    constant flags: a block's steps reuse them instead of building them every step.
    The tensors are shared between steps and must not be written to (``StepState`` is a
    read-only view)."""

    def __init__(self, batch: int, length: int, device: torch.device) -> None:
        self.batch, self.length, self.device = batch, length, device
        self._pos = torch.arange(length, device=device)
        self._spans: dict[tuple[int, int], Tensor] = {}
        self._flags: dict[bool, Tensor] = {}

    def get(self, lo: int, hi: int) -> Tensor:
        """``[B, L]`` bool: ``lo <= position < hi`` (an expanded view; read-only)."""
        out = self._spans.get((lo, hi))
        if out is None:
            one = (self._pos >= lo) & (self._pos < hi)
            out = self._spans[(lo, hi)] = one[None].expand(self.batch, -1)
        return out

    def flag(self, value: bool) -> Tensor:
        """``[B]`` bool filled with ``value`` (read-only)."""
        out = self._flags.get(value)
        if out is None:
            out = self._flags[value] = torch.full((self.batch,), value, device=self.device)
        return out


class StepModelView:
    """``types.StepModel``: extra forwards against the plan, counted in NFE (each appends its
    ``[B]`` participating rows to the generation's ``took_part`` record). One per generation;
    ``begin`` points it at each step's canvas and active rows."""

    def __init__(self, model: Any, plan: ForwardPlan, maker: ProposalMaker,
                 took_part: list[Tensor], batch: int, *, enabled: bool) -> None:
        self.mask_token_id = model.mask_token_id
        self.eos_token_ids = tuple(model.eos_token_ids or ())
        self.block_size = getattr(model, "block_size", None)
        self.calls = 0
        self.processed = 0  # token positions per row the step's extra forwards ran
        self._plan, self._maker, self._batch = plan, maker, batch
        self._took_part, self._enabled = took_part, enabled
        self._canvas: Tensor | None = None
        self._active: Tensor | None = None

    def begin(self, canvas: Tensor, default_active: Tensor) -> StepModelView:
        """Start a step: its model canvas ``[B', L]`` and the rows ``[B]`` an extra forward
        counts by default; resets ``calls``."""
        self._canvas, self._active, self.calls = canvas, default_active, 0
        self.processed = 0
        return self

    @property
    def positions(self) -> Tensor:
        """``[B, L]`` RoPE positions (sliced on use: most steps never ask)."""
        return self._plan.positions[:self._batch]

    @property
    def valid(self) -> Tensor:
        """``[B, L]`` key validity."""
        return self._plan.valid[:self._batch]

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor,
                active: Tensor | None = None) -> Tensor:
        if not self._enabled:
            raise ValueError("extra forwards (e.g. S2D2 verification) do not support "
                             "cfg_scale > 0")
        logits = self._plan.extra_forward(self._canvas, tokens, positions, mask)
        self.calls += 1
        self.processed += self._plan.extra_width(tokens.shape[1])
        self._took_part.append(self._active if active is None else active.bool())
        return logits

    def probs(self, logits: Tensor) -> Tensor:
        return self._maker.distribution(logits)


def bits_per_step(commit_at: Tensor, commit_prob: Tensor, steps: int, chunk: int = 64) -> Tensor:
    """``[B, steps]`` float64 information committed per step: the sum of ``-log p`` over the
    positions committed at that step (``commit_at [B, L]``, -1: never; ``commit_prob [B, L]``
    the probability each was committed with). Computed once after the loop, per step as a
    masked row sum over the canvas (the same reduction a per-step sum would do)."""
    b = commit_at.shape[0]
    nll = -torch.log(commit_prob.double().clamp_min(1e-300))
    out = [torch.zeros(b, 0, dtype=torch.float64, device=nll.device)]
    for s0 in range(0, steps, chunk):
        at = torch.arange(s0, min(s0 + chunk, steps), device=nll.device)
        hit = commit_at[:, None, :] == at[None, :, None]  # [B, S', L]
        out.append(torch.where(hit, nll[:, None, :], 0.0).sum(2))
    return torch.cat(out, 1)


def step_progress(value: float, compiled: bool | str, device: torch.device) -> float | Tensor:
    """``StepState.progress``: a float, or under ``compile`` a 0-d float64 tensor (a host
    float would specialise the compiled step on its value and recompile every step)."""
    if not compiled:
        return value
    return torch.tensor(value, dtype=torch.float64, device=device)


def _ids_on(ids: tuple[int, ...] | Tensor, device: torch.device) -> Tensor:
    """Token ids as a tensor on ``device`` (the loop passes a tensor it made once: a
    ``torch.tensor`` per step would be a blocking host-to-device copy on CUDA)."""
    return ids if isinstance(ids, Tensor) else torch.tensor(ids, device=device)


def fill_after_eos(canvas: Tensor, mask_id: int, eos_ids: tuple[int, ...] | Tensor, p: int,
                   fill_id: int, *, committed_at: int | None = None,
                   commit_at: Tensor | None = None) -> Tensor:
    """Rows with a committed EOS and nothing masked before it: masks after it become EOS.
    With ``committed_at`` (a step) only rows that committed an EOS at that step
    (``commit_at [B, L]``: each position's commit step) are checked (LLaDA2.0's
    ``eos_early_stop``). ``canvas [B, L]``; ``eos_ids``: ids or a ``[E]`` tensor of them."""
    gen = canvas[:, p:]
    is_eos = torch.isin(gen, _ids_on(eos_ids, canvas.device))
    now = None
    if committed_at is not None and commit_at is not None:
        now = (is_eos & (commit_at[:, p:] == committed_at)).any(1)
    idx = torch.arange(gen.shape[1], device=canvas.device)
    first = torch.where(is_eos, idx, gen.shape[1]).min(1).values
    masked_before = ((gen == mask_id) & (idx[None] < first[:, None])).any(1)
    stop = ~masked_before if now is None else ~masked_before & now
    fill = stop[:, None] & (idx[None] > first[:, None]) & (gen == mask_id)
    return torch.cat([canvas[:, :p], torch.where(fill, fill_id, gen)], dim=1)


def end_rows_at_eos(canvas: Tensor, mask_id: int, eos_ids: tuple[int, ...] | Tensor, p: int,
                    end: int, fill_id: int, skip_every: int | None = None) -> Tensor:
    """After a block ending at ``end``: rows whose generated part ``[p, end)`` of ``canvas
    [B, L]`` holds an EOS stop (their masks past ``end`` become ``fill_id``;
    ``SamplerConfig.block_eos_stop``). ``skip_every``: EOS tokens at multiples of it (block
    starts) do not count (``eos_skip_block_start``)."""
    eos = _ids_on(eos_ids, canvas.device)
    found = torch.isin(canvas[:, p:end], eos)
    if skip_every:
        found = found & (torch.arange(p, end, device=canvas.device) % skip_every != 0)
    hit = found.any(1)
    after = torch.arange(canvas.shape[1], device=canvas.device) >= end
    return torch.where(hit[:, None] & after[None] & (canvas == mask_id), fill_id, canvas)
