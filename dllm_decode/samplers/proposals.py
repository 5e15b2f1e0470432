"""Per-step proposals: sampling choice, LLaDA's EOS options and reference-order noise."""

from __future__ import annotations

import functools
from typing import Any, Final

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode import kernels
from dllm_decode.cache.fed import Fed
from dllm_decode.config import SamplerConfig
from dllm_decode.kernels import reference
from dllm_decode.kernels.reference import filter_logits
from dllm_decode.types import Impl, Proposal

#: score only the masked rows when that skips at least this many logits (rows x V): below it the
#: gather / scatter ops cost more than the full-vocabulary passes they save
MASKED_ROWS_MIN_SAVED = 16384

#: the reference decoders' loops a policy part may name (its class's ``reference_loop``), with
#: the code each one is; ``rng="reference"`` reproduces the named loop's random draws
REFERENCE_LOOPS: Final[dict[str, str]] = {
    "fast_dllm": "NVlabs/Fast-dLLM llada/generate.py (generate, generate_with_prefix_cache, "
                 "generate_with_dual_cache)",
    "fast_dllm_pp": "Ringo-Star/FastdLLM_plusplus v1/llada/generate.py (the same three loops)",
}
#: the loops whose prefix-cache step draws one extra Gumbel tensor and discards it (Fast-dLLM's
#: ``generate_with_prefix_cache`` calls ``add_gumbel_noise`` twice per cached step; Fast-dLLM++'s
#: copy of the loop calls it once)
PREFIX_DOUBLE_DRAW: Final[frozenset[str]] = frozenset({"fast_dllm"})


def reference_loop_of(part: Any) -> str | None:
    """The reference loop a selector reproduces (``REFERENCE_LOOPS``), or ``None`` (a loop with
    one draw per forward and no quirk of its own).

    A part names it with a ``reference_loop`` attribute (or property) declared by its own
    class; a wrapper (``Supervised``, ``Credit``, ``FullSpan``, ...) does not pass its base's
    on, even one that forwards attribute reads (``__getattr__``): the wrapped method's loop is
    not the base rule's. Raises ``ValueError`` for a name that is not in ``REFERENCE_LOOPS``.
    """
    if not hasattr(type(part), "reference_loop"):
        return None
    loop = part.reference_loop
    if loop is not None and loop not in REFERENCE_LOOPS:
        raise ValueError(f"{type(part).__name__}.reference_loop is {loop!r}; known reference "
                         f"loops: {sorted(REFERENCE_LOOPS)} (or None)")
    return loop


