"""LoPA (``policies.lopa``): conformance to the authors' ``_generate_enhanced_speculative``
token for token with the step count, on the scripted block-causal table model
(``tests/block_table_lm.py``; cases recorded by ``benchmarks/conformance/record_lopa.py``);
its reductions, batch invariance and the cache modes it runs under."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.policies.adaptive import Threshold
from dllm_decode.policies.lopa import Lopa
from dllm_decode.policies.resolve import make_policy
from tests.block_table_lm import BlockTable, TableLM
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "methods2026" / "lopa.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
#: the reference's ``sampling_strategy`` -> ``Lopa.score``
SCORE = {"neg_entropy": "neg_entropy", "default": "prob", "margin": "margin"}


class Noisy(TableLM):
    """The table model with N(0, std) on every logit."""

    def __init__(self, table: BlockTable, eos: int, std: float, seed: int) -> None:
        super().__init__(table, eos)
        self.std, self.gen = std, torch.Generator().manual_seed(seed)

    def forward(self, tokens, positions, **kw):
        out = super().forward(tokens, positions, **kw)
        return out + self.std * torch.randn(out.shape, generator=self.gen)

    __call__ = forward


def _setup(case: dict, std: float = 0.0) -> tuple[Any, Lopa]:
    a, m = case["args"], case["model"]
    table = BlockTable(m["vocab"], m["mask_id"], len(case["prompt_ids"][0]), a["block_size"],
                       seed=m["table_seed"], banned=tuple(m["banned"]))
    model = Noisy(table, m["eot_id"], std, 5) if std else TableLM(table, m["eot_id"])
    bf = a["branching_factor"]
    # the scale script spawns ``branching_factor`` lookaheads, none when it is 1 (``> 1``)
    policy = Lopa(threshold=a["skip_threshold"], branches=bf if bf > 1 else 0,
                  score=SCORE[a["sampling_strategy"]], branch_topp=a["branch_topp"],
                  alpha=a["selection_conf_alpha"],
                  force_anchor=a["verification_force_base_winner"])
    return model, policy


def _decode(model: Any, policy: Any, case: dict, **kw: Any) -> Any:
    a = case["args"]
    return DiffusionSampler(model, policy, debug=True, **kw).generate(
        torch.tensor(case["prompt_ids"]), gen_length=a["max_new_tokens"],
        block_length=a["block_size"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_lopa_case(case: dict) -> None:
    """Tokens and rounds (the reference's forward rounds; it reports one more, its final round
    that only finds every branch finished); each row's NFE is a forward per step plus one per
    step that had a lookahead to run."""
    model, policy = _setup(case)
    out = _decode(model, policy, case)
    assert out.answer[0].tolist() == case["answer_ids"], case["name"]
    assert out.steps == case["forward_rounds"] == case["steps_reported"] - 1
    extra = int(out.nfe[0]) - out.steps
    assert 0 <= extra <= out.steps - 1 and out.forwards >= int(out.nfe[0])
    if policy.branches == 0:
        assert out.forwards == out.steps == case["branch_forwards"]


@pytest.mark.parametrize("case", CASES[2:6], ids=[c["name"] for c in CASES[2:6]])
def test_lopa_case_under_logit_noise(case: dict) -> None:
    model, policy = _setup(case, std=1e-6)
    out = _decode(model, policy, case)
    assert out.answer[0].tolist() == case["answer_ids"]
    assert out.steps == case["forward_rounds"]


def test_cases_where_branches_decide() -> None:
    """The recorded lookaheads change the answer or the rounds in several cases (so winning
    lookaheads, and the next-block decoding of one that completes its block, are covered)."""
    differ = 0
    for case in CASES:
        model, policy = _setup(case)
        base = _decode(model, Lopa(threshold=policy.threshold, branches=0, score=policy.score),
                       case)
        differ += base.answer[0].tolist() != case["answer_ids"] or \
            base.steps != case["forward_rounds"]
    assert differ >= 3


def test_force_anchor_and_zero_branches_are_the_base_rule() -> None:
    """``branches=0`` and ``force_anchor`` decode the base rule's tokens and rounds; with
    ``score="prob"`` that rule is Fast-dLLM's threshold (strict ``>`` aside)."""
    model = tiny_model("llada", seed=3)
    prompt = torch.randint(0, 60, (2, 6), generator=torch.Generator().manual_seed(4))
    common = dict(gen_length=16, block_length=8)
    base = DiffusionSampler(model, Lopa(threshold=0.7, branches=0, score="prob"),
                            debug=True).generate(prompt, **common)
    forced = DiffusionSampler(model, Lopa(threshold=0.7, branches=3, score="prob",
                                          force_anchor=True), debug=True).generate(prompt,
                                                                                   **common)
    fast = DiffusionSampler(model, Threshold(tau=0.7), debug=True).generate(prompt, **common)
    assert torch.equal(base.tokens, forced.tokens) and base.steps == forced.steps
    assert torch.equal(base.tokens, fast.tokens) and torch.equal(base.nfe, fast.nfe)
    assert forced.forwards > base.forwards and forced.positions > base.positions


