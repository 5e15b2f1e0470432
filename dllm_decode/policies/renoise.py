"""Uniform-noise decoding policies: re-noising, entropy-bound acceptance, stable-and-confident
stop (DiffusionGemma; reference: Hugging Face transformers
``models/diffusion_gemma/generation_diffusion_gemma.py``, v5.24).

On a uniform-noise model (``model.noise_kind == "uniform"``) a canvas starts as uniformly random
tokens. Every step the model proposes a token per position (a sample at the step's temperature);
the **acceptance** rule (a selector) keeps some positions at their proposal and every other one
is **re-noised** with a fresh random token. Re-noising rewrites a position accepted earlier: an
edit, declared with the editing capability (``Capabilities(edits=True)``; ``StepState.editable``
marks the positions accepted at earlier steps of the canvas, ``Generation.edits`` records the
ones rewritten). In the reference every step decides acceptance over the whole canvas again, so
``eligible`` is the whole canvas. With ``sticky=True`` an accepted position is final instead,
and ``eligible`` is "not yet accepted" (the masked-decoding analogue).

A canvas ends when the **stopper** fires (stable and confident), when every position is accepted
(sticky only), or at the step budget; the canvas then takes the last step's argmax at every
position (as a stopper's "commit the rest at the argmax" does on a mask model).

* ``Renoise``: the selector of a uniform-noise policy: step budget, linear temperature schedule,
  the acceptance rule it wraps, re-noising. Any selector that declares ``"uniform"`` in its
  ``Capabilities.noise_kinds`` can be the acceptance rule (``eb``, ``threshold``,
  ``entropy_threshold``, ``EntropyBoundAccept``); ``DiffusionSampler`` wraps such a selector in
  ``Renoise`` when it is given directly with a uniform model.
* ``EntropyBoundAccept``: the reference's rule in its numerics (float32 entropy of the tempered
  logits, ``torch.sort``, float32 cumulative sum): accept the lowest-entropy positions while
  ``sum H - max H <= entropy_bound`` (EB-sampler, arXiv 2505.24857).
* ``StableConfident``: stop once the argmax canvas has been unchanged for
  ``stability_threshold`` steps (0: always stable) and the mean entropy is below
  ``confidence_threshold``.

Unset parameters (``None``) take the model's ``generation_config.json`` values (``bind``), and
otherwise the reference's defaults: 48 steps, t 0.8 -> 0.4, entropy bound 0.1, stability 1,
confidence 0.005.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.capabilities import Capabilities, capabilities_of
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.validate import check_fields
from dllm_decode.types import Selection, StepState

#: the reference's generation defaults (``DiffusionGemmaGenerationConfig``)
DEFAULTS: Final[dict[str, Any]] = {"max_denoising_steps": 48, "entropy_bound": 0.1,
                                   "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1,
                                   "confidence_threshold": 0.005}


def _default(model: Any, key: str) -> Any:
    gen = getattr(model, "generation_defaults", None) or {}
    return gen.get(key, DEFAULTS[key])


def step_temperature(remaining: int | Tensor, steps: int, t_min: float, t_max: float,
                     device: torch.device | None = None) -> Tensor:
    """``t = t_min + (t_max - t_min) * remaining / steps`` as a float32 tensor, computed in the
    reference's float32 order (``remaining`` counts down from ``steps`` to 1): 0-d for an int,
    elementwise for an int32 tensor of ``remaining`` values (``Renoise.temperatures``)."""
    if not isinstance(remaining, Tensor):
        remaining = torch.tensor(remaining, dtype=torch.int32, device=device)
    frac = remaining / steps
    return t_min + (t_max - t_min) * frac


def reference_entropy(logits: Tensor) -> Tensor:
    """``[..., V]`` -> ``[...]`` float32 entropy as ``torch.distributions.Categorical`` computes
    it (normalised logits clamped at the float32 minimum, times the softmax)."""
    norm = logits - logits.logsumexp(-1, keepdim=True)
    probs = torch.softmax(norm, dim=-1)
    norm = norm.clamp(min=torch.finfo(norm.dtype).min)
    return -(norm * probs).sum(-1)


@dataclass(frozen=True)
class EntropyBoundAccept:
    """Accept the lowest-entropy eligible positions while ``sum H - max H <= entropy_bound``
    (always at least one), in the reference's float32 numerics (module docstring).

    Reads ``-proposal.neg_entropy``; positions that are not eligible never count."""

    entropy_bound: float | None = None
    capabilities = Capabilities(budgeted=False, proposal_fields=("neg_entropy",),
                                noise_kinds=("mask", "uniform"))

    def __post_init__(self) -> None:
        check_fields(self, "EntropyBoundAccept")
        if self.entropy_bound is not None and not self.entropy_bound > 0:
            raise ValueError(f"EntropyBoundAccept: entropy_bound must be > 0, got "
                             f"{self.entropy_bound}")

    def bind(self, model: Any, cfg: Any = None) -> EntropyBoundAccept:
        if self.entropy_bound is not None:
            return self
        return replace(self, entropy_bound=float(_default(model, "entropy_bound")))

    def select(self, state: StepState) -> Tensor:
        """Sorted over the block span only (the reference sorts the canvas ``[B, C]``)."""
        bound = DEFAULTS["entropy_bound"] if self.entropy_bound is None else self.entropy_bound
        span = slice(state.block_start, state.block_end)
        eligible = state.eligible[:, span]
        h = (-state.proposal.neg_entropy[:, span]).float().masked_fill(~eligible, torch.inf)
        sorted_h, order = torch.sort(h, dim=-1)
        finite = sorted_h.masked_fill(sorted_h.isinf(), 0.0)
        ok = (torch.cumsum(finite, -1) - sorted_h) <= bound
        out = torch.zeros_like(state.eligible)
        out[:, span] = torch.zeros_like(ok).scatter(-1, order, ok) & eligible
        return out


@dataclass(frozen=True)
class Renoise:
    """The selector of a uniform-noise policy (module docstring).

    Args:
        accept: the acceptance rule, a selector whose ``Capabilities.noise_kinds`` include
            ``"uniform"`` (default: ``EntropyBoundAccept()``).
        max_denoising_steps: denoising steps per canvas, the step budget (``None``: the model's
            ``max_denoising_steps``, else 48). ``SamplerConfig.steps``, when given, is the total
            over the canvases and wins.
        t_min, t_max: the linear temperature schedule, ``t_max`` on a canvas's first step down
            to ``t_min + (t_max - t_min) / steps`` on its last (``None``: the model's, else
            0.4 / 0.8).
        sticky: accepted positions are final (eligible = not yet accepted; the canvas ends
            when all are accepted). Default False: the reference, which re-decides every
            position every step and re-noises the rest.
        eos_token_ids: the ids that finish a row (``None``: the model's; the reference's
            ``generate(eos_token_id=...)``).
    """

    accept: Any = None
    max_denoising_steps: int | None = None
    t_min: float | None = None
    t_max: float | None = None
    sticky: bool = False
    eos_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.eos_token_ids is not None:
            ids = self.eos_token_ids
            ids = tuple(ids) if isinstance(ids, (list, tuple)) else (ids,)
            if not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in ids):
                raise ValueError(f"Renoise: eos_token_ids must be None (the model's), a token "
                                 f"id >= 0 or a list of them, got {self.eos_token_ids!r}")
            object.__setattr__(self, "eos_token_ids", tuple(ids))
        if self.accept is None:
            object.__setattr__(self, "accept", EntropyBoundAccept())
        check_fields(self, "Renoise")
        caps = capabilities_of(self.accept, "selector")
        if "uniform" not in caps.noise_kinds or caps.budgeted:
            raise ValueError(f"Renoise: {type(self.accept).__name__} cannot accept positions on a "
                             "uniform-noise canvas (it needs a mask schedule or does not declare "
                             "noise_kinds=('uniform', ...)); usable: EntropyBoundAccept, "
                             "EntropyBounded ('eb'), Threshold ('threshold'), EntropyThreshold")
        if self.max_denoising_steps is not None and self.max_denoising_steps < 1:
            raise ValueError(f"Renoise: max_denoising_steps must be >= 1, got "
                             f"{self.max_denoising_steps}")
        for name in ("t_min", "t_max"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"Renoise: {name} must be a finite number > 0, got {value}")
        if self.t_min is not None and self.t_max is not None and self.t_max < self.t_min:
            raise ValueError(f"Renoise: t_max ({self.t_max}) must be >= t_min ({self.t_min})")

    @property
    def capabilities(self) -> Capabilities:
        inner = capabilities_of(self.accept, "selector")
        # re-noising rewrites positions accepted at earlier steps: the editing capability
        # (``Generation.edits`` records it); sticky acceptance never rewrites one
        return Capabilities(budgeted=False, needs_logits=inner.needs_logits,
                            proposal_fields=inner.proposal_fields, may_commit_nothing=True,
                            noise_kinds=("uniform",), stochastic=True, edits=not self.sticky)

    def bind(self, model: Any, cfg: Any = None) -> Renoise:
        bind = getattr(self.accept, "bind", None)
        return replace(
            self, accept=self.accept if bind is None else bind(model, cfg),
            max_denoising_steps=self.max_denoising_steps
            or int(_default(model, "max_denoising_steps")),
            t_min=float(_default(model, "t_min")) if self.t_min is None else self.t_min,
            t_max=float(_default(model, "t_max")) if self.t_max is None else self.t_max)

    def temperature(self, remaining: int | Tensor, steps: int,
                    device: torch.device | None = None) -> Tensor:
        """The step's temperature (``remaining`` = steps left including this one)."""
        t_min = DEFAULTS["t_min"] if self.t_min is None else self.t_min
        t_max = DEFAULTS["t_max"] if self.t_max is None else self.t_max
        return step_temperature(remaining, steps, t_min, t_max, device)

    def temperatures(self, steps: int, device: torch.device | None = None) -> Tensor:
        """``[steps]`` float32: step ``i``'s temperature at ``[i]`` (``temperature(steps - i,
        steps)``), made once per generation: indexing it in the step loop copies nothing from
        the host (a ``torch.tensor`` per step is a blocking host-to-device copy on CUDA)."""
        remaining = torch.arange(steps, 0, -1, dtype=torch.int32, device=device)
        return self.temperature(remaining, steps)

    def select(self, state: StepState) -> Tensor:
        """``[B, L]`` accepted positions (a subset of ``eligible``, which the loop checks); the
        other eligible positions are re-noised."""
        chosen = self.accept.select(state)
        return chosen.commit if isinstance(chosen, Selection) else chosen


