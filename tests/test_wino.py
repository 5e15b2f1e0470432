"""WINO (``policies.wino``): conformance to the authors' ``decoding_wino``, token for token with
the step count and each step's commits and re-masks; its reductions, batch invariance,
termination and block-diffusion use.

The recorded cases (``tests/fixtures/methods2026/wino.json``, recorded by
``benchmarks/conformance/record_wino.py``) run on ``../shared/conformance/llada-tiny`` and skip
when ``../shared`` is absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.policies.resolve import make_policy
from dllm_decode.policies.wino import LAST_ACCEPT_INIT, WideIn, Wino
from tests.conformance import GaussianNoise as Noisy
from tests.conformance import conformance_model
from tests.helpers import tiny_model
from tests.mock_models import Call, ScriptedLM, from_probs

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "methods2026" / "wino.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def _llada() -> Any:
    return conformance_model("llada-tiny")


def _decode(model: Any, case: dict, **extra: Any) -> tuple[Any, list[list[int]]]:
    args = case["args"]
    commits: list[list[int]] = []
    p = len(case["prompt_ids"][0])
    sampler = DiffusionSampler(model, "wino", threshold=args["threshold"],
                               threshold_back=args["threshold_back"], debug=True, **extra)
    out = sampler.generate(torch.tensor(case["prompt_ids"]), gen_length=args["gen_length"],
                           block_length=args["block_length"],
                           on_step=lambda s, c: commits.append(
                               (torch.nonzero(c[0, p:]).flatten()).tolist()))
    return out, commits


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_wino_case(case: dict) -> None:
    """Tokens, steps (the reference's NFE) and every step's commits and re-masks; the
    library's forwards are the steps plus one shadow forward per step after a block's first."""
    out, commits = _decode(_llada(), case)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.steps == case["nfe"]
    assert commits == [s["committed"] for s in case["steps"]]
    remasked = [torch.nonzero(e).flatten().tolist() for e in out.edits[0]]
    assert remasked == [s["remasked"] for s in case["steps"]]
    blocks = case["args"]["gen_length"] // case["args"]["block_length"]
    assert out.forwards == 2 * out.steps - blocks == int(out.nfe[0])


@pytest.mark.parametrize("case", CASES[:4], ids=[c["name"] for c in CASES[:4]])
def test_wino_case_under_logit_noise(case: dict) -> None:
    """The recorded cases hold with N(0, 1e-6) noise on every logit (any CPU's fp32 rounding
    is far below that)."""
    out, _ = _decode(Noisy(_llada(), 1e-6, seed=7), case)
    assert out.tokens.tolist() == case["output_ids"]
    assert out.steps == case["nfe"]


def test_recorded_cases_exercise_every_branch() -> None:
    """The cases re-mask (capped and uncapped), commit several tokens a step, and hit the
    wide-in cap: the branches the conformance is meant to cover."""
    steps = [s for c in CASES for s in c["steps"]]
    assert sum(len(s["remasked"]) for s in steps) > 100
    assert any(len(s["committed"]) > 5 for s in steps)
    assert any(len(s["committed"]) == 1 for s in steps)


def _wide_in_vs(model: Any, policy: Any, **kw: Any) -> tuple[Any, Any]:
    prompt = torch.randint(0, 400, (2, 6), generator=torch.Generator().manual_seed(4))
    common = dict(gen_length=16, block_length=8, debug=True)
    base = DiffusionSampler(model, WideIn(threshold=0.4), **common).generate(prompt)
    other = DiffusionSampler(model, policy, **common, **kw).generate(prompt)
    return base, other


def test_without_verification_wino_is_its_drafting_rule() -> None:
    """``verify=False``: exactly ``WideIn`` (no shadow forward); ``threshold_back=0`` (no
    verification can fail): the same tokens, with the shadow forwards counted."""
    model = _llada()
    base, off = _wide_in_vs(model, Wino(WideIn(threshold=0.4), verify=False))
    assert torch.equal(base.tokens, off.tokens) and torch.equal(base.nfe, off.nfe)
    assert off.edits is None
    _, never = _wide_in_vs(model, Wino(WideIn(threshold=0.4), threshold_back=0.0))
    assert torch.equal(base.tokens, never.tokens) and base.steps == never.steps
    assert never.forwards == 2 * never.steps - 2 and not never.edits.any()


def test_batch_rows_decode_as_alone() -> None:
    model = _llada()
    prompts = torch.randint(0, 400, (3, 7), generator=torch.Generator().manual_seed(5))
    sampler = DiffusionSampler(model, "wino", threshold=0.3, debug=True)
    both = sampler.generate(prompts, gen_length=16, block_length=8)
    assert both.edits.any(), "the batch re-masks"
    for row in range(3):
        alone = sampler.generate(prompts[row:row + 1], gen_length=16, block_length=8)
        assert torch.equal(both.tokens[row], alone.tokens[0])
        assert int(both.nfe[row]) == int(alone.nfe[0])


def test_sampled_run_repeats_with_its_seed() -> None:
    model = _llada()
    prompt = torch.randint(0, 400, (2, 5), generator=torch.Generator().manual_seed(6))
    sampler = DiffusionSampler(model, "wino", threshold=0.3)
    runs = [sampler.generate(prompt, gen_length=16, block_length=8, temperature=0.8, seed=11)
            for _ in range(2)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert not (runs[0].answer == model.mask_token_id).any()


def _always_unsure(vocab: int = 16) -> Any:
    """Every row: top-1 probability 0.95 on a token that depends on the canvas, so every
    shadow verification (the canvas changed since) fails: maximal re-masking."""

    def script(call: Call) -> torch.Tensor:
        b, n = call.tokens.shape
        top = (call.tokens.sum(1, keepdim=True) + torch.arange(n)) % (vocab - 2)
        probs = torch.full((b, n, vocab), 0.05 / (vocab - 1))
        probs.scatter_(-1, top[..., None], 0.95)
        return from_probs(probs)

    return script


def test_decoding_terminates_under_maximal_remasking() -> None:
    """A model whose every verification fails: each block still ends (the re-mask cap keeps
    the committed count growing), within its length in steps; with a step cap below that,
    the cap's last step commits what is left and re-masks nothing."""
    model = ScriptedLM(_always_unsure())
    prompt = torch.tensor([[1, 2, 3]])
    out = DiffusionSampler(model, Wino(WideIn(threshold=0.5)), debug=True).generate(
        prompt, gen_length=16, block_length=8)
    assert out.edits.any()
    assert not (out.answer == model.mask_token_id).any()
    assert out.steps <= 16
    capped = DiffusionSampler(model, Wino(WideIn(threshold=0.5)), debug=True,
                              max_steps_per_block=3).generate(prompt, gen_length=16,
                                                              block_length=8)
    assert capped.steps == 6 and not (capped.answer == model.mask_token_id).any()
    assert not capped.edits[0, 2].any() and not capped.edits[0, 5].any()


def test_last_accept_bounds_the_remasks() -> None:
    """A step re-masks at most the previous step's commit count minus one."""
    model = ScriptedLM(_always_unsure())
    commits: list[int] = []
    out = DiffusionSampler(model, Wino(WideIn(threshold=0.5)), debug=True).generate(
        torch.tensor([[1, 2, 3]]), gen_length=16, block_length=16,
        on_step=lambda s, c: commits.append(int(c.sum())))
    remasks = out.edits[0].sum(1).tolist()
    assert remasks[0] == 0
    for before, now in zip(commits[:-1], remasks[1:], strict=True):
        assert now <= max(before - 1, 0)
    assert LAST_ACCEPT_INIT == 30


def test_wino_on_block_diffusion_model() -> None:
    """SDAR-style model: the shadow rows see the prefix and the current block; the exact
    block-causal cache gives the tokens of the uncached run."""
    model = load_model("tiny-sdar")
    prompt = torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(8))
    runs = {c: DiffusionSampler(model, "wino", threshold=0.3, cache=c, debug=True).generate(
        prompt, gen_length=12) for c in ("none", "block_causal")}
    assert torch.equal(runs["none"].tokens, runs["block_causal"].tokens)
    assert runs["none"].steps == runs["block_causal"].steps
    assert not (runs["none"].answer == model.mask_token_id).any()


def test_shifted_logits_are_refused() -> None:
    dream = tiny_model("dream", seed=1)
    with pytest.raises(ValueError, match="position-aligned logits"):
        DiffusionSampler(dream, "wino").generate(torch.tensor([[5, 6]]), gen_length=4)
    out = DiffusionSampler(dream, "wino", verify=False).generate(torch.tensor([[5, 6]]),
                                                                  gen_length=4)
    assert not (out.answer == dream.mask_token_id).any()


def test_preset_defaults_and_errors() -> None:
    policy = make_policy("wino")
    assert policy.selector == Wino(WideIn(threshold=0.6), threshold_back=0.9)
    assert make_policy("wino", task="mbpp").selector.draft.threshold == 0.8
    with pytest.raises(ValueError, match="task must be one of"):
        make_policy("wino", task="trivia")
    with pytest.raises(ValueError, match="threshold_back"):
        make_policy("wino", threshold_back=1.5)
    with pytest.raises(ValueError, match="accept_max"):
        WideIn(accept_min=6, accept_max=5)