def test_batch_rows_decode_as_alone() -> None:
    case = CASES[2]
    model, policy = _setup(case)
    prompts = torch.cat([torch.tensor(case["prompt_ids"]),
                         torch.randint(0, 20, (2, len(case["prompt_ids"][0])),
                                       generator=torch.Generator().manual_seed(9))])
    sampler = DiffusionSampler(model, policy, debug=True)
    both = sampler.generate(prompts, gen_length=24, block_length=8)
    for row in range(3):
        alone = sampler.generate(prompts[row:row + 1], gen_length=24, block_length=8)
        assert torch.equal(both.tokens[row], alone.tokens[0])
        assert int(both.nfe[row]) == int(alone.nfe[0])


@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "dllm_cache"])
def test_lopa_under_cache_modes(cache: str) -> None:
    """Bidirectional models (LLaDA; Dream's shifted logits with the prefix cache): every
    cache mode the branches support decodes to the end and counts the branch positions."""
    for family in ("llada", "dream"):
        model = tiny_model(family, seed=2)
        prompt = torch.randint(3, 40, (2, 5), generator=torch.Generator().manual_seed(1))
        out = DiffusionSampler(model, "lopa", threshold=0.8, branches=3, cache=cache,
                               debug=True).generate(prompt, gen_length=16, block_length=8)
        assert not (out.answer == model.mask_token_id).any()
        assert out.forwards > out.steps and sum(out.step_forwards) == out.forwards


def test_lopa_on_block_diffusion_model() -> None:
    """SDAR-style model: the exact block-causal cache gives the uncached run's tokens."""
    model = load_model("tiny-sdar")
    prompt = torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(8))
    runs = {c: DiffusionSampler(model, "lopa", threshold=0.6, branches=2, cache=c,
                                debug=True).generate(prompt, gen_length=12)
            for c in ("none", "block_causal")}
    assert torch.equal(runs["none"].tokens, runs["block_causal"].tokens)
    assert runs["none"].steps == runs["block_causal"].steps
    assert runs["block_causal"].positions < runs["none"].positions


def test_preset_and_errors() -> None:
    assert make_policy("lopa").selector == Lopa(threshold=0.9, branches=14)
    assert make_policy("lopa", task="humaneval").selector.threshold == 0.95
    with pytest.raises(ValueError, match="greedily"):
        DiffusionSampler(tiny_model("llada"), "lopa").generate(
            torch.tensor([[5, 6]]), gen_length=4, temperature=0.5)
    with pytest.raises(ValueError, match="per-row position sets"):
        DiffusionSampler(tiny_model("llada"), "lopa", cache="window").generate(
            torch.tensor([[5, 6]]), gen_length=4)
    with pytest.raises(ValueError, match="score must be one of"):
        Lopa(score="entropy")
