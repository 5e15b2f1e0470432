"""The uniform noise kind's part of the one decode loop (``samplers.loop``): ``UniformRun``.

``DiffusionSampler.generate`` runs ``samplers.loop.decode_loop`` over a ``UniformRun`` for
models with ``noise_kind == "uniform"`` (DiffusionGemma): the same blocks -> steps -> forward ->
propose -> ``StepState`` -> select -> stop -> commit loop as for mask models, with the same
policy protocols (``select(state)``, ``should_stop(state)``, declared ``Capabilities``); what
the noise kind defines is what a block, eligibility and a commit mean (``policies.renoise``):

* a **block** is one canvas of ``model.canvas_length`` tokens; at its start the
  encoder-decoder cache plan (``cache.canvas.CanvasPlan``) appends the prompt (first canvas)
  or the previous finished canvas to the model's K/V cache; the canvas starts as
  ``randint(0, V)``;
* a **step**: the plan's decoder forward, self-conditioned on the previous step's tempered
  logits (state the plan carries); proposal = a sample from ``softmax(logits / t)`` (``t``
  from the ``Renoise`` schedule) with its probability, entropy, margins and the argmax;
  **eligible** = the canvas's pending positions (not yet accepted for good: the whole canvas
  in the reference, which re-decides every step; ``sticky``: not yet accepted); the selector's
  accepted positions are committed with their sample and every other position is re-noised
  with a fresh random token (re-noising a position accepted earlier is an edit, declared by
  ``Renoise``'s ``Capabilities(edits=True)`` and recorded in ``Generation.edits``);
* **termination**: a canvas ends when the stopper fires for every row (rows that stop
  earlier are frozen, as the reference freezes them), when every position is accepted
  (``sticky``), or at the step budget; it then takes the last step's argmax (``sticky``:
  accepted tokens stay). Rows whose canvas holds an EOS are finished: later positions become
  ``pad_token_id``, and decoding stops once every row is finished.

Random draws follow the reference (transformers 5.24 ``DiffusionGemmaGenerationMixin``), from
one ``torch.Generator`` seeded with ``seed`` on the model's device: per canvas one
``randint(0, V, [B, C])``; per step one ``multinomial`` over the ``[B * C, V]`` float32
probabilities, then one ``randint(0, V, [B, C])`` for re-noising (drawn in full). NFE per row
counts the decoder forwards while the row is neither stopped in its canvas nor finished; the
encoder's cache fills are not counted (as in the reference).

Host syncs: one per step with a stopper or ``sticky`` ("is every row's canvas decided?",
which also reads the contract flags; the loop's ``sync`` reads it before the next step), and
one at each canvas's end ("is every row finished?", the EOS check, with the contract flags).
The contract (``samplers.contract`` error classes): non-finite logits (recorded per row,
sampled uniformly meanwhile so that ``multinomial`` never sees NaN) and accepted positions
outside ``eligible`` raise at the next sync, naming the rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.canvas import CanvasPlan
from dllm_decode.config import SamplerConfig
from dllm_decode.policies.capabilities import policy_capabilities
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.renoise import Renoise, reference_entropy
from dllm_decode.samplers.contract import NonFiniteLogitsError, PolicyContractError
from dllm_decode.samplers.step import bits_per_step
from dllm_decode.types import Generation, Proposal, StepState


def uniform_policy(policy: Policy, model: Any) -> Policy:
    """A uniform-noise model's policy: ``Renoise`` as is, or an acceptance rule that declares
    ``noise_kinds`` ``"uniform"`` (``eb``, ``threshold``, ...) wrapped in ``Renoise`` with the
    model's step budget and temperature schedule. Anything else is a ``ValueError``."""
    sel = policy.selector
    if policy.truncator is not None:
        raise ValueError(f"policy {policy.name!r} has a truncator; uniform-noise decoding "
                         "ends rows at their EOS itself and takes no truncator")
    if isinstance(sel, Renoise):
        return policy
    caps = policy_capabilities(sel)
    if "uniform" not in caps.noise_kinds or caps.selector.budgeted:
        raise ValueError(f"policy {policy.name!r} is a masked-decoding policy ("
                         f"{type(sel).__name__} needs a mask token or a per-step budget); this "
                         f"model ({getattr(model, 'family', type(model).__name__)}) is a "
                         "uniform-noise model without a mask token: use 'gemma_renoise', or an "
                         "acceptance rule that works on a random-token canvas: 'eb', "
                         "'threshold', 'entropy_threshold'")
    return Policy(selector=Renoise(accept=sel), stopper=policy.stopper, name=policy.name)


