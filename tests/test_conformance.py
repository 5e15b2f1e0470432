"""Reference-decoder conformance: every recorded case token for token, NFE included.

Cases come from ``../shared/conformance/*/cases.json`` (recorded from ML-GSAI/LLaDA,
NVlabs/Fast-dLLM and Dream's ``diffusion_generate``); settings are mapped generically from each
case's fields, never special-cased. Fast-dLLM 24cc59e's cached loops run one wasted forward when
the refresh already finished the block; the library follows the later revision (f6b35ec), so for
those cases tokens must match and the NFE may be lower than recorded.
"""

from __future__ import annotations

import copy

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from tests.conformance import (
    CONFORMANCE,
    UnmappedCaseField,
    dream_settings,
    llada_settings,
    load_cases,
    require_shared,
    tensors,
)

LLADA = load_cases("llada-tiny")
DREAM = load_cases("dream-tiny")
_MODELS: dict[str, object] = {}


def _model(name: str):
    if name not in _MODELS:
        _MODELS[name] = load_model(require_shared(CONFORMANCE / name))
    return _MODELS[name]


def _wasted_forward_revision(case: dict) -> bool:
    return case.get("reference_commit") == "24cc59e" and case["settings"].get("cache") != "none"


def _check(model, policy: str, params: dict, case: dict, nfe_may_be_lower: bool) -> None:
    prompt, mask = tensors(case)
    out = DiffusionSampler(model, policy, debug=True, **params).generate(prompt, mask)
    expected = torch.tensor(case["output_ids"])
    assert torch.equal(out.tokens, expected), (
        f"{case['name']}: {(out.tokens != expected).sum().item()} positions differ")
    if nfe_may_be_lower:
        assert out.forwards <= case["nfe"]
    else:
        assert out.forwards == case["nfe"], case["name"]


@pytest.mark.parametrize("case", LLADA, ids=[c["name"] for c in LLADA])
def test_llada_case(case: dict) -> None:
    """Recorded: the case's tokens and NFE. Machine-independent: greedy and Gumbel-seeded
    trajectories with boundary margins >= 1e-4, unchanged under fp32 perturbations (weights
    x (1 + 1e-7 N(0, 1)), ``ATEN_CPU_CAPABILITY=default``, ``MKL_CBWR=COMPATIBLE``)."""
    model = _model("llada-tiny")
    policy, params = llada_settings(case, model)
    _check(model, policy, params, case, _wasted_forward_revision(case))


@pytest.mark.parametrize("case", DREAM, ids=[c["name"] for c in DREAM])
def test_dream_case(case: dict) -> None:
    """Recorded: the case's tokens and NFE (machine-independent, as ``test_llada_case``)."""
    model = _model("dream-tiny")
    policy, params = dream_settings(case, model)
    _check(model, policy, params, case, False)


def test_fixtures_present_or_skipped() -> None:
    require_shared(CONFORMANCE)
    assert LLADA and DREAM, "conformance folders exist but hold no cases"


@pytest.mark.parametrize("family, field, where", [
    ("llada", "new_knob", None), ("llada", "new_knob", "settings"), ("llada", "new_knob", "args"),
    ("dream", "new_knob", None), ("dream", "new_knob", "effective_generation_config"),
    ("dream", "new_knob", "args"),
])
def test_harness_raises_on_unmapped_fields(family: str, field: str, where: str | None) -> None:
    """No silent drops: a field the harness does not map is an error, wherever it sits."""
    cases = LLADA if family == "llada" else DREAM
    if not cases:
        pytest.skip("no conformance cases")
    case = copy.deepcopy(cases[0])
    (case if where is None else case.setdefault(where, {}))[field] = 1
    settings = llada_settings if family == "llada" else dream_settings
    with pytest.raises(UnmappedCaseField, match=field):
        settings(case)


def test_harness_raises_on_unknown_values() -> None:
    if not LLADA or not DREAM:
        pytest.skip("no conformance cases")
    case = copy.deepcopy(LLADA[0])
    case["settings"]["remasking"] = "entropy"
    with pytest.raises(UnmappedCaseField, match="remasking"):
        llada_settings(case)
    case = copy.deepcopy(LLADA[0])
    case["args"]["steps"] = case["settings"]["steps"] + 1  # the call and the settings disagree
    with pytest.raises(UnmappedCaseField, match="steps"):
        llada_settings(case)
    case = copy.deepcopy(LLADA[0])
    case["settings"]["mask_id"] = 7
    with pytest.raises(UnmappedCaseField, match="mask_id"):
        llada_settings(case, _model("llada-tiny"))
    case = copy.deepcopy(DREAM[0])
    case["effective_generation_config"]["alg"] = "confidence_threshold"
    with pytest.raises(UnmappedCaseField, match="alg"):
        dream_settings(case)


def test_threshold_and_factor_keep_random_remasking() -> None:
    """``remasking="random"`` reaches the threshold / factor rules as their score."""
    if not LLADA:
        pytest.skip("no conformance cases")
    case = copy.deepcopy(next(c for c in LLADA if c["settings"].get("threshold") is not None))
    case["settings"]["remasking"] = case["args"]["remasking"] = "random"
    policy, params = llada_settings(case)
    assert (policy, params["score"]) == ("threshold", "random")
    case["settings"]["threshold"] = case["args"]["threshold"] = None
    case["settings"]["factor"] = case["args"]["factor"] = 1.0
    assert llada_settings(case)[1]["score"] == "random"
