"""SGLang's dLLM rows decoded with a library policy: per-request block state and the step.

Each SGLang row is one request's block of ``K`` positions (``input_ids [B * K]``), the prompt
tail of a first block marked by ``dllm_prompt_mask``. A row's block is decoded as
``DiffusionSampler`` decodes a block of a block-diffusion model (``samplers.mask_run``): the
canvas is the block (a cut first block starts after its prompt tail), eligible = masked and not
prompt, the proposal comes from the step's logits (fused first by a selector that fuses them,
CreditDecoding) through the library's ``ProposalMaker`` (prompt positions unscored), the budget
schedule is the policy's (LLaDA split or Dream grid of ``steps`` per block), the selector's
commits (and edits, stopper and truncator) are written into ``input_ids`` in place, and the
block's last scheduled step commits what is left, so every block ends.

Done flags follow SGLang's contract for models that keep the block's K/V: a row is done at the
first step whose forward saw the block complete (no mask left, and for editing policies no
change since), never at the step that commits its last mask. Editing policies run post steps
while they edit, at most ``max_post_steps`` (``samplers.editing``'s rule).

One policy call per round (``round_rows.RoundRows``): rows at different steps of their blocks (the
normal case under first-done-first-out scheduling) share the call, their step values as ``[B]``
tensors (``Capabilities(row_steps=True)``, every built-in part), their memory gathered from the
``pool.RequestPool`` by slot and scattered back, their random draws from per-request
counter-based streams (``row_seeds``: the request's seed mixed with its block step), so a
request's draws do not depend on its batch and every tensor-parallel rank draws the same. A
part that does not declare ``row_steps`` (a user's class) is decided as before: all rows in one
call while it reads no per-row step value, else one call per step value, one per request if it
draws from ``state.generator``. A policy error is contained: logged once per failing call, the
call's rows commit their single most confident eligible position.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

from dllm_decode.integrations.sglang.commit import StepParts, fall_back, write_step
from dllm_decode.integrations.sglang.pool import RequestPool
from dllm_decode.integrations.sglang.round_rows import STEP, RequestBlock, RoundRows, Tables
from dllm_decode.integrations.sglang.spec import ServedModel, ServingSpec, refuse_unservable
from dllm_decode.integrations.sglang.views import (
    RowsState,
    ServedStepModel,
    Watched,
    WatchedExtras,
    request_seed,
    take_rows,
    unscored,
)
from dllm_decode.policies.base import bind_of
from dllm_decode.policies.capabilities import policy_capabilities
from dllm_decode.samplers.contract import StepGuard
from dllm_decode.samplers.proposals import ProposalMaker
from dllm_decode.types import Proposal, StepState

logger = logging.getLogger("dllm_decode.integrations.sglang")
#: the default bound on the per-request pool (the YAML's ``pool_budget_mb`` overrides it)
POOL_BUDGET = 4 << 30


class BlockDecoder:
    """Decodes SGLang rows with ``spec``'s policy (bound to the served model by ``bind``).

    Args:
        spec: the resolved ``--dllm-algorithm-config``.
        block_size, mask_id: SGLang's ``K`` and mask token.
        max_requests: SGLang's ``max_running_requests`` (the per-request pool's rows).
    """

    def __init__(self, spec: ServingSpec, block_size: int, mask_id: int,
                 max_requests: int = 1) -> None:
        self.spec, self.k, self.mask_id = spec, block_size, mask_id
        self.max_requests = max_requests
        #: how rows share a call: "rows" (one call, per-row step tensors: ``row_steps``
        #: policies), else "merge" (one call while the policy reads no differing step value),
        #: "key" (one per step value) or "row" (one per request), escalated as it reads / draws
        self.split = "merge"
        self.served: ServedModel | None = None
        #: policy errors contained so far (each logged once, per failing call); policy calls made
        self.errors = self.calls = 0

    def max_forwards(self) -> int:
        """An upper bound on the forwards of one block (SGLang's ``max_steps``)."""
        cfg = self.spec.cfg
        return max(self.k, cfg.steps or 0, cfg.max_steps_per_block or 0) + self.max_post + 1

    # ---- binding -----------------------------------------------------------------------
    @torch.inference_mode()
    def bind(self, served: ServedModel) -> None:
        """Bind the policy's parts to the served model (``bind(model, cfg)``: Learn2PD's filter
        fingerprint, EoTP's EOS ids, ...), build the proposal maker and the per-request pool
        on its device."""
        policy, cfg = self.spec.policy, self.spec.cfg
        parts = (policy.selector, policy.stopper, policy.truncator)
        self.selector, self.stopper, self.truncator = (bind_of(p, served, cfg) for p in parts)
        caps = policy_capabilities(self.selector, self.stopper, self.truncator)
        refuse_unservable(caps, policy.name)  # e.g. a lookahead kept by the bound part
        if self.truncator is not None and not served.eos_token_ids:
            raise ValueError(f"policy {policy.name!r} cannot run inside SGLang on this model: "
                             "its truncator fills the cut tail with EOS and the model has no "
                             "stop token (eos_token_id)")
        device = served.anchor.device
        self.caps, self.served, sel = caps, served, caps.selector
        self.edits, self.max_post, self.timed = sel.edits, sel.max_post_steps, sel.budgeted
        self.schedule = cfg.schedule or sel.preferred_schedule or "llada"
        self.needs_logits = caps.needs_logits
        #: a score transform of the step's logits (CreditDecoding), before anything is proposed
        self.fuse = self.selector.fuse_logits if sel.fuses_logits else None
        #: handed to calls that must not draw: a draw shows in its state (``_decide``)
        self.probe = torch.Generator(device=device)
        #: the decode contract's host-side shape check of a selection (``StepGuard.check_shape``)
        self.guard = StepGuard(1, device, policy.name)
        self.parts = StepParts(self.selector, self.stopper, self.truncator, self.guard,
                               policy.name, self.mask_id, torch.arange(self.k, device=device),
                               served.eos_token_ids[0] if served.eos_token_ids else self.mask_id)
        maker = self.maker = ProposalMaker(served, cfg, served.family, self.probe)
        maker.fields = caps.proposal_fields
        maker.greedy = caps.selector.samples_tokens
        self.step_model = ServedStepModel(served, maker)
        self.rows = torch.arange(self.k, device=device)
        #: two slots (a request and the scratch slot of inert rows) until ``reserve``
        self.pool = RequestPool(self.selector, self.k, 2, device,
                                lengths=self.truncator is not None)
        #: the slot of rows that ride along in a call after their block was emitted
        self.scratch = self.pool.acquire(self)
        self.tables = Tables(self.k, self.schedule, cfg.eps, device)
        self.sampling = cfg.temperature > 0 and not maker.greedy
        self.row_steps = caps.row_steps
        self.split = "rows" if self.row_steps else "merge"
        if not self.row_steps and (self.pool.has_memory or self.sampling):
            self.split = "row"  # a user's part with memory or sampling: one request per call

    def reserve(self, budget: int = POOL_BUDGET) -> int:
        """Preallocate the per-request pool for ``max_requests`` (plus the scratch slot) after
        a warm-up step has allocated one request's memory; returns the pool's bytes.

        Raises:
            ValueError: one line, when the pool would exceed ``budget`` bytes (SGLang does
                not count it in ``--mem-fraction-static``).
        """
        per = self.pool.bytes_per_request()
        total = per * (self.max_requests + 1)
        if total > budget:
            raise ValueError(
                f"policy {self.spec.policy.name!r} keeps {per / 2**20:.1f} MiB per running "
                f"request (its memory of a block, e.g. a [K, V] float32 history): "
                f"--max-running-requests {self.max_requests} needs {total / 2**20:.0f} MiB, "
                f"over the pool budget of {budget / 2**20:.0f} MiB; lower "
                "--max-running-requests, or raise pool_budget_mb in the YAML (and lower "
                "--mem-fraction-static by as much: SGLang does not count this memory)")
        self.pool.reserve(self.max_requests + 1)
        return per * self.pool.capacity

    # ---- per block ---------------------------------------------------------------------
    @torch.inference_mode()
    def start(self, prompt: Tensor, block_start: Tensor | None = None,
              rids: list[str] | None = None) -> list[RequestBlock]:
        """Fresh block states for rows with prompt masks ``prompt [B, K]`` (the prompt tail: a
        prefix of the block, as SGLang lays a first block out); ``block_start [B]`` (each
        block's first absolute position) and ``rids`` (request ids) seed each request's
        streams, identically on every tensor-parallel rank. One host sync."""
        tails = prompt.sum(1)
        if block_start is None or rids is None:
            values = [self.k - n for n in tails.tolist()]  # the one host sync of a block start
            seeds, rids = [None] * prompt.shape[0], [""] * prompt.shape[0]
        else:
            start = block_start if block_start.dtype == tails.dtype else block_start.long()
            pairs = torch.stack([tails, start], 1).tolist()
            pairs = [(self.k - n, pos) for n, pos in pairs]
            values = [n for n, _ in pairs]
            base = self.spec.cfg.seed or 0
            seeds = [request_seed(base, rid, pos) for rid, (_, pos) in zip(rids, pairs,
                                                                            strict=True)]
        out = []
        for rid, n_open, seed in zip(rids, values, seeds, strict=True):
            n_commit = self._steps(int(n_open))
            st = RequestBlock(str(rid), int(n_open), n_commit, n_commit + self.max_post, seed,
                              has_mask=n_open > 0, done=n_open == 0)
            out.append(st)
        return out

    def _take_slots(self, sts: list[RequestBlock]) -> bool:
        """Pool slots for the blocks at their first step (SGLang builds states for every row
        of a batch and keeps only the new rows'; a slot is taken when a block first runs).
        Returns whether a new slot must be reset to fresh memory (``RoundRows.reset``)."""
        new = [st for st in sts if st.slot < 0 and not st.done]
        for st in new:
            st.slot = self.pool.acquire(st)
            st.fresh_slot = True
        return bool(new) and self.pool.needs_reset

    def _steps(self, n_open: int) -> int:
        """Scheduled steps of a block with ``n_open`` positions to decode: ``steps`` per block of
        ``K`` (its share, rounded up, as ``DiffusionSampler``'s block-diffusion split), else one
        per position; adaptive policies: ``max_steps_per_block`` or one per position."""
        cfg = self.spec.cfg
        if self.timed:
            return max(1, -(-n_open * cfg.steps // self.k)) if cfg.steps else max(1, n_open)
        return cfg.max_steps_per_block or max(1, n_open)

    # ---- per step ----------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, ids: Tensor, logits: Tensor, states: list[RequestBlock]) -> list[bool]:
        """One step for every row: ``ids [B, K]`` (written in place), ``logits [B, K, V]``
        (edited in place: the mask token at -inf). Returns SGLang's done flags; one host sync.
        """
        done, active = [], []
        for row, st in enumerate(states):
            if not st.done and not st.has_mask:  # this forward saw the block complete
                st.post_used += self.edits  # editing: a post step, while it edits
                st.done = not self.edits or st.post_used > self.max_post
            if st.done:
                self.pool.release(st)
            done.append(st.done)
            if not st.done:
                active.append(row)
        if not active:
            return done
        logits = self.maker.edit(logits)  # the mask token (and EOS if asked) at -inf, in place
        calls = self._calls(active, states, ids, logits)
        for _, idx, canvas, _ in calls:
            if idx is None:
                ids.copy_(canvas)  # a no-op copy where the step wrote nothing
            else:
                ids.index_copy_(0, idx, canvas.to(ids.dtype))
        order = [row for call in calls for row in call[0]]
        if len(calls) == 1:
            flags = calls[0][3].tolist()  # the one host sync
        else:  # [b] (has a mask) or [b, 2] (and edited) per call, widened to [b, 2]
            parts = [c[3] if c[3].dim() == 2 else torch.stack([c[3], torch.zeros_like(c[3])], 1)
                     for c in calls]
            flags = torch.cat(parts).tolist()  # the one host sync
        for row, flag in zip(order, flags, strict=True):
            st = states[row]
            if st.done:  # an inert row (its block was emitted) rode along in the call
                continue
            has_mask, edited = (flag, False) if isinstance(flag, bool) else (flag[0],
                                                                             any(flag[1:]))
            post = not st.has_mask
            st.step, st.has_mask = st.step + 1, bool(has_mask)
            if post and not edited:  # a post step that changed nothing: this forward saw it
                st.done = done[row] = True
                self.pool.release(st)
        return done

    def _calls(self, active: list[int], states: list[RequestBlock], ids: Tensor,
               logits: Tensor) -> list[Any]:
        """Decide the active rows: in one call (``rows``; ``merge`` while the policy reads no
        differing step value), one per step key, or one per request, the first that holds
        (escalated when a wider call read a differing step field or drew from the generator;
        it stays escalated)."""
        shared = None
        while True:
            keys: dict[tuple[int, int, int], list[int]] = {}
            for r in active:
                keys.setdefault(states[r].key(), []).append(r)
            if self.split == "rows":
                groups = RoundRows.groups(active, states, self.tables)
                if len(groups) == 1 and len(active) < len(states):  # inert rows ride along:
                    groups = [list(range(len(states)))]  # no gathers of the active rows
            elif self.split == "row":
                groups = [[r] for r in active]
            else:
                groups = [active] if self.split == "merge" else list(keys.values())
            watch = self.split == "merge" and len(keys) > 1
            if shared is None and not self.sampling and self.fuse is None:
                shared = self._propose(logits, None)  # every row's greedy proposal, once
            calls = []
            for rows in groups:
                call = self._decide(rows, states, ids, logits, shared, watch=watch)
                if call is None:
                    break
                calls.append(call)
            else:
                self.calls += len(calls)
                return calls

    def _decide(self, rows: list[int], states: list[RequestBlock], ids: Tensor, logits: Tensor,
                shared: Proposal | None, *, watch: bool) -> Any:
        """One call of the policy over ``rows``.

        Returns ``(rows, index, canvas [b, K], flags [b, 2])`` (flags: the block still has a
        mask, the step edited), or ``None`` when the call must be redone narrower (a part
        without ``row_steps`` read a step field that differs between its rows, or drew).
        """
        sts = [states[r] for r in rows]
        reset = self._take_slots(sts)
        rr = RoundRows(sts, rows, ids.shape[0], self.tables, self.timed, self.k, ids.device,
                       per_row=self.split == "rows", scratch=self.scratch,
                       always=self.pool.needs_reset)  # pooled memory: no host counters
        if reset:  # new blocks' slots (the scratch slot for the other rows) to fresh memory
            self.pool.reset(rr.reset)
        take = rr.take
        canvas = take(ids)
        canvas = canvas if canvas.dtype == torch.long else canvas.long()
        fresh = rr.fresh()  # the positions after the prompt tail (none: inert rows)
        masked = (canvas == self.mask_id) & fresh
        probe = self.probe
        generator = self._generator(sts[0], ids.device) if self.split == "row" else probe
        drawn = probe.get_state()
        memory = self.pool.gather(rr.slots)
        lengths = self.pool.lengths.index_select(0, rr.slots) if self.truncator else None
        step_logits = take(logits)
        try:
            if self.fuse is not None:
                per_row = {"block_step": rr.cols[STEP]} if rr.per_row else {}
                step_logits = self.fuse(step_logits.clone(), self.rows, masked, memory,
                                        (rr.block_start, self.k), **per_row)
            failure = None
        except Exception as err:  # noqa: BLE001 - a policy bug must not stop the server
            failure = err
        if shared is not None:
            prop = take_rows(shared, rr.idx)
        else:
            seeds = rr.proposal_seeds if self.split == "rows" else None
            if self.sampling and seeds is None and self.split == "rows":
                raise ValueError("sampling inside SGLang is seeded per request: the batch "
                                 "needs its request ids")
            prop = self._propose(step_logits, generator, seeds)
        full = unscored(prop, canvas, fresh)  # prompt positions unscored
        fields = rr.fields(masked, full, canvas, fresh, generator, memory, lengths)
        fields.update(model=self.step_model, rows=self.rows,
                      logits=step_logits if self.needs_logits else None,
                      editable=~masked & fresh if self.edits else None,
                      mask_logit=take(self.maker.mask_logit) if self.maker.greedy else None)
        lazy = fields.pop("lazy")
        if watch:
            state = Watched(**fields)
            state.extras = WatchedExtras(state.reads, fields["extras"])
        elif lazy:
            state = RowsState(**fields, lazy=lazy)
        else:
            state = StepState(**fields)
        if failure is None:
            try:
                new, commit, edit, lengths = self._commit(state, canvas, rr.last, lengths)
            except Exception as err:  # noqa: BLE001 - a policy bug must not stop the server
                failure = err
        if watch and state.reads:
            self.split = "key"
            return None
        if failure is None and not torch.equal(drawn, probe.get_state()):  # it drew
            if self.split == "rows":
                failure = RuntimeError("the policy drew from state.generator although it "
                                       "declares row_steps: draw from state.row_seeds")
            elif self.split == "row":
                raise ValueError("this policy draws random numbers, which inside SGLang are "
                                 "seeded per request: the batch needs its request ids")
            else:
                self.split = "row"
                return None
        if failure is not None:
            self._contain(failure, sts)
            new, edit = fall_back(state, canvas, rr.last, self.mask_id), None
        else:
            self.pool.scatter(rr.slots, memory)
            if lengths is not None:
                self.pool.lengths.index_copy_(0, rr.slots, lengths)
        has_mask = ((new == self.mask_id) & fresh).any(1)
        flags = has_mask if edit is None else torch.stack([has_mask, edit.any(1)], 1)
        return rows, rr.idx, new, flags

    def _commit(self, state: StepState, canvas: Tensor, last: Tensor, lengths: Tensor | None
                ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """``commit.write_step`` with this decoder's parts."""
        return write_step(self.parts, state, canvas, last, lengths)

    def _contain(self, err: Exception, sts: list[RequestBlock]) -> None:
        """Log a failing call once: the policy, its requests and the error."""
        self.errors += 1
        rids = [st.rid for st in sts]
        logger.error("DllmDecode: policy %r failed on request(s) %s: %s: %s; these rows commit "
                     "their most confident position this step", self.spec.policy.name, rids,
                     type(err).__name__, " ".join(str(err).split()))

    def _generator(self, st: RequestBlock, device: torch.device) -> torch.Generator:
        """The request's generator for this block (a part without ``row_steps`` that draws),
        seeded from its seed (made on first use; without a seed the probe, which must then
        stay untouched)."""
        if st.seed is None:
            if self.sampling:
                raise ValueError("sampling inside SGLang is seeded per request: the batch "
                                 "needs its request ids")
            return self.probe
        if st.generator is None:
            st.generator = torch.Generator(device=device).manual_seed(st.seed)
        return st.generator

    def _propose(self, logits: Tensor, generator: torch.Generator | None,
                 row_seeds: Tensor | None = None) -> Proposal:
        """The library's proposal over every position of ``logits [b, K, V]`` (already
        edited); sampling draws from ``row_seeds`` (per request) or ``generator``."""
        maker = self.maker
        maker.generator = self.probe if generator is None else generator
        try:
            return maker.propose(logits, None, self.rows, None, 0, edited=True,
                                 row_seeds=row_seeds)
        finally:
            maker.generator = self.probe
