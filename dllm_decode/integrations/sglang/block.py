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

State is per request (``RequestBlock``, carried by SGLang between first-done-first-out rounds
in any row order). The host integers of a ``StepState`` (block step, steps left, progress,
time grid) are per row; rows that share them are decided in one call, and all rows in one call
when the policy reads none of those that differ (the state records what is read (``views.Watched``),
and a call that read a differing value, or drew from the generator, is redone per group / per
request). Policies with per-request memory or sampling run one request per call, with the
request's memory and generator, so every tensor-parallel rank decides identically and a
request's tokens do not depend on its batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.integrations.sglang.spec import ServedModel, ServingSpec, refuse_unservable
from dllm_decode.integrations.sglang.views import (
    ServedStepModel,
    Watched,
    WatchedExtras,
    index_of,
    request_seed,
    take_rows,
)
from dllm_decode.policies.base import bind_of, init_memory_of
from dllm_decode.policies.capabilities import policy_capabilities
from dllm_decode.samplers import schedule as sch
from dllm_decode.samplers.contract import PolicyContractError, StepGuard
from dllm_decode.samplers.proposals import ProposalMaker, widen
from dllm_decode.types import Proposal, Selection, StepState


@dataclass
class RequestBlock:
    """One request's block in progress (SGLang's ``dllm_algo_state``; host values unless noted).

    Attributes:
        prompt: ``[K]`` bool prompt positions of the block (device).
        open: positions to decode at the block's start; n_commit: its scheduled (commit)
            steps; n_iter: plus the editing post steps.
        seed: the request's seed for this block (``None``: the policy draws nothing).
        step: steps taken; has_mask: the block still has a mask (as of the last step);
        post_used: editing post steps taken; done: the block is emitted.
        plan: ``[n_iter, 3]`` float64 per step: LLaDA budget, Dream fraction, last scheduled
            step (device; made at the first step, one tensor shared by blocks alike).
            memory / generator / lengths: the policy's per-request memory, generator and
            truncation length (made on first use).
    """

    prompt: Tensor
    open: int
    n_commit: int
    n_iter: int
    seed: int | None = None
    step: int = 0
    has_mask: bool = True
    post_used: int = 0
    done: bool = False
    plan: Tensor | None = None
    memory: Any = None
    generator: torch.Generator | None = None
    lengths: Tensor | None = None

    def key(self) -> tuple[int, int, int]:
        """The host integers its ``StepState`` is built from: step, schedule length and open
        positions (the block of a cut first block starts after the prompt tail)."""
        return self.step, self.n_commit, self.open


