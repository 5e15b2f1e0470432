"""ETE (arXiv 2511.21103, reconstructed) and the bits-per-round diagnostic on mock models with
known probabilities (methods.md §3(f))."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.policies import make_policy
from dllm_decode.policies.ete import ExploreThenExploit
from tests.helpers import EOS, left_pad_rows, tiny_model
from tests.mock_models import Call, ScriptedLM, from_probs, single_thread  # noqa: F401

V = 16
MODELS = {f: tiny_model(f, seed=13) for f in ("llada", "dream", "sdar")}


def _prompt(b: int, p: int, seed: int) -> torch.Tensor:
    return torch.randint(0, EOS, (b, p), generator=torch.Generator().manual_seed(seed))


def _probs(top: torch.Tensor, tok: torch.Tensor, spread: int = V - 2) -> torch.Tensor:
    """Rows ``[..., V]``: ``tok`` at probability ``top``; the rest spread evenly over the first
    ``spread`` other tokens (never the mask token ``V - 1``)."""
    rest = (1 - top) / (spread - 1)
    ids = torch.arange(V)
    probs = torch.where(ids < spread, rest[..., None], torch.zeros(()))
    probs = probs.expand(*top.shape, V).clone()
    probs.scatter_(-1, tok[..., None], top[..., None])
    return probs


def _cascade(g_start: int):
    """Until the first generated position (the pivot: 0.25, the rest spread over 13 tokens,
    the highest entropy) is committed, every other position sits at 0.6 (the rest on two
    tokens); once it is, they are all at 0.99 (a cascade)."""
    def script(call: Call) -> torch.Tensor:
        pos = call.positions
        pivot_open = call.masked[:, g_start:g_start + 1]  # [B, 1]
        top = torch.where(pivot_open, 0.6, 0.99).expand(pos.shape).clone()
        top = torch.where(pos == g_start, 0.25, top)
        spread = torch.where(pos == g_start, V - 2, 3)
        probs = torch.stack([_probs(t, torch.full_like(t, 1, dtype=torch.long), int(sp))
                             for t, sp in zip(top.flatten(), spread.flatten(), strict=True)])
        return from_probs(probs.view(*pos.shape, V))
    return script


def test_bits_per_round_equal_committed_information() -> None:
    g = torch.Generator().manual_seed(3)
    top = torch.rand(12, generator=g) * 0.6 + 0.35
    rows = from_probs(_probs(top, torch.arange(12) % 7))
    model = ScriptedLM(lambda call: rows[call.positions])
    out = DiffusionSampler(model, "ete", tau=0.8, gen_length=10,
                           block_length=5).generate([[1, 2]])
    nats = -torch.log(top.double())
    for t in range(out.steps):
        at = (out.commit_step[0] == t).nonzero().flatten() + 2
        assert float(out.bits[0, t]) == pytest.approx(float(nats[at].sum()), rel=1e-5)
    assert float(out.nll[0]) == pytest.approx(float(nats[2:].sum()), rel=1e-5)


@pytest.mark.parametrize("policy,params", [("ete", {}), ("threshold", {}),
                                           ("low_confidence", {"steps": 5})])
def test_total_information_is_the_nll_along_the_realised_order(policy, params) -> None:
    script = _cascade(2)
    model = ScriptedLM(script)
    canvases: list[tuple[torch.Tensor, torch.Tensor]] = []
    out = DiffusionSampler(model, policy, gen_length=10, **params).generate(
        [[1, 2]], on_step=lambda s, c: canvases.append((s.canvas.clone(), c.clone())))
    nll = 0.0
    for t, (canvas, commit) in enumerate(canvases):
        pos = torch.arange(canvas.shape[1])[None]
        logp = torch.log_softmax(script(Call(canvas, pos, t, V - 1))[0].double(), -1)
        final = out.tokens[0]
        step_bits = -logp[commit[0], final[commit[0]]].sum()
        assert float(out.bits[0, t]) == pytest.approx(float(step_bits), rel=1e-5)
        nll += float(step_bits)
    assert float(out.nll[0]) == pytest.approx(nll, rel=1e-5)
    per_round = float(out.bits.max())
    assert out.steps >= int(out.rounds_lower_bound(per_round)[0])


@pytest.mark.parametrize("family,block,temperature", [
    ("llada", 4, 0.0), ("llada", 2, 0.7), ("dream", 4, 0.0), ("sdar", None, 0.0),
])
def test_no_budget_no_lookahead_is_threshold(family, block, temperature) -> None:
    prompt = _prompt(3, 5, 1)
    kw = dict(gen_length=12, block_length=block, temperature=temperature, seed=4)
    ref = DiffusionSampler(MODELS[family], "threshold", tau=0.5, **kw).generate(prompt)
    ete = DiffusionSampler(MODELS[family], "ete", tau=0.5, budget_nats=0.0, lookahead=0,
                           debug=True, **kw).generate(prompt)
    assert torch.equal(ete.tokens, ref.tokens) and torch.equal(ete.bits, ref.bits)
    assert torch.equal(ete.nfe, ref.nfe) and ete.forwards == ref.forwards


def test_exploration_triggers_the_cascade() -> None:
    # threshold (0.9): nothing is confident, the pivot (0.25) is always the least confident,
    # so it goes last: 10 rounds. ETE explores the pivot (highest entropy) in round 0 and
    # exploits the 9 certain positions in round 1.
    model = ScriptedLM(_cascade(2))
    base = DiffusionSampler(model, "threshold", gen_length=10).generate([[1, 2]])
    ete = DiffusionSampler(model.reset(), "ete", gen_length=10, debug=True).generate([[1, 2]])
    assert base.steps == 10 and ete.steps == 2
    assert ete.commit_step[0].tolist() == [0] + [1] * 9
    assert float(ete.bits[0, 0]) == pytest.approx(math.log(4), rel=1e-5)  # explored: -log 0.25
    assert float(ete.nll[0]) < float(base.nll[0])


def test_cross_block_commits_and_exploration_stays_in_the_earliest_block() -> None:
    # blocks of 4 over 12 positions; gen offset 9 is certain (0.99) from the start, offset 10
    # has the highest entropy of the canvas, offset 1 the highest inside block 0
    top = torch.full((14,), 0.6)
    top[11], top[12], top[3] = 0.99, 0.2, 0.3
    rows = from_probs(_probs(top, torch.arange(14) % 7))
    model = ScriptedLM(lambda call: rows[call.positions])
    seen: list[torch.Tensor] = []
    kw = dict(gen_length=12, block_length=4)
    out = DiffusionSampler(model, "ete", lookahead=8, **kw).generate(
        [[1, 2]], on_step=lambda s, c: seen.append(c[0].clone()))
    assert seen[0].nonzero().flatten().tolist() == [3, 11]  # explored 3, exploited 11
    near = DiffusionSampler(model.reset(), "ete", lookahead=0, **kw).generate([[1, 2]])
    assert int(near.commit_step[0, 9]) > 0 and int(out.commit_step[0, 9]) == 0


def test_preset_defaults_and_selector_attributes() -> None:
    sel = make_policy("ete").selector
    assert sel == ExploreThenExploit(tau=0.9, lookahead=32, budget_nats=1.0, explore=1)
    assert sel.lookahead == 32 and not sel.capabilities.budgeted
    with pytest.raises(ValueError, match=">= 0"):
        ExploreThenExploit(budget_nats=-1.0)
    out = DiffusionSampler(MODELS["llada"], "ete", cache="dual", lookahead=4, gen_length=12,
                           block_length=4, debug=True).generate(_prompt(2, 3, 5))
    assert out.steps <= 12 and (out.answer != 63).all()


def _past_block_commits(model, **params) -> tuple[int, int]:
    """(commits past the current block over the run, forwards) of ETE on ``model``."""
    past = []

    def on_step(state, commit) -> None:
        pos = torch.arange(commit.shape[1])
        past.append(int((commit & (pos >= state.block_end)).sum()))

    out = DiffusionSampler(model, "ete", tau=0.5, debug=True, **params).generate(
        _prompt(4, 6, 5), gen_length=16, on_step=on_step)
    assert not (out.answer == model.mask_token_id).any()
    return sum(past), out.forwards


def test_ete_stays_in_block_on_block_causal_models_by_default() -> None:
    """SDAR-style models are not trained past the current block: no cross-block commits unless
    asked for; bidirectional models keep ETE's cross-block lookahead."""
    sdar = MODELS["sdar"]
    inside, _ = _past_block_commits(sdar)
    assert inside == 0
    assert _past_block_commits(sdar, cache="block_causal")[0] == 0
    crossed, _ = _past_block_commits(sdar, cross_block=True)
    assert crossed > 0
    assert _past_block_commits(MODELS["llada"], block_length=4)[0] > 0
    assert _past_block_commits(MODELS["llada"], block_length=4, cross_block=False)[0] == 0
    assert make_policy("ete").selector.bind(sdar).lookahead == 0
    assert make_policy("ete", cross_block=True).selector.bind(sdar).lookahead == 32


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "window"])
def test_batch_decodes_like_its_rows_alone(family: str, cache: str) -> None:
    """A row that finishes its block before its neighbours waits for the batch: working ahead,
    it would decode its next block against the current block's cache and a lookahead window
    cut at the current block's end, unlike the same row alone (tests/test_fuzz.py
    ``REGRESSIONS``: the default lookahead with caches; here a short one, even uncached)."""
    rows = [_prompt(1, n, 40 + n)[0] for n in (3, 6, 2)]
    ids, mask = left_pad_rows(rows, EOS)
    sampler = DiffusionSampler(MODELS[family], "ete", cache=cache, tau=0.5, lookahead=2,
                               gen_length=16, block_length=4, debug=True)
    past: list[int] = []

    def on_step(state, commit) -> None:
        past.append(int((commit & (torch.arange(commit.shape[1]) >= state.block_end)).sum()))

    out = sampler.generate(ids, mask, on_step=on_step)
    assert sum(past) > 0  # cross-block commits do happen
    for i, r in enumerate(rows):
        alone = sampler.generate(r[None])
        assert torch.equal(alone.answer[0], out.answer[i]), i
        assert int(alone.nfe[0]) == int(out.nfe[i]), i