@dataclass(frozen=True)
class StableConfident:
    """Stop a canvas once its argmax canvas has been unchanged for ``stability_threshold``
    steps and the mean entropy of the tempered logits is below ``confidence_threshold``
    (reference ``StableAndConfidentStoppingCriteria``). Reads ``state.extras["unchanged"]``
    (``[B]`` consecutive steps the argmax canvas stayed the same) and ``neg_entropy`` over
    the canvas (``state.eligible``'s block span)."""

    stability_threshold: int | None = None
    confidence_threshold: float | None = None
    capabilities = Capabilities(proposal_fields=("neg_entropy",), full_span=True,
                                noise_kinds=("uniform",))

    def __post_init__(self) -> None:
        check_fields(self, "StableConfident")
        if self.stability_threshold is not None and self.stability_threshold < 0:
            raise ValueError(f"StableConfident: stability_threshold must be >= 0, got "
                             f"{self.stability_threshold}")
        if self.confidence_threshold is not None and not self.confidence_threshold > 0:
            raise ValueError(f"StableConfident: confidence_threshold must be > 0, got "
                             f"{self.confidence_threshold}")

    def bind(self, model: Any, cfg: Any = None) -> StableConfident:
        return replace(self, stability_threshold=int(_default(model, "stability_threshold"))
                       if self.stability_threshold is None else self.stability_threshold,
                       confidence_threshold=float(_default(model, "confidence_threshold"))
                       if self.confidence_threshold is None else self.confidence_threshold)

    def should_stop(self, state: StepState) -> Tensor:
        """``[B]`` rows whose argmax canvas is stable and whose mean entropy over the canvas
        span ``[block_start, block_end)`` is below ``confidence_threshold``."""
        stab = self.stability_threshold
        conf = self.confidence_threshold
        stab = DEFAULTS["stability_threshold"] if stab is None else stab
        conf = DEFAULTS["confidence_threshold"] if conf is None else conf
        span = slice(state.block_start, state.block_end)
        h = -state.proposal.neg_entropy[:, span].float()
        stable = state.extras["unchanged"] >= stab
        return stable & (h.mean(-1) < conf)


def gemma_renoise(*, entropy_bound: float | None = None,
                  max_denoising_steps: int | None = None,
                  t_min: float | None = None, t_max: float | None = None,
                  stability_threshold: int | None = None,
                  confidence_threshold: float | None = None, sticky: bool = False,
                  early_stop: bool = True, eos_token_ids: tuple[int, ...] | None = None) -> Any:
    """The ``gemma_renoise`` preset: ``Renoise(EntropyBoundAccept)`` + ``StableConfident``
    (``early_stop=False``: no stopper, every canvas runs its step budget, as the reference with
    ``stability_threshold=None``)."""
    sel = Renoise(EntropyBoundAccept(entropy_bound), max_denoising_steps=max_denoising_steps,
                  t_min=t_min, t_max=t_max, sticky=sticky, eos_token_ids=eos_token_ids)
    stop = StableConfident(stability_threshold, confidence_threshold) if early_stop else None
    return Policy(selector=sel, stopper=stop, name="gemma_renoise")