class ProposalMaker:
    """Turns a step's logits into a ``Proposal`` for the scored rows.

    ``rng="reference"`` reproduces the reference decoders' random draws: LLaDA / Fast-dLLM draw
    a float64 uniform over the *whole forward* ``[B, fed_width, V]`` (Fast-dLLM's prefix loop
    twice per cached step: only for a selector that names that loop, ``reference_loop``);
    Dream draws Exp(1) noise ``[n_masked, V]`` over the masked positions
    of all rows in row-major order (``torch.multinomial``'s algorithm). With Gumbel sampling
    it also computes ``prob`` as LLaDA's ``generate`` computes its confidence
    (``reference_prob``: a softmax, then a gather, bit for bit the reference's value); the
    default is ``exp(z - lse)`` from the one-pass statistics (fused on a GPU), which can round
    differently (0.99999917 -> 1.0: a tie the reference does not have).
    """

    def __init__(self, model: Any, cfg: SamplerConfig, family: str,
                 generator: torch.Generator) -> None:
        self.cfg = cfg
        self.generator = generator
        self.after_select = False
        #: the optional ``Proposal`` fields to compute (``None``: all; the sampler sets the
        #: ones the policy's parts declare, ``PolicyCapabilities.proposal_fields``)
        self.fields: tuple[str, ...] | None = None
        #: the sampler sets it when every part reads the proposal only at masked positions
        #: (``Capabilities.reads_masked_only``) and the proposal is greedy torch reference
        #: work on the CPU: ``masked_rows`` may then pick the masked rows alone
        self.masked_only = False
        self.mask_id = model.mask_token_id
        self.block_size = getattr(model, "block_size", None)
        #: the selector samples its own tokens (``Capabilities.samples_tokens``): proposals stay
        #: greedy and draw nothing
        self.greedy = False
        #: the reference loop the selector reproduces (``reference_loop_of``; the sampler sets
        #: it): its draw quirks apply under ``rng="reference"`` (``PREFIX_DOUBLE_DRAW``), and no
        #: other policy's
        self.reference_loop: str | None = None
        #: with ``greedy``: the mask token's raw logits ``[B, R]`` of the last proposal (before
        #: ``propose`` removes the column), for ``StepState.mask_logit``
        self.mask_logit: Tensor | None = None
        self.sampling = cfg.sampling or ("categorical" if family == "dream" else "gumbel")
        #: ``prob`` as the reference computes it (``reference_prob``)
        self.softmax_prob = cfg.rng == "reference" and self.sampling == "gumbel"
        #: the kernel implementation, resolved once here (not inside a compiled step); ``auto``
        #: never resolves to a kernel that would refuse this sampling (categorical: torch)
        self.impl = kernels.propose_impl(cfg.impl, generator.device, self.sampling)
        eos = tuple(getattr(model, "eos_token_ids", ()) or ())
        spec = getattr(model, "spec", None)
        self.eos = eos[0] if eos else None
        self.eot = getattr(spec, "eot_token_id", None)
        if (cfg.logits_eos_inf or cfg.confidence_eos_eot_inf) and self.eos is None:
            raise ValueError("the EOS options need a model with an EOS token id")
        # vocabulary columns every proposal removes: the mask token (a committed MASK would
        # stay masked forever) and, with ``logits_eos_inf``, EOS (one ``index_fill_``)
        self._removed = torch.tensor([self.mask_id, self.eos] if cfg.logits_eos_inf
                                     else [self.mask_id], device=generator.device)

    def propose(self, logits: Tensor, fed: Fed, rows: Tensor, masked: Tensor,
                n_masked: int, *, edited: bool = False,
                row_seeds: Tensor | None = None) -> Proposal:
        """logits ``[B, R, V]`` for canvas ``rows`` -> Proposal ``[B, R]``.

        Edits ``logits`` in place (the mask token and, if asked, EOS become -inf) unless
        ``edited`` says the caller already did (``edit``). ``row_seeds`` (``[B]`` int64): draw
        each row's noise from its own counter-based stream (``kernels.row_uniform``) instead of
        ``generator``, so a row's tokens do not depend on its batch (serving engines).
        """
        cfg = self.cfg
        if not edited:
            logits = self.edit(logits)
        noise = None
        temperature = 0.0 if self.greedy else cfg.temperature
        if temperature > 0 and cfg.rng == "reference":
            noise = self._reference_noise(logits, fed, rows, masked, n_masked)
        # the torch reference directly when that is the resolved impl (no dispatch per step)
        propose = reference.propose if self.impl is Impl.REFERENCE else functools.partial(
            kernels.propose, impl=self.impl)
        extra = {} if row_seeds is None or temperature == 0 else {"row_seeds": row_seeds}
        prop = propose(logits, temperature=temperature, sampling=self.sampling,
                       top_p=cfg.top_p, top_k=cfg.top_k, noise=noise, generator=self.generator,
                       fields=self.fields, **extra)
        if self.softmax_prob:
            return self.reference_prob(logits, prop)
        if cfg.confidence_eos_eot_inf and self.sampling == "gumbel":
            prop = self._demote_eos(logits, prop)
        return prop

    def edit(self, logits: Tensor) -> Tensor:
        """``logits [..., V]`` with the removed columns (the mask token and, with
        ``logits_eos_inf``, EOS) at -inf: in place in eager code; a new tensor while
        ``torch.compile`` traces, so that a compiled step never mutates its input (a mutated
        input makes Inductor skip CUDA graphs)."""
        removed = self._removed
        if self.greedy or self.softmax_prob:
            self.mask_logit = logits[..., self.mask_id].clone()
        if removed.device != logits.device:
            removed = removed.to(logits.device)
        if torch.compiler.is_compiling():
            return logits.index_fill(-1, removed, -torch.inf)
        return logits.index_fill_(-1, removed, -torch.inf)

    def masked_rows(self, logits: Tensor, fed: Fed, live: Tensor | None, masked: Tensor,
                    count: int | None = None) -> tuple[Tensor, Tensor] | None:
        """The masked rows to score instead of every fed row, or ``None`` (score them all).

        Only when ``masked_only`` is set, the rows are a contiguous span and skipping the
        unmasked ones saves at least ``MASKED_ROWS_MIN_SAVED`` logits (Dream's reference
        scores only its masked rows too). CPU only: the row count is data dependent (a
        ``nonzero``, no device sync on the CPU), and per-row reductions there give the same
        bits on any number of rows.

        Args:
            count: the number of masked fed positions if the host knows it (skips counting
                them when too few rows would be skipped).

        Returns: ``(rows, flat)``: ``[K]`` indices into the flattened ``[B * R]`` fed rows and
        the same positions as indices into the flattened ``[B, L]`` canvas.
        """
        if not self.masked_only or fed.span is None or live is not None:
            return None
        b, r, v = logits.shape
        if (b * r - (count or 0)) * v < MASKED_ROWS_MIN_SAVED or logits.device.type != "cpu":
            return None
        lo, hi = fed.span
        rows = masked[:, lo:hi].reshape(-1).nonzero().squeeze(1)
        k = rows.shape[0]
        if k == 0 or (b * r - k) * v < MASKED_ROWS_MIN_SAVED:
            return None
        length = masked.shape[1]
        flat = rows + lo if b == 1 else rows + (rows // r) * (length - r) + lo
        return rows, flat

    def propose_rows(self, logits: Tensor, rows: Tensor, *, edited: bool = False) -> Proposal:
        """Greedy proposal ``[K]`` for the ``rows`` (``masked_rows``) of logits ``[B, R, V]``,
        which get ``propose``'s in-place edits (``StepState.logits`` sees them) unless
        ``edited``."""
        cfg = self.cfg
        if not edited:
            logits = self.edit(logits)
        b, r, v = logits.shape
        sub = logits.reshape(b * r, v).index_select(0, rows)
        prop = reference.propose(sub, temperature=0.0, sampling=self.sampling, top_p=cfg.top_p,
                                 top_k=cfg.top_k, fields=self.fields)
        return self.reference_prob(logits, prop, rows) if self.softmax_prob else prop

    def reference_prob(self, logits: Tensor, prop: Proposal, rows: Tensor | None = None
                       ) -> Proposal:
        """``prop`` with ``prob`` as LLaDA's ``generate`` (and Fast-dLLM's, up to its float64)
        computes the confidence: ``softmax(logits)`` over V in the logits' dtype, then the
        token's entry, over the logits as the reference holds them (the mask column at its raw
        value; EOS at -inf with ``logits_eos_inf``; the demoted EOS / EoT with
        ``confidence_eos_eot_inf``, as ``_demote_eos``).

        Args:
            logits: ``[B, R, V]`` after ``edit`` (whose raw mask column it kept).
            prop: the proposal ``[B, R]``, or ``[K]`` for the flat ``rows [K]`` of
                ``propose_rows``.
        """
        b, r, v = logits.shape
        if rows is None:
            z = logits.clone()
            z[..., self.mask_id] = self.mask_logit
        else:
            z = logits.reshape(b * r, v).index_select(0, rows)
            z[:, self.mask_id] = self.mask_logit.reshape(-1).index_select(0, rows)
        if self.cfg.confidence_eos_eot_inf:
            z[..., self._demoted()] = -torch.inf
        prob = torch.softmax(z, dim=-1).gather(-1, prop.tokens[..., None])[..., 0]
        return Proposal(prop.tokens, prob.float(), prop.get("margin"), prop.get("logit_margin"),
                        prop.get("neg_entropy"), prop.argmax, prop.lse)

    def _demoted(self) -> list[int]:
        """The ids ``confidence_eos_eot_inf`` gives probability 0 (see ``_demote_eos``)."""
        ids = [] if self.eot is None else [self.eot]
        if self.cfg.temperature == 0 or not self.cfg.eos_eot_reference_asymmetry:
            ids.append(self.eos)
        return ids

    def distribution(self, logits: Tensor) -> Tensor:
        """``[..., V]`` logits -> the float32 distribution proposals are sampled from.

        The same edits as ``propose`` (mask token and, if asked, EOS removed) on a copy, then
        ``softmax(logits / T)`` (``T = 0``: plain softmax) for Gumbel sampling, or Dream's
        tempered, top-p / top-k filtered distribution for categorical sampling.
        """
        cfg = self.cfg
        z = logits.float().clone()
        z[..., self.mask_id] = -torch.inf
        if cfg.logits_eos_inf:
            z[..., self.eos] = -torch.inf
        if self.sampling in ("categorical", "llada2"):
            z = filter_logits(z, cfg.temperature, cfg.top_p, cfg.top_k,
                              k_first=self.sampling == "llada2")
        elif cfg.temperature > 0:
            z = z / cfg.temperature
        return torch.softmax(z, dim=-1)

    def _reference_noise(self, logits: Tensor, fed: Fed, rows: Tensor, masked: Tensor,
                         n_masked: int) -> Tensor | None:
        b, _, v = logits.shape
        gen = self.generator
        if rows.dim() != 1:
            raise ValueError("rng='reference' reproduces the reference decoders' draws over "
                             "contiguous spans; pruned per-row forwards (cache='window') need "
                             "rng='compact'")
        if self.sampling == "gumbel":
            shape = (b, fed.fed_width, v)
            if fed.double_draw and self.reference_loop in PREFIX_DOUBLE_DRAW:
                # Fast-dLLM's prefix loop: a Gumbel tensor drawn and discarded
                torch.rand(shape, dtype=torch.float64, generator=gen, device=logits.device)
            u = torch.rand(shape, dtype=torch.float64, generator=gen, device=logits.device)
            return u[:, rows - fed.fed_start]
        if self.sampling == "llada2":
            return self._block_noise(logits, fed)
        if self.after_select:  # origin: tokens are drawn after the reveal (resample_committed)
            return torch.ones_like(logits, dtype=torch.float32)
        at = masked[:, rows]
        if int(at.sum()) != n_masked:
            raise ValueError("rng='reference' with categorical sampling needs every masked "
                             "position scored in the same forward (Dream's single block)")
        noise = torch.ones(b, rows.numel(), v, device=logits.device)
        noise[at] = torch.empty(n_masked, v, device=logits.device).exponential_(1, generator=gen)
        return noise

    def _block_noise(self, logits: Tensor, fed: Fed) -> Tensor:
        """LLaDA2 (``rng="reference"``): one ``multinomial(probs [K, V], 1)`` per forward over
        the ``K`` rows of the current aligned block, which ends at the fed span's end (prompt
        and padding rows of the block included), i.e. Exp(1) noise ``[B, K, V]`` row-major;
        scored rows before the block get no draw."""
        b, r, v = logits.shape
        k = self.block_size
        if k is None or fed.span is None:
            raise ValueError("sampling='llada2' with rng='reference' needs a block-diffusion "
                             "model fed one contiguous span (cache 'none' or 'block_causal')")
        lo, hi = fed.span
        drawn = torch.empty(b, k, v, device=logits.device).exponential_(1,
                                                                        generator=self.generator)
        noise = torch.ones(b, r, v, device=logits.device)
        first = max(lo, hi - k)  # the block's first scored row
        noise[:, first - lo:] = drawn[:, first - (hi - k):]
        return noise

    def _demote_eos(self, logits: Tensor, prop: Proposal) -> Proposal:
        """LLaDA ``confidence_eos_eot_inf``: EOS/EoT candidates get probability 0.

        The reference writes -inf into the noised logits at EOS and into the logits at EoT;
        at T = 0 both are the same tensor, so both are demoted, at T > 0 only EoT is
        (``eos_eot_reference_asymmetry``); the remaining probabilities renormalise.
        """
        z = logits.double().clone()
        z[..., self._demoted()] = -torch.inf
        prob = torch.softmax(z, dim=-1).gather(-1, prop.tokens[..., None])[..., 0]
        return Proposal(prop.tokens, prob, prop.get("margin"), prop.get("logit_margin"),
                        prop.get("neg_entropy"), prop.argmax, prop.lse)

    def resample_committed(self, logits: Tensor, rows: Tensor, commit: Tensor,
                           tokens: Tensor) -> Tensor:
        """Dream ``origin``: tokens of revealed positions drawn after the reveal (one
        categorical draw over the revealed rows, row-major), as the reference orders it."""
        cfg = self.cfg
        if cfg.temperature == 0 or cfg.rng != "reference":
            return tokens
        at = take(commit, rows)
        # sync (reference RNG mode only): the draw's shape is the number revealed
        n = int(at.sum())
        if n == 0:
            return tokens
        z = filter_logits(logits[at], cfg.temperature, cfg.top_p, cfg.top_k)
        probs = F.softmax(z, dim=-1)
        e = torch.empty_like(probs).exponential_(1, generator=self.generator)
        drawn = torch.argmax((probs / probs.sum(-1, keepdim=True)) / e, dim=-1)
        sub = take(tokens, rows).clone()
        sub[at] = drawn
        return put(tokens, rows, sub, live=at)


def take(x: Tensor, rows: Tensor) -> Tensor:
    """``x [B, L]`` at canvas positions ``rows`` (``[R]`` shared or ``[B, R]`` per row)."""
    return x[:, rows] if rows.dim() == 1 else x.gather(1, rows)


def put(base: Tensor, rows: Tensor, x: Tensor, live: Tensor | None = None) -> Tensor:
    """A copy of ``base [B, L]`` with ``x [B, R]`` written at ``rows`` (see ``take``).

    With ``live [B, R]`` only live entries are written (the others, e.g. padding that repeats
    an entry, go to a scratch column that is dropped), so writes never race.
    """
    if rows.dim() == 1 and live is None:
        out = base.clone()
        out[:, rows] = x.to(out.dtype)
        return out
    b, length = base.shape
    rows = rows.expand(b, -1)
    if live is not None:
        rows = torch.where(live, rows, length)
    out = torch.cat([base, base[:, :1]], dim=1)
    out.scatter_(1, rows, x.to(out.dtype))
    return out[:, :length]


def widen(prop: Proposal, canvas: Tensor, rows: Tensor, live: Tensor | None = None,
          span: tuple[int, int] | None = None, span_mask: Tensor | None = None) -> Proposal:
    """Scatter a ``[B, R]`` proposal into ``[B, L]`` (unscored positions: current token, 0).

    ``rows`` is ``[R]`` (shared) or ``[B, R]`` (per row, see ``take``); ``live [B, R]``
    selects the entries written (``None``: all). ``span=(lo, hi)`` says ``rows`` is
    ``arange(lo, hi)``: the float fields are then zero-padded to the canvas in one op, and
    the tokens placed with one select against ``span_mask`` (``[B, L]`` bool, True on the
    span; a few ops instead of a scatter per field). Fields absent from ``prop`` (not
    computed) stay absent.
    """
    names = prop.computed()
    dtype = prop.prob.dtype
    if span is not None and live is None and all(prop.get(n).dtype == dtype for n in names):
        lo, hi = span
        pad = (lo, canvas.shape[1] - hi)  # zero-pad [.., R] to the canvas [.., L] (F.pad's op)
        if names:  # one pad for every float field
            prob, *wide = torch.constant_pad_nd(
                torch.stack([prop.prob, *(prop.get(n) for n in names)]), pad).unbind(0)
        else:
            prob, wide = torch.constant_pad_nd(prop.prob, pad), []

        def tok(x: Tensor) -> Tensor:
            if span_mask is not None:
                return torch.where(span_mask, torch.constant_pad_nd(x, pad), canvas)
            return torch.cat([canvas[:, :lo], x, canvas[:, hi:]], dim=1)

        tokens = tok(prop.tokens)
        argmax = None if prop.argmax is None else tok(prop.argmax)
    else:
        zeros = torch.zeros(canvas.shape, dtype=dtype, device=canvas.device)
        prob = put(zeros, rows, prop.prob, live)
        wide = [put(zeros, rows, prop.get(n), live) for n in names]
        tokens = put(canvas, rows, prop.tokens, live)
        argmax = None if prop.argmax is None else put(canvas, rows, prop.argmax, live)
    fields = dict(zip(names, wide, strict=True))
    return Proposal(tokens, prob, fields.get("margin"), fields.get("logit_margin"),
                    fields.get("neg_entropy"), argmax)


def widen_at(prop: Proposal, canvas: Tensor, flat: Tensor) -> Proposal:
    """A ``[K]`` proposal at the flattened canvas positions ``flat`` -> ``[B, L]`` (elsewhere:
    the canvas token and 0). The LSE is not widened (the contract checks the ``[K]``
    proposal), as ``widen`` leaves it out."""
    b, length = canvas.shape
    names = prop.computed()
    if names:  # one scatter for every float field
        floats = torch.stack([prop.prob, *(prop.get(n) for n in names)])  # [F, K]
        wide = floats.new_zeros(floats.shape[0], b * length).index_copy_(1, flat, floats)
        prob, *rest = wide.view(-1, b, length).unbind(0)
    else:
        prob = prop.prob.new_zeros(b * length).index_copy_(0, flat, prop.prob).view(b, length)
        rest = []
    fields = dict(zip(names, rest, strict=True))
    tokens = canvas.reshape(-1).index_copy(0, flat, prop.tokens).view(b, length)
    return Proposal(tokens, prob, fields.get("margin"), fields.get("logit_margin"),
                    fields.get("neg_entropy"), None if prop.argmax is None else
                    canvas.reshape(-1).index_copy(0, flat, prop.argmax).view(b, length))
