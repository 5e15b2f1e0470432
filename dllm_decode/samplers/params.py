"""Where each ``DiffusionSampler`` keyword goes, with clear errors for the ones that go nowhere.

``DiffusionSampler(model, policy, cache, **params)`` and ``build_sampler`` (the CLI / grid
spelling, with ``stopper=`` / ``truncator=`` and ``stopper.NAME`` / ``truncator.NAME``
parameters) mix ``SamplerConfig`` fields with the policy's own parameters (``tau``, ``gamma``,
...). ``build_policy`` is the one path for both: a keyword that is neither is reported with the
closest valid name; parameters beside a policy *object* are an error (the object is already
configured: build it with them instead).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dllm_decode.config import SamplerConfig
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.resolve import resolve_policy, unknown_params
from dllm_decode.policies.resolve import split_params as split_parts


def split_params(policy: Any, params: Mapping[str, Any], *, stopper: Any = None,
                 truncator: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``params`` -> (``SamplerConfig`` fields, policy parameters). Raises ``ValueError``."""
    names = set(SamplerConfig.field_names())
    cfg_params = {k: v for k, v in params.items() if k in names}
    policy_params = {k: v for k, v in params.items() if k not in names}
    if not policy_params:
        return cfg_params, policy_params
    selector_params = split_parts(policy_params)["selector"]
    if selector_params and not isinstance(policy, str):
        kind = policy.name if isinstance(policy, Policy) else type(policy).__name__
        raise ValueError(
            f"keyword(s) {sorted(selector_params)} are neither SamplerConfig fields nor allowed "
            f"beside a policy object ({kind}): configure the object itself (e.g. "
            f"Threshold(tau=0.9)) or pass a preset name (policy='threshold', tau=0.9)"
            f"{_hints(selector_params, names)}")
    bad = unknown_params(policy, policy_params, stopper=stopper, truncator=truncator)
    if bad:
        unknown = [k for k, _ in bad]
        accepted = sorted({a for _, valid in bad for a in valid})
        what = f"policy {policy!r}" + "".join(
            f" / {role} {spec!r}" for role, spec in (("stopper", stopper),
                                                      ("truncator", truncator)) if spec)
        raise ValueError(
            f"unknown keyword(s) {unknown}: not a SamplerConfig field and not a parameter of "
            f"{what} (its parameters: {accepted}){_hints(unknown, names | set(accepted))}")
    return cfg_params, policy_params


def build_policy(policy: Any, params: Mapping[str, Any] | None = None, *, stopper: Any = None,
                 truncator: Any = None) -> tuple[dict[str, Any], Policy]:
    """(``SamplerConfig`` fields, the composed ``Policy``) from the flat keywords."""
    cfg_params, policy_params = split_params(policy, dict(params or {}), stopper=stopper,
                                             truncator=truncator)
    return cfg_params, resolve_policy(policy, policy_params, stopper=stopper, truncator=truncator)


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
