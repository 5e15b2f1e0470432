"""Measure how far an approximate cache (prefix / dual) drifts from full recomputation.

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
from dllm_decode.policies.registry import make_policy
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

    def select(self, state: StepState) -> Tensor:
        rows = state.fresh[0].nonzero().flatten()
        state.memory.append((state.canvas.clone(), rows, state.logits.clone(),
                             bool(state.extras["refresh"]), state.eligible.clone()))
        return self.inner.select(state)


@torch.inference_mode()
def measure_drift(model: Any, prompt: Tensor, *, gen_length: int, block_length: int,
                  mode: str = "dual", policy: str = "low_confidence", steps: int | None = None,
                  **params: Any) -> dict[str, float]:
    """Decode with ``mode`` and compare each step's logits with a full forward.

    Returns max / mean absolute logit drift over the scored rows of non-refresh steps, the
    argmax agreement with full recomputation on eligible rows, and the max difference on refresh
    steps (which must be ~0).
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
    for canvas, rows, logits, refresh, eligible in records:
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        full = full_plan.forward(canvas, (lo, hi), lo, 0, lo, full_span=False).logits
        keep = torch.isfinite(logits)  # the sampler sets the mask token's logit to -inf
        diff = torch.where(keep, (logits.float() - full.float()).abs(), 0.0)
        if refresh:
            refresh_max = max(refresh_max, float(diff.max()))
            continue
        drift.append(diff)
        el = eligible[:, rows]
        agree += int((logits.argmax(-1) == full.argmax(-1))[el].sum())
        total += int(el.sum())
    stacked = torch.cat([d.flatten() for d in drift]) if drift else torch.zeros(1)
    return {
        "steps": float(len(records)),
        "max_abs_logit_drift": float(stacked.max()),
        "mean_abs_logit_drift": float(stacked.mean()),
        "argmax_agreement": agree / max(total, 1),
        "refresh_max_abs": refresh_max,
    }
