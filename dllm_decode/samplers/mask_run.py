"""The mask noise kind's part of the one decode loop (``samplers.loop``): ``MaskRun``.

A generation of a mask-token model (LLaDA, Dream, SDAR, LLaDA2, Fast-dLLM v2): the canvas
starts as ``[prompt | mask * G]``; per block the budget base (LLaDA) or time grid (Dream) is
computed; per step, the one host sync ("is anything still masked in this block?", which also
reads the integers the cache plan asked for and the contract's flags), the cache plan's
forward over the positions this mode recomputes (CFG doubles the batch), then
``samplers.step.post_forward`` (propose -> select -> contract -> stop -> commit), the bit-identical
``samplers.fused.fused_step``, or the same step on static buffers (``samplers.graph``).
Eligible = still masked (``canvas == mask_id``) and fed; the block ends when no mask is left in
it and no row is in an editing post step (``samplers.editing``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from dllm_decode.policies.base import check_commit
from dllm_decode.samplers import schedule as sch
from dllm_decode.samplers.contract import expected_rows
from dllm_decode.samplers.fused import fused_step
from dllm_decode.samplers.mask_setup import MaskSetup
from dllm_decode.samplers.records import mask_generation
from dllm_decode.samplers.step import end_rows_at_eos, fill_after_eos, step_progress
from dllm_decode.types import Generation

_F64 = torch.float64  # one dtype for the sync's stack (the guard's flags are float64)


class MaskRun(MaskSetup):
    """One generation of a mask-token model (``samplers.loop.DecodeRun``): the per-block and
    per-step parts over the state ``MaskSetup`` built (same arguments)."""

    # ---- per block ----

    def start_block(self, blk: int) -> int:
        """The block's budget schedule / time grid and the guard's and tracker's block start;
        returns its step cap (the commit phase, then at most ``max_post_steps`` post steps)."""
        bs, be, aligned = self.layout[blk]
        self.blk, self.bs, self.be, self.aligned = blk, bs, be, aligned
        spb = self.steps_per_block = self.block_steps[blk] if self.block_steps else None
        n_commit = self.n_commit = spb or self.cfg.max_steps_per_block or (be - self.lo)
        self.n_iter = n_commit + (self.sel_caps.max_post_steps if self.tracker is not None
                                  else 0)
        times = self.times = (sch.dream_times(n_commit, self.cfg.eps, self.device)
                              if self.schedule == "dream" else None)
        self.fractions = None if times is None else sch.dream_fractions(times)
        self.timed = bool(spb) or times is not None  # steps_left is meaningful
        # LLaDA: the block's whole budget schedule [B] x S (and budget > 0), once per block
        self.budgets = self.positive = None
        if spb and self.schedule != "dream":
            schedule_t = sch.llada_budgets((self.canvas[:, bs:be] == self.mask_id).sum(1),
                                           n_commit)
            self.budgets, self.positive = schedule_t.unbind(1), (schedule_t > 0).unbind(1)
        self.guard.start_block()
        if self.tracker is not None:
            self.tracker.start_block((self.canvas[:, bs:be] == self.mask_id).any(1))
        return self.n_iter

    def end_block(self, blk: int) -> bool:
        """``block_eos_stop``: rows with an EOS end here. Never ends the generation early."""
        cfg, model = self.cfg, self.model
        if cfg.block_eos_stop and self.eos_ids is not None:
            self.canvas = end_rows_at_eos(self.canvas, self.mask_id, self.eos_ids,
                                          self.p, self.be, self.fill_id,
                                          getattr(model, "block_size", None)
                                          if cfg.eos_skip_block_start else None)
        return False

    # ---- per step ----

    def sync(self, i: int) -> bool:
        """Eligibility (still masked), the plan's preparation and the one host sync per step:
        is anything still masked in this block (or a row in a post step)? Also the step's
        budget."""
        bs, be, cfg, canvas = self.bs, self.be, self.cfg, self.canvas
        masked = self.masked = canvas == self.mask_id
        model_canvas = canvas
        if self.cfg_on:
            model_canvas = torch.cat([canvas, canvas.masked_fill(self.prompt_index,
                                                                 self.mask_id)])
        self.model_canvas = model_canvas
        spb = self.steps_per_block
        need = self.plan.prepare(model_canvas, i, self.lo, final=bool(spb) and i == self.n_iter - 1)
        # the one host sync per step: is anything still masked in this block? (plus the
        # integers the plan needs to shape its forward, and the contract's flag)
        flags = self.guard.flags()
        # editing: the rows still in a post step (``EditTracker.begin_step``)
        extra = ([] if self.tracker is None
                 else [self.tracker.begin_step(masked[:, bs:be].any(1))])
        counts = torch.stack([masked[:, bs:be].sum(dtype=_F64), masked.sum(dtype=_F64), *flags,
                              *extra])
        synced = (counts if need is None else torch.cat([counts, need])).tolist()
        self.guard.raise_if(synced[2:2 + len(flags)])
        n_left, self.n_masked = int(synced[0]), int(synced[1])
        n_edit = int(synced[2 + len(flags)]) if extra else 0
        self.host = [int(v) for v in synced[2 + len(flags) + len(extra):]]
        self.n_left = n_left
        n_commit = self.n_commit
        if n_left == 0 and not n_edit and not (cfg.exact_steps and spb and i < n_commit):
            return False
        self.reach = min(be + self.lookahead, self.length)
        budget = None
        if i >= n_commit and (self.budgets is not None or spb):
            budget = self.no_budget  # a post step: nothing scheduled
        elif self.budgets is not None:
            budget = self.budgets[i]
        elif spb:
            budget = sch.dream_budget(masked, self.times, i, n_commit, self.fractions)
        self.budget = budget
        return True

    def forward(self, i: int) -> Any:
        """The cache plan's forward over the fed span (``None``: the static-buffer step runs
        forward and post together, in ``post``)."""
        if self.graphed is not None:
            return None
        # DAWN's attention maps are captured in this forward (every row scored); ReMix's
        # selector rewrites its fed embeddings; any other policy runs the plain forward
        lo = 0 if self.maps else self.lo
        with self._forward_context(i) as maps:
            fed = self.plan.forward(self.model_canvas, (self.bs, self.reach), self.aligned, i,
                                    lo, self.full_span, host=self.host)
        if self.maps:
            self.attention = maps.mean()[:self.b]
        self.forwards += fed.calls  # two where rows of a sub-block cache step disagree
        return fed

    def _forward_context(self, i: int) -> contextlib.AbstractContextManager[Any]:
        """What wraps step ``i``'s forward: the attention capture (``attention_maps``), the
        embedding feed (``soft_inputs``) or nothing."""
        if self.maps:
            return self.model.capture_attention(self.maps)
        if self.soft:
            return self.model.feed_embeddings(lambda e: self._soft_inputs(e, i))
        return contextlib.nullcontext()

    def _soft_inputs(self, embeds: Any, i: int) -> Any:
        """``Capabilities.soft_inputs``: the selector's ``mix_inputs`` on the fed embeddings
        ``[B, L, H]`` of this step's (uncached, whole-canvas) forward."""
        if embeds.shape[1] != self.length:
            raise ValueError(f"soft inputs need the whole canvas fed ({self.length} "
                             f"positions), the forward fed {embeds.shape[1]}")
        return self.parts.selector.mix_inputs(
            embeds, self.canvas, self.memory, self.model.input_embedding, self.mask_id,
            (self.bs, self.be), self.step, i)

    def post(self, fed: Any, i: int) -> None:
        """Propose -> select -> contract -> stop -> commit (``post_forward``, the fused step or
        the static-buffer step), then truncation, EOS fill and the callback."""
        if fed is None:
            self._post_graphed(i)
        else:
            self._post_eager(fed, i)
        cfg = self.cfg
        if cfg.stop_at_eos and self.eos_ids is not None:
            if fed is None:
                self.canvas = fill_after_eos(self.canvas, self.mask_id, self.eos_ids,
                                             self.p, self.fill_id)
            else:
                self.canvas = fill_after_eos(self.canvas, self.mask_id, self.eos_ids,
                                             self.p, self.fill_id,
                                             committed_at=self.step if cfg.eos_stop_on_commit
                                             else None, commit_at=self.commit_at)
        if fed is not None and self.on_step is not None:  # never with the fused step
            self.on_step(self.state, self.commit)
        self.step += 1

    def _post_graphed(self, i: int) -> None:
        """The same step on static buffers, maybe replayed (``samplers.graph``)."""
        n_commit, times, step = self.n_commit, self.times, self.step
        self.canvas, self.commit_prob, active, full = self.graphed.step(
            self.canvas, self.commit_prob, block=self.blk, bounds=(self.bs, self.be),
            aligned=self.aligned, step_in_block=i, lo=self.lo, full_span=self.full_span,
            step=step, progress=step / max(self.total_steps - 1, 1), budget=self.budget,
            times=(times[i], times[i + 1]) if times is not None else None,
            n_masked=self.n_masked, last=i == n_commit - 1,
            steps_left=(n_commit - i) if self.timed else None,
            force_end=i == n_commit - 1 and self.lo == self.p,
            stall_limit=min(n_commit, self.be - self.bs))
        self.forwards += 1
        self.step_forwards.append(1)
        self.step_positions.append(float(self.graphed.positions))
        self.refreshed.append(self.spans.flag(full))
        self.took_part.append(active)

    def _post_eager(self, fed: Any, i: int) -> None:
        cfg, b, p, spans = self.cfg, self.b, self.p, self.spans
        bs, be, reach, masked, budget = self.bs, self.be, self.reach, self.masked, self.budget
        n_commit, times, tracker = self.n_commit, self.times, self.tracker
        logits = fed.logits
        if self.cfg_on:
            cond, uncond = logits.chunk(2)
            logits = uncond + (cfg.cfg_scale + 1) * (cond - uncond)
        rows = fed.rows if fed.rows.dim() == 1 else fed.rows[:b]
        live = None if fed.live is None else fed.live[:b]
        if fed.span is not None and live is None:  # contiguous rows: cached masks
            fresh = spans.get(*fed.span)
            eligible = masked & spans.get(fed.span[0], min(fed.span[1], reach))
        else:
            fresh = fed.fresh_mask(b, self.length)
            eligible = masked & fresh & spans.get(0, reach)
        if self.lookahead:  # batch invariance: a row whose block is complete waits
            eligible = eligible & masked[:, bs:be].any(1, keepdim=True)
        has_eligible = active = eligible.any(1)
        editable = None
        if tracker is not None:  # rows in a post step still take part (and count)
            active = active | tracker.post
            span = spans.get(max(bs, p), be)
            if self.sel_caps.edits_prompt:  # the prompt too (DAWN's position-0 quirk)
                span = span | spans.get(0, p)
            editable = tracker.editable(masked, fresh, span)
        self.step_model.begin(self.model_canvas, active)
        # the contract's per-step inputs (samplers.contract; see post_forward)
        # masked fed rows, known on the host when the rows end with the block (no mask
        # before it): lets the proposal skip counting them (``masked_rows``)
        in_rows = (self.n_left if reach == be and not self.full_span and self.lo == p
                   else None)
        positive = self.positive
        expected = expected_rows(has_eligible, budget,
                                 None if positive is None or i >= n_commit else positive[i])
        stall_limit = min(n_commit, be - bs)
        step_refreshed = (spans.flag(fed.refresh) if fed.refreshed is None
                          else fed.refreshed[:b])
        step, timed = self.step, self.timed
        self.state = self.commit = None
        if self.fuse is not None and i < self.n_iter - 1 and fused_step(
                self.fuse, self.maker, self.guard, fed, logits, rows, masked, eligible, budget,
                expected, self.canvas, self.commit_at, self.commit_prob, step, self.n_masked,
                in_rows, stall_limit):
            self.step_forwards.append(fed.calls)  # (samplers.fused) records in place
            self.step_positions.append(float(fed.positions))
        else:
            info = dict(
                step=step, block=self.blk, block_start=bs, block_end=be, gen_start=p,
                block_step=i, steps_left=max(n_commit - i, 1) if timed else None,
                progress=step_progress(step / max(self.total_steps - 1, 1), self.compile,
                                       self.device),
                generator=self.gen, forward_start=fed.fed_start, forward_width=fed.fed_width,
                times=(times[i], times[i + 1]) if times is not None and i < n_commit
                else None,
                memory=self.memory, extras={"n_masked": self.n_masked, "lengths": self.lengths,
                                            "refresh": fed.refresh,
                                            "total_steps": self.total_steps},
                model=self.step_model, refreshed=step_refreshed,
                reference_order=cfg.rng == "reference", attention=self.attention)
            ctl = dict(n_masked=self.n_masked, in_rows=in_rows, expected=expected,
                       last=i == n_commit - 1, stall_limit=stall_limit,
                       force_end=spans.get(bs, be) if i == n_commit - 1 and self.lo == p
                       else None, editable=editable, mask_id=self.mask_id)
            out = self.run_step(self.parts, fed, logits, rows, live, self.canvas, masked, fresh,
                                eligible, budget, self.commit_at, self.commit_prob, info, ctl)
            self.state, self.commit, self.canvas, self.commit_prob = out.state, out.commit, \
                out.canvas, out.commit_prob
            if tracker is not None:
                tracker.end_step(out.edit)
                self.edit_log.append(self.no_edit if out.edit is None else out.edit[:, p:])
            self.commit_at = out.commit_at  # a new tensor under compile
            self.forwards += self.step_model.calls
            if self.debug:
                check_commit(self.state, out.selected,
                             allow_empty=self.sel_caps.may_commit_nothing)
            self.step_forwards.append(fed.calls + self.step_model.calls)
            self.step_positions.append(float(fed.positions) + self.step_model.processed)
            if self.truncator is not None:
                new_len = self.truncator.truncate(self.state, self.commit).clamp(max=self.g)
                self.lengths = torch.minimum(self.lengths, new_len)
                dead = self.pos_idx[None] >= (p + self.lengths)[:, None]
                self.canvas = torch.where(dead, self.fill_id, self.canvas)  # ends at its EOS
                self.plan.restrict(torch.cat([~dead, ~dead]) if self.cfg_on else ~dead)
        self.refreshed.append(step_refreshed)
        self.took_part.append(active)

    # ---- after the loop ----

    def finish(self) -> Generation:
        """The contract's end check (one sync) and the ``Generation``
        (``samplers.records.mask_generation``)."""
        return mask_generation(self)
