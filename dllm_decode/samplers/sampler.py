"""``DiffusionSampler``: the one decode loop every policy and cache mode plugs into."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.plans import make_plan
from dllm_decode.config import SamplerConfig
from dllm_decode.policies.base import check_commit, init_memory_of
from dllm_decode.policies.capabilities import Capabilities, noise_kind_of, policy_capabilities
from dllm_decode.policies.registry import Policy
from dllm_decode.samplers import schedule as sch
from dllm_decode.samplers.batching import decode_groups, split_rows
from dllm_decode.samplers.contract import StepGuard, expected_rows
from dllm_decode.samplers.editing import EditTracker
from dllm_decode.samplers.fused import fused_step, span_selector
from dllm_decode.samplers.graph import StepGraphs, graph_run
from dllm_decode.samplers.inputs import check_inputs
from dllm_decode.samplers.params import build_policy, replace_config
from dllm_decode.samplers.proposals import ProposalMaker
from dllm_decode.samplers.step import (
    SpanMasks,
    StepModelView,
    StepParts,
    bits_per_step,
    compile_step,
    end_rows_at_eos,
    fill_after_eos,
    post_forward,
    step_progress,
)
from dllm_decode.samplers.uniform import check_noise_kind, decode_uniform, uniform_policy
from dllm_decode.types import Generation, Impl, StepState

OnStep = Callable[[StepState, Tensor], None]


class DiffusionSampler:
    """Decode a masked diffusion LM with any policy and any cache mode.

    The loop, per block (left to right) and per step:

    1. **block start**: compute the block's budget base (LLaDA) or time grid (Dream);
    2. **sync**: the one host check per step, "is anything still masked in this block?",
       which also reads the few integers the cache plan asked for (``plan.prepare``: the
       window plan's fed width);
    3. **forward**: the cache plan feeds the positions this mode recomputes (full canvas,
       block + suffix, block only, block-causal span, or per-row window sets); CFG doubles
       the batch;
    4. **propose**: per-position token and probability, plus the margins / entropy the policy
       declares it reads (``Capabilities.proposal_fields``; all of them by default), in one
       fused pass over V on a GPU (``kernels.propose``); logits are dropped after this unless
       a policy asks;
    5. **select**: the policy turns the ``StepState`` into a commit mask (subset of eligible);
    6. **stop / truncate**: optional stopper (commit everything at its argmax) and truncator
       (EoTP: shorten the row, crop visible keys);
    7. **commit**: write tokens, record the commit step and the information committed; a
       selector declaring ``Capabilities(edits=True)`` may also rewrite committed positions
       of the block (``Selection.edit``, LLaDA2.1 token editing), and a block whose masks are
       all committed then runs on while its rows edit, at most ``max_post_steps`` steps
       (``samplers.editing``; recorded in ``Generation.edits``).

    Steps 4-7 are ``samplers.step.post_forward``; for exactly ``TopK(prob)`` / ``Threshold(prob)``
    with nothing else reading the step (no stopper, truncator, ``on_step``, ``debug``), every
    step but a block's last runs the bit-identical ``samplers.fused.fused_step`` on the fed span
    instead (eager only).

    Hooks for policies (all optional, read off the selector or the ``StepState``):

    * ``state.model`` (``types.StepModel``): ``forward(tokens, positions, mask, active)`` runs
      an extra forward against the step's keys (the plan's K/V, or the recomputed canvas
      without a cache), stores nothing, and counts in ``Generation.forwards`` and in the
      per-row NFE of ``active`` rows (S2D2's verifier); ``probs(logits)`` is the sampling
      distribution. Unavailable under CFG.
    * ``select`` may return a ``types.Selection(commit, tokens, prob)`` instead of a bare
      mask: ``tokens`` replace the proposal at committed positions (a resampled token).
    * declared capabilities (``policies.capabilities.Capabilities``, the ``capabilities``
      attribute of the selector, stopper and truncator): read and checked once, here in
      ``__init__`` (``self.capabilities``); unknown names and capabilities set as plain
      attributes are errors. ``preferred_cache`` / ``preferred_schedule`` apply when the
      config gives none, ``requires_attention`` is checked against the model.

    Args:
        model: any ``DiffusionLM``.
        policy: a preset name (``make_policy``), an import path ``module:Class``, a ``Policy``
            or a selector object (composition by names: ``samplers.build.build_sampler``).
        cache: ``"none" | "prefix" | "dual" | "block_causal" | "window"`` (``None``: the
            policy's ``preferred_cache``, else ``"none"``).
        debug: also assert the full commit contract every step (``check_commit``; the cheap
            part, ``samplers.contract``, is enforced on every run).
        compile: run each step's work after the forward (propose, select, contract, stop,
            commit; ``samplers.step.post_forward``) through ``torch.compile(fullgraph=True)``
            (``mode="reduce-overhead"`` on CUDA); a string names the ``torch.compile``
            backend (``True``: Inductor). Compiled once per sampler, on the first
            ``generate`` (reuse the sampler). Tokens equal the eager loop's; ``bits`` may differ
            in the last float32 digits. Not for policies that run extra forwards or draw
            data-dependent shapes (``rng="reference"`` sampling, Dream ``origin``): they raise.
        graphs: run each step (forward + the work after it) on static buffers
            (``samplers.graph``): on CUDA each step shape is captured once as a CUDA graph and
            replayed; on the CPU the same step runs eagerly (for tests). ``None`` (default):
            on for CUDA wherever the policy and settings allow (else the eager loop, the
            reason logged on the ``dllm_decode.graph`` logger and kept in
            ``graph_reason``; ``DLLM_DECODE_GRAPHS=0`` in the environment turns the default
            off); ``False``: never. Tokens equal the eager loop's.
        **params: ``SamplerConfig`` fields and the policy's own parameters (e.g. ``tau``; only
            with a preset name or an import path), split and checked by
            ``samplers.params.build_policy``. Unknown names raise ``ValueError`` with the
            closest valid one.

    Noise kinds (``Capabilities.noise_kinds``, ``model.noise_kind``): the loop above is the
    mask-token one. A uniform-noise model (DiffusionGemma: no mask token, canvases of random
    tokens) runs the same block -> step -> forward -> propose -> select -> stop -> commit
    structure in ``samplers.uniform.decode_uniform``, where a block is one canvas, a commit is
    an acceptance and every other position is re-noised (``policies.renoise``); its policies
    are ``gemma_renoise`` or an acceptance rule declaring ``"uniform"`` (``eb``,
    ``threshold``, ``entropy_threshold``), wrapped in ``Renoise``. A policy and a model of
    different noise kinds are refused here, in ``__init__``.

    Batch invariance: a row's greedy tokens and NFE do not depend on its batch neighbours
    (block-causal models split ragged batches by block phase, see ``samplers.batching``); with
    ``temperature > 0`` one generator is shared by the batch unless ``seed`` is a list with one
    int per row, which decodes every row as it decodes alone with its seed.
    """

    def __init__(self, model: Any, policy: str | Policy | Any = "low_confidence",
                 cache: str | None = None, *, debug: bool = False, compile: bool | str = False,
                 graphs: bool | None = None, **params: Any) -> None:
        cfg_params, self.policy = build_policy(policy, params)  # the one split (with build_sampler)
        self.model = model
        self.noise_kind = noise_kind_of(model)
        if self.noise_kind == "uniform":
            self.policy = uniform_policy(self.policy, model)
        # the one place the policy's declared capabilities are read and validated
        self.capabilities = policy_capabilities(self.policy.selector, self.policy.stopper,
                                                self.policy.truncator)
        check_noise_kind(self.capabilities, self.noise_kind, self.policy.name, model)
        need = self.capabilities.requires_attention
        if need is not None and getattr(model, "attention", None) != need:
            raise ValueError(f"policy {self.policy.name!r} needs a model with attention={need!r} "
                             "('block_causal': block-diffusion models such as SDAR; "
                             "'bidirectional': LLaDA, Dream); this model's attention is "
                             f"{getattr(model, 'attention', None)!r}")
        if cache is None:
            cache = self.capabilities.selector.preferred_cache or "none"
        self.config = SamplerConfig(cache=cache, **cfg_params)
        self.debug = debug
        self.compile = compile
        self._compiled: Any = None  # the compiled step, built on first use (per device)
        self.graphs = graphs
        self.step_graphs: StepGraphs | None = None  # static buffers and graphs (first use)
        self.graph_reason: str | None = None  # why the last generate ran without them

    def __repr__(self) -> str:
        return f"DiffusionSampler(policy={self.policy.name!r}, cache={self.config.cache.value!r})"

    @torch.inference_mode()
    def generate(self, prompt_ids: Tensor | list[list[int]], attention_mask: Tensor | None = None,
                 *, on_step: OnStep | None = None, **overrides: Any) -> Generation:
        """Decode ``gen_length`` positions after each prompt.

        Args:
            prompt_ids: ``[B, P]`` int64, left-padded.
            attention_mask: ``[B, P]`` 1 = token, 0 = left padding (``None``: no padding).
            on_step: optional callback ``(state, commit)`` after every selection.
            **overrides: ``SamplerConfig`` fields for this call (``gen_length``, ``steps``, ...).

        Returns: ``Generation`` (tokens ``[B, P + G]``, per-row NFE, commit steps, bits).
        """
        cfg = replace_config(self.config, overrides) if overrides else self.config
        model, policy, caps = self.model, self.policy, self.capabilities
        # components may check themselves against the model/config (``bind(model, cfg)``:
        # Learn2PD's filter fingerprint and block length, EoTP's EOS ids) and resolve what
        # depends on the model (ETE's in-block lookahead on block-causal models): the loop
        # follows the bound parts' declarations
        parts = (policy.selector, policy.stopper, policy.truncator)
        selector, stopper, truncator = bound = tuple(_bind(c, model, cfg) for c in parts)
        if any(b_ is not c for b_, c in zip(bound, parts, strict=True)):
            caps = policy_capabilities(*bound)
        sel_caps = caps.selector
        prompt, valid_prompt = check_inputs(model, prompt_ids, attention_mask, cfg)
        groups = split_rows(model, valid_prompt, cfg.seed)
        if groups is not None:  # batch invariance: sub-batches decoded alone, then merged
            return decode_groups(self.generate, prompt, valid_prompt, groups, on_step=on_step,
                                 **{k: v for k, v in overrides.items() if k != "seed"})
        if self.noise_kind == "uniform":  # canvases of random tokens (samplers.uniform)
            return decode_uniform(model, selector, stopper, prompt, valid_prompt, cfg,
                                  policy.name, on_step)
        b, p = prompt.shape
        # the decoded span: G, or (``decode_block_padding``, LLaDA2's quirk) up to a block end
        g, g_out = sch.padded_gen_length(model, cfg, p), cfg.gen_length
        length = p + g
        device = prompt.device
        mask_id = model.mask_token_id
        fill_id = model.eos_token_ids[0] if model.eos_token_ids else mask_id

        canvas = torch.cat([prompt, torch.full((b, g), mask_id, device=device)], dim=1)
        valid = torch.cat([valid_prompt, torch.ones(b, g, dtype=torch.bool, device=device)], 1)
        positions = model.rope_positions(valid)
        gen = torch.Generator(device=device).manual_seed(cfg.seed or 0)  # one per batch
        family = getattr(model, "family", "")
        schedule = cfg.schedule or sel_caps.preferred_schedule or (
            "dream" if family == "dream" else "llada")
        layout = sch.decode_layout(model, cfg, p, length)
        block_steps = sch.steps_per_block(model, cfg, layout, sel_caps)

        cfg_on = cfg.cfg_scale > 0
        prompt_index = (canvas != mask_id) & (torch.arange(length, device=device) < p)
        model_valid = torch.cat([valid, valid]) if cfg_on else valid
        model_pos = torch.cat([positions, positions]) if cfg_on else positions
        causal = cfg.causal_prefix
        if causal is None:  # the policy's preference, where it applies
            causal = sel_caps.causal_prefix and model.attention == "block_causal"
        plan = make_plan(model, cfg.cache, model_valid, model_pos,
                         replace(cfg, causal_prefix=causal), family,
                         cache=self.step_graphs and self.step_graphs.cache_for(
                             cfg.cache, model_valid.shape, device),  # the graphs' K/V
                         sub_block=sel_caps.sub_block_size)
        plan.draft_causal = sel_caps.draft_causal  # S2D2 draft_ver
        maker = ProposalMaker(model, cfg, family, gen)
        maker.after_select = sel_caps.proposes_after_select
        maker.greedy = sel_caps.samples_tokens
        # only the proposal fields the parts read (every field for parts that do not declare
        # them, and for an ``on_step`` callback, which may read anything)
        maker.fields = caps.proposal_fields if on_step is None else None
        # masked-only parts: greedy reference proposals may skip the unmasked rows (on the CPU,
        # eager; ``ProposalMaker.masked_rows``)
        maker.masked_only = (caps.masked_only and on_step is None and not self.compile
                             and maker.impl is Impl.REFERENCE and cfg.temperature == 0
                             and not cfg.confidence_eos_eot_inf
                             and not sel_caps.proposes_after_select)
        guard = StepGuard(b, device, policy.name, exempt_stall=sel_caps.may_commit_nothing)
        if self.compile:  # the compiler fuses the torch reference itself
            maker.impl = Impl.REFERENCE
        parts = StepParts(maker, selector, stopper, guard, caps.needs_logits,
                          sel_caps.proposes_after_select)
        # editing policies: the per-row post-step state (``samplers.editing``)
        tracker = (EditTracker(b, device, sel_caps.max_post_steps) if sel_caps.edits
                   else None)
        edit_log: list[Tensor] = []  # [B, G] per step, stacked at the end
        fuse = None if tracker is not None else span_selector(
            selector, stopper, truncator, caps, on_step=on_step, debug=self.debug,
            compile=self.compile)
        run_step = self._step_function(caps, cfg, device)

        memory = init_memory_of(selector, b, length, device)
        pos_idx = torch.arange(length, device=device)
        lo = 0 if cfg.allow_prompt_masks else p
        full_span = caps.full_span  # a stopper, or any part that declares it
        # cross-block selectors (ETE) may commit up to ``lookahead`` positions past the block,
        # but only in rows whose current block still has a mask: rows of a batch walk blocks
        # together, and a row that finished its block early waits (inactive, no NFE) for the
        # batch to move on, as it would have moved on alone. Working ahead instead would decode
        # the next block against the current block's cache refresh and a lookahead window
        # cut at the current block's end, so its tokens would depend on its batch neighbours.
        lookahead = sel_caps.lookahead
        # [B] rows that took part in each forward (the step's own and any extra ones); NFE is
        # their sum after the loop
        took_part: list[Tensor] = []
        step_model = StepModelView(model, plan, maker, took_part, b, enabled=not cfg_on)
        lengths = torch.full((b,), g, dtype=torch.long, device=device)
        # per-generation records, written in place at commits (one op each per step); bits
        # and commit steps are derived from them after the loop
        commit_at = torch.full((b, length), -1, dtype=torch.long, device=device)
        commit_prob = torch.ones(b, length, dtype=torch.float64, device=device)
        spans = SpanMasks(b, length, device)
        refreshed: list[Tensor] = []  # [B] per step, stacked at the end (no sync)
        step_forwards: list[int] = []  # host counters: model calls per step
        step = forwards = 0
        total_steps = sum(block_steps) if block_steps else g
        graphed = graph_run(self, plan, parts, memory, canvas, caps, cfg, bound, on_step, p,
                            total_steps)
        if graphed is not None:  # the step runs on static buffers (samplers.graph)
            maker.masked_only, fuse = False, None
            canvas, commit_at, commit_prob = graphed.canvas, graphed.commit_at, \
                graphed.commit_prob
            lengths = graphed.lengths

        if cfg.separate_prefill:  # the prompt's complete blocks in a forward of their own
            n_pre = plan.prefill(torch.cat([canvas, canvas.masked_fill(prompt_index, mask_id)])
                                 if cfg_on else canvas, *layout[0])
            forwards += n_pre
            took_part += [torch.ones(b, dtype=torch.bool, device=device)] * n_pre
        no_edit = torch.zeros(b, g, dtype=torch.bool, device=device)
        no_budget = torch.zeros(b, dtype=torch.long, device=device)
        for blk, (bs, be, aligned) in enumerate(layout):
            steps_per_block = block_steps[blk] if block_steps else None
            # the commit phase's steps, then (editing) at most ``max_post_steps`` post steps
            n_commit = steps_per_block or cfg.max_steps_per_block or (be - lo)
            n_iter = n_commit + (sel_caps.max_post_steps if tracker is not None else 0)
            times = sch.dream_times(n_commit, cfg.eps, device) if schedule == "dream" else None
            fractions = None if times is None else sch.dream_fractions(times)
            # LLaDA: the block's whole budget schedule [B] x S (and budget > 0), once per block
            budgets = positive = None
            if steps_per_block and schedule != "dream":
                schedule_t = sch.llada_budgets((canvas[:, bs:be] == mask_id).sum(1), n_commit)
                budgets, positive = schedule_t.unbind(1), (schedule_t > 0).unbind(1)
            guard.start_block()
            if tracker is not None:
                tracker.start_block((canvas[:, bs:be] == mask_id).any(1))
            for i in range(n_iter):
                masked = canvas == mask_id
                model_canvas = canvas
                if cfg_on:
                    model_canvas = torch.cat([canvas, canvas.masked_fill(prompt_index, mask_id)])
                need = plan.prepare(model_canvas, i, lo,
                                    final=bool(steps_per_block) and i == n_iter - 1)
                # the one host sync per step: is anything still masked in this block? (plus
                # the integers the plan needs to shape its forward, and the contract's flag)
                flags = guard.flags()
                # editing: the rows still in a post step (``EditTracker.begin_step``)
                extra = ([] if tracker is None
                         else [tracker.begin_step(masked[:, bs:be].any(1))])
                f64 = torch.float64  # one dtype for the stack (the guard's flags are float64)
                counts = torch.stack([masked[:, bs:be].sum(dtype=f64), masked.sum(dtype=f64),
                                      *flags, *extra])
                synced = (counts if need is None else torch.cat([counts, need])).tolist()
                guard.raise_if(synced[2:2 + len(flags)])
                n_left, n_masked = int(synced[0]), int(synced[1])
                n_edit = int(synced[2 + len(flags)]) if extra else 0
                host = [int(v) for v in synced[2 + len(flags) + len(extra):]]
                if n_left == 0 and not n_edit and not (
                        cfg.exact_steps and steps_per_block and i < n_commit):
                    break
                reach = min(be + lookahead, length)
                budget = None
                if i >= n_commit and (budgets is not None or steps_per_block):
                    budget = no_budget  # a post step: nothing scheduled
                elif budgets is not None:
                    budget = budgets[i]
                elif steps_per_block:
                    budget = sch.dream_budget(masked, times, i, n_commit, fractions)
                if graphed is not None:  # the same step on static buffers, maybe replayed
                    canvas, commit_prob, active, full = graphed.step(
                        canvas, commit_prob, block=blk, bounds=(bs, be), aligned=aligned,
                        step_in_block=i, lo=lo, full_span=full_span, step=step,
                        progress=step / max(total_steps - 1, 1), budget=budget,
                        times=(times[i], times[i + 1]) if times is not None else None,
                        n_masked=n_masked, last=i == n_commit - 1,
                        steps_left=(n_commit - i) if steps_per_block or times is not None
                        else None, force_end=i == n_commit - 1 and lo == p,
                        stall_limit=min(n_commit, be - bs))
                    forwards += 1
                    step_forwards.append(1)
                    refreshed.append(spans.flag(full))
                    took_part.append(active)
                    if cfg.stop_at_eos and model.eos_token_ids:
                        canvas = fill_after_eos(canvas, mask_id, model.eos_token_ids, p, fill_id)
                    step += 1
                    continue
                fed = plan.forward(model_canvas, (bs, reach), aligned, i, lo, full_span,
                                   host=host)
                forwards += fed.calls
                logits = fed.logits
                if cfg_on:
                    cond, uncond = logits.chunk(2)
                    logits = uncond + (cfg.cfg_scale + 1) * (cond - uncond)
                rows = fed.rows if fed.rows.dim() == 1 else fed.rows[:b]
                live = None if fed.live is None else fed.live[:b]
                if fed.span is not None and live is None:  # contiguous rows: cached masks
                    fresh = spans.get(*fed.span)
                    eligible = masked & spans.get(fed.span[0], min(fed.span[1], reach))
                else:
                    fresh = fed.fresh_mask(b, length)
                    eligible = masked & fresh & spans.get(0, reach)
                if lookahead:  # batch invariance: a row whose block is complete waits
                    eligible = eligible & masked[:, bs:be].any(1, keepdim=True)
                has_eligible = active = eligible.any(1)
                editable = None
                if tracker is not None:  # rows in a post step still take part (and count)
                    active = active | tracker.post
                    editable = tracker.editable(masked, fresh, spans.get(max(bs, p), be))
                step_model.begin(model_canvas, active)
                # the contract's per-step inputs (samplers.contract; see post_forward)
                # masked fed rows, known on the host when the rows end with the block (no mask
                # before it): lets the proposal skip counting them (``masked_rows``)
                in_rows = n_left if reach == be and not full_span and lo == p else None
                expected = expected_rows(has_eligible, budget,
                                         None if positive is None or i >= n_commit
                                         else positive[i])
                stall_limit = min(n_commit, be - bs)
                step_refreshed = (spans.flag(fed.refresh) if fed.refreshed is None
                                  else fed.refreshed[:b])
                state = commit = None
                if fuse is not None and i < n_iter - 1 and fused_step(
                        fuse, maker, guard, fed, logits, rows, masked, eligible, budget, expected,
                        canvas, commit_at, commit_prob, step, n_masked, in_rows, stall_limit):
                    step_forwards.append(1)  # (samplers.fused) canvas and records in place
                else:
                    info = dict(
                        step=step, block=blk, block_start=bs, block_end=be, gen_start=p,
                        block_step=i,
                        steps_left=max(n_commit - i, 1) if steps_per_block or times is not None
                        else None,
                        progress=step_progress(step / max(total_steps - 1, 1), self.compile,
                                               device),
                        generator=gen, forward_start=fed.fed_start, forward_width=fed.fed_width,
                        times=(times[i], times[i + 1]) if times is not None and i < n_commit
                        else None,
                        memory=memory, extras={"n_masked": n_masked, "lengths": lengths,
                                               "refresh": fed.refresh,
                                               "total_steps": total_steps},
                        model=step_model, refreshed=step_refreshed)
                    ctl = dict(n_masked=n_masked, in_rows=in_rows, expected=expected,
                               last=i == n_commit - 1, stall_limit=stall_limit,
                               force_end=spans.get(bs, be) if i == n_commit - 1 and lo == p
                               else None, editable=editable, mask_id=mask_id)
                    out = run_step(parts, fed, logits, rows, live, canvas, masked, fresh,
                                   eligible, budget, commit_at, commit_prob, info, ctl)
                    state, commit, canvas, commit_prob = out.state, out.commit, out.canvas, \
                        out.commit_prob
                    if tracker is not None:
                        tracker.end_step(out.edit)
                        edit_log.append(no_edit if out.edit is None else out.edit[:, p:])
                    commit_at = out.commit_at  # a new tensor under compile
                    forwards += step_model.calls
                    if self.debug:
                        check_commit(state, out.selected,
                                     allow_empty=sel_caps.may_commit_nothing)
                    step_forwards.append(fed.calls + step_model.calls)
                    if truncator is not None:
                        new_len = truncator.truncate(state, commit).clamp(max=g)
                        lengths = torch.minimum(lengths, new_len)
                        dead = pos_idx[None] >= (p + lengths)[:, None]
                        canvas = torch.where(dead, fill_id, canvas)  # the row ends at its EOS
                        plan.restrict(torch.cat([~dead, ~dead]) if cfg_on else ~dead)
                refreshed.append(step_refreshed)
                took_part.append(active)
                if cfg.stop_at_eos and model.eos_token_ids:
                    canvas = fill_after_eos(canvas, mask_id, model.eos_token_ids, p, fill_id,
                                            committed_at=step if cfg.eos_stop_on_commit
                                            else None, commit_at=commit_at)
                if on_step is not None:  # never with the fused step (``span_selector``)
                    on_step(state, commit)
                step += 1
            if cfg.block_eos_stop and model.eos_token_ids:  # rows with an EOS end here
                canvas = end_rows_at_eos(canvas, mask_id, model.eos_token_ids, p, be, fill_id,
                                         getattr(model, "block_size", None)
                                         if cfg.eos_skip_block_start else None)
        guard.finish(canvas[:, p:], mask_id, check_masks=lo == p)  # one sync after the loop
        if graphed is not None:  # the buffers are the next generation's
            canvas, lengths = canvas.clone(), lengths.clone()
        nfe = (torch.stack(took_part, 1).sum(1) if took_part
               else torch.zeros(b, dtype=torch.long, device=device))
        bits_t = bits_per_step(commit_at, commit_prob, step)
        refreshed_t = (torch.stack(refreshed, 1) if refreshed
                       else torch.zeros(b, 0, dtype=torch.bool, device=device))
        edits = None
        if tracker is not None:
            edits = (torch.stack(edit_log, 1) if edit_log
                     else torch.zeros(b, 0, g, dtype=torch.bool, device=device))
        if g != g_out:  # decode_block_padding: the padding positions are cut
            canvas, commit_at = canvas[:, :p + g_out], commit_at[:, :p + g_out]
            lengths, edits = lengths.clamp(max=g_out), None if edits is None else edits[..., :g_out]
        return Generation(tokens=canvas, nfe=nfe, forwards=forwards, steps=step, prompt_length=p,
                          commit_step=commit_at[:, p:].clone(), bits=bits_t, lengths=lengths,
                          refreshed=refreshed_t, step_forwards=step_forwards, edits=edits)

    def _step_function(self, caps: Capabilities, cfg: SamplerConfig,
                       device: torch.device) -> Callable[..., Any]:
        """``post_forward``, compiled when ``compile=True`` (once per sampler and device)."""
        if not self.compile:
            return post_forward
        sel = caps.selector
        if sel.extra_forwards or (cfg.temperature > 0 and cfg.rng == "reference") or \
                sel.proposes_after_select:
            raise ValueError(f"compile=True does not support policy {self.policy.name!r} with "
                             "these settings (extra forwards, or rng='reference' sampling with "
                             "data-dependent shapes); use compile=False")
        if self._compiled is None or self._compiled[0] != device.type:
            backend = "inductor" if self.compile is True else str(self.compile)
            self._compiled = (device.type, compile_step(device, backend))
        return self._compiled[1]


def _bind(component: Any, model: Any, cfg: SamplerConfig) -> Any:
    bind = getattr(component, "bind", None)
    return component if bind is None else bind(model, cfg)
