"""The decode loop's uniform-noise branch: canvases of random tokens, accepted or re-noised.

``DiffusionSampler.generate`` runs this for models with ``noise_kind == "uniform"``
(DiffusionGemma). It is the same loop shape as the mask loop (blocks -> steps -> forward ->
propose -> ``StepState`` -> select -> stop -> commit) with the same policy protocols
(``select(state)``, ``should_stop(state)``, declared ``Capabilities``); what differs is what a
block and a commit mean (``policies.renoise``):

* a **block** is one canvas of ``model.canvas_length`` tokens; before it the model's encoder
  appends the prompt (first canvas) or the previous finished canvas to its K/V cache; the
  canvas starts as ``randint(0, V)``;
* a **step**: decoder forward with the previous step's tempered logits as self-conditioning;
  proposal = a sample from ``softmax(logits / t)`` (``t`` from the ``Renoise`` schedule) with
  its probability, entropy, margins and the argmax; the selector's accepted positions take
  their sample and every other position a fresh random token (re-noising);
* a canvas **ends** when the stopper fires for every row (rows that stop earlier are frozen, as
  the reference freezes them), when every position is accepted (``sticky``), or at the step
  budget; it then takes the last step's argmax (``sticky``: accepted tokens stay). Rows whose
  canvas holds an EOS are finished: later positions become ``pad_token_id``, and decoding stops
  once every row is finished.

Random draws follow the reference (transformers 5.24 ``DiffusionGemmaGenerationMixin``), from
one ``torch.Generator`` seeded with ``seed`` on the model's device: per canvas one
``randint(0, V, [B, C])``; per step one ``multinomial`` over the ``[B * C, V]`` float32
probabilities, then one ``randint(0, V, [B, C])`` for re-noising (drawn in full). NFE per row
counts the decoder forwards while the row is neither stopped in its canvas nor finished; the
encoder's cache fills are not counted (as in the reference).

Host syncs: one per step with a stopper or ``sticky`` ("is every row's canvas decided?",
which also reads the contract flags), else one at a canvas's last step (the contract flags);
one per canvas for the EOS check. The contract (``samplers.contract`` error classes): non-finite
logits (recorded per row, sampled uniformly meanwhile so that ``multinomial`` never sees NaN)
and accepted positions outside ``eligible`` raise at the next sync, naming the rows.

This is a separate step loop from the mask loop's body (cache plans, ``ProposalMaker``,
``StepGuard``, ``EditTracker``): DiffusionGemma's encoder + self-conditioned decoder forward is
not a ``DecoderLM`` forward any cache plan speaks. Folding it into the mask loop (a "pending"
set in place of ``canvas == mask_id``, an encoder-decoder cache plan) is left to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import SamplerConfig
from dllm_decode.policies.capabilities import policy_capabilities
from dllm_decode.policies.registry import Policy
from dllm_decode.policies.renoise import Renoise, reference_entropy
from dllm_decode.samplers.contract import NonFiniteLogitsError, PolicyContractError
from dllm_decode.types import Generation, Proposal, StepState


def check_noise_kind(caps: Any, kind: str, name: str, model: Any) -> None:
    """``ValueError`` unless every part of the policy (``PolicyCapabilities``) works on a model
    of noise kind ``kind``."""
    if kind in caps.noise_kinds:
        return
    works = " / ".join(repr(k) for k in caps.noise_kinds) or "no"
    family = getattr(model, "family", type(model).__name__)
    raise ValueError(f"policy {name!r} works on {works} models; this model ({family}) has "
                     f"noise_kind {kind!r}: use a masked-decoding policy (low_confidence, "
                     "threshold, ...) on mask models and 'gemma_renoise' (or eb / threshold / "
                     "entropy_threshold acceptance) on uniform-noise models such as "
                     "DiffusionGemma")


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
                                 ("logits_eos_inf", cfg.logits_eos_inf)) if on]
    if bad:
        raise ValueError(f"{bad} do not apply to a uniform-noise model (it always caches the "
                         "encoded prefix and decodes each canvas in full); leave them unset")
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


def decode_uniform(model: Any, selector: Renoise, stopper: Any, prompt: Tensor, valid: Tensor,
                   cfg: SamplerConfig, name: str,
                   on_step: Callable[[StepState, Tensor], None] | None = None) -> Generation:
    """Decode ``cfg.gen_length`` tokens after ``prompt [B, P]`` (``valid [B, P]``, False =
    left padding) with a bound ``Renoise`` selector and an optional bound stopper.

    Returns a ``Generation``: ``tokens [B, P + G]`` (positions of canvases never decoded, and
    everything after a row's first EOS, hold ``pad_token_id``), per-row NFE, ``commit_step``
    = the step each position was first accepted at (-1: only the final argmax set it),
    ``edits [B, steps, G]`` = accepted positions each step rewrote (re-noised or re-sampled to
    another token; ``None`` with ``sticky``, which never rewrites)."""
    c, n_canvas, budget = check_uniform_config(model, cfg)
    steps = budget or int(selector.max_denoising_steps)
    b, p = prompt.shape
    g = cfg.gen_length
    length = p + n_canvas * c
    device = prompt.device
    v = int(model.vocab_size)
    pad = model.pad_token_id if model.pad_token_id is not None else model.eos_token_ids[0]
    eos_ids = model.eos_token_ids if selector.eos_token_ids is None else selector.eos_token_ids
    eos = torch.tensor(eos_ids or (-1,), device=device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed or 0)
    cache = model.new_cache(b, length)
    model.encode(prompt, cache, valid)

    tokens = torch.cat([prompt, torch.full((b, n_canvas * c), pad, device=device)], 1)
    commit_at = torch.full((b, length), -1, dtype=torch.long, device=device)
    commit_prob = torch.ones(b, length, dtype=torch.float64, device=device)
    finished_seq = torch.zeros(b, dtype=torch.bool, device=device)
    nfe = torch.zeros(b, dtype=torch.long, device=device)
    outside = torch.zeros(b, dtype=torch.bool, device=device)  # accepted outside eligible
    nonfinite = torch.zeros(b, dtype=torch.bool, device=device)
    step = forwards = 0
    bits: list[Tensor] = []
    edits: list[Tensor] = []  # [B, C] per step: accepted positions rewritten
    canvas_of: list[int] = []  # the canvas index of each step
    sync = stopper is not None or selector.sticky
    for k in range(n_canvas):
        bs, be = p + k * c, p + (k + 1) * c
        canvas = torch.randint(0, v, (b, c), generator=gen, device=device)
        argmax = canvas
        sc: Tensor | None = None
        prev_argmax = torch.full_like(canvas, -1)
        unchanged = torch.zeros(b, dtype=torch.long, device=device)
        stopped = torch.zeros(b, dtype=torch.bool, device=device)
        kept = torch.zeros(b, c, dtype=torch.bool, device=device)  # sticky: accepted for good
        accepted_once = torch.zeros(b, c, dtype=torch.bool, device=device)
        span_mask = torch.zeros(b, length, dtype=torch.bool, device=device)
        span_mask[:, bs:be] = True
        for i in range(steps):
            nfe += (~(stopped | finished_seq)).long()
            logits = model.decode(canvas, cache, sc)
            forwards += 1
            # non-finite rows are recorded (raised at the next sync) and sampled uniformly
            # meanwhile, so that torch's sampler never sees NaN
            bad = ~torch.isfinite(logits).all(-1) | torch.isneginf(logits).all(-1)  # [B, C]
            nonfinite |= bad.any(1)
            logits = torch.where(bad[..., None], 0.0, logits)
            proc = logits / selector.temperature(steps - i, steps, device)
            probs = torch.softmax(proc, dim=-1, dtype=torch.float32)
            sample = torch.multinomial(probs.view(-1, v), 1, generator=gen).view(b, c)
            new_argmax = proc.argmax(-1)
            prop = _proposal(proc, probs, sample, new_argmax)
            same = (new_argmax == prev_argmax).all(1)
            full_canvas = tokens.clone()
            full_canvas[:, bs:be] = canvas
            eligible = span_mask & ~torch.cat(
                [torch.zeros(b, bs, dtype=torch.bool, device=device), kept,
                 torch.zeros(b, length - be, dtype=torch.bool, device=device)], 1)
            editable = None
            if not selector.sticky:  # positions accepted at earlier steps of this canvas
                editable = torch.zeros_like(eligible)
                editable[:, bs:be] = accepted_once
            state = StepState(
                proposal=_widen(prop, full_canvas, bs), eligible=eligible, masked=eligible,
                editable=editable, block_step=i,
                fresh=span_mask, canvas=full_canvas, step=step, block=k, block_start=bs,
                block_end=be, gen_start=p, steps_left=steps - i, budget=None,
                progress=i / max(steps - 1, 1), generator=gen, forward_start=bs,
                forward_width=c, logits=proc, rows=torch.arange(bs, be, device=device),
                extras={"unchanged": torch.where(same, unchanged + 1, 0), "temperature":
                        selector.temperature(steps - i, steps, device), "noise_kind": "uniform"})
            chosen = selector.select(state)
            outside |= (chosen & ~eligible).any(1)
            accept = chosen[:, bs:be] & ~kept
            noise = torch.randint(0, v, (b, c), generator=gen, device=device)
            new_canvas = torch.where(accept, sample, noise)
            new_canvas = torch.where(kept, canvas, new_canvas)
            prev_canvas = canvas
            # rows stopped earlier keep their canvas, argmax and self-conditioning (reference)
            frozen = stopped[:, None]
            new_argmax = torch.where(frozen, argmax, new_argmax)
            canvas = torch.where(frozen, canvas, new_canvas)
            sc = proc if sc is None else torch.where(frozen[..., None], sc, proc)
            unchanged = torch.where((new_argmax == prev_argmax).all(1), unchanged + 1, 0)
            prev_argmax = argmax = new_argmax
            live = accept & ~frozen
            # an accepted position rewritten (re-noised or re-sampled to another token) is an
            # edit; commit_step / bits keep each position's first acceptance
            edited = accepted_once & ~frozen & (canvas != prev_canvas)
            edits.append(edited)
            canvas_of.append(k)
            first = live & ~accepted_once
            commit_at[:, bs:be].masked_fill_(first, step)
            commit_prob[:, bs:be] = torch.where(first, prop.prob.double(), commit_prob[:, bs:be])
            bits.append(torch.where(first, -prop.prob.double().clamp_min(1e-300).log(), 0.0)
                        .sum(1))
            accepted_once = accepted_once | live
            if selector.sticky:
                kept = kept | live
                stopped = stopped | kept.all(1)
            if stopper is not None:
                stopped = stopped | stopper.should_stop(state)
            if on_step is not None:
                on_step(state, chosen)
            step += 1
            # the one host sync per step: is every row's canvas decided? (and the contract)
            if sync or i == steps - 1:
                flags = torch.stack([(stopped | finished_seq).all(), nonfinite.any(),
                                     outside.any()]).tolist()
                _raise_if(flags, nonfinite, outside, step - 1, name)
                if sync and flags[0]:
                    break
        final = torch.where(kept, canvas, argmax) if selector.sticky else argmax
        final = torch.where(finished_seq[:, None], pad, final)
        # rows with an EOS in this canvas are finished: every later position becomes pad
        is_eos = torch.isin(final, eos)
        run = is_eos.long().cumsum(1)
        final = torch.where((run > 0) & ~((run == 1) & is_eos), pad, final)
        tokens[:, bs:be] = final
        finished_seq = finished_seq | is_eos.any(1)
        if k == n_canvas - 1 or bool(finished_seq.all()):  # one sync per canvas
            break
        model.encode(final, cache, prompt=False)
    bits_t = torch.stack(bits, 1) if bits else torch.zeros(b, 0, dtype=torch.float64,
                                                             device=device)
    edits_t = None
    if not selector.sticky:  # [B, steps, G]: each step's edits at their canvas positions
        edits_t = torch.zeros(b, step, length - p, dtype=torch.bool, device=device)
        for s_, e in enumerate(edits):
            k_ = int(canvas_of[s_])
            edits_t[:, s_, k_ * c:(k_ + 1) * c] = e
        edits_t = edits_t[:, :, :g]
    return Generation(tokens=tokens[:, :p + g], nfe=nfe, forwards=forwards, steps=step,
                      prompt_length=p, commit_step=commit_at[:, p:p + g].clone(), bits=bits_t,
                      lengths=torch.full((b,), g, dtype=torch.long, device=device),
                      refreshed=torch.ones(b, step, dtype=torch.bool, device=device),
                      step_forwards=[1] * step, edits=edits_t)