class BlockDecoder:
    """Decodes SGLang rows with ``spec``'s policy (bound to the served model on first use).

    Args:
        spec: the resolved ``--dllm-algorithm-config``.
        block_size, mask_id: SGLang's ``K`` and mask token.
    """

    def __init__(self, spec: ServingSpec, block_size: int, mask_id: int) -> None:
        self.spec, self.k, self.mask_id = spec, block_size, mask_id
        #: what a merged call of rows may not do: "merge" (all rows in one call), "key" (one call
        #: per step key) or "row" (one call per request); escalated when a call reads a
        #: differing step field or draws from the generator
        self.split = "merge"
        self.served: ServedModel | None = None
        self._memo: dict[Any, Tensor] = {}

    def max_forwards(self) -> int:
        """An upper bound on the forwards of one block (SGLang's ``max_steps``)."""
        cfg = self.spec.cfg
        return max(self.k, cfg.steps or 0, cfg.max_steps_per_block or 0) + self.max_post + 1

    # ---- binding -----------------------------------------------------------------------
    def bind(self, served: ServedModel) -> None:
        """Bind the policy's parts to the served model (``bind(model, cfg)``: Learn2PD's filter
        fingerprint, EoTP's EOS ids, ...) and build the proposal maker on its device."""
        policy, cfg = self.spec.policy, self.spec.cfg
        parts = (policy.selector, policy.stopper, policy.truncator)
        self.selector, self.stopper, self.truncator = (bind_of(p, served, cfg) for p in parts)
        caps = policy_capabilities(self.selector, self.stopper, self.truncator)
        refuse_unservable(caps, policy.name)  # e.g. a lookahead kept by the bound part
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
        maker = self.maker = ProposalMaker(served, cfg, served.family, self.probe)
        maker.fields = caps.proposal_fields
        maker.greedy = caps.selector.samples_tokens
        self.step_model = ServedStepModel(served, maker)
        self.rows = torch.arange(self.k, device=device)
        self.fill_id = served.eos_token_ids[0] if served.eos_token_ids else self.mask_id
        self.has_memory = init_memory_of(self.selector, 1, self.k, device) is not None
        sampling = cfg.temperature > 0 and not maker.greedy
        if self.has_memory or sampling:
            self.split = "row"
        self.sampling = sampling

    # ---- per block ---------------------------------------------------------------------
    @torch.inference_mode()
    def start(self, prompt: Tensor, block_start: Tensor | None = None,
              rids: list[str] | None = None) -> list[RequestBlock]:
        """Fresh block states for rows with prompt masks ``prompt [B, K]``; ``block_start [B]``
        (each block's first absolute position) and ``rids`` (request ids) seed each request's
        generator, identically on every tensor-parallel rank. One host sync."""
        prompt = prompt.clone()  # the engine's tensor may be refilled for the next batch
        opens = self.k - prompt.sum(1)
        if block_start is None or rids is None:
            values, seeds = opens.tolist(), [None] * prompt.shape[0]  # once per block
        else:
            pairs = torch.stack([opens, block_start.long()], 1).tolist()
            values = [n for n, _ in pairs]
            base = self.spec.cfg.seed or 0
            seeds = [request_seed(base, rid, pos) for rid, (_, pos) in zip(rids, pairs,
                                                                            strict=True)]
        out = []
        for row, (n_open, seed) in enumerate(zip(values, seeds, strict=True)):
            n_commit = self._steps(int(n_open))
            out.append(RequestBlock(prompt[row], int(n_open), n_commit, n_commit + self.max_post,
                                    seed, has_mask=n_open > 0, done=n_open == 0))
        return out

    def _steps(self, n_open: int) -> int:
        """Scheduled steps of a block with ``n_open`` positions to decode: ``steps`` per block of
        ``K`` (its share, rounded up, as ``DiffusionSampler``'s block-diffusion split), else one
        per position; adaptive policies: ``max_steps_per_block`` or one per position."""
        cfg = self.spec.cfg
        if self.timed:
            return max(1, -(-n_open * cfg.steps // self.k)) if cfg.steps else max(1, n_open)
        return cfg.max_steps_per_block or max(1, n_open)

    def _plan(self, st: RequestBlock, device: torch.device) -> Tensor:
        """``[n_iter, 3]`` float64: LLaDA budget, Dream fraction (1 at the last scheduled step),
        last-scheduled-step flag, per step (zeros in post steps). Read-only, so shared by every
        block with the same open positions and schedule length (made once per such pair, not
        once per request and block)."""
        key = ("plan", st.n_commit, st.open)
        plan = self._memo.get(key)
        if plan is not None:
            return plan
        plan = self._memo[key] = torch.zeros(st.n_iter, 3, dtype=torch.float64, device=device)
        n = st.n_commit
        if self.schedule == "dream":
            fr = sch.dream_fractions(sch.dream_times(n, self.spec.cfg.eps, device))
            plan[:n, 1] = fr.double()
            plan[n - 1, 1] = 1.0
        else:
            n_open = torch.full((1,), st.open, dtype=torch.long, device=device)
            plan[:n, 0] = sch.llada_budgets(n_open, n)[0].double()
        plan[n - 1:, 2] = 1.0  # the last scheduled step (and any past it) finishes the block
        return plan

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
            if not st.done and st.plan is None:
                st.plan = self._plan(st, ids.device)
            done.append(st.done)
            if not st.done:
                active.append(row)
        if not active:
            return done
        logits = self.maker.edit(logits)  # the mask token (and EOS if asked) at -inf, in place
        shared = None if self.sampling or self.fuse else self._propose(logits, None)
        calls = self._calls(active, states, ids, logits, shared, self.maker.mask_logit)
        for rows, idx, canvas, _, lengths in calls:
            if idx is None:
                ids.copy_(canvas)
            else:
                ids.index_copy_(0, idx, canvas.to(ids.dtype))
            if lengths is not None:
                for j, row in enumerate(rows):
                    states[row].lengths = lengths[j:j + 1]
        order = [row for call in calls for row in call[0]]
        flags = torch.cat([call[3] for call in calls]).tolist()  # the one host sync
        for row, (has_mask, edited) in zip(order, flags, strict=True):
            st = states[row]
            post = not st.has_mask
            st.step, st.has_mask = st.step + 1, bool(has_mask)
            if post and not edited:  # a post step that changed nothing: this forward saw it
                st.done = done[row] = True
        return done

    def _calls(self, active: list[int], states: list[RequestBlock], *args: Any) -> list[Any]:
        """Decide the active rows: in one call, one per step key, or one per request, the
        first that holds (``split``, escalated when a wider call read a differing step field
        or drew from the generator; it stays escalated)."""
        while True:
            keys: dict[tuple[int, int], list[int]] = {}
            for r in active:
                keys.setdefault(states[r].key(), []).append(r)
            if self.split == "row":
                groups = [[r] for r in active]
            else:
                groups = [active] if self.split == "merge" else list(keys.values())
            watch = self.split == "merge" and len(keys) > 1
            calls = []
            for rows in groups:
                call = self._decide(rows, states, *args, watch=watch)
                if call is None:
                    break
                calls.append(call)
            else:
                return calls

    def _decide(self, rows: list[int], states: list[RequestBlock], ids: Tensor, logits: Tensor,
                shared: Proposal | None, mask_logit: Tensor | None, *, watch: bool) -> Any:
        """One call of the policy over ``rows`` (all at one step key unless ``watch``).

        Returns ``(rows, index, canvas [b, K], flags [b, 2], lengths [b] | None)`` (flags: the
        block still has a mask, the step edited), or ``None`` when the call must be redone
        narrower (it read a step field that differs between its rows, or drew randomness).
        """
        sts = [states[r] for r in rows]
        st0, b, k, device = sts[0], len(rows), self.k, ids.device
        idx = None if rows == list(range(ids.shape[0])) else index_of(rows, device)

        def take(t: Tensor | None) -> Tensor | None:
            return t if t is None or idx is None else t.index_select(0, idx)

        canvas = take(ids).long()
        prompt = torch.stack([st.prompt for st in sts])
        plan = torch.stack([st.plan[st.step] for st in sts])
        masked, fresh = (canvas == self.mask_id) & ~prompt, ~prompt
        row_mode = self.split == "row"
        probe = self.probe
        generator = self._generator(st0, device) if row_mode else probe
        drawn = probe.get_state()
        memory = None
        if self.has_memory:  # row mode: the request's own memory
            if st0.memory is None:
                st0.memory = init_memory_of(self.selector, 1, k, device)
            memory = st0.memory
        start = k - st0.open  # a cut first block starts after the prompt tail, as in the loop
        step_logits = take(logits)
        if self.fuse is not None:  # row mode (the fusion's memory is per request)
            step_logits = self.fuse(step_logits.clone(), self.rows, masked, memory, (start, k))
        prop = self._propose(step_logits, generator) if shared is None else take_rows(shared, idx)
        full = widen(prop, canvas, self.rows, live=fresh)  # prompt positions unscored
        budget = None
        if self.timed:
            budget = plan[:, 0].long() if self.schedule != "dream" else (
                masked.sum(1, dtype=torch.float32) * plan[:, 1].float()).long()
        i, total = st0.step, st0.n_commit if self.timed else st0.open
        lengths = None
        if self.truncator is not None:
            lengths = torch.cat([st.lengths if st.lengths is not None else
                                 torch.full((1,), k, device=device) for st in sts])
        editable = ~masked & fresh if self.edits else None
        fields = dict(
            proposal=full, eligible=masked, masked=masked, fresh=fresh, canvas=canvas, step=i,
            block=0, block_start=start, block_end=k, gen_start=start, block_step=i,
            steps_left=max(st0.n_commit - i, 1) if self.timed else None, budget=budget,
            progress=i / max(total - 1, 1), generator=generator, forward_start=0,
            forward_width=k, times=self._times(st0), memory=memory,
            extras={"lengths": lengths, "refresh": i == 0, "total_steps": total},
            logits=step_logits if self.needs_logits else None, rows=self.rows,
            refreshed=torch.full((b,), i == 0, device=device), model=self.step_model,
            editable=editable, mask_logit=take(mask_logit) if self.maker.greedy else None)
        if watch:
            state = Watched(**fields)
            state.extras = WatchedExtras(state.reads, fields["extras"])
        else:
            state = StepState(**fields)
        new, commit, edit = self._commit(state, canvas, plan[:, 2] > 0)
        if self.truncator is not None:
            cut = self.truncator.truncate(state, commit).clamp(max=k)
            lengths = torch.minimum(lengths, cut)
            dead = (self.rows[None] >= lengths[:, None]) & fresh
            new = torch.where(dead, self.fill_id, new)
        if watch and state.reads:
            self.split = "key"
            return None
        if not torch.equal(drawn, probe.get_state()):  # the call drew from the probe
            if row_mode:
                raise ValueError("this policy draws random numbers, which inside SGLang are "
                                 "seeded per request: the batch needs its request ids")
            self.split = "row"
            return None
        edited = edit.any(1) if edit is not None else torch.zeros_like(masked[:, 0])
        flags = torch.stack([((new == self.mask_id) & fresh).any(1), edited], 1)
        return rows, idx, new, flags, lengths

    def _commit(self, state: StepState, canvas: Tensor, last: Tensor) -> tuple[Tensor, ...]:
        """The selector's commits (and edits, and the stopper's greedy commits) written into
        the canvas: ``post_forward``'s rules; commits outside ``eligible`` and edits outside
        ``editable`` are dropped (a serving engine does not stop on a policy bug), the mask
        token is never written, and the block's last scheduled step (``last [b]``) commits
        every eligible position left. Returns ``(canvas, commit, edit | None)``."""
        chosen = self.selector.select(state)
        sel = chosen if isinstance(chosen, Selection) else Selection(chosen)
        eligible, prop = state.eligible, state.proposal
        self.guard.check_shape(sel.commit, eligible)
        commit = (sel.commit & eligible) | (eligible & last[:, None])
        edit = None
        if sel.edit is not None:
            if state.editable is None:
                raise PolicyContractError(
                    f"policy {self.spec.policy.name!r} returned Selection.edit without "
                    "declaring it: capabilities = Capabilities(edits=True)")
            self.guard.check_shape(sel.edit, eligible)
            edit = sel.edit & state.editable
        write = commit if edit is None else commit | edit
        tokens = prop.tokens if sel.tokens is None else torch.where(write, sel.tokens,
                                                                    prop.tokens)
        if self.stopper is not None:
            greedy = self.stopper.should_stop(state)[:, None] & state.masked & state.fresh
            if prop.argmax is not None:  # sampled proposals: a stop takes the argmax
                tokens = torch.where(greedy & ~commit, prop.argmax, tokens)
            commit, write = commit | greedy, write | greedy
        write = write & (tokens != self.mask_id)
        return torch.where(write, tokens, canvas), commit, edit

    def _times(self, st: RequestBlock) -> tuple[Tensor, Tensor] | None:
        """Dream's ``(t, s)`` of the row's step (``None`` off the Dream grid / in post steps)."""
        if self.schedule != "dream" or st.step >= st.n_commit:
            return None
        key = ("times", st.n_commit)
        times = self._memo.get(key)
        if times is None:
            times = self._memo[key] = sch.dream_times(st.n_commit, self.spec.cfg.eps,
                                                      self.rows.device)
        return times[st.step], times[st.step + 1]

    def _generator(self, st: RequestBlock, device: torch.device) -> torch.Generator:
        """The request's generator for this block, seeded from its seed (made on first use;
        without a seed the probe, which must then stay untouched)."""
        if st.seed is None:
            if self.sampling:
                raise ValueError("sampling inside SGLang is seeded per request: the batch "
                                 "needs its request ids")
            return self.probe
        if st.generator is None:
            st.generator = torch.Generator(device=device).manual_seed(st.seed)
        return st.generator

    def _propose(self, logits: Tensor, generator: torch.Generator | None) -> Proposal:
        """The library's proposal over every position of ``logits [b, K, V]`` (already
        edited); sampling draws from ``generator``."""
        maker = self.maker
        maker.generator = self.probe if generator is None else generator
        try:
            return maker.propose(logits, None, self.rows, None, 0, edited=True)
        finally:
            maker.generator = self.probe
