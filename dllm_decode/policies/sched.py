"""SchED early-exit stopper, and Prophet as its special case.

* SchED: Mohamed, Zhang, Vazirgiannis, Shang, "Fast-Decoding Diffusion Language Models via
  Progress-Aware Confidence Schedules", arXiv 2512.02892 (released Dream code
  ``amr-mohamedd/SchED`` ``dream_sampling/sched.py``).
* Prophet: Li, Zhou et al., "Diffusion Language Models Know the Answer Before Decoding",
  arXiv 2508.19982 (``pixeli99/Prophet``).

A stopper watches the aggregated top-2 *logit* margin of the still-masked answer region and, once
it clears a threshold that decays with progress, the sampler commits every remaining mask at its
argmax ("go all-in"). The selector in between is untouched: ``sched`` wraps any base preset.

Per-generation memory (previous argmax, patience, sticky stop) lives in ``SchEDMemory``. The
sampler only calls ``init_memory`` on the *selector*, so the presets wrap the base selector in
``Supervised``, which owns both memories, hands the base its own and binds as itself. The
per-step check itself is ``sched_step.decide`` (the same decisions with few ops).

Deviations from the papers / released code:

* statistics, gate and exit are per row (the code pools the batch and exits all rows
  together); explicit regions are offsets into the generation, not canvas indices;
* the mask token's logit is -inf before the top-2 margin is taken (the code keeps it; this
  matters only where MASK is a top-2 token);
* the released code is Dream-only; on LLaDA and block-diffusion models the stopper runs over
  the base's block schedule (the paper's LLaDA appendix code is not released); block-causal
  models never score later blocks, so region ``all`` can only fire in the last block;
* under caches the statistic is checked on fully fresh steps only (``stale="skip"``) or from
  the newest values per position (``stale="use"``, approximate); the code has no cache;
* Prophet: the task-specific anchor injection ("The answer is" at fixed indices) is not done;
  no gate by default (Prophet's own rule), SchED's re-implementation of it keeps the gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.resolve import make_policy
from dllm_decode.policies.rows import as_rows, column, per_row, positions, table
from dllm_decode.policies.sched_step import RegionMemo, decide, order_stat, window_rows
from dllm_decode.policies.supervised import PairedMemory, Supervised  # noqa: F401 (re-export)
from dllm_decode.policies.validate import check_fields
from dllm_decode.types import StepState

_MODES = ("linear", "cosine", "exp", "piecewise")
_STATS = ("mean", "median", "quantile")
_REGIONS = ("all", "tail", "explicit")
_STALE = ("skip", "use")


@dataclass
class SchEDMemory:
    """Mutable per-generation state of a ``SchED`` stopper (updated in place).

    stopped ``[B]`` bool: the sticky stop (replaced by a new tensor each eager step, written
    in place under ``torch.compile``). The other tensors exist only where the stopper's
    settings read them (else ``None``: a serving engine's pool gathers and scatters every
    tensor each step): prev_argmax ``[B, L]`` int64, argmax at the row's last checked step,
    -1 before its first (``max_change_ratio < 1``); patience ``[B]`` int64
    (``patience_steps > 0``); last_margin ``[B, L]`` float32 / last_argmax ``[B, L]`` int64,
    newest fresh values per position (``stale="use"``; -inf = never scored). regions: the
    ``sched_step.RegionMemo`` of the generation (eager only).
    """

    stopped: Tensor
    prev_argmax: Tensor | None = None
    patience: Tensor | None = None
    last_margin: Tensor | None = None
    last_argmax: Tensor | None = None
    regions: RegionMemo | None = None


@dataclass(frozen=True)
class SchED:
    """Schedule-based early exit on the aggregated top-2 logit margin (SchED, arXiv 2512.02892).

    At step i with progress ``u = i / (T - 1)`` (``state.progress``, clipped to [0, 1]):

    1. focus ``F = R ∩ M`` (region ∩ still masked; ``average_over_masked=False``: all of R
       inside the generation, since the sampler scores no prompt rows). ``R ∩ M`` empty: stop.
    2. ``ḡ = stat(z1 - z2 over F)`` from ``proposal.logit_margin`` (raw logits; the sampler has
       already set the mask token's logit to -inf, the released code keeps it). Empty -> -inf.
    3. Stability gate of the released code: ``changed`` = fraction of ``R ∩ M`` whose argmax
       differs from the last checked step's (1.0 at the first); ``progress_R = 1 - |R ∩ M| /
       |R|`` (region ``all`` counts the prompt, so it is inflated, as in the code); patience
       += 1 when ``progress_R >= min_progress`` and ``changed <= max_change_ratio``, else 0.
    4. Exit when ``progress_R >= min_progress``, ``ḡ >= τ(u)`` and ``patience > patience_steps``;
       the sampler then commits every masked fresh position at its argmax (greedy even when
       sampling). The stop is sticky in memory, so masks that were not fresh at the exit step
       (cached modes, narrow regions) are filled at their argmax on the next forward.

    Thresholds (``threshold``): ``linear`` τ_high + (τ_low - τ_high)u; ``cosine`` τ_low +
    (τ_high - τ_low)(1 + cos πu)/2; ``exp`` τ_low + (τ_high - τ_low)e^{-k u} (never reaches
    τ_low); ``piecewise`` (Prophet) τ_high / τ_mid / τ_low on thirds of the phase clock
    ``(i + 1) / T`` (T from ``extras["total_steps"]`` or derived from ``progress``; at step 0
    with T unknown the clock is 0).

    An empty region (a window past a truncated row) never decides, as in the code. Models with
    shifted logits (Dream) are realigned by the model: the margin at canvas j is raw row j - 1.

    Memory: the gate needs ``SchEDMemory`` (found at ``state.memory.stopper``, see
    ``Supervised``; ``Policy(selector, SchED(...))`` wraps the selector so); called without
    it, ``should_stop`` runs stateless, which is allowed only with the gate off
    (``max_change_ratio=1``, ``patience_steps=0``) and ``stale="skip"``.

    Caches: ``stale="skip"`` (default) checks, and advances the gate, only on steps whose logits
    are fresh over every position the statistic reads (every full-canvas forward, i.e. refresh
    steps under ``dual``; most steps under ``prefix``); other steps return False. Block-causal
    models never score later blocks, so with region ``all`` SchED only acts in the last block.
    ``stale="use"`` (approximation) aggregates the newest margin/argmax seen per position.

    Args:
        tau_mode: ``linear | cosine | exp | piecewise``.
        tau_high, tau_low: thresholds at u = 0 and u = 1 (logit units; τ_high >= τ_low).
        tau_k: ``exp`` curvature k. tau_mid: ``piecewise`` middle level (None: midpoint).
        stat: ``mean | median`` (lower median, as ``torch.median``) ``| quantile`` (linear
            interpolation at ``q``, as ``torch.quantile``).
        region: ``all`` (whole canvas) ``| tail`` (the generation) ``| explicit``.
        region_start, region_end: explicit region ``[start, end)`` as offsets into the
            generation (``end=None``: to its end); truncated rows (EoTP) are clipped.
        average_over_masked: the statistic over ``R ∩ M`` (True) or all of R.
        max_change_ratio, patience_steps, min_progress: the gate (released defaults 0, 0, 0;
            ``max_change_ratio=1`` disables it).
        stale: ``skip | use``, see above.
    """

    #: reads the top-2 logit margin (and the always-present greedy tokens), at every fresh
    #: position of its region, masked or not; per-row progress / steps / generation starts
    #: (``row_steps``)
    capabilities = Capabilities(proposal_fields=("logit_margin",), row_steps=True)

    tau_mode: str = "cosine"
    tau_high: float = 7.5
    tau_low: float = 2.5
    tau_k: float = 4.0
    tau_mid: float | None = None
    stat: str = "mean"
    q: float = 0.2
    region: str = "all"
    region_start: int = 0
    region_end: int | None = None
    average_over_masked: bool = True
    max_change_ratio: float = 0.0
    patience_steps: int = 0
    min_progress: float = 0.0
    stale: str = "skip"

    def __post_init__(self) -> None:
        check_fields(self, "SchED")
        for name, value, valid in (("tau_mode", self.tau_mode, _MODES),
                                   ("stat", self.stat, _STATS),
                                   ("region", self.region, _REGIONS),
                                   ("stale", self.stale, _STALE)):
            if value not in valid:
                raise ValueError(f"{name} must be one of {valid}, got {value!r}")
        if not self.tau_high >= self.tau_low:
            raise ValueError(f"tau_high ({self.tau_high}) must be >= tau_low ({self.tau_low})")
        if self.tau_mid is not None and not self.tau_high >= self.tau_mid >= self.tau_low:
            raise ValueError(f"tau_mid ({self.tau_mid}) must lie in [tau_low, tau_high]")
        if not 0.0 <= self.q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {self.q}")
        if not 0.0 <= self.max_change_ratio <= 1.0:
            raise ValueError(f"max_change_ratio must be in [0, 1], got {self.max_change_ratio}")
        if self.patience_steps < 0 or self.region_start < 0:
            raise ValueError("patience_steps and region_start must be >= 0")
        if self.region_end is not None and self.region_end <= self.region_start:
            raise ValueError(f"region_end ({self.region_end}) must be > region_start "
                             f"({self.region_start})")

    @property
    def gated(self) -> bool:
        """True when the stability gate can block an exit (it then needs memory)."""
        return self.max_change_ratio < 1.0 or self.patience_steps > 0

    def init_memory(self, batch: int, length: int, device: torch.device) -> SchEDMemory:
        """Fresh ``SchEDMemory`` for a ``[batch, length]`` canvas (only the tensors this
        stopper's settings read)."""
        mem = SchEDMemory(stopped=torch.zeros(batch, dtype=torch.bool, device=device))
        if self.max_change_ratio < 1.0:
            mem.prev_argmax = torch.full((batch, length), -1, device=device)
        if self.patience_steps > 0:
            mem.patience = torch.zeros(batch, dtype=torch.long, device=device)
        if self.stale == "use":
            mem.last_margin = torch.full((batch, length), -torch.inf, device=device)
            mem.last_argmax = torch.zeros(batch, length, dtype=torch.long, device=device)
        return mem

    # ---- schedule ----------------------------------------------------------------------
    def threshold(self, u: float | Tensor) -> float | Tensor:
        """τ at clock ``u`` (clipped to [0, 1]); non-increasing in u. A 0-d float64 tensor
        ``u`` (the compiled step's ``progress``) gives a 0-d tensor by the same formulas, a
        ``[B]`` one (per-row progress) a ``[B]`` tensor."""
        hi, lo = self.tau_high, self.tau_low
        if hi == lo:
            return hi
        if isinstance(u, Tensor):
            return self._threshold_tensor(u)
        u = min(max(u, 0.0), 1.0)
        if self.tau_mode == "piecewise":
            mid = (hi + lo) / 2 if self.tau_mid is None else self.tau_mid
            return hi if u < 1 / 3 else mid if u < 2 / 3 else lo
        w = {"linear": 1.0 - u, "cosine": 0.5 * (1.0 + math.cos(math.pi * u)),
             "exp": math.exp(-self.tau_k * u)}[self.tau_mode]
        if math.isfinite(hi) and math.isfinite(lo):
            return lo + (hi - lo) * w
        # an infinite end: drop zero-weight terms instead of forming inf * 0
        return (w * hi if w > 0 else 0.0) + ((1.0 - w) * lo if w < 1 else 0.0)

    def _threshold_tensor(self, u: Tensor) -> Tensor:
        """``threshold`` on a 0-d float64 tensor (no host value: a compiled step captures it
        without specialising on the clock), or a ``[B]`` one (per-row clocks; ``piecewise``
        then gives float32, the host thresholds' rounding). The same values as the host
        formulas, in fewer ops."""
        hi, lo = self.tau_high, self.tau_low
        if self.tau_mode == "piecewise":  # (clipping u changes no comparison: not done)
            mid = (hi + lo) / 2 if self.tau_mid is None else self.tau_mid
            if per_row(u):  # the third of the clock each row is in, looked up: two ops
                third = torch.bucketize(u, table((1 / 3, 2 / 3), u.dtype, u.device),
                                        right=True)  # 0: u < 1/3, 1: u < 2/3, else 2
                return table((hi, mid, lo), torch.float32, u.device)[third]
            return torch.where(u < 1 / 3, hi, torch.where(u < 2 / 3, mid, lo))
        u = u.clamp(0.0, 1.0)
        finite = math.isfinite(hi) and math.isfinite(lo)
        if self.tau_mode == "cosine" and finite and (hi - lo) * 0.5 * 2 == hi - lo:
            # lo + (hi - lo) * (0.5 * s) with s = 1 + cos(pi u), as lo + ((hi - lo) / 2) * s:
            # both halvings are exact, so the product is the same real number, rounded once
            return lo + (hi - lo) * 0.5 * (1.0 + torch.cos(math.pi * u))
        if self.tau_mode == "linear":
            w = 1.0 - u
        elif self.tau_mode == "cosine":
            w = 0.5 * (1.0 + torch.cos(math.pi * u))
        else:
            w = torch.exp(-self.tau_k * u)
        if finite:
            return lo + (hi - lo) * w
        return torch.where(w > 0, w * hi, 0.0) + torch.where(w < 1, (1.0 - w) * lo, 0.0)

    def clock(self, state: StepState) -> float | Tensor:
        """Schedule clock: ``i / (T - 1)``; Prophet's phases use ``(i + 1) / T`` (``[B]``
        float64 for per-row steps)."""
        if self.tau_mode != "piecewise":
            return state.progress
        total = state.extras.get("total_steps")
        if per_row(state.step) or per_row(total) or per_row(state.progress):
            return self._phase_rows(state, total)
        if total is None and state.step > 0 and state.progress > 0:
            total = round(state.step / state.progress) + 1
        return (state.step + 1) / total if total else 0.0

    @staticmethod
    def _phase_rows(state: StepState, total: Any) -> Tensor:
        """``clock``'s ``(i + 1) / T`` per row, float64 as Python computes it (``T`` derived
        from the progress where not given; 0 where unknown)."""
        b, device = state.masked.shape[0], state.masked.device
        step = as_rows(state.step, b, device)
        if total is None:
            progress = as_rows(state.progress, b, device, torch.float64)
            known = (step > 0) & (progress > 0)  # elsewhere the quotient is not used
            total = torch.where(known, torch.round(step / progress).long() + 1, 0)
        total = as_rows(total, b, device)
        # int64 / float64 divides in float64 (the int converted exactly), as Python's int / int
        return torch.where(total != 0, (step + 1) / total.double(), 0.0)

    # ---- statistic ---------------------------------------------------------------------
    def region_mask(self, state: StepState) -> Tensor:
        """``[B, L]`` bool: the answer region R of each row (truncated rows clipped)."""
        region = self.region_of(state)
        return state.masked.new_ones(()).expand_as(state.masked) if region is None else region

    def region_of(self, state: StepState) -> Tensor | None:
        """``region_mask``, or ``None`` when R is every position (region ``all`` without
        truncation ``lengths``). Without ``lengths`` a row's region ends with the canvas, so
        per row only its start (and an explicit end) is compared: few ops."""
        masked = state.masked
        b, length = masked.shape
        p = state.gen_start
        lengths = state.extras.get("lengths")
        if lengths is None:
            if self.region == "all":
                return None
            if per_row(p):
                pos = positions(length, masked.device)
                start = self.region_start if self.region == "explicit" else 0
                if self.region == "tail" or self.region_end is None:
                    return pos >= (p + start if start else p)[:, None]
                return window_rows(p, start, self.region_end, length, masked.device)
            lengths = length - p if per_row(p) else torch.full((b,), length - p,
                                                               device=masked.device)
        end = (p + lengths)[:, None]
        pos = torch.arange(length, device=masked.device)[None]
        if self.region == "all":
            return (pos < end).expand(b, -1)
        start = p + (self.region_start if self.region == "explicit" else 0)
        if self.region == "explicit" and self.region_end is not None:
            end = torch.minimum(end, column(p + self.region_end)) if per_row(p) else \
                end.clamp(max=p + self.region_end)
        return (pos >= column(start)) & (pos < end)

    def aggregate(self, values: Tensor, focus: Tensor) -> Tensor:
        """``stat`` of ``values [B, L]`` over ``focus [B, L]`` per row -> ``[B]`` (empty: -inf)."""
        n = focus.sum(1)
        if self.stat == "mean":
            out = torch.where(focus, values, 0.0).sum(1) / n.clamp(min=1)
        else:
            out = order_stat(values, focus, n, self.stat, self.q)
        return torch.where(n > 0, out, -torch.inf)

    def statistic(self, state: StepState) -> Tensor:
        """``[B]`` float32 ḡ of this step over the focus set (fresh margins only)."""
        region, gen = self.region_mask(state), self._gen(state)
        focus = region & state.masked if self.average_over_masked else region & gen
        return self.aggregate(state.proposal.logit_margin.float(), focus)

    @staticmethod
    def _gen(state: StepState) -> Tensor:
        """``[B, L]`` (``[1, L]`` for a shared start) bool: inside the generation."""
        return positions(state.masked.shape[1], state.masked.device) >= column(state.gen_start)

    # ---- the stopper -------------------------------------------------------------------
    def should_stop(self, state: StepState) -> Tensor:
        """``[B]`` bool: commit every remaining mask at its argmax now. No host sync."""
        mem = state.memory.stopper if isinstance(state.memory, PairedMemory) else None
        if mem is None and (self.gated or self.stale == "use"):
            raise ValueError("SchED with the stability gate or stale='use' needs its memory: "
                             "use the 'sched'/'prophet' presets or Supervised(selector, "
                             "stopper); max_change_ratio=1 and patience_steps=0 run stateless")
        return decide(self, state, mem)


_SCHED_FIELDS = frozenset(f.name for f in fields(SchED))
def supervise(base: str | Any, stopper: Any, base_params: dict[str, Any], name: str) -> Policy:
    """Compose a base preset (or selector object) with ``stopper`` into a ``Policy``."""
    if not isinstance(base, str) and base_params:
        raise ValueError(f"parameters {sorted(base_params)} given for a base selector object")
    built = make_policy(base, **base_params)
    if built.stopper is not None:
        raise ValueError(f"base policy {built.name!r} already has a stopper")
    return Policy(selector=Supervised(built.selector, stopper), stopper=stopper,
                  truncator=built.truncator, name=name)


def sched_policy(base: str | Any = "entropy", **params: Any) -> Policy:
    """The ``sched`` preset: ``SchED`` (released defaults: cosine 7.5 -> 2.5, mean over the
    masked canvas, gate on) over ``base`` (Dream ``entropy`` in the released code). Parameters
    that are ``SchED`` fields go to the stopper, the rest to the base preset."""
    stopper = SchED(**{k: v for k, v in params.items() if k in _SCHED_FIELDS})
    rest = {k: v for k, v in params.items() if k not in _SCHED_FIELDS}
    return supervise(base, stopper, rest, "sched")


def prophet_policy(base: str | Any = "low_confidence", answer_offset: int = 0,
                   answer_length: int = 5, tau_high: float = 7.5, tau_mid: float = 5.0,
                   tau_low: float = 2.5, max_change_ratio: float = 1.0,
                   **params: Any) -> Policy:
    """The ``prophet`` preset (Prophet, arXiv 2508.19982) as a SchED special case.

    Mean logit margin over the masked positions of an answer window of ``answer_length``
    positions starting ``answer_offset`` into the generation (Prophet puts it right after
    forced anchor tokens such as "The answer is"; injecting anchors is task-specific and not
    done here), against 7.5 / 5.0 / 2.5 on thirds of the phase clock. Prophet has no stability
    gate (``max_change_ratio=1``); SchED's re-implementation keeps the 0.0 gate, pass
    ``max_change_ratio=0.0`` to match it (it also runs Dream ``entropy`` as the base; LLaDA's
    ``low_confidence``, the default here, is Dream's ``maskgit_plus``). Other ``SchED`` fields
    and base parameters pass on.
    """
    if answer_length < 1:
        raise ValueError(f"answer_length must be >= 1, got {answer_length}")
    stopper = SchED(tau_mode="piecewise", tau_high=tau_high, tau_mid=tau_mid, tau_low=tau_low,
                    region="explicit", region_start=answer_offset,
                    region_end=answer_offset + answer_length, max_change_ratio=max_change_ratio,
                    **{k: v for k, v in params.items() if k in _SCHED_FIELDS})
    rest = {k: v for k, v in params.items() if k not in _SCHED_FIELDS}
    return supervise(base, stopper, rest, "prophet")

