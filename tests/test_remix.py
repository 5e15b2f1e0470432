"""ReMix (``policies.remix``): conformance to the authors' ``decoding_remix``, token for token
with the step count, each step's commits and each step's mixed (soft-input) positions; the
sticky-rejection quirk and its fix, the soft-input path, refusals and batch invariance.

The recorded cases (``tests/fixtures/methods2026/remix.json``, recorded by
``benchmarks/conformance/record_remix.py``) run on ``../shared/conformance/llada-tiny`` and skip
when ``../shared`` is absent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.policies.remix import (
    REMIX_TASKS,
    Remix,
    js_divergence,
    remix_policy,
    soft_embedding,
)
from dllm_decode.policies.resolve import make_policy
from tests.conformance import GaussianNoise as Noisy
from tests.conformance import conformance_model
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "methods2026" / "remix.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def _llada() -> Any:
    return conformance_model("llada-tiny")


@dataclass(frozen=True)
class Recording(Remix):
    """``Remix`` keeping, per forward, the answer positions fed a mixed embedding (a masked
    position whose input differs from the mask embedding), as the recorder reads them off the
    reference's ``inputs_embeds``."""

    start: int = 0
    log: list = field(default_factory=list, compare=False)

    def mix_inputs(self, embeds: Any, canvas: Any, memory: Any, weight: Any, mask_id: int,
                    block: tuple[int, int], step: int, block_step: int) -> Any:
        out = super().mix_inputs(embeds, canvas, memory, weight, mask_id, block, step,
                                  block_step)
        p = self.start
        mixed = (canvas[0, p:] == mask_id) & (out[0, p:] != weight[mask_id]).any(-1)
        self.log.append(torch.nonzero(mixed).flatten().tolist())
        return out


def _decode(model: Any, case: dict, **extra: Any) -> tuple[Any, list, list]:
    args = case["args"]
    p = len(case["prompt_ids"][0])
    policy = Recording(threshold=args["threshold"], js_threshold=args["js_threshold"],
                       beta_mix=args["beta_mix"], start=p, **extra)
    commits: list[list[int]] = []
    out = DiffusionSampler(model, policy, debug=True).generate(
        torch.tensor(case["prompt_ids"]), gen_length=args["gen_length"],
        block_length=args["block_length"],
        on_step=lambda s, c: commits.append(torch.nonzero(c[0, p:]).flatten().tolist()))
    return out, commits, policy.log


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_remix_case(case: dict) -> None:
    """Tokens, NFE (the reference's step count: one forward per step), each step's commits
    and each forward's mixed positions."""
    out, commits, mixed = _decode(_llada(), case)
    assert out.tokens.tolist() == case["output_ids"], case["name"]
    assert out.steps == out.forwards == int(out.nfe[0]) == case["nfe"]
    assert commits == case["commits_per_step"]
    assert mixed == case["mixed_per_step"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_remix_case_under_logit_noise(case: dict) -> None:
    """The recorded cases hold with N(0, 1e-6) noise on every logit."""
    out, commits, mixed = _decode(Noisy(_llada(), 1e-6, seed=7), case)
    assert out.tokens.tolist() == case["output_ids"]
    assert out.steps == case["nfe"]
    assert commits == case["commits_per_step"] and mixed == case["mixed_per_step"]


def test_recorded_cases_exercise_every_branch() -> None:
    """The cases mix, reject (a masked block position left out of the mixing while others
    are mixed: sticky, it never comes back), hit the cap (20) and the single fallback."""
    steps = [(c, m) for case in CASES
             for c, m in zip(case["commits_per_step"], case["mixed_per_step"], strict=True)]
    assert sum(len(m) for _, m in steps) > 100
    assert any(len(c) == 20 for c, _ in steps) and any(len(c) == 1 for c, _ in steps)
    shrinking = [len(a) - len(b) - len(set(a) & set(c))
                 for case in CASES
                 for a, b, c in zip(case["mixed_per_step"], case["mixed_per_step"][1:],
                                    case["commits_per_step"][1:], strict=False) if a and b]
    assert any(d > 0 for d in shrinking), "some mixed position was rejected"
    for case in CASES:  # sticky: once out of the mixing (and still masked), never back
        seen: set[int] = set()
        for mixed in case["mixed_per_step"]:
            if not mixed:
                seen = set()  # a block start (or nothing mixed): a new block's state
                continue
            assert not seen or set(mixed) <= seen, case["name"]
            seen = set(mixed)


def test_sticky_quirk_and_its_fix() -> None:
    """A rejected (zeroed) row scores JS ~ ln2/2 against any sharp distribution, above the
    default 0.3: rejected again for good. ``sticky=False`` tests the real last distribution:
    rejected positions come back into the mixing, other tokens, everything still decodes."""
    v = 512
    sharp = torch.full((v,), 1e-4 / (v - 1))
    sharp[3] = 1 - 1e-4
    js = float(js_divergence(torch.zeros(v), sharp))
    assert abs(js - math.log(2) / 2) < 0.01 and js > 0.3
    case = next(c for c in CASES if c["name"] == "gsm8k_two_blocks")
    fixed, _, mixed = _decode(_llada(), case, sticky=False)
    assert sum(map(len, mixed)) > sum(map(len, case["mixed_per_step"]))
    assert not (fixed.answer == 500).any()


def test_soft_embedding_rule() -> None:
    """Top-1 always kept; the kept mass (not renormalised) weights W's rows, the rest the mask
    embedding; a zero row is the mask embedding."""
    weight = torch.randn(8, 4)
    e = weight[7]
    h = torch.tensor([0.02, 0.5, 0.3, 0.08, 0.06, 0.0, 0.0, 0.0])
    # alpha = clip(2 * 0.5, .2, .9) = .9: cumsum .5, .8, .88 kept, .94 not
    want = 0.5 * weight[1] + 0.3 * weight[2] + 0.08 * weight[3] + (1 - 0.88) * e
    assert torch.allclose(soft_embedding(h, weight, e), want, atol=1e-6)
    top = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.05, 0.95, 0.0])
    assert torch.allclose(soft_embedding(top, weight, e), 0.95 * weight[6] + 0.05 * e,
                          atol=1e-6)  # alpha .9 < .95: the top-1 alone, always kept
    flat = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1, 0.0, 0.0, 0.0])
    assert torch.allclose(soft_embedding(flat, weight, e),
                          0.3 * weight[0] + 0.25 * weight[1] + 0.45 * e,
                          atol=1e-6)  # alpha .6: cumsum .3, .55 kept, .75 not
    assert torch.equal(soft_embedding(torch.zeros(8), weight, e), e)


