"""Exact confidence ties broken as LLaDA's ``generate`` breaks them (``rng="reference"``).

Under classifier-free guidance the guided logits grow far apart and several positions get a
confidence of exactly 1.0f. The reference then picks among them with ``torch.topk`` (on a CPU
``std::nth_element``: not the index order), over a confidence computed as a softmax, then a
gather (which can stay below 1.0f where ``exp(z1 - lse)`` rounds to it). With
``rng="reference"`` the library does both the same way; the default keeps its fused
confidence and lower-index ties.

Kind of check: *recorded*. ``tests/fixtures/llada_reference_ties.json`` holds outputs of
ML-GSAI/LLaDA ``generate`` (b7e6c35, unmodified), run from the public code on the conformance
checkpoints ``llada-tiny`` / ``llada-moe-tiny`` (CFG, greedy) and on a scripted model (its
``metadata`` says how, with which commits and versions). The recordings do not depend on the
machine: each was re-run under N(0, σ²) logit noise (σ = 1e-6 and 1e-5, two draws each) and
under ``ATEN_CPU_CAPABILITY=default`` / ``avx2`` and ``MKL_CBWR=COMPATIBLE`` with identical
tokens — its exact ties are at 1.0f (logit gaps beyond ~17 nats, which no fp32 rounding
moves), and ``torch.topk``'s order among equal values is the same under every capability.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.policies.base import reference_topk_mask, topk_mask
from tests.conformance import llada_settings, tensors
from tests.mock_models import FLOOR, ScriptedLM, constant
from tests.moe_helpers import load_fixture

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "llada_reference_ties.json")
                     .read_text())
CONSTRUCTED = FIXTURE["constructed"]
CASES = FIXTURE["cases"]


#: the fixture's fields the conformance harness maps (the rest describe the recording)
MAPPED = ("name", "prompt_ids", "attention_mask", "args", "seed", "output_ids", "nfe")


def _settings(case: dict, model) -> tuple[str, dict]:
    """The LLaDA ``generate`` mapping of the conformance harness (``args`` only)."""
    return llada_settings({k: case[k] for k in MAPPED} | {"settings": {}}, model)


def _scripted(case: dict) -> ScriptedLM:
    """The scripted model the case was recorded on: position i's top token ``i % 14`` at its
    gap (prompt rows 5.0, the answer's ``answer_gaps``), the runner-up at 0, the rest FLOOR."""
    gaps = [case["prompt_gap"]] * len(case["prompt_ids"][0]) + case["answer_gaps"]
    rows = torch.full((len(gaps), case["vocab_size"]), FLOOR)
    for i, gap in enumerate(gaps):
        top = i % case["top_modulus"]
        rows[i, (top + 1) % case["mask_id"]] = 0.0
        rows[i, top] = gap
    return ScriptedLM(constant(rows), vocab_size=case["vocab_size"],
                      mask_token_id=case["mask_id"])


@pytest.mark.parametrize("name", sorted(CONSTRUCTED))
def test_constructed_ties_follow_the_reference(name: str) -> None:
    """Recorded (scripted model): three confidences of exactly 1.0f with two commits at the
    first step, and a 0.99999964f confidence (``exp(z1 - lse)``: 1.0f) beside a 1.0f one:
    the reference's commit order, step by step; the default order differs (lower index)."""
    case = dict(CONSTRUCTED[name], name=name, attention_mask=None, seed=0)
    model = _scripted(case)
    policy, params = _settings(case, model)
    out = DiffusionSampler(model, policy, debug=True, **params).generate(
        torch.tensor(case["prompt_ids"]))
    assert out.tokens.tolist() == case["output_ids"]
    assert out.commit_step[0].tolist() == case["commit_step"]
    assert out.forwards == case["nfe"]
    plain = DiffusionSampler(model.reset(), policy, **(params | {"rng": "compact"})).generate(
        torch.tensor(case["prompt_ids"]))
    assert plain.commit_step[0].tolist() != case["commit_step"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_cfg_tie_case(case: dict) -> None:
    """Recorded (conformance checkpoint, CFG, greedy): tokens and NFE of LLaDA's ``generate``;
    the recording holds exact ties at a top-k boundary (the case is about them)."""
    _, model = load_fixture(case["checkpoint"])
    policy, params = _settings(case, model)
    prompt, mask = tensors(case)
    out = DiffusionSampler(model, policy, debug=True, **params).generate(prompt, mask)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.forwards == case["nfe"], case["name"]
    assert case["checks"]["boundary_ties"]


@pytest.mark.parametrize("checkpoint", sorted({c["checkpoint"] for c in CASES}))
def test_cfg_ties_need_the_reference_order(checkpoint: str) -> None:
    """The recorded cases exercise the tie path: with the default (fused confidence, lower
    index) some of them decode differently."""
    _, model = load_fixture(checkpoint)
    differ = 0
    for case in (c for c in CASES if c["checkpoint"] == checkpoint):
        policy, params = _settings(case, model)
        prompt, mask = tensors(case)
        out = DiffusionSampler(model, policy, **(params | {"rng": "compact"})).generate(
            prompt, mask)
        differ += out.tokens.tolist() != case["output_ids"]
    assert differ > 0


@pytest.mark.parametrize("seed", range(6))
def test_reference_topk_mask_is_torch_topk_per_row(seed: int) -> None:
    """``reference_topk_mask`` = the reference's loop (``torch.topk(confidence[j], k[j])`` per
    row over the span, -inf where not eligible), on rows full of exact ties and a different
    ``k`` per row; ``topk_mask`` picks the same number, ties to the lower index."""
    g = torch.Generator().manual_seed(seed)
    b, length, start = 3, 40, 5
    width = length - start - 3
    score = torch.randint(0, 4, (b, length), generator=g).float() / 3  # many exact ties
    eligible = torch.rand(b, length, generator=g) < 0.7
    eligible[:, :start] = eligible[:, start + width:] = False
    k = torch.minimum(torch.randint(0, 6, (b,), generator=g), eligible.sum(1))
    got = reference_topk_mask(score, eligible, k, start, width)
    for j in range(b):
        conf = torch.where(eligible[j], score[j], -torch.inf)[start:start + width]
        want = torch.zeros(length, dtype=torch.bool)
        want[start + torch.topk(conf, int(k[j])).indices] = True
        assert torch.equal(got[j], want & eligible[j])
    assert torch.equal(got.sum(1), topk_mask(score, eligible, k).sum(1))


def test_reference_order_runs_eagerly() -> None:
    """The reference order reads the budget on the host: the static-buffer step falls back
    with the reason, ``compile=True`` refuses it; the fused eager step is not used."""
    case = dict(CONSTRUCTED["three_exact_ties_k2"], name="c", attention_mask=None, seed=0)
    model = _scripted(case)
    policy, params = _settings(case, model)
    s = DiffusionSampler(model, policy, graphs=True, **params)
    assert s.generate(torch.tensor(case["prompt_ids"])).commit_step[0].tolist() == \
        case["commit_step"]
    assert "tie order" in s.graph_reason
    with pytest.raises(ValueError, match="tie"):
        DiffusionSampler(model.reset(), policy, compile=True, **params).generate(
            torch.tensor(case["prompt_ids"]))
