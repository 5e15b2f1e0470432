"""Per-step proposals: sampling choice, LLaDA's EOS options and reference-order noise."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode import kernels
from dllm_decode.cache.plans import Fed
from dllm_decode.config import SamplerConfig
from dllm_decode.kernels.reference import filter_logits
from dllm_decode.types import OPTIONAL_FIELDS, Proposal


class ProposalMaker:
    """Turns a step's logits into a ``Proposal`` for the scored rows.

    ``rng="reference"`` reproduces the reference decoders' random draws: LLaDA / Fast-dLLM draw
    a float64 uniform over the *whole forward* ``[B, fed_width, V]`` (Fast-dLLM's prefix loop
    twice per cached step); Dream draws Exp(1) noise ``[n_masked, V]`` over the masked positions
    of all rows in row-major order (``torch.multinomial``'s algorithm).
    """

    def __init__(self, model: Any, cfg: SamplerConfig, family: str,
                 generator: torch.Generator) -> None:
        self.cfg = cfg
        self.generator = generator
        self.after_select = False
        #: the optional ``Proposal`` fields to compute (``None``: all; the sampler sets the
        #: ones the policy's parts declare, ``PolicyCapabilities.proposal_fields``)
        self.fields: tuple[str, ...] | None = None
        #: the kernel implementation, resolved once here (not inside a compiled step)
        self.impl = kernels.resolve_impl(cfg.impl, generator.device)
        self.mask_id = model.mask_token_id
        self.sampling = cfg.sampling or ("categorical" if family == "dream" else "gumbel")
        eos = tuple(getattr(model, "eos_token_ids", ()) or ())
        spec = getattr(model, "spec", None)
        self.eos = eos[0] if eos else None
        self.eot = getattr(spec, "eot_token_id", None)
        if (cfg.logits_eos_inf or cfg.confidence_eos_eot_inf) and self.eos is None:
            raise ValueError("the EOS options need a model with an EOS token id")

    def propose(self, logits: Tensor, fed: Fed, rows: Tensor, masked: Tensor,
                n_masked: int) -> Proposal:
        """logits ``[B, R, V]`` for canvas ``rows`` -> Proposal ``[B, R]``.

        Edits ``logits`` in place (the mask token and, if asked, EOS become -inf).
        """
        cfg = self.cfg
        # the mask token is never a proposal (a committed MASK would stay masked forever)
        logits.select(-1, self.mask_id).fill_(-torch.inf)
        if cfg.logits_eos_inf:
            logits.select(-1, self.eos).fill_(-torch.inf)
        noise = None
        if cfg.temperature > 0 and cfg.rng == "reference":
            noise = self._reference_noise(logits, fed, rows, masked, n_masked)
        prop = kernels.propose(logits, temperature=cfg.temperature, sampling=self.sampling,
                               top_p=cfg.top_p, top_k=cfg.top_k, noise=noise,
                               generator=self.generator, impl=self.impl, fields=self.fields)
        if cfg.confidence_eos_eot_inf and self.sampling == "gumbel":
            prop = self._demote_eos(logits, prop)
        return prop

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
        if self.sampling == "categorical":
            z = filter_logits(z, cfg.temperature, cfg.top_p, cfg.top_k)
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
            if fed.double_draw:  # Fast-dLLM's prefix loop: a Gumbel tensor drawn and discarded
                torch.rand(shape, dtype=torch.float64, generator=gen, device=logits.device)
            u = torch.rand(shape, dtype=torch.float64, generator=gen, device=logits.device)
            return u[:, rows - fed.fed_start]
        if self.after_select:  # origin: tokens are drawn after the reveal (resample_committed)
            return torch.ones_like(logits, dtype=torch.float32)
        at = masked[:, rows]
        if int(at.sum()) != n_masked:
            raise ValueError("rng='reference' with categorical sampling needs every masked "
                             "position scored in the same forward (Dream's single block)")
        noise = torch.ones(b, rows.numel(), v, device=logits.device)
        noise[at] = torch.empty(n_masked, v, device=logits.device).exponential_(1, generator=gen)
        return noise

    def _demote_eos(self, logits: Tensor, prop: Proposal) -> Proposal:
        """LLaDA ``confidence_eos_eot_inf``: EOS/EoT candidates get probability 0.

        The reference writes -inf into the noised logits at EOS and into the logits at EoT;
        at T = 0 both are the same tensor, so both are demoted, at T > 0 only EoT is
        (``eos_eot_reference_asymmetry``); the remaining probabilities renormalise.
        """
        ids = []
        if self.eot is not None:
            ids.append(self.eot)
        if self.cfg.temperature == 0 or not self.cfg.eos_eot_reference_asymmetry:
            ids.append(self.eos)
        z = logits.double().clone()
        z[..., ids] = -torch.inf
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
    names = ("prob", *OPTIONAL_FIELDS)
    floats = {n: prop.get(n) for n in names if prop.get(n) is not None}
    if span is not None and live is None and all(f.dtype == prop.prob.dtype
                                                 for f in floats.values()):
        lo, hi = span
        pad = (lo, canvas.shape[1] - hi)  # zero-pad [.., R] to the canvas [.., L]
        if len(floats) == 1:
            padded = {"prob": F.pad(prop.prob, pad)}
        else:
            padded = dict(zip(floats, F.pad(torch.stack(list(floats.values())), pad).unbind(0),
                              strict=True))

        def tok(x: Tensor) -> Tensor:
            if span_mask is not None:
                return torch.where(span_mask, F.pad(x, pad), canvas)
            return torch.cat([canvas[:, :lo], x, canvas[:, hi:]], dim=1)

        return Proposal(tokens=tok(prop.tokens), prob=padded["prob"], margin=padded.get("margin"),
                        logit_margin=padded.get("logit_margin"),
                        neg_entropy=padded.get("neg_entropy"),
                        argmax=None if prop.argmax is None else tok(prop.argmax))

    def put_(x: Tensor, base: Tensor) -> Tensor:
        return put(base, rows, x, live)

    zeros = torch.zeros(canvas.shape, dtype=prop.prob.dtype, device=canvas.device)
    wide = {n: put_(x, zeros) for n, x in floats.items()}
    return Proposal(tokens=put_(prop.tokens, canvas), prob=wide["prob"], margin=wide.get("margin"),
                    logit_margin=wide.get("logit_margin"), neg_entropy=wide.get("neg_entropy"),
                    argmax=None if prop.argmax is None else put_(prop.argmax, canvas))
