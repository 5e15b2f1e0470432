"""DAWN (``policies.dawn``) and the attention maps it reads (``models.attention_maps``):
conformance to the authors' ``generate(dawn=True)`` token for token (prompt included: the
position-0 quirk overwrites it), NFE and each step's H / I / C / fallback split; the quirk's
fix (``checked``), the excluded-neighbour option (``neighbours="union"``), the capture itself,
refusals, batch rows and Dream.

The recorded cases (``tests/fixtures/methods2026/dawn.json``, recorded by
``benchmarks/conformance/record_dawn.py``) run on ``../shared/conformance/llada-tiny``; the Dream
cases (``dawn_dream.json``, the same recorder with ``--family dream``: the authors'
``diffusion_generate(alg='dawn')``) on ``../shared/conformance/dream-tiny``; both skip when
``../shared`` is absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.policies.capabilities import capabilities_of
from dllm_decode.policies.dawn import Dawn
from dllm_decode.policies.resolve import compose, make_policy
from dllm_decode.train.testbed import waiting_line_oracle
from dllm_decode.types import Proposal, StepState
from tests.conformance import RelativeNoise as Noisy
from tests.conformance import conformance_model
from tests.helpers import tiny_model
from tests.mock_models import ScriptedLM, from_probs

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "methods2026" / "dawn.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
DREAM_CASES = json.loads(FIXTURE.with_name("dawn_dream.json").read_text())["cases"]


def _llada() -> Any:
    return conformance_model("llada-tiny")


def _dream() -> Any:
    model = conformance_model("dream-tiny")
    assert model.mask_token_id == 440
    return model


def _policy(case: dict, **extra: Any) -> Dawn:
    a = case["args"]
    return Dawn(tau_sink=a["tau_sink"], tau_edge=a["tau_edge"], tau_induce=a["tau_induce"],
                tau_low=a["tau_low"], attention_layers=a["attention_layers"], **extra)


def _positions(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask[0]).flatten().tolist()


def _decode(model: Any, case: dict, policy: Dawn | None = None,
            **extra: Any) -> tuple[Any, list[dict]]:
    a = case["args"]
    policy = policy or _policy(case)
    steps: list[dict] = []

    def record(state: StepState, commit: torch.Tensor) -> None:
        sets = policy.sets(state)
        steps.append({"high": _positions(sets.high), "induced": _positions(sets.induced),
                      "free": _positions(sets.free), "fallback": _positions(sets.fallback),
                      "overwrite": bool(sets.overwrite[0].any())})
        assert torch.equal(commit, sets.high | sets.induced | sets.free | sets.fallback)

    if "top_k" in a:  # the reference call's top-k filter (a Dream case without top_k=None)
        extra.setdefault("top_k", a["top_k"])
    out = DiffusionSampler(model, policy, debug=True, **extra).generate(
        torch.tensor(case["prompt_ids"]), gen_length=a["gen_length"],
        block_length=a["block_length"], on_step=record)
    return out, steps


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_dawn_case(case: dict) -> None:
    """The whole canvas (prompt included), NFE and every step's H / I / C / fallback split
    and position-0 overwrite, as the reference's own locals had them."""
    out, steps = _decode(_llada(), case)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.forwards == out.steps == int(out.nfe[0]) == case["nfe"]
    assert steps == case["steps"]


@pytest.mark.parametrize("case", CASES[:3] + CASES[5:6], ids=lambda c: c["name"])
def test_dawn_case_under_logit_noise(case: dict) -> None:
    """The recorded cases hold with relative 1e-6 noise on every logit, and with the
    reference's confidence (the mask token's column kept, ``rng="reference"``)."""
    out, steps = _decode(Noisy(_llada(), 1e-6, seed=7), case)
    assert out.tokens.tolist() == case["output_ids"] and out.forwards == case["nfe"]
    assert steps == case["steps"]
    ref, _ = _decode(_llada(), case, rng="reference")
    assert ref.tokens.tolist() == case["output_ids"] and ref.forwards == case["nfe"]


def test_recorded_cases_exercise_every_set() -> None:
    """Every set of the rule and the quirk occur, and the quirk changes the prompt's first
    token in some cases (and not in others)."""
    steps = [s for c in CASES for s in c["steps"]]
    for key in ("high", "induced", "free", "fallback"):
        assert sum(bool(s[key]) for s in steps) > 20, key
    assert sum(len(s["free"]) > 1 for s in steps) > 5
    assert sum(s["overwrite"] for s in steps) >= 5
    changed = [c["output_ids"][0][0] != c["prompt_ids"][0][0] for c in CASES]
    assert 3 <= sum(changed) < len(CASES)


