"""The per-generation setup of a mask-token generation (``samplers.mask_run.MaskRun``).

``MaskSetup`` builds, once per ``generate`` call, what the per-block and per-step parts of
``MaskRun`` read: the sizes and the starting canvas ``[prompt | mask * G]``, the schedule and
block layout, the cache plan (``cache.table.make_plan``), the step parts (proposal maker,
contract guard, ``StepParts``, editing tracker, fused selector), the policy memory and the
per-generation records, the static-buffer step where it applies (``samplers.graph``), and the
``separate_prefill`` forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.table import make_plan
from dllm_decode.config import SamplerConfig
from dllm_decode.policies.base import init_memory_of
from dllm_decode.samplers import schedule as sch
from dllm_decode.samplers.contract import StepGuard
from dllm_decode.samplers.editing import EditTracker
from dllm_decode.samplers.fused import span_selector
from dllm_decode.samplers.graph import graph_run
from dllm_decode.samplers.proposals import ProposalMaker, reference_loop_of
from dllm_decode.samplers.step import SpanMasks, StepModelView, StepParts
from dllm_decode.types import CacheMode, Impl


class MaskSetup:
    """The setup half of ``MaskRun``: everything built before the first block.

    Args:
        sampler: the ``DiffusionSampler`` (its model, policy, ``debug`` / ``compile`` /
            ``graphs`` settings and step graphs).
        cfg: the call's ``SamplerConfig``; caps: the bound parts' ``PolicyCapabilities``;
        bound: the bound ``(selector, stopper, truncator)``.
        prompt, valid_prompt: ``[B, P]`` checked prompt and its validity (False = padding).
        on_step: the optional per-step callback.
        step_function: ``post_forward``, compiled or not.
    """

    def __init__(self, sampler: Any, cfg: SamplerConfig, caps: Any, bound: tuple[Any, ...],
                 prompt: Tensor, valid_prompt: Tensor, on_step: Callable[..., None] | None,
                 step_function: Callable[..., Any]) -> None:
        model = sampler.model
        self.model, self.cfg, self.on_step, self.run_step = model, cfg, on_step, step_function
        self.debug, self.compile = sampler.debug, sampler.compile
        self.sel_caps, self.truncator = caps.selector, bound[2]
        canvas, valid, positions = self._canvas(prompt, valid_prompt)
        self._blocks()
        self.plan = self._plan(sampler, valid, positions)
        self._step_parts(sampler, caps, bound)
        self._records(caps)
        self.canvas = canvas
        graphed = self.graphed = graph_run(sampler, self.plan, self.parts, self.memory, canvas,
                                           caps, cfg, bound, on_step, self.p, self.total_steps)
        if graphed is not None:  # the step runs on static buffers (samplers.graph)
            self.maker.masked_only, self.fuse = False, None
            self.canvas, self.commit_at, self.commit_prob = graphed.canvas, \
                graphed.commit_at, graphed.commit_prob
            self.lengths = graphed.lengths
        if cfg.separate_prefill:  # the prompt's complete blocks in a forward of their own
            self._prefill()
        self.no_edit = torch.zeros(self.b, self.g, dtype=torch.bool, device=self.device)
        self.no_budget = torch.zeros(self.b, dtype=torch.long, device=self.device)

    def _canvas(self, prompt: Tensor, valid_prompt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sizes, token ids and the starting canvas ``[B, L]`` (``[prompt | mask * G]``), its
        key validity ``[B, L]`` and RoPE positions ``[B, L]``."""
        model, cfg = self.model, self.cfg
        b, p = prompt.shape
        # the decoded span: G, or (``decode_block_padding``, LLaDA2's quirk) up to a block end
        g, self.g_out = sch.padded_gen_length(model, cfg, p), cfg.gen_length
        length = p + g
        self.b, self.p, self.g, self.length = b, p, g, length
        device = self.device = prompt.device
        mask_id = self.mask_id = model.mask_token_id
        self.fill_id = model.eos_token_ids[0] if model.eos_token_ids else mask_id
        # [E] EOS ids on the device, made once (``fill_after_eos`` / ``end_rows_at_eos``)
        self.eos_ids = (torch.tensor(model.eos_token_ids, device=device)
                        if model.eos_token_ids else None)
        canvas = torch.cat([prompt, torch.full((b, g), mask_id, device=device)], dim=1)
        valid = torch.cat([valid_prompt, torch.ones(b, g, dtype=torch.bool, device=device)], 1)
        positions = model.rope_positions(valid)
        self.gen = torch.Generator(device=device).manual_seed(cfg.seed or 0)  # per batch
        self.prompt_index = (canvas != mask_id) & (torch.arange(length, device=device) < p)
        return canvas, valid, positions

    def _blocks(self) -> None:
        """The schedule (LLaDA budgets or Dream's time grid), the block layout and the steps
        of each block."""
        model, cfg, sel_caps = self.model, self.cfg, self.sel_caps
        family = self.family = getattr(model, "family", "")
        self.schedule = cfg.schedule or sel_caps.preferred_schedule or (
            "dream" if family == "dream" else "llada")
        self.layout = sch.decode_layout(model, cfg, self.p, self.length)
        self.n_blocks = len(self.layout)
        self.block_steps = sch.steps_per_block(model, cfg, self.layout, sel_caps)
        self.total_steps = sum(self.block_steps) if self.block_steps else self.g

    def _plan(self, sampler: Any, valid: Tensor, positions: Tensor) -> Any:
        """The cache plan (``cache.table.make_plan``) over the model's batch (doubled under
        CFG), reusing the static buffers' K/V where there are some."""
        model, cfg, sel_caps = self.model, self.cfg, self.sel_caps
        cfg_on = self.cfg_on = cfg.cfg_scale > 0
        model_valid = torch.cat([valid, valid]) if cfg_on else valid
        model_pos = torch.cat([positions, positions]) if cfg_on else positions
        causal = cfg.causal_prefix
        if causal is None:  # the policy's preference, where it applies
            causal = sel_caps.causal_prefix and model.attention == "block_causal"
        graphs = sampler.step_graphs
        plan = make_plan(model, cfg.cache, model_valid, model_pos,
                         replace(cfg, causal_prefix=causal), self.family,
                         cache=graphs and graphs.cache_for(
                             cfg.cache, model_valid.shape, self.device),  # graphs' K/V
                         sub_block=sel_caps.sub_block_size)
        plan.draft_causal = sel_caps.draft_causal  # S2D2 draft_ver
        return plan

    def _step_parts(self, sampler: Any, caps: Any, bound: tuple[Any, ...]) -> None:
        """The proposal maker (only the fields the parts read), the contract's guard, the
        ``StepParts`` of ``post_forward``, the editing tracker and the fused step's selector."""
        cfg, sel_caps, on_step = self.cfg, self.sel_caps, self.on_step
        selector, stopper, truncator = bound
        maker = self.maker = ProposalMaker(self.model, cfg, self.family, self.gen)
        maker.after_select = sel_caps.proposes_after_select
        maker.greedy = sel_caps.samples_tokens
        # the reference loop whose draw quirks rng='reference' reproduces (Fast-dLLM's)
        maker.reference_loop = reference_loop_of(selector)
        # only the proposal fields the parts read (every field for parts that do not declare
        # them, and for an ``on_step`` callback, which may read anything)
        maker.fields = caps.proposal_fields if on_step is None else None
        # masked-only parts: greedy reference proposals may skip the unmasked rows (on the CPU,
        # eager; ``ProposalMaker.masked_rows``)
        maker.masked_only = (caps.masked_only and on_step is None and not self.compile
                             and maker.impl is Impl.REFERENCE and cfg.temperature == 0
                             and not cfg.confidence_eos_eot_inf
                             and not sel_caps.proposes_after_select)
        guard = self.guard = StepGuard(self.b, self.device, sampler.policy.name,
                                       exempt_stall=sel_caps.may_commit_nothing,
                                       budgeted=sel_caps.budgeted
                                       and not sel_caps.at_least_budget,
                                       remasks=sel_caps.remasks)
        if self.compile:  # the compiler fuses the torch reference itself
            maker.impl = Impl.REFERENCE
        self.parts = StepParts(maker, selector, stopper, guard, caps.needs_logits,
                               sel_caps.proposes_after_select,
                               selector.fuse_logits if sel_caps.fuses_logits else None)
        # editing policies: the per-row post-step state (``samplers.editing``)
        self.tracker = (EditTracker(self.b, self.device, sel_caps.max_post_steps)
                        if sel_caps.edits else None)
        self.edit_log: list[Tensor] = []  # [B, G] per step, stacked at the end
        self.fuse = None if self.tracker is not None else span_selector(
            selector, stopper, truncator, caps, on_step=on_step, debug=self.debug,
            compile=self.compile, reference_order=cfg.rng == "reference")

    def _records(self, caps: Any) -> None:
        """The policy memory and the per-generation records the steps write in place."""
        b, length, device = self.b, self.length, self.device
        self.memory = init_memory_of(self.parts.selector, b, length, device)
        self.pos_idx = torch.arange(length, device=device)
        self.lo = 0 if self.cfg.allow_prompt_masks else self.p
        # ``Capabilities.attention_maps`` (DAWN): the step's maps, captured in its forward
        self.attention: Tensor | None = None
        self.maps = self.sel_caps.attention_maps
        if self.maps and (self.cfg.cache is not CacheMode.NONE or not callable(
                getattr(self.model, "capture_attention", None))):
            raise ValueError(f"policy {self.guard.policy!r} reads the model's attention maps "
                             "(Capabilities.attention_maps): it needs cache='none' (got "
                             f"{self.cfg.cache.value!r}) and a model that can materialise them "
                             f"(DecoderLM; {type(self.model).__name__} cannot)")
        # ``Capabilities.soft_inputs`` (ReMix): the selector rewrites the fed embeddings
        self.soft = self.sel_caps.soft_inputs
        if self.soft and (self.cfg.cache is not CacheMode.NONE or self.cfg_on or not callable(
                getattr(self.model, "feed_embeddings", None)) or not callable(
                getattr(self.parts.selector, "mix_inputs", None))):
            raise ValueError(f"policy {self.guard.policy!r} feeds soft input embeddings "
                             "(Capabilities.soft_inputs): it needs cache='none' (got "
                             f"{self.cfg.cache.value!r}), no CFG and a model whose input "
                             f"embeddings it can replace (DecoderLM; "
                             f"{type(self.model).__name__})")
        self.full_span = caps.full_span  # a stopper, or any part that declares it
        # cross-block selectors (ETE) may commit up to ``lookahead`` positions past the block,
        # but only in rows whose current block still has a mask: rows of a batch walk blocks
        # together, and a row that finished its block early waits (inactive, no NFE) for the
        # batch to move on, as it would have moved on alone. Working ahead instead would decode
        # the next block against the current block's cache refresh and a lookahead window
        # cut at the current block's end, so its tokens would depend on its batch neighbours.
        self.lookahead = self.sel_caps.lookahead
        # [B] rows that took part in each forward (the step's own and any extra ones); NFE is
        # their sum after the loop
        self.took_part: list[Tensor] = []
        self.step_model = StepModelView(self.model, self.plan, self.maker, self.took_part, b,
                                        enabled=not self.cfg_on)
        self.lengths = torch.full((b,), self.g, dtype=torch.long, device=device)
        # per-generation records, written in place at commits (one op each per step); bits
        # and commit steps are derived from them after the loop
        self.commit_at = torch.full((b, length), -1, dtype=torch.long, device=device)
        self.commit_prob = torch.ones(b, length, dtype=torch.float64, device=device)
        self.spans = SpanMasks(b, length, device)
        self.refreshed: list[Tensor] = []  # [B] per step, stacked at the end (no sync)
        self.step_forwards: list[int] = []  # host counters: model calls per step
        self.step_positions: list[float] = []  # token positions per row run per step
        self.prefill_positions = 0.0  # token positions per row of ``separate_prefill``
        self.step = self.forwards = 0

    def _prefill(self) -> None:
        """``separate_prefill``: the prompt's complete blocks in a forward of their own."""
        now = self.canvas
        n_pre = self.plan.prefill(torch.cat([now, now.masked_fill(self.prompt_index,
                                                                  self.mask_id)])
                                  if self.cfg_on else now, *self.layout[0])
        self.forwards += n_pre
        self.prefill_positions = float(n_pre * self.layout[0][2])
        self.took_part += [torch.ones(self.b, dtype=torch.bool, device=self.device)] * n_pre