def check_uniform_config(model: Any, cfg: SamplerConfig) -> tuple[int, int, int]:
    """-> (canvas length C, canvases, steps per canvas or 0 for the policy's). ``ValueError``
    for settings that have no meaning on a uniform-noise model."""
    c = int(model.canvas_length)
    if cfg.block_length not in (None, c):
        raise ValueError(f"block_length must be None or the model's canvas_length ({c}) for a "
                         f"uniform-noise model, got {cfg.block_length}")
    if cfg.temperature != 0:
        raise ValueError("temperature is not used on a uniform-noise model: its sampling "
                         "temperature follows the policy's schedule (Renoise t_min / t_max)")
    bad = [name for name, on in (("cache", cfg.cache.value != "none"),
                                 ("cfg_scale", cfg.cfg_scale > 0),
                                 ("allow_prompt_masks", cfg.allow_prompt_masks),
                                 ("exact_steps", cfg.exact_steps),
                                 ("logits_eos_inf", cfg.logits_eos_inf),
                                 ("separate_prefill", cfg.separate_prefill),
                                 ("decode_block_padding", cfg.decode_block_padding),
                                 ("block_eos_stop", cfg.block_eos_stop),
                                 ("eos_stop_on_commit", cfg.eos_stop_on_commit)) if on]
    if bad:
        raise ValueError(f"{bad} do not apply to a uniform-noise model (it always caches the "
                         "encoded prefix, decodes each canvas in full and ends a row at its "
                         "EOS itself); leave them unset")
    n = math.ceil(cfg.gen_length / c)
    if cfg.steps is not None and cfg.steps % n:
        raise ValueError(f"steps ({cfg.steps}) is the total over {n} canvases of {c} tokens and "
                         f"must be a multiple of {n}; or leave it unset (the policy's budget)")
    return c, n, (cfg.steps // n if cfg.steps else 0)


def _proposal(proc: Tensor, probs: Tensor, sample: Tensor, argmax: Tensor) -> Proposal:
    """Proposal fields ``[B, C]`` of the tempered logits ``proc [B, C, V]`` and their float32
    probabilities ``probs`` (the sample's distribution)."""
    top2 = probs.topk(2, dim=-1).values
    ltop2 = proc.topk(2, dim=-1).values
    return Proposal(tokens=sample, prob=probs.gather(-1, sample[..., None])[..., 0],
                    margin=top2[..., 0] - top2[..., 1], logit_margin=ltop2[..., 0] - ltop2[..., 1],
                    neg_entropy=-reference_entropy(proc), argmax=argmax)


def _widen(prop: Proposal, canvas: Tensor, bs: int) -> Proposal:
    """Canvas-span proposal ``[B, C]`` -> ``[B, L]`` (prompt / other canvases: their token,
    probability 1, zero scores)."""
    def put(x: Tensor, fill: Tensor) -> Tensor:
        out = fill.clone()
        out[:, bs:bs + x.shape[1]] = x
        return out

    zeros = torch.zeros(canvas.shape, dtype=torch.float32, device=canvas.device)
    return Proposal(tokens=put(prop.tokens, canvas), prob=put(prop.prob, zeros + 1),
                    margin=put(prop.margin, zeros), logit_margin=put(prop.logit_margin, zeros),
                    neg_entropy=put(prop.neg_entropy, zeros), argmax=put(prop.argmax, canvas))


def _raise_if(flags: list, nonfinite: Tensor, outside: Tensor, step: int, name: str) -> None:
    """The contract, read at a sync: non-finite logits, acceptance outside ``eligible``."""
    if flags[1]:
        raise NonFiniteLogitsError(
            f"the model returned non-finite logits (NaN, +inf, or all -inf at a position) by "
            f"step {step} in rows {nonfinite.nonzero().flatten().tolist()}; check the checkpoint "
            "(load_model(..., check_finite=True)) and the dtype (fp16 overflow)")
    if flags[2]:
        raise PolicyContractError(
            f"policy {name!r} accepted positions that were not eligible (outside the canvas, or "
            f"already accepted with sticky=True) by step {step} in rows "
            f"{outside.nonzero().flatten().tolist()}; select() must return a subset of "
            "state.eligible")


class UniformRun:
    """One generation of a uniform-noise model (``samplers.loop.DecodeRun``): decode
    ``cfg.gen_length`` tokens after ``prompt [B, P]`` (``valid [B, P]``, False = left padding)
    with a bound ``Renoise`` selector and an optional bound stopper.

    ``finish`` returns a ``Generation``: ``tokens [B, P + G]`` (positions of canvases never
    decoded, and everything after a row's first EOS, hold ``pad_token_id``), per-row NFE,
    ``commit_step`` = the step each position was first accepted at (-1: only the final argmax
    set it), ``edits [B, steps, G]`` = accepted positions each step rewrote (re-noised or
    re-sampled to another token; ``None`` with ``sticky``, which never rewrites)."""

    def __init__(self, model: Any, selector: Renoise, stopper: Any, prompt: Tensor,
                 valid: Tensor, cfg: SamplerConfig, name: str,
                 on_step: Callable[[StepState, Tensor], None] | None = None) -> None:
        c, self.n_blocks, budget = check_uniform_config(model, cfg)
        self.selector, self.stopper, self.name, self.on_step = selector, stopper, name, on_step
        self.steps = budget or int(selector.max_denoising_steps)
        self.temperatures = selector.temperatures(self.steps, prompt.device)  # [steps]
        b, p = prompt.shape
        self.b, self.p, self.c, self.g = b, p, c, cfg.gen_length
        length = self.length = p + self.n_blocks * c
        device = self.device = prompt.device
        self.v = int(model.vocab_size)
        pad = self.pad = (model.pad_token_id if model.pad_token_id is not None
                          else model.eos_token_ids[0])
        eos_ids = model.eos_token_ids if selector.eos_token_ids is None else selector.eos_token_ids
        self.eos = torch.tensor(tuple(eos_ids or ()), dtype=torch.long, device=device)  # [E]
        self.gen = torch.Generator(device=device).manual_seed(cfg.seed or 0)
        self.plan = CanvasPlan(model, prompt, valid, length)

        self.tokens = torch.cat([prompt, torch.full((b, self.n_blocks * c), pad,
                                                    device=device)], 1)
        self.commit_at = torch.full((b, length), -1, dtype=torch.long, device=device)
        self.commit_prob = torch.ones(b, length, dtype=torch.float64, device=device)
        self.finished_seq = torch.zeros(b, dtype=torch.bool, device=device)
        self.nfe = torch.zeros(b, dtype=torch.long, device=device)
        self.outside = torch.zeros(b, dtype=torch.bool, device=device)  # accepted, ineligible
        self.nonfinite = torch.zeros(b, dtype=torch.bool, device=device)
        self.step = self.forwards = 0
        self.edits: list[Tensor] = []  # [B, C] per step: accepted positions rewritten
        self.canvas_of: list[int] = []  # the canvas index of each step
        # the host sync after every step (else only after a canvas's last one)
        self.sync_every = stopper is not None or selector.sticky
        self.final: Tensor | None = None  # the previous canvas's tokens [B, C]

    # ---- per block: one canvas ----

    def start_block(self, k: int) -> int:
        """Canvas ``k``: the cache plan's block action (encode the prompt or the previous
        canvas), then the canvas ``randint(0, V)`` and its per-canvas state. Returns the step
        budget."""
        b, c, device = self.b, self.c, self.device
        self.plan.start_block(k, self.final)
        self.k, self.bs, self.be = k, self.p + k * c, self.p + (k + 1) * c
        self.canvas = torch.randint(0, self.v, (b, c), generator=self.gen, device=device)
        self.argmax = self.canvas
        self.prev_argmax = torch.full_like(self.canvas, -1)
        self.unchanged = torch.zeros(b, dtype=torch.long, device=device)
        self.stopped = torch.zeros(b, dtype=torch.bool, device=device)
        # the pending set (eligible): not yet accepted for good (only ``sticky`` removes any)
        self.pending = torch.ones(b, c, dtype=torch.bool, device=device)
        self.accepted_once = torch.zeros(b, c, dtype=torch.bool, device=device)
        self.span_mask = torch.zeros(b, self.length, dtype=torch.bool, device=device)
        self.span_mask[:, self.bs:self.be] = True
        return self.steps

    def end_block(self, k: int) -> bool:
        """The canvas's final tokens (the last argmax; ``sticky``: accepted tokens stay) and
        the EOS check: rows with an EOS are finished, every later position becomes pad; then
        one host sync for the EOS check and the contract. ``True`` when every row is finished
        or this was the last canvas."""
        sel, pad = self.selector, self.pad
        final = torch.where(self.pending, self.argmax, self.canvas) if sel.sticky else self.argmax
        final = torch.where(self.finished_seq[:, None], pad, final)
        is_eos = torch.isin(final, self.eos)
        run = is_eos.long().cumsum(1)
        final = torch.where((run > 0) & ~((run == 1) & is_eos), pad, final)
        self.tokens[:, self.bs:self.be] = final
        self.final = final
        self.finished_seq = self.finished_seq | is_eos.any(1)
        # the one sync per canvas: every row finished? (and the contract, as after a step)
        flags = torch.stack([self.finished_seq.all(), self.nonfinite.any(),
                             self.outside.any()]).tolist()
        _raise_if(flags, self.nonfinite, self.outside, self.step - 1, self.name)
        return k == self.n_blocks - 1 or bool(flags[0])

    # ---- per step ----

    def _check(self) -> bool:
        """The host sync after a step: is every row's canvas decided? (and the contract)"""
        flags = torch.stack([(self.stopped | self.finished_seq).all(), self.nonfinite.any(),
                             self.outside.any()]).tolist()
        _raise_if(flags, self.nonfinite, self.outside, self.step - 1, self.name)
        return bool(flags[0])

    def sync(self, i: int) -> bool:
        """The termination contract: step ``i`` runs unless every row stopped (or finished)
        at step ``i - 1`` (read with a stopper or ``sticky``; the step budget is the loop's
        cap)."""
        return i == 0 or not self.sync_every or not self._check()

    def forward(self, i: int) -> Tensor:
        """The decoder forward (self-conditioned, ``CanvasPlan``) -> ``[B, C, V]`` logits; a
        row counts in NFE while it is neither stopped in its canvas nor finished."""
        self.nfe += (~(self.stopped | self.finished_seq)).long()
        self.forwards += 1
        return self.plan.forward(self.canvas)

    def post(self, logits: Tensor, i: int) -> None:
        """Propose (a sample at the step's temperature) -> select (acceptance) -> commit
        (accepted positions take their sample) and re-noise every other position -> stop."""
        proc, sample, new_argmax, prop, temperature = self._propose(logits, i)
        state = self._state(prop, proc, new_argmax, temperature, i)
        chosen = self.selector.select(state)
        self.outside |= (chosen & ~state.eligible).any(1)
        self._commit(chosen[:, self.bs:self.be] & self.pending, sample, new_argmax, proc, prop)
        if self.selector.sticky:  # a row whose canvas is all accepted is done
            self.stopped = self.stopped | ~self.pending.any(1)
        if self.stopper is not None:
            self.stopped = self.stopped | self.stopper.should_stop(state)
        if self.on_step is not None:
            self.on_step(state, chosen)
        self.step += 1

    def _propose(self, logits: Tensor, i: int) -> tuple[Tensor, Tensor, Tensor, Proposal,
                                                          Tensor]:
        """``logits [B, C, V]`` -> the tempered logits ``[B, C, V]``, one sample per position
        (the step's ``multinomial``), the argmax, the ``Proposal`` ``[B, C]`` and the step's
        temperature."""
        b, c, v = self.b, self.c, self.v
        # non-finite rows are recorded (raised at the next sync) and sampled uniformly
        # meanwhile, so that torch's sampler never sees NaN
        bad = ~torch.isfinite(logits).all(-1) | torch.isneginf(logits).all(-1)  # [B, C]
        self.nonfinite |= bad.any(1)
        logits = torch.where(bad[..., None], 0.0, logits)
        temperature = self.temperatures[i]  # 0-d float32, no host copy
        proc = logits / temperature
        probs = torch.softmax(proc, dim=-1, dtype=torch.float32)
        sample = torch.multinomial(probs.view(-1, v), 1, generator=self.gen).view(b, c)
        argmax = proc.argmax(-1)
        return proc, sample, argmax, _proposal(proc, probs, sample, argmax), temperature

    def _state(self, prop: Proposal, proc: Tensor, argmax: Tensor, temperature: Tensor,
               i: int) -> StepState:
        """The step's ``StepState`` over the canvas ``[B, L]``: eligible = the pending
        positions of the canvas; editable = positions accepted at earlier steps (``None``
        with ``sticky``, which never rewrites)."""
        bs, be, steps = self.bs, self.be, self.steps
        full_canvas = self.tokens.clone()
        full_canvas[:, bs:be] = self.canvas
        eligible = self.span_mask.clone()
        eligible[:, bs:be] &= self.pending
        editable = None
        if not self.selector.sticky:
            editable = torch.zeros_like(eligible)
            editable[:, bs:be] = self.accepted_once
        same = (argmax == self.prev_argmax).all(1)
        return StepState(
            proposal=_widen(prop, full_canvas, bs), eligible=eligible, masked=eligible,
            editable=editable, block_step=i,
            fresh=self.span_mask, canvas=full_canvas, step=self.step, block=self.k,
            block_start=bs, block_end=be, gen_start=self.p, steps_left=steps - i, budget=None,
            progress=i / max(steps - 1, 1), generator=self.gen, forward_start=bs,
            forward_width=self.c, logits=proc, rows=torch.arange(bs, be, device=self.device),
            extras={"unchanged": torch.where(same, self.unchanged + 1, 0),
                    "temperature": temperature, "noise_kind": "uniform"})

    def _commit(self, accept: Tensor, sample: Tensor, argmax: Tensor, proc: Tensor,
                prop: Proposal) -> None:
        """Accepted positions ``accept [B, C]`` take their sample, every other pending one a
        fresh ``randint`` token (re-noising: an edit where it was accepted before); rows
        stopped earlier keep their canvas, argmax and self-conditioning (reference). Records
        the first acceptances (``commit_step`` and the probability, from which ``finish``
        derives the bits) and the edits."""
        b, c, bs, be, canvas = self.b, self.c, self.bs, self.be, self.canvas
        noise = torch.randint(0, self.v, (b, c), generator=self.gen, device=self.device)
        new_canvas = torch.where(accept, sample, noise)
        new_canvas = torch.where(self.pending, new_canvas, canvas)
        frozen = self.stopped[:, None]
        argmax = torch.where(frozen, self.argmax, argmax)
        self.canvas = torch.where(frozen, canvas, new_canvas)
        self.plan.condition(proc, self.stopped)
        self.unchanged = torch.where((argmax == self.prev_argmax).all(1), self.unchanged + 1, 0)
        self.prev_argmax = self.argmax = argmax
        live = accept & ~frozen
        accepted_once = self.accepted_once
        # an accepted position rewritten (re-noised or re-sampled to another token) is an
        # edit; commit_step / bits keep each position's first acceptance
        self.edits.append(accepted_once & ~frozen & (self.canvas != canvas))
        self.canvas_of.append(self.k)
        first = live & ~accepted_once
        self.commit_at[:, bs:be].masked_fill_(first, self.step)
        self.commit_prob[:, bs:be] = torch.where(first, prop.prob.double(),
                                                 self.commit_prob[:, bs:be])
        self.accepted_once = accepted_once | live
        if self.selector.sticky:  # accepted for good: no longer pending
            self.pending = self.pending & ~live

    # ---- after the loop ----

    def finish(self) -> Generation:
        """The ``Generation`` (class docstring): tokens ``[B, P + G]``, NFE ``[B]``, bits
        ``[B, steps]``, ``commit_step [B, G]``, ``edits [B, steps, G]``."""
        b, p, c, g, step, device = self.b, self.p, self.c, self.g, self.step, self.device
        bits_t = bits_per_step(self.commit_at, self.commit_prob, step)  # first acceptances
        edits_t = None
        if not self.selector.sticky:  # [B, steps, G]: each step's edits at its canvas
            edits_t = torch.zeros(b, step, self.length - p, dtype=torch.bool, device=device)
            for s_, (k_, e) in enumerate(zip(self.canvas_of, self.edits, strict=True)):
                edits_t[:, s_, k_ * c:(k_ + 1) * c] = e
            edits_t = edits_t[:, :, :g]
        return Generation(tokens=self.tokens[:, :p + g], nfe=self.nfe, forwards=self.forwards,
                          steps=step, prompt_length=p,
                          commit_step=self.commit_at[:, p:p + g].clone(), bits=bits_t,
                          lengths=torch.full((b,), g, dtype=torch.long, device=device),
                          refreshed=torch.ones(b, step, dtype=torch.bool, device=device),
                          step_forwards=[1] * step, edits=edits_t)
