"""Measure how far an approximate cache (prefix / dual / sub_block) drifts from full
recomputation.

Between refreshes the cached K/V of positions outside the fed span are stale; this runs a real
decode with the cache and, at every step, recomputes the full canvas to compare the logits of
the scored rows. Used by the tests and by ``benchmarks/bench_decode.py`` to report drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.policies.capabilities import Capabilities, capabilities_of
from dllm_decode.policies.resolve import make_policy
from dllm_decode.types import CacheMode, StepState


@dataclass(frozen=True)
class _Probe:
    """Wraps a selector and records the step's logits (declares ``needs_logits``)."""

    inner: Any
    records: list = field(default_factory=list)

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped selector's, with ``needs_logits``."""
        return replace(capabilities_of(self.inner), needs_logits=True)

    def init_memory(self, batch: int, length: int, device: torch.device) -> list:
        return self.records

    def bind(self, model: Any, cfg: Any = None) -> _Probe:
        """The probe over the bound selector (the same record list)."""
        bind = getattr(self.inner, "bind", None)
        return self if bind is None else replace(self, inner=bind(model, cfg))

    def select(self, state: StepState) -> Tensor:
        # the canvas rows of the logits ([R] or [B, R] per row) and whether each is scored
        rows = state.rows if state.rows is not None else state.fresh[0].nonzero().flatten()
        rows = rows if rows.dim() == 2 else rows[None].expand(state.canvas.shape[0], -1)
        scored = state.fresh.gather(1, rows)
        refreshed = (state.refreshed if state.refreshed is not None
                     else torch.full_like(scored[:, 0], bool(state.extras["refresh"])))
        state.memory.append((state.canvas.clone(), rows.clone(), state.logits.clone(),
                             refreshed.clone(), state.eligible.gather(1, rows), scored))
        return self.inner.select(state)


@torch.inference_mode()
def measure_drift(model: Any, prompt: Tensor, *, gen_length: int, block_length: int,
                  mode: str = "dual", policy: str = "low_confidence", steps: int | None = None,
                  **params: Any) -> dict[str, float]:
    """Decode with ``mode`` and compare each step's logits with a full forward.

    Returns max / mean absolute logit drift over the scored rows of non-refresh steps (per
    row: ``sub_block`` refreshes rows one by one), the argmax agreement with full recomputation
    on eligible rows, and the max difference on refreshed rows (which must be ~0). ``prompt``
    ``[B, P]`` without padding.
    """
    from dllm_decode.samplers.sampler import DiffusionSampler

    base = make_policy(policy, **params)
    probe = _Probe(base.selector)
    sampler = DiffusionSampler(model, probe, cache=mode, gen_length=gen_length,
                               block_length=block_length, steps=steps)
    sampler.generate(prompt)
    records = probe.records
    valid = torch.ones(prompt.shape[0], prompt.shape[1] + gen_length, dtype=torch.bool)
    full_plan = ForwardPlan(model, CacheMode.NONE, valid, model.rope_positions(valid))
    drift, agree, total, refresh_max = [], 0, 0, 0.0
    length = valid.shape[1]
    for canvas, rows, logits, refreshed, eligible, scored in records:
        full = full_plan.forward(canvas, (0, length), 0, 0, 0, full_span=True).logits
        full = full.gather(1, rows[..., None].expand(-1, -1, full.shape[-1]))
        keep = torch.isfinite(logits) & scored[..., None]  # the mask token's logit is -inf
        diff = torch.where(keep, (logits.float() - full.float()).abs(), 0.0)
        if refreshed.any():
            refresh_max = max(refresh_max, float(diff[refreshed].max()))
        stale = ~refreshed
        if not stale.any():
            continue
        drift.append(diff[stale])
        el = (eligible & scored)[stale]
        agree += int((logits.argmax(-1) == full.argmax(-1))[stale][el].sum())
        total += int(el.sum())
    stacked = torch.cat([d.flatten() for d in drift]) if drift else torch.zeros(1)
    return {
        "steps": float(len(records)),
        "max_abs_logit_drift": float(stacked.max()),
        "mean_abs_logit_drift": float(stacked.mean()),
        "argmax_agreement": agree / max(total, 1),
        "compared": float(total),  # eligible rows behind the agreement (0: none was stale)
        "refresh_max_abs": refresh_max,
    }