def test_batch_rows_decode_as_alone() -> None:
    model = _llada()
    prompts = torch.randint(0, 400, (3, 7), generator=torch.Generator().manual_seed(5))
    sampler = DiffusionSampler(model, "remix", threshold=0.8, js_threshold=0.2, debug=True)
    both = sampler.generate(prompts, gen_length=32, block_length=16)
    for row in range(3):
        alone = sampler.generate(prompts[row:row + 1], gen_length=32, block_length=16)
        assert torch.equal(both.tokens[row], alone.tokens[0])
        assert int(both.nfe[row]) == int(alone.nfe[0])


def test_mixing_changes_the_decode() -> None:
    """``beta_mix=0`` feeds the mask embedding (WINO's drafting rule, ``wide_in``); ReMix's
    mixing changes tokens or steps on the recorded cases."""
    model = _llada()
    differs = 0
    for case in CASES[:4]:
        args = case["args"]
        prompt = torch.tensor(case["prompt_ids"])
        kw = dict(gen_length=args["gen_length"], block_length=args["block_length"])
        plain = DiffusionSampler(model, "wide_in", threshold=args["threshold"]).generate(
            prompt, **kw)
        zero = DiffusionSampler(model, Remix(threshold=args["threshold"], beta_mix=0.0)
                                ).generate(prompt, **kw)
        assert torch.equal(plain.tokens, zero.tokens) and plain.steps == zero.steps
        differs += plain.tokens.tolist() != case["output_ids"] or plain.steps != case["nfe"]
    assert differs


def test_temperature_is_ignored() -> None:
    """The reference ignores ``temperature`` (argmax): the same tokens at 0.8, any seed."""
    model = _llada()
    prompt = torch.randint(0, 400, (2, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(gen_length=32, block_length=16)
    greedy = DiffusionSampler(model, "remix", threshold=0.8).generate(prompt, **kw)
    hot = DiffusionSampler(model, "remix", threshold=0.8).generate(prompt, temperature=0.8,
                                                                   seed=5, **kw)
    assert torch.equal(greedy.tokens, hot.tokens) and greedy.steps == hot.steps


def test_preset_defaults_and_tasks() -> None:
    assert remix_policy() == Remix(threshold=0.9, js_threshold=0.3, beta_mix=0.5)
    assert remix_policy(task="countdown") == Remix(threshold=0.8, beta_mix=0.6)
    assert remix_policy(task="mbpp", threshold=0.7).threshold == 0.7
    assert set(REMIX_TASKS) >= {"gsm8k", "math500", "humaneval", "sudoku"}
    with pytest.raises(ValueError, match="task"):
        remix_policy(task="nope")
    assert make_policy("remix").selector.capabilities.soft_inputs


def test_refusals() -> None:
    """A cache, CFG and a model without an input-embedding path are refused with one line
    each."""
    model = _llada()
    prompt = torch.randint(0, 400, (1, 5), generator=torch.Generator().manual_seed(1))
    for kw, words in ((dict(cache="prefix"), "cache='none'"), (dict(cfg_scale=1.0), "CFG")):
        with pytest.raises(ValueError, match=words):
            DiffusionSampler(model, "remix", **kw).generate(prompt, gen_length=16,
                                                            block_length=16)

    class NoEmbeddings:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name in ("feed_embeddings", "input_embedding"):
                raise AttributeError(name)
            return getattr(self._inner, name)

        def __call__(self, *a: Any, **k: Any) -> Any:
            return self._inner(*a, **k)

    with pytest.raises(ValueError, match="input-embedding path"):
        DiffusionSampler(NoEmbeddings(model), "remix").generate(prompt, gen_length=16,
                                                                block_length=16)


def test_dream_family_runs() -> None:
    """Dream-family (shifted logits) models run it: everything decodes, mixing happens."""
    model = tiny_model("dream", seed=3)
    policy = Recording(threshold=0.5, js_threshold=0.3, start=6)
    prompt = torch.randint(0, 60, (1, 6), generator=torch.Generator().manual_seed(2))
    out = DiffusionSampler(model, policy, debug=True).generate(prompt, gen_length=16,
                                                               block_length=8)
    assert not (out.answer == model.mask_token_id).any()
    assert out.forwards == out.steps and any(policy.log)