def test_checked_stops_at_the_last_candidate() -> None:
    """``checked=True``: the prompt is never edited; a case without the quirk decodes the same,
    a case with it keeps its first token."""
    model = _llada()
    picked = ("dawn_defaults", "dawn_quirk_edge03", "dawn_low_floor", "dawn_short_scaled")
    for case in [c for c in CASES if c["name"] in picked]:
        out, steps = _decode(model, case, _policy(case, checked=True))
        assert out.edits is None and not any(s["overwrite"] for s in steps)
        assert out.tokens[0, :len(case["prompt_ids"][0])].tolist() == case["prompt_ids"][0]
        if not any(s["overwrite"] for s in case["steps"]):
            assert out.tokens.tolist() == case["output_ids"] and out.forwards == case["nfe"]
        if case["name"] == "dawn_quirk_edge03":
            assert out.tokens.tolist() != case["output_ids"]


# ---- the authors' Dream path ----------------------------------------------------------------

@pytest.mark.parametrize("case", DREAM_CASES, ids=[c["name"] for c in DREAM_CASES])
def test_dawn_dream_case(case: dict) -> None:
    """Dream (``_sample_block``'s ``alg == 'dawn'`` branch: shifted logits, its
    ``sample_tokens`` confidence): the whole canvas, NFE and every step's sets, with the same
    selector and settings as LLaDA (the rule is the same; only the taus' defaults differ)."""
    out, steps = _decode(_dream(), case)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.forwards == out.steps == int(out.nfe[0]) == case["nfe"]
    assert steps == case["steps"]


@pytest.mark.parametrize("case", DREAM_CASES[:1] + DREAM_CASES[7:8] + DREAM_CASES[11:12],
                         ids=lambda c: c["name"])
def test_dawn_dream_case_under_logit_noise(case: dict) -> None:
    """The Dream cases hold with relative 1e-6 noise on every logit, and with
    ``rng="reference"``."""
    out, steps = _decode(Noisy(_dream(), 1e-6, seed=11), case)
    assert out.tokens.tolist() == case["output_ids"] and out.forwards == case["nfe"]
    assert steps == case["steps"]
    ref, _ = _decode(_dream(), case, rng="reference")
    assert ref.tokens.tolist() == case["output_ids"] and ref.forwards == case["nfe"]


def test_dream_cases_exercise_every_set_and_the_top_k_call() -> None:
    """Every set and the quirk occur on Dream (x[0] takes the shifted argmax there, the raw
    output of position 0); the case recorded with the reference's inherited ``top_k=50`` needs
    it (its confidences are the filtered softmax's)."""
    steps = [s for c in DREAM_CASES for s in c["steps"]]
    for key in ("high", "induced", "free", "fallback"):
        assert sum(bool(s[key]) for s in steps) > 20, key
    assert sum(s["overwrite"] for s in steps) >= 5
    changed = [c["output_ids"][0][0] != c["prompt_ids"][0][0] for c in DREAM_CASES]
    assert 3 <= sum(changed) < len(DREAM_CASES)
    case = next(c for c in DREAM_CASES if "top_k" in c["args"])
    _, steps = _decode(_dream(), case, top_k=None)
    assert steps != case["steps"]


def test_dream_checked_keeps_the_prompt() -> None:
    """``checked=True`` on Dream: no edit, the prompt kept; a case without the quirk is
    unchanged."""
    picked = ("dream_script", "dream_quirk_edge03", "dream_loose_induce")
    for case in [c for c in DREAM_CASES if c["name"] in picked]:
        out, steps = _decode(_dream(), case, _policy(case, checked=True))
        assert out.edits is None and not any(s["overwrite"] for s in steps)
        assert out.tokens[0, :len(case["prompt_ids"][0])].tolist() == case["prompt_ids"][0]
        if not any(s["overwrite"] for s in case["steps"]):
            assert out.tokens.tolist() == case["output_ids"] and out.forwards == case["nfe"]
        else:
            assert out.tokens.tolist() != case["output_ids"]


# ---- one hand-built step ----------------------------------------------------------------------

