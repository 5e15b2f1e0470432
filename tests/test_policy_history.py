"""KLASS (arXiv 2511.05664) and CCD-DS (arXiv 2512.02044): equivalence with the baselines they
reduce to, and hand-checked behaviour on scripted mock models (methods.md §7(f), §8.4)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.policies import make_policy
from dllm_decode.policies.history import CCD, KL_EPS, KLASS, KLASSMemory
from tests.helpers import EOS, MASK, tiny_model
from tests.mock_models import Call, ScriptedLM, from_probs, peaked, single_thread  # noqa: F401

MODELS = {f: tiny_model(f, seed=9) for f in ("llada", "dream")}
V = 16


def _prompt(b: int, p: int, seed: int) -> torch.Tensor:
    return torch.randint(0, EOS, (b, p), generator=torch.Generator().manual_seed(seed))


def _same(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.nfe, b.nfe) and a.forwards == b.forwards


# ---- KLASS -------------------------------------------------------------------------------
@pytest.mark.parametrize("family,block,steps,cache", [
    ("llada", 4, 12, "none"), ("llada", 6, 6, "dual"), ("dream", None, 12, "none"),
])
def test_klass_never_ready_is_the_baseline(family, block, steps, cache) -> None:
    prompt = _prompt(2, 4, 1)
    kw = dict(gen_length=12, block_length=block, steps=steps, cache=cache)
    base = DiffusionSampler(MODELS[family], "low_confidence", **kw).generate(prompt)
    klass = DiffusionSampler(MODELS[family], "klass", conf_threshold=1.01, debug=True,
                             **kw).generate(prompt)
    _same(klass, base)


def _constant_probs(top_prob: float, flip_at: int | None = None):
    """Position j proposes token ``j % 8`` with ``top_prob - j / 1000`` (no ties: lower
    positions are more confident); at ``flip_at`` the argmax alternates between two tokens
    every step (a context-sensitive position)."""
    def script(call: Call) -> torch.Tensor:
        pos = call.positions
        tok = pos % 8
        if flip_at is not None:
            tok = torch.where(pos == flip_at, 8 + call.step % 2, tok)
        top = (top_prob - pos / 1000)[..., None]
        probs = ((1 - top) / (V - 2)).expand(*pos.shape, V).clone()
        probs[..., V - 1] = 0.0  # the mask token
        probs.scatter_(-1, tok[..., None], top)
        return from_probs(probs)
    return script


@pytest.mark.parametrize("history", [1, 2, 3])
def test_klass_ready_after_h_stable_steps(history) -> None:
    # the first KL (step 0) has no previous distribution: h KLs < eps exist from step h on;
    # before that the schedule's top-1 commits one position per step
    model = ScriptedLM(_constant_probs(0.95))
    out = DiffusionSampler(model, "klass", history=history, gen_length=8, steps=8,
                           debug=True).generate([[1, 2]])
    want = [min(i, history) for i in range(8)]
    assert out.commit_step[0].tolist() == want and out.steps == history + 1


def test_klass_flipping_position_waits_and_low_confidence_never_fires() -> None:
    out = DiffusionSampler(ScriptedLM(_constant_probs(0.95, flip_at=5)), "klass", gen_length=8,
                           steps=8).generate([[1, 2]])
    assert out.commit_step[0].tolist() == [0, 1, 2, 3, 2, 2, 2, 2]  # gen offset 3 = canvas 5
    base = DiffusionSampler(ScriptedLM(_constant_probs(0.85)), "low_confidence", gen_length=8,
                            steps=8).generate([[1, 2]])
    low = DiffusionSampler(ScriptedLM(_constant_probs(0.85)), "klass", gen_length=8,
                           steps=8).generate([[1, 2]])  # 0.85 < conf_threshold 0.9
    _same(low, base)


def test_klass_kl_values_and_memory() -> None:
    g = torch.Generator().manual_seed(2)
    tables = [torch.randn(10, V, generator=g) * 2 for _ in range(3)]
    model = ScriptedLM(lambda call: tables[min(call.step, 2)][call.positions])
    seen: list[torch.Tensor] = []
    out = DiffusionSampler(model, "klass", conf_threshold=2.0, gen_length=8, steps=8).generate(
        [[1, 2]], on_step=lambda s, c: seen.append(s.memory.kl[..., -1].clone()))
    assert out.steps == 8
    for t in (1, 2):
        z0, z1 = tables[t - 1].clone(), tables[t].clone()
        z0[:, V - 1] = z1[:, V - 1] = -torch.inf
        p0, p1 = torch.softmax(z0, -1), torch.softmax(z1, -1)
        want = (p1 * (torch.log(p1 + KL_EPS) - torch.log(p0 + KL_EPS))).sum(-1)
        assert torch.allclose(seen[t][0, 2:], want[2:], rtol=1e-4, atol=1e-6)
    assert torch.isinf(seen[0][0, 2:]).all()  # no previous distribution at step 0
    mem = KLASS().init_memory(2, 10, torch.device("cpu"))
    assert isinstance(mem, KLASSMemory) and mem.log_prev is None and mem.kl.shape == (2, 10, 2)


def test_klass_single_unmask_strategies() -> None:
    for strategy in ("max_conf", "min_kl"):
        out = DiffusionSampler(ScriptedLM(_constant_probs(0.95)), "klass",
                               unmask_strategy=strategy, gen_length=6, steps=6).generate([[1]])
        assert out.steps == 6  # one position per step even when several are ready


def test_klass_defaults_and_caches_complete() -> None:
    assert make_policy("klass").selector == KLASS(0.9, 0.01, 2)
    prompt = _prompt(2, 3, 4)
    for cache in ("prefix", "dual"):
        out = DiffusionSampler(MODELS["llada"], "klass", cache=cache, conf_threshold=0.3,
                               kl_threshold=0.5, gen_length=8, block_length=4, steps=4,
                               debug=True).generate(prompt)
        assert (out.answer != MASK).all()


# ---- CCD ---------------------------------------------------------------------------------
@pytest.mark.parametrize("family,steps,block", [
    ("llada", 12, None), ("llada", 6, 4), ("dream", 12, None), ("dream", 4, None),
])
def test_ccd_expand_ratio_zero_is_the_baseline(family, steps, block) -> None:
    prompt = _prompt(3, 4, 5)
    kw = dict(gen_length=12, steps=steps, block_length=block)
    base = DiffusionSampler(MODELS[family], "entropy", **kw).generate(prompt)
    ccd = DiffusionSampler(MODELS[family], "ccd", expand_ratio=0.0, debug=True,
                           **kw).generate(prompt)
    _same(ccd, base)


def test_ccd_width_schedule() -> None:
    ccd = CCD()
    assert [int(ccd.width(i, torch.tensor([1]))) for i in range(10)] == \
        [1, 1, 1, 1, 2, 3, 4, 5, 5, 5]
    assert int(ccd.width(40, torch.tensor([2]))) == 10
    assert int(CCD(expand_ratio=0.0).width(40, torch.tensor([3]))) == 3


def _ranked_script(order, stable, first_stable: int = 0):
    """``order(step, masked_positions) -> ranked positions``: rank r gets logit gap 12 - r (the
    lower the entropy the higher the rank). Positions in ``stable`` keep argmax ``pos % 8``
    from ``first_stable`` on; every other argmax moves each step."""
    def script(call: Call) -> torch.Tensor:
        pos = call.positions[0]
        masked = call.masked[0].nonzero().flatten().tolist()
        gap = torch.full(pos.shape, 1.0)
        for r, j in enumerate(order(call.step, masked)):
            gap[j] = 12.0 - r
        fixed = torch.tensor([j in stable for j in pos.tolist()]) & (call.step >= first_stable)
        tok = torch.where(fixed, pos % 8, (pos + call.step) % 8)
        return peaked(tok, gap, V)[None]
    return script


def test_ccd_consistent_pair_committed_together_at_warm_up() -> None:
    # prompt 1, gen 10; a = canvas 9, b = canvas 10 keep their argmax from step 3 and rank
    # 2nd / 3rd at steps 3, 4 (buffer of step 4 = {a, b}); at step 5 a ranks 1st, b 2nd:
    # the baseline top-1 meets the buffer and both kept their token -> both committed
    a, b = 9, 10

    def order(step, masked):
        if step < 5:
            head = [j for j in masked if j not in (a, b)][:1]
            return head + [a, b] if step >= 3 else head
        return [a, b]

    out = DiffusionSampler(ScriptedLM(_ranked_script(order, {a, b}, first_stable=3)), "ccd",
                           gen_length=10, steps=10, debug=True).generate([[1]])
    steps = out.commit_step[0]
    assert steps[a - 1] == 5 and steps[b - 1] == 5
    assert steps[:5].tolist() == [0, 1, 2, 3, 4]


def test_ccd_flipping_position_is_never_committed_early() -> None:
    # f always ranks 2nd with a moving argmax; the rest keep theirs and get seek commits
    f = 3

    def order(step, masked):
        rest = [j for j in masked if j != f]
        return rest[:1] + [f] + rest[1:] if rest else [f]

    commits: list[torch.Tensor] = []
    out = DiffusionSampler(ScriptedLM(_ranked_script(order, set(range(1, 13)) - {f})), "ccd",
                           gen_length=12, steps=12).generate(
        [[1]], on_step=lambda s, c: commits.append(c[0].clone()))
    last = int(out.commit_step[0, f - 1])
    assert last == out.steps - 1 and commits[last].sum() == 1  # alone, at the very end
    assert out.steps < 12  # consistent positions were committed several per step


def test_ccd_buffer_never_holds_committed_positions() -> None:
    violations = []

    def check(state, commit):
        mem = state.memory
        open_now = state.masked & ~commit
        violations.append(bool((mem.buffer & ~open_now).any()))

    for family in ("llada", "dream"):
        DiffusionSampler(MODELS[family], "ccd", gen_length=16, steps=16).generate(
            _prompt(3, 4, 6), on_step=check)
    assert violations and not any(violations)


def test_ccd_without_seek_commits_the_budget() -> None:
    out = DiffusionSampler(MODELS["llada"], "ccd", seek_mode=False, gen_length=12,
                           steps=12).generate(_prompt(2, 4, 7))
    assert out.steps == 12 and (out.nfe == 12).all()
