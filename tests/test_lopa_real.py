"""LoPA (``policies.lopa``, the default rule: not ``checked``) against the authors'
``_generate_enhanced_speculative`` (zhijie-group/LoPA @ 433177a) on a real tiny checkpoint.

Cases: ``tests/fixtures/methods2026/lopa_real.json``, recorded by
``benchmarks/conformance/record_lopa.py --checkpoint ../shared/conformance/fastdllm2-tiny``: the
authors' decoder driving their own ``model_cache/dream/model_dream.py`` ``DreamModel`` loaded with
fastdllm2-tiny's weights, ``use_full_attention=False`` (their block-causal mask, prompt = block 0),
the prompt exactly one block (``bd_size`` 8) long, so their mask is the checkpoint's own and
their prefix cache and stored last logit are exact. Each case is unchanged under relative logit
noise of 1e-6 (most also 1e-5, see ``checks``).

Here the same files load with the library's loader (``load_model``: ``model_type``
``Fast_dLLM_Qwen`` -> the Fast-dLLM v2 family, block-causal, logits shifted by one; the mask id
310 is given since the config omits it) and decode with ``lopa``: tokens and rounds exactly, under
``cache="none"`` and ``cache="block_causal"``. Skips when ``../shared`` is absent.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.models.loading import load_model
from tests.conformance import CONFORMANCE, require_shared

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "methods2026" / "lopa_real.json"
CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]
#: the reference's ``sampling_strategy`` -> ``lopa``'s ``score``
SCORE = {"neg_entropy": "neg_entropy", "default": "prob", "margin": "margin"}


@pytest.fixture(scope="module")
def model() -> Any:
    """The recorded checkpoint, loaded by the library (skips without ``../shared``); its
    bytes must be the recorded ones."""
    spec = CASES[0]["model"]
    directory = require_shared(CONFORMANCE / spec["checkpoint"])
    digest = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    assert digest == spec["sha256"], f"{directory} is not the checkpoint the cases were recorded on"
    return load_model(directory, mask_token_id=spec["mask_id"])


def _params(case: dict[str, Any], **over: Any) -> dict[str, Any]:
    """The case's reference arguments as ``lopa`` parameters (the scale script spawns
    ``branching_factor`` lookaheads, none when it is 1: its ``> 1`` guard)."""
    a = case["args"]
    bf = a["branching_factor"]
    return {"threshold": a["skip_threshold"], "branches": bf if bf > 1 else 0,
            "score": SCORE[a["sampling_strategy"]], "branch_topp": a["branch_topp"],
            "alpha": a["selection_conf_alpha"],
            "force_anchor": a["verification_force_base_winner"], **over}


def _decode(model: Any, case: dict[str, Any], cache: str = "none", **over: Any) -> Any:
    a = case["args"]
    return DiffusionSampler(model, "lopa", cache=cache, debug=True, **_params(case, **over)
                            ).generate(torch.tensor(case["prompt_ids"]),
                                       gen_length=a["max_new_tokens"],
                                       block_length=a["block_size"])


def test_cases_fit_the_checkpoint(model: Any) -> None:
    """What makes the reference's run exact is what the library runs: a block-causal model
    with shifted logits whose block is the cases' block and prompt length, the reference's
    block-causal mask, one block at a time, greedy, no EOS in any answer (so the reference's
    EOS rule never cut a run short)."""
    assert model.attention == "block_causal" and model.logit_shift == 1
    for case in CASES:
        a, spec = case["args"], case["model"]
        assert a["block_size"] == model.block_size == spec["block_size"]
        assert len(case["prompt_ids"][0]) == model.block_size
        assert not a["use_full_attention"] and a["block_add_threshold"] == 1.0
        assert a["temperature"] == 0.0 and len(case["answer_ids"]) == a["max_new_tokens"]
        assert spec["eos_id"] not in case["answer_ids"]
        assert case["forward_rounds"] == case["steps_reported"] - 1


@pytest.mark.parametrize("cache", ["none", "block_causal"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_lopa_real_case(model: Any, case: dict[str, Any], cache: str) -> None:
    """Tokens and rounds exactly (the reference reports one round more: its last one only
    finds every branch finished); without lookaheads one forward per round, as the
    reference's model calls."""
    out = _decode(model, case, cache)
    assert out.answer[0].tolist() == case["answer_ids"], case["name"]
    assert out.steps == case["forward_rounds"], case["name"]
    if _params(case)["branches"] == 0:
        assert out.forwards == out.steps == case["branch_forwards"]
    else:
        assert out.steps < out.forwards <= case["branch_forwards"]


def test_lookaheads_decide_on_the_real_model(model: Any) -> None:
    """The cases check the lookahead logic, not only the base rule: the anchor alone
    (``branches=0``) decodes other tokens or rounds in most of them."""
    differ = []
    for case in CASES:
        if _params(case)["branches"] == 0:
            continue
        base = _decode(model, case, branches=0)
        if base.answer[0].tolist() != case["answer_ids"] or base.steps != case["forward_rounds"]:
            differ.append(case["name"])
    assert len(differ) >= 10, differ