def _state(prob: list[float], edges: list[tuple[int, int]], masked: list[bool],
           block: tuple[int, int]) -> StepState:
    """A one-row step over ``L = len(prob)`` positions: ``edges`` ``(i, j)``: query j attends
    key i with 0.2 (no sink at tau_sink 0.5, an edge at tau_edge 0.1)."""
    length = len(prob)
    attn = torch.zeros(1, length, length)
    for i, j in edges:
        attn[0, j, i] = 0.2
    p = torch.tensor([prob])
    m = torch.tensor([masked])
    eligible = m & (torch.arange(length) >= block[0]) & (torch.arange(length) < block[1])
    return StepState(proposal=Proposal(torch.zeros(1, length, dtype=torch.long), p),
                     eligible=eligible, masked=m, fresh=torch.ones_like(m),
                     canvas=torch.zeros(1, length, dtype=torch.long), step=0, block=0,
                     block_start=block[0], block_end=block[1], gen_start=2, steps_left=None,
                     budget=None, progress=0.0, generator=None, forward_start=0,
                     forward_width=length, attention=attn)


def test_sets_of_a_hand_built_step() -> None:
    """Prompt 0-1 (1: an anchor at 0.95), block 2-7. I = {2} (edge 1 -> 2, c 0.8), H = {3}
    (0.95) with an edge 3 -> 4, which puts 4 in ``X`` only with ``neighbours="union"``. Nodes
    4, 5, 6 (0.75, 0.8, 0.8), conflicts 4 - 5 and 5 - 6: 5 goes first (equal confidences: the
    lower index) and drops both, so C = {5} < |N| = 3 and the quirk overwrites position 0."""
    prob = [0.5, 0.95, 0.8, 0.95, 0.75, 0.8, 0.8]
    edges = [(1, 2), (3, 4), (5, 6), (4, 5)]
    masked = [False, False, True, True, True, True, True]
    state = _state(prob, edges, masked, (2, 7))
    base = dict(tau_sink=0.5, tau_edge=0.1)
    sets = Dawn(**base).sets(state)
    assert _positions(sets.high) == [3] and _positions(sets.induced) == [2]
    assert _positions(sets.free) == [5] and not sets.fallback.any()
    assert _positions(sets.overwrite) == [0]
    assert not Dawn(**base, checked=True).sets(state).overwrite.any()
    union = Dawn(**base, neighbours="union").sets(state)
    assert _positions(union.free) == [5] and _positions(union.overwrite) == [0]  # N = {5, 6}
    # without the 5 - 6 conflict, 5 goes first, then 6 (4 fell with 5): still |C| < |N|
    free = Dawn(**base).sets(_state(prob, edges[:2] + edges[3:], masked, (2, 7)))
    assert _positions(free.free) == [5, 6] and free.overwrite.any()
    # no conflict at all: every node, no quirk
    calm = Dawn(**base).sets(_state(prob, edges[:2], masked, (2, 7)))
    assert _positions(calm.free) == [4, 5, 6] and not calm.overwrite.any()
    # nothing qualifies: the most confident eligible position (ties to the lower index)
    low = Dawn(**base).sets(_state([0.5, 0.5, 0.3, 0.6, 0.6, 0.2, 0.1], [], masked, (2, 7)))
    assert _positions(low.fallback) == [3] and not low.free.any()


def test_sinks_are_removed_before_the_edges() -> None:
    """A key column whose mean attention exceeds tau_sink carries no edge."""
    prob = [0.95, 0.5, 0.8, 0.5]
    state = _state(prob, [(0, 2)], [False, True, True, True], (1, 4))
    assert _positions(Dawn(tau_sink=0.1, tau_edge=0.1).sets(state).induced) == [2]
    # column 0 mean 0.2 / 4 = 0.05 > 0.04: a sink
    assert not Dawn(tau_sink=0.04, tau_edge=0.1).sets(state).induced.any()


# ---- the loop: capture, refusals, batches, Dream ----------------------------------------------

