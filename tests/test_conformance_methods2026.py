"""Conformance of the 2026 methods to their authors' code, token for token with NFE.

Cases in ``tests/fixtures/methods2026/`` were recorded from the authors' public code by
``record_cases.py`` there (its docstring has the command): Fast-dLLM++'s ``generate`` /
``generate_with_prefix_cache`` / ``generate_with_dual_cache`` with ``frechet_margin``
(``frechet``), DUS's ``generate_scheduled(scheduler="dilated")`` and ``generate(n_transfer=
"inc_dilated")`` (``dus``), dInfer's ``BlockWiseDiffusionLLM`` with its credit and threshold
decoders (``credit``, ``threshold``), on ``../shared/conformance/llada-tiny`` (skipped when
``../shared`` is absent) and on scripted logits. Every case was kept only if 1e-6 relative
logit noise leaves it unchanged; each is replayed here plain and with such noise on the
library's forward, so fp32 rounding on another CPU cannot flip it.

The sampled Fréchet cases (temperature 0.7, seeded) run every loop, prefix and dual cache
included: Fast-dLLM++'s prefix loop draws one Gumbel tensor per forward, so the library must not
apply Fast-dLLM's discarded second draw there (``samplers.proposals.PREFIX_DOUBLE_DRAW``; with
it, every sampled prefix case fails).

dInfer's ``BlockRunner`` may forward a finished block again (it checks for masks only every
``unroll_k`` forwards): its NFE counts those, ``nfe_useful`` does not, and the library must
equal ``nfe_useful`` (the recorded cases show how many forwards the check saves).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from tests.conformance import CONFORMANCE, require_shared
from tests.conformance import RelativeNoise as Noisy
from tests.mock_models import ScriptedLM, by_step

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = Path(__file__).parent / "fixtures" / "methods2026"
NOISE = 1e-6
#: dInfer's threshold also commits what lies within 1e-5 of the best (``Threshold.tie_window``;
#: the recorder checked that the cases are the same without it)
DINFER_TIE_WINDOW = 1e-5
_MODEL: list[Any] = []


def _cases(name: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / f"{name}.json").read_text())["cases"]


FRECHET, DUS, CREDIT = _cases("frechet"), _cases("dus"), _cases("credit")
CACHES = {"generate": "none", "generate_with_prefix_cache": "prefix",
          "generate_with_dual_cache": "dual"}


def _llada_tiny(noisy: bool) -> Any:
    if not _MODEL:
        _MODEL.append(load_model(require_shared(CONFORMANCE / "llada-tiny")))
    return Noisy(_MODEL[0], NOISE, seed=7) if noisy else _MODEL[0]


def frechet_settings(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    a = case["args"]
    assert a["remasking"] == "low_confidence" and set(a) == {
        "steps", "gen_length", "block_length", "temperature", "remasking", "mask_id",
        "frechet_margin"}, case["name"]
    return "frechet", dict(delta=a["frechet_margin"], gen_length=a["gen_length"],
                           block_length=a["block_length"], steps=a["steps"],
                           temperature=a["temperature"], seed=case["seed"], rng="reference",
                           sampling="gumbel", schedule="llada",
                           cache=CACHES[case["reference_function"]])


def dus_settings(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    a = case["args"]
    params: dict[str, Any] = dict(gen_length=a["gen_length"], block_length=a["block_length"])
    if case["reference_function"] == "generate_scheduled":
        assert a["scheduler"] == "dilated" and a["confidence_threshold"] == 0.0, case["name"]
        return "dus", params | dict(base=a["base"], skip_exp=a["base_skip"])
    assert a["n_transfer"] == "inc_dilated", case["name"]
    return "dus", params | dict(order="confidence")  # the code's base 2, skip 1


def credit_settings(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    a = dict(case["args"])
    kind = a.pop("decoder")
    params: dict[str, Any] = dict(gen_length=a.pop("gen_length"),
                                  block_length=a.pop("block_length"), tau=a.pop("threshold"),
                                  tie_window=DINFER_TIE_WINDOW,
                                  block_eos_stop=True)  # dInfer's early_stop=True
    if kind == "credit":
        params |= {k: a.pop(k) for k in ("credit_alpha", "boost_gamma", "decay_beta")}
    assert not a, f"{case['name']}: unmapped {sorted(a)}"
    return kind, params


def _run(case: dict[str, Any], policy: str, params: dict[str, Any], noisy: bool) -> Any:
    prompt = torch.tensor(case["prompt_ids"])
    if "scripted_logits" in case:
        model = ScriptedLM(by_step(torch.tensor(case["scripted_logits"])),
                           vocab_size=case["vocab_size"], mask_token_id=case["mask_id"],
                           eos_token_ids=(case["eos_id"],))
        model = Noisy(model, NOISE, seed=7) if noisy else model
    else:
        model = _llada_tiny(noisy)
        assert case["args"].get("mask_id", model.mask_token_id) == model.mask_token_id
    return DiffusionSampler(model, policy, debug=True, **params).generate(prompt)


@pytest.mark.parametrize("noisy", [False, True], ids=["plain", "noise1e-6"])
@pytest.mark.parametrize("case", FRECHET, ids=[c["name"] for c in FRECHET])
def test_frechet_case(case: dict[str, Any], noisy: bool) -> None:
    out = _run(case, *frechet_settings(case), noisy)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.forwards == case["nfe"], case["name"]


@pytest.mark.parametrize("noisy", [False, True], ids=["plain", "noise1e-6"])
@pytest.mark.parametrize("case", DUS, ids=[c["name"] for c in DUS])
def test_dus_case(case: dict[str, Any], noisy: bool) -> None:
    out = _run(case, *dus_settings(case), noisy)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.forwards == case["nfe"], case["name"]


@pytest.mark.parametrize("noisy", [False, True], ids=["plain", "noise1e-6"])
@pytest.mark.parametrize("case", CREDIT, ids=[c["name"] for c in CREDIT])
def test_credit_case(case: dict[str, Any], noisy: bool) -> None:
    out = _run(case, *credit_settings(case), noisy)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.forwards == case["nfe_useful"] <= case["nfe"], case["name"]


def test_sampled_cached_frechet_cases_present() -> None:
    """The public set pins Fast-dLLM++'s sampled cached loops (prefix and dual)."""
    sampled = {c["reference_function"] for c in FRECHET if c["args"]["temperature"] > 0}
    assert sampled == set(CACHES)
    prefix = [c for c in FRECHET if c["args"]["temperature"] > 0
              and c["reference_function"] == "generate_with_prefix_cache"]
    assert len(prefix) >= 3 and any(len(c["prompt_ids"]) > 1 for c in prefix)


def test_fixtures_carry_their_provenance() -> None:
    for name in ("frechet", "dus", "credit"):
        data = json.loads((FIXTURES / f"{name}.json").read_text())
        assert "record_cases.py" in data["meta"]["command"]
        for case in data["cases"]:
            assert case["reference_repo"] and len(case["reference_commit"]) == 40
            assert case["reference_function"] and case["checks"], case["name"]
