"""SAID (``policies.said``): conformance to the authors' code, its schedule and its options.

Cases in ``tests/fixtures/methods2026/said.json`` were recorded by
``benchmarks/conformance/record_said.py`` (its docstring has the command) from
``TH-AI-Lab-PKU/SAID`` @ a2d7f60, ``SAID-v1/my_generate_said.py::generate`` (preset ``said``)
and ``SAID-block/generate_said.py::generate_said`` (preset ``said_block``), run unmodified on
``../shared/conformance/llada-tiny`` (skipped when ``../shared`` is absent) with the code's
literal EOS / EoT ids mapped onto llada-tiny's vocabulary (the fixture's ``meta.patched``).
Each case was kept only if 1e-6 relative logit noise (three seeds) leaves it unchanged; each is
replayed here plain and with such noise: tokens, NFE (the code's model calls, its idle forwards
included) and the step at which every answer position was committed. The fixture's
``meta.unit_vectors`` hold the code's ``said_stage_partition`` / ``compute_stage_steps`` on a
grid, which the library's functions must equal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.policies import make_policy
from dllm_decode.policies.said import (
    Said,
    block_timeline,
    compute_stage_steps,
    said_stage_partition,
)
from tests.conformance import CONFORMANCE, require_shared
from tests.conformance import RelativeNoise as Noisy

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "methods2026" / "said.json")
                     .read_text())
CASES = FIXTURE["cases"]
NOISE = 1e-6
_MODEL: list[Any] = []


def _llada_tiny(noisy: bool = False) -> Any:
    if not _MODEL:
        _MODEL.append(load_model(require_shared(CONFORMANCE / "llada-tiny")))
    return Noisy(_MODEL[0], NOISE, seed=7) if noisy else _MODEL[0]


def settings(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The case's call as a preset and ``DiffusionSampler`` keywords (every argument mapped)."""
    a = dict(case["args"])
    assert a.pop("temperature") == 0.0 and a.pop("cfg_scale") == 0.0, case["name"]
    assert a.pop("remasking") == "low_confidence" and a.pop("mask_id") == 500, case["name"]
    params: dict[str, Any] = dict(gen_length=a.pop("gen_length"), steps=a.pop("steps"),
                                  logits_eos_inf=a.pop("logits_eos_inf"),
                                  demote_stops=a.pop("confidence_eos_eot_inf"))
    if case["reference_function"] == "generate":
        name = "said"
        need = params["steps"] + 2 + 3  # the scaffold, probe, easy and hard forwards at most
        if need > params["gen_length"]:
            params["max_steps_per_block"] = need
    else:
        assert case["reference_function"] == "generate_said", case["name"]
        name = "said_block"
        params |= dict(block_length=a.pop("block_length"), num_stages=a.pop("num_stages"),
                       rec_steps=a.pop("rec_steps"))
    assert not a, f"{case['name']}: unmapped {sorted(a)}"
    return name, params


def _split(n: int, steps: int) -> list[int]:
    """``n`` split over ``steps`` as the code's ``get_num_transfer_tokens``, zeros dropped."""
    base, rem = divmod(n, steps)
    return [q for q in (base + (i < rem) for i in range(steps)) if q]


def _commit_steps(case: dict[str, Any]) -> list[int]:
    """The recorded forward after which each answer position was committed."""
    g = case["args"]["gen_length"]
    out = [-1] * g
    for step, positions in enumerate(case["commits_per_step"]):
        for pos in positions:
            out[pos] = step
    return out


def _run(case: dict[str, Any], noisy: bool = False, **extra: Any) -> Any:
    name, params = settings(case)
    sampler = DiffusionSampler(_llada_tiny(noisy), name, debug=True, **params | extra)
    return sampler.generate(torch.tensor(case["prompt_ids"]))