def test_attention_capture_is_the_forward_softmax() -> None:
    """The capture averages softmax(q k^T / sqrt(D)) over heads, then layers; it leaves the
    forward's logits unchanged, hides masked keys and removes its hooks."""
    model = tiny_model("dream", seed=3)  # GQA, q/k/v biases, shifted logits
    tokens = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9).expand(2, -1)
    mask = torch.ones(2, 9, 9, dtype=torch.bool)
    mask[1, :, :3] = False
    plain = model(tokens, pos, mask=mask)
    with model.capture_attention(2) as cap:
        logits = model(tokens, pos, mask=mask)
    assert torch.equal(plain, logits)
    maps = cap.mean()
    assert maps.shape == (2, 9, 9)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 9))
    assert (maps[1, :, :3] == 0).all()
    assert all(not layer.attn._forward_pre_hooks for layer in model.layers)
    with model.capture_attention(1) as last:
        model(tokens, pos, mask=mask)
    with model.capture_attention(99) as every:  # more than the model has: every layer
        model(tokens, pos, mask=mask)
    assert torch.equal(every.mean(), maps) and not torch.equal(last.mean(), maps)


def test_refused_without_attention_maps_or_with_a_cache() -> None:
    """The oracle and a scripted model have no attention; cached forwards have no L x L map."""
    prompt = torch.tensor([[1, 2, 3]])
    scripted = ScriptedLM(lambda call: from_probs(torch.full((*call.tokens.shape, 16), 1 / 16)))
    for model in (waiting_line_oracle(), scripted):
        with pytest.raises(ValueError, match="cannot materialise them") as err:
            DiffusionSampler(model, "dawn").generate(prompt, gen_length=4)
        assert "\n" not in str(err.value)
    model = tiny_model("llada", seed=1)
    with pytest.raises(ValueError, match="needs cache='none'"):
        DiffusionSampler(model, "dawn", cache="dual").generate(prompt, gen_length=4,
                                                                block_length=4)
    with pytest.raises(ValueError, match="neighbours"):
        Dawn(neighbours="both")
    caps = capabilities_of(make_policy("dawn").selector)
    assert caps.attention_maps == 4 and caps.edits and caps.edits_prompt and not caps.budgeted


def test_batch_rows_decode_as_alone() -> None:
    """Rows of a batch decode as each alone (LLaDA: the quirk fires in these rows)."""
    model = _llada()
    prompts = torch.randint(0, 499, (3, 60), generator=torch.Generator().manual_seed(5))
    policy = Dawn(tau_edge=0.03)
    sampler = DiffusionSampler(model, policy, debug=True)
    both = sampler.generate(prompts, gen_length=64, block_length=32)
    assert (both.tokens[:, 0] != prompts[:, 0]).tolist() == [True, False, True]
    for row in range(3):
        alone = sampler.generate(prompts[row:row + 1], gen_length=64, block_length=32)
        assert torch.equal(both.tokens[row], alone.tokens[0])
        assert int(both.nfe[row]) == int(alone.nfe[0])


def test_padded_rows_decode_as_alone() -> None:
    """Dream (shifted logits, RoPE positions that skip left padding): rows of different
    prompt lengths decode as alone, the quirk's overwrite included (it edits the row's first
    valid position); the sink mean runs over the valid query rows."""
    model = tiny_model("dream", seed=2)
    gen = torch.Generator().manual_seed(3)
    long, short = torch.randint(3, 40, (1, 26), generator=gen), torch.randint(
        3, 40, (1, 20), generator=gen)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 6, dtype=torch.long), short], 1)])
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :6] = 0
    sampler = DiffusionSampler(model, Dawn(tau_sink=0.05, tau_edge=0.05), debug=True)
    both = sampler.generate(ids, attention_mask, gen_length=32, block_length=16)
    overwritten = []
    for row, prompt in enumerate((long, short)):
        alone = sampler.generate(prompt, gen_length=32, block_length=16)
        assert torch.equal(both.tokens[row, 26 - prompt.shape[1]:], alone.tokens[0])
        assert int(both.nfe[row]) == int(alone.nfe[0])
        overwritten.append(bool(alone.tokens[0, 0] != prompt[0, 0]))
    assert overwritten == [True, False]


def test_dream_and_composition() -> None:
    """Dream (shifted logits) decodes to the end; a SchED stopper and EoTP compose."""
    model = tiny_model("dream", seed=2)
    prompt = torch.randint(3, 40, (2, 30), generator=torch.Generator().manual_seed(1))
    for extra in ({}, {"stopper": "sched"}, {"truncator": "eotp"}):
        out = DiffusionSampler(model, compose("dawn", **extra), debug=True).generate(
            prompt, gen_length=32, block_length=16)
        assert not (out.answer == model.mask_token_id).any()
        assert out.forwards <= 32
