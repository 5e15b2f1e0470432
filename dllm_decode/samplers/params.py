"""Where each ``DiffusionSampler`` keyword goes, with clear errors for the ones that go nowhere.

``DiffusionSampler(model, policy, cache, **params)`` mixes ``SamplerConfig`` fields with the
policy's own parameters (``tau``, ``gamma``, ...). A keyword that is neither is reported with
the closest valid name; parameters beside a policy *object* are an error (the object is
already configured: build it with them instead).
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from typing import Any

from dllm_decode.config import SamplerConfig
from dllm_decode.policies.registry import Policy, accepted_params


def split_params(policy: Any, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``params`` -> (``SamplerConfig`` fields, policy parameters). Raises ``ValueError``."""
    names = set(SamplerConfig.field_names())
    cfg_params = {k: v for k, v in params.items() if k in names}
    policy_params = {k: v for k, v in params.items() if k not in names}
    if not policy_params:
        return cfg_params, policy_params
    if not isinstance(policy, str):
        kind = policy.name if isinstance(policy, Policy) else type(policy).__name__
        raise ValueError(
            f"keyword(s) {sorted(policy_params)} are neither SamplerConfig fields nor allowed "
            f"beside a policy object ({kind}): configure the object itself (e.g. "
            f"Threshold(tau=0.9)) or pass a preset name (policy='threshold', tau=0.9)"
            f"{_hints(policy_params, names)}")
    accepted = accepted_params(policy, policy_params)
    unknown = sorted(set(policy_params) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ValueError(
            f"unknown keyword(s) {unknown}: not a SamplerConfig field and not a parameter of "
            f"policy {policy!r} (its parameters: {sorted(accepted or [])})"
            f"{_hints(unknown, names | set(accepted or []))}")
    return cfg_params, policy_params


def replace_config(cfg: SamplerConfig, overrides: dict[str, Any]) -> SamplerConfig:
    """``dataclasses.replace`` with a clear error (and a suggestion) for unknown fields."""
    names = set(SamplerConfig.field_names())
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"unknown generate() option(s) {unknown}; SamplerConfig fields: "
                         f"{sorted(names)}{_hints(unknown, names)}")
    return replace(cfg, **overrides)


def _hints(keys: Any, valid: set[str]) -> str:
    out = []
    for key in sorted(keys):
        close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
        if close:
            out.append(f"{key!r} -> did you mean {close[0]!r}?")
    return ("; " + ", ".join(out)) if out else ""