@pytest.mark.parametrize("rng", ["compact", "reference"])
@pytest.mark.parametrize("noisy", [False, True], ids=["plain", "noise1e-6"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_said_case(case: dict[str, Any], noisy: bool, rng: str) -> None:
    """``rng="reference"``: the proposal's confidence keeps the mask token in the softmax, as
    the code; ``compact`` drops it (both give the recorded cases)."""
    out = _run(case, noisy, rng=rng)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.forwards == case["nfe"], case["name"]
    assert out.commit_step[0].tolist() == _commit_steps(case), case["name"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_without_idle_forwards_same_tokens_fewer_forwards(case: dict[str, Any]) -> None:
    """The fix: a forward that commits nothing (v1's probe, quota-0 steps) is folded into the
    next one, which sees the same canvas: the tokens stay, the NFE drops by the idle ones."""
    out = _run(case, idle_forwards=False)
    idle = sum(not step for step in case["commits_per_step"])
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.forwards == case["nfe"] - idle, case["name"]


def test_cases_cover_the_spec() -> None:
    """Both variants, both prompt parities, an empty easy set, a hard set under 3, idle
    scaffold / stage forwards, both EOS options, K = 1, 2, 3, 4, several blocks."""
    v1 = [c for c in CASES if c["reference_function"] == "generate"]
    block = [c for c in CASES if c["reference_function"] == "generate_said"]
    assert len(v1) >= 8 and len(block) >= 8
    assert {len(c["prompt_ids"][0]) % 2 for c in v1} == {0, 1}
    after_probe = [[len(s) for s in c["commits_per_step"][c["args"]["steps"] + 1:]]
                   for c in v1]
    assert any(rest == _split(sum(rest), 3) for rest in after_probe)  # easy = {}
    assert any(len(rest) in (2, 3) and set(rest[1:]) == {1} for rest in after_probe)  # |hard|<3
    assert any(not step for c in v1 for step in c["commits_per_step"][:c["args"]["steps"]])
    assert {c["args"]["num_stages"] for c in block} >= {1, 2, 3, 4}
    assert any(c["args"]["gen_length"] > c["args"]["block_length"] for c in block)
    for key in ("logits_eos_inf", "confidence_eos_eot_inf"):
        assert {c["args"][key] for c in CASES} == {False, True}
    assert "126081" in FIXTURE["meta"]["patched"]


def test_stage_functions_equal_the_code() -> None:
    units = FIXTURE["meta"]["unit_vectors"]
    for length, k, stages in units["said_stage_partition"]:
        assert [list(s) for s in said_stage_partition(length, k)] == stages, (length, k)
    for k, total, rec, steps in units["compute_stage_steps"]:
        assert list(compute_stage_steps(k, total, rec)) == steps, (k, total, rec)


def test_spec_examples() -> None:
    assert said_stage_partition(8, 3) == ((0, 4), (2, 6), (1, 3, 5, 7))
    for total, steps in ((4, (1, 1, 2)), (8, (5, 1, 2)), (32, (23, 7, 2)), (128, (95, 31, 2))):
        assert compute_stage_steps(3, total, 2) == steps
    # a stage with fewer positions than steps spends them (quota 0), unless idle=False
    assert block_timeline(16, 8, 3, 2) == ((0, 1),) * 4 + ((0, 0), (1, 4), (2, 4), (2, 4))
    assert block_timeline(16, 8, 3, 2, idle=False) == ((0, 1),) * 4 + ((1, 4), (2, 4), (2, 4))


def test_stage_of_a_position_is_the_partition() -> None:
    """``_select_block``'s arithmetic stage index equals ``said_stage_partition``'s."""
    for k in (1, 2, 3, 4, 5):
        for length in (1, 5, 8, 13, 32):
            rel = torch.arange(length)
            depth = sum(((rel % 2 ** j) == 0).long() for j in range(1, k))
            arith = ((k - 1) - depth).tolist() if k > 1 else [0] * length
            want = [0] * length
            for stage, positions in enumerate(said_stage_partition(length, k)):
                for p in positions:
                    want[p] = stage
            assert arith == want, (k, length)


def test_presets_and_defaults() -> None:
    v1, block = make_policy("said").selector, make_policy("said_block").selector
    assert (v1.variant, v1.easy_threshold, v1.hard_steps, v1.demote_stops) == ("v1", 0.8, 3,
                                                                            True)
    assert (block.variant, block.num_stages, block.rec_steps, block.demote_stops) == (
        "block", 3, 2, True)
    model = _llada_tiny()
    # the scripts' steps: v1 gen_length / 2, block gen_length / 4; stop ids: the model's
    s = DiffusionSampler(model, "said", gen_length=32)
    assert s.policy.selector.bind(model, s.config).total_steps == 16
    s = DiffusionSampler(model, "said_block", gen_length=64, block_length=16)
    bound = s.policy.selector.bind(model, s.config)
    assert (bound.total_steps, bound.n_blocks, bound.stop_ids) == (16, 4, (499,))
    out = s.generate(torch.tensor([[5, 6, 7]]))
    assert out.forwards == 4 * len(block_timeline(16, 4, 3, 2))


def test_refusals() -> None:
    model = _llada_tiny()
    prompt = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="greedy"):
        DiffusionSampler(model, "said", gen_length=16, temperature=0.5).generate(prompt)
    with pytest.warns(UserWarning, match="max_steps_per_block=21"):  # 16 + probe + easy + 3
        cut = DiffusionSampler(model, "said", gen_length=16, steps=16).generate(prompt)
    assert cut.forwards == 16  # the cap's step committed what was left
    with pytest.raises(ValueError, match="confidence_eos_eot_inf"):
        DiffusionSampler(model, "said_block", gen_length=16,
                         confidence_eos_eot_inf=True).generate(prompt)
    with pytest.raises(ValueError, match="variant"):
        Said(variant="v2")
    ok = DiffusionSampler(model, "said", gen_length=16, steps=16, max_steps_per_block=21)
    assert 16 + 1 < ok.generate(prompt).forwards <= 21


def test_v1_in_blocks_runs_the_schedule_per_block() -> None:
    """The code has one block; in blocks, each block runs its own v1 (T = steps // blocks):
    its even positions in T steps (quotas split evenly), the probe, then its odd ones."""
    model = _llada_tiny()
    out = DiffusionSampler(model, "said", gen_length=32, block_length=16, steps=8).generate(
        torch.tensor([[5, 6, 7, 8]]))  # prompt of 4: answer offset j has parity j
    steps = out.commit_step[0].tolist()
    first = 0
    for block in (steps[:16], steps[16:]):
        rel = [s - first for s in block]
        even, odd = rel[0::2], rel[1::2]
        assert sorted(even) == [0, 0, 1, 1, 2, 2, 3, 3]  # T = 4, 8 positions
        assert min(odd) == 5  # step 4: the probe commits nothing
        first += max(rel) + 1
    assert out.forwards == first


def test_stop_ids_are_the_models_and_the_sampled_asymmetry() -> None:
    """EOS and EoT of the model; at temperature > 0 the code zeroes EoT alone (its in-place
    edit of EOS lands on the Gumbel tensor), unless ``eos_eot_asymmetry=False``."""
    from types import SimpleNamespace  # noqa: PLC0415

    model = SimpleNamespace(eos_token_ids=(7,), spec=SimpleNamespace(eot_token_id=9),
                            vocab_size=12)
    greedy, sampled = (SimpleNamespace(gen_length=8, temperature=t) for t in (0.0, 0.7))
    assert Said(variant="block").bind(model, greedy).stop_ids == (7, 9)
    assert Said(variant="block").bind(model, sampled).stop_ids == (9,)
    both = Said(variant="block", eos_eot_asymmetry=False).bind(model, sampled)
    assert both.stop_ids == (7, 9)
    assert Said(variant="block", stop_ids=(3,)).bind(model, greedy).stop_ids == (3,)


def test_demotion_ranks_stop_proposals_last() -> None:
    """With ``demote_stops`` a position proposing EOS gets confidence 0 and the others
    ``p / (1 - p_eos)``; without it the plain ``p``."""
    from dllm_decode.types import Proposal, StepState  # noqa: PLC0415

    logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 2.5, 0.0], [1.0, 0.0, 0.5]]])  # EOS = 1
    prob = torch.softmax(logits, -1)
    tokens = logits.argmax(-1)
    state = StepState(
        proposal=Proposal(tokens, prob.max(-1).values, None, None, None),
        eligible=torch.ones(1, 3, dtype=torch.bool), masked=torch.ones(1, 3, dtype=torch.bool),
        fresh=torch.ones(1, 3, dtype=torch.bool), canvas=torch.zeros(1, 3, dtype=torch.long),
        step=0, block=0, block_start=0, block_end=3, gen_start=0, steps_left=None,
        budget=None, progress=0.0, generator=None, forward_start=0, forward_width=3,
        logits=logits, rows=torch.arange(3))
    conf = Said(stop_ids=(1,)).confidence(state)[0]
    rest = torch.softmax(logits[0][:, [0, 2]], -1).max(-1).values.double()
    assert conf[0] == 0 and conf[1] == 0  # both propose EOS
    assert torch.allclose(conf[2], rest[2])
    plain = Said(stop_ids=(1,), demote_stops=False).confidence(state)[0]
    assert torch.allclose(plain, prob[0].max(-1).values.double())
