"""SchED (arXiv 2512.02892) and Prophet (arXiv 2508.19982): the faithfulness tests of
methods.md §1(f) and §8.3, on tiny models and on scripted mock models."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.models.dream import DreamModel
from dllm_decode.policies import Policy, TopK, make_policy
from dllm_decode.policies.adaptive import Threshold
from dllm_decode.policies.history import CCD, KLASSMemory
from dllm_decode.policies.sched import PairedMemory, SchED, Supervised
from tests.helpers import EOS, MASK, tiny_model
from tests.mock_models import Call, ScriptedLM, peaked, single_thread  # noqa: F401

INF = math.inf
MODELS = {f: tiny_model(f, seed=3) for f in ("llada", "dream")}


def _prompt(b: int, p: int, seed: int) -> torch.Tensor:
    return torch.randint(0, EOS, (b, p), generator=torch.Generator().manual_seed(seed))


def _exit_steps(out) -> torch.Tensor:
    """``[B]`` the step at which each row committed its last position."""
    return out.commit_step.max(1).values


# ---- schedules ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["linear", "cosine", "exp", "piecewise"])
@pytest.mark.parametrize("high,low,k", [(7.5, 2.5, 4.0), (7.5, 0.0, 16.0), (3.0, -1.0, 2.0)])
def test_schedule_endpoints_and_monotone(mode, high, low, k) -> None:
    s = SchED(tau_mode=mode, tau_high=high, tau_low=low, tau_k=k)
    taus = [s.threshold(i / 200) for i in range(201)]
    assert taus[0] == high
    assert all(a >= b for a, b in zip(taus, taus[1:], strict=False))
    end = low + (high - low) * math.exp(-k) if mode == "exp" else low
    assert taus[-1] == pytest.approx(end, abs=1e-12)
    assert s.threshold(-0.5) == taus[0] and s.threshold(1.5) == taus[-1]  # u is clipped


def test_schedule_values_by_hand() -> None:
    cos = SchED(tau_mode="cosine")
    assert cos.threshold(0.5) == pytest.approx(5.0)
    assert SchED(tau_mode="linear").threshold(0.25) == pytest.approx(6.25)
    assert SchED(tau_mode="exp", tau_k=2.0).threshold(0.5) == pytest.approx(2.5 + 5 / math.e)
    pw = SchED(tau_mode="piecewise", tau_mid=5.0)
    assert [pw.threshold(u) for u in (0.0, 0.33, 1 / 3, 0.66, 2 / 3, 1.0)] == \
        [7.5, 7.5, 5.0, 5.0, 2.5, 2.5]
    assert SchED(tau_high=INF, tau_low=INF).threshold(0.3) == INF
    assert SchED(tau_high=-INF, tau_low=-INF).threshold(0.3) == -INF
    assert SchED(tau_mode="linear", tau_high=INF, tau_low=0.0).threshold(1.0) == 0.0


def test_bad_parameters_list_valid_values() -> None:
    with pytest.raises(ValueError, match="tau_mode must be one of"):
        SchED(tau_mode="step")
    with pytest.raises(ValueError, match="stat must be one of"):
        SchED(stat="max")
    with pytest.raises(ValueError, match="tau_high"):
        SchED(tau_high=1.0, tau_low=2.0)
    with pytest.raises(ValueError, match="for policy 'sched'.*tau_high"):
        make_policy("sched", bogus=1)
    with pytest.raises(ValueError, match="for policy 'sched'"):
        make_policy("sched", base=TopK(), tau=0.5)


# ---- aggregation and regions -------------------------------------------------------------
@pytest.mark.parametrize("stat", ["mean", "median", "quantile"])
def test_aggregate_matches_torch_per_row(stat) -> None:
    g = torch.Generator().manual_seed(0)
    values = torch.randn(6, 11, generator=g) * 3
    focus = torch.rand(6, 11, generator=g) < 0.5
    focus[0] = False
    focus[1] = False
    focus[1, 4] = True
    s = SchED(stat=stat, q=0.2)
    got = s.aggregate(values, focus)
    assert got[0] == -INF  # empty focus
    for r in range(1, 6):
        v = values[r][focus[r]]
        want = {"mean": v.mean(), "median": v.median(), "quantile": torch.quantile(v, 0.2)}[stat]
        assert got[r] == pytest.approx(float(want), abs=1e-5)


def test_region_masks() -> None:
    p, g = 3, 8
    state = _state_stub(p, g, lengths=torch.tensor([8, 5]))
    all_r = SchED(region="all").region_mask(state)
    assert all_r.sum(1).tolist() == [11, 8]  # the prompt counts, truncated rows are clipped
    tail = SchED(region="tail").region_mask(state)
    assert tail[:, :p].sum() == 0 and tail.sum(1).tolist() == [8, 5]
    win = SchED(region="explicit", region_start=2, region_end=6).region_mask(state)
    assert win[0].nonzero().flatten().tolist() == [5, 6, 7, 8]
    assert win[1].nonzero().flatten().tolist() == [5, 6, 7]


def _state_stub(p: int, g: int, lengths: torch.Tensor):
    from dllm_decode.types import Proposal, StepState

    b, length = lengths.shape[0], p + g
    z = torch.zeros(b, length)
    masked = torch.zeros(b, length, dtype=torch.bool)
    masked[:, p:] = True
    prop = Proposal(tokens=z.long(), prob=z, margin=z, logit_margin=z, neg_entropy=z)
    return StepState(proposal=prop, eligible=masked, masked=masked, fresh=masked, canvas=z.long(),
                     step=0, block=0, block_start=p, block_end=length, gen_start=p,
                     steps_left=None, budget=None, progress=0.0, generator=None,
                     forward_start=0, forward_width=length, extras={"lengths": lengths})


# ---- faithfulness against the base sampler -------------------------------------------------
@pytest.mark.parametrize("family,base,cache", [
    ("llada", "low_confidence", "none"), ("llada", "threshold", "prefix"),
    ("llada", "low_confidence", "dual"), ("dream", "entropy", "none"),
    ("dream", "klass", "none"), ("llada", "ccd", "none"),
])
def test_infinite_threshold_is_the_base_sampler(family, base, cache) -> None:
    model = MODELS[family]
    prompt = _prompt(3, 4, 1)
    kw = dict(cache=cache, gen_length=12, block_length=4, steps=12)
    ref = DiffusionSampler(model, base, **kw).generate(prompt)
    out = DiffusionSampler(model, "sched", base=base, tau_high=INF, tau_low=INF, debug=True,
                           **kw).generate(prompt)
    assert torch.equal(out.tokens, ref.tokens)
    assert torch.equal(out.nfe, ref.nfe) and out.forwards == ref.forwards


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_gate_off_and_minus_infinity_exits_at_step_zero(family) -> None:
    prompt = _prompt(2, 5, 2)
    first: list[torch.Tensor] = []
    sampler = DiffusionSampler(MODELS[family], "sched", tau_high=-INF, tau_low=-INF,
                               max_change_ratio=1.0, gen_length=8, block_length=4, steps=8)
    out = sampler.generate(prompt, on_step=lambda s, c: first.append(s.proposal.greedy.clone()))
    assert out.forwards == 1 and out.steps == 1 and out.nfe.tolist() == [1, 1]
    assert torch.equal(out.answer, first[0][:, 5:])  # every mask took its step-0 argmax


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_released_gate_exits_at_first_repeated_argmax(family) -> None:
    p, g = 4, 12
    prompt = _prompt(4, p, 3)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    sampler = DiffusionSampler(MODELS[family], "sched", tau_high=-INF, tau_low=-INF,
                               gen_length=g, steps=g)
    out = sampler.generate(prompt, on_step=lambda s, c: seen.append((s.proposal.greedy.clone(),
                                                                     s.masked.clone())))
    exits = _exit_steps(out)
    early = 0
    for r in range(prompt.shape[0]):
        want = g - 1  # no repeat before the last step: the base runs to the end
        for i in range(1, len(seen)):
            greedy, masked = seen[i]
            if not masked[r].any():
                break
            if torch.equal(greedy[r][masked[r]], seen[i - 1][0][r][masked[r]]):
                want = i
                break
        assert int(exits[r]) == want and want >= 1
        early += want < g - 1
    assert early > 0  # the check is not vacuous


def _stabilising_script(s: int, gap: float = 5.0):
    """Every position's logits peak with ``gap``; the argmax moves every step before step
    ``s - 1`` and is fixed from step ``s - 1`` on, so the first repeat is at step ``s``."""
    def script(call: Call) -> torch.Tensor:
        pos = call.positions
        shift = call.step + 1 if call.step < s - 1 else 0
        return peaked((pos + shift) % 10, gap, 16)
    return script


@pytest.mark.parametrize("mode,s,gate,expected", [
    # constant gap 5 over the masked canvas; T = 8, u = i / 7. cosine and linear: tau(i) <= 5
    # from i = 4 (i >= 3.5); exp k = 4: 2.5 + 5 e^{-4i/7} <= 5 from i = 2 (i >= 7 ln 2 / 4)
    ("cosine", 2, 0.0, 4), ("cosine", 6, 0.0, 6), ("cosine", 6, 1.0, 4),
    ("linear", 2, 0.0, 4), ("exp", 1, 0.0, 2), ("exp", 3, 0.0, 3), ("exp", 5, 1.0, 2),
])
def test_mock_exit_step_by_hand(mode, s, gate, expected) -> None:
    model = ScriptedLM(_stabilising_script(s))
    out = DiffusionSampler(model, "sched", base="low_confidence", tau_mode=mode,
                           max_change_ratio=gate, gen_length=8, steps=8).generate([[1, 2]])
    assert out.steps == expected + 1 and out.forwards == expected + 1
    last = out.commit_step[0] == expected
    shift = expected + 1 if expected < s - 1 else 0
    want = ((torch.arange(2, 10) + shift) % 10)[last]  # the exit fills with that step's argmax
    assert torch.equal(out.answer[0][last], want)


def test_margins_come_from_logits() -> None:
    gaps = torch.rand(12, generator=torch.Generator().manual_seed(4)) * 3 + 0.5
    stat: list[torch.Tensor] = []
    stopper = SchED()
    for scale in (1.0, 2.0):
        model = ScriptedLM(lambda call, c=scale: c * peaked(call.positions % 7,
                                                            gaps[call.positions], 16))
        DiffusionSampler(model, "sched", base="low_confidence", gen_length=10,
                         steps=10).generate([[3, 4]], on_step=lambda s, c: stat.append(
                             stopper.statistic(s)) if s.step == 0 else None)
    assert float(stat[0]) == pytest.approx(float(gaps[2:].mean()), rel=1e-5)
    assert float(stat[1]) == pytest.approx(2 * float(stat[0]), rel=1e-5)


def test_dream_margin_comes_from_the_previous_row() -> None:
    model = MODELS["dream"]
    raw = DreamModel(replace(model.spec, logit_shift=0))
    raw.load_state_dict(model.state_dict())
    prompt = _prompt(2, 5, 5)
    states = []
    DiffusionSampler(model, "sched", gen_length=8, steps=8).generate(
        prompt, on_step=lambda s, c: states.append(s) if s.step == 0 else None)
    state = states[0]
    with torch.no_grad():
        z = raw(state.canvas, model.rope_positions(torch.ones_like(state.canvas).bool()))
    z[..., MASK] = -INF
    top2 = z.topk(2, dim=-1).values
    gap = top2[..., 0] - top2[..., 1]  # [B, L] raw rows
    margin = state.proposal.logit_margin
    assert torch.allclose(margin[:, 5:], gap[:, 4:-1], atol=1e-4)
    assert not torch.allclose(margin[:, 5:], gap[:, 5:], atol=1e-2)
    assert torch.allclose(SchED().statistic(state), gap[:, 4:-1].mean(1), atol=1e-4)


def test_exit_is_monotone_in_thresholds() -> None:
    prompt = _prompt(4, 4, 6)
    grid = [(-INF, -INF), (0.0, 0.0), (1.0, 3.0), (2.5, 7.5), (4.0, 10.0), (INF, INF)]
    for gate in (0.0, 1.0):
        exits = []
        for low, high in grid:
            out = DiffusionSampler(MODELS["llada"], "sched", base="low_confidence", tau_low=low,
                                   tau_high=high, max_change_ratio=gate, gen_length=12,
                                   steps=12).generate(prompt)
            exits.append(_exit_steps(out))
        stacked = torch.stack(exits)
        assert (stacked[1:] >= stacked[:-1]).all()
        assert len(set(stacked.flatten().tolist())) > 2  # the grid moves the exit


# ---- caches ------------------------------------------------------------------------------
def _flip_steps(cache: str, stale: str) -> tuple[list[tuple[int, bool]], object]:
    """Exit schedule +inf until the phase clock (i + 1) / 12 reaches 1/3 (step 3), then -inf."""
    flips: list[tuple[int, bool]] = []

    def record(state, commit):
        stopped = state.memory.stopper.stopped
        if stopped.any() and not flips:
            flips.append((state.step, bool(state.extras["refresh"])))

    out = DiffusionSampler(MODELS["llada"], "sched", cache=cache, base="low_confidence",
                           tau_mode="piecewise", tau_high=INF, tau_mid=-INF, tau_low=-INF,
                           max_change_ratio=1.0, stale=stale, gen_length=12, block_length=4,
                           steps=12).generate(_prompt(1, 4, 7), on_step=record)
    return flips, out


def test_dual_cache_checks_only_fresh_steps() -> None:
    flips, out = _flip_steps("dual", "skip")
    assert flips == [(4, True)]  # step 3 is not fresh over the canvas; step 4 refreshes
    assert out.steps == 5 and (out.answer != MASK).all()
    flips, out = _flip_steps("prefix", "skip")  # prefix scores the suffix at every step
    assert flips == [(3, False)] and out.steps == 4


def test_stale_margins_exit_between_refreshes() -> None:
    flips, out = _flip_steps("dual", "use")
    assert flips == [(3, False)]
    assert out.steps == 5 and (out.answer != MASK).all()  # the rest is filled at the refresh
    assert (out.commit_step[0, 4:] == 4).all()


# ---- Prophet -----------------------------------------------------------------------------
def _window_script(window_gap: float, other_gap: float = 0.5):
    def script(call: Call) -> torch.Tensor:
        pos = call.positions
        in_window = (pos >= 4) & (pos < 9)  # offset 2 into the generation (prompt of 2)
        return peaked(pos % 9, torch.where(in_window, window_gap, other_gap), 16)
    return script


@pytest.mark.parametrize("window_gap,expected", [
    (9.0, 0),  # 9 >= 7.5 at once
    (6.0, 3),  # phase (i + 1) / 12 >= 1/3 from i = 3: tau 5.0; two window masks remain
    (2.0, 5),  # never above 2.5; the base commits the 5 window positions first, then converged
])
def test_prophet_answer_window_by_hand(window_gap, expected) -> None:
    model = ScriptedLM(_window_script(window_gap))
    out = DiffusionSampler(model, "prophet", answer_offset=2, gen_length=12,
                           steps=12).generate([[1, 2]])
    assert out.steps == expected + 1 and (out.answer != model.mask_token_id).all()


def test_presets_and_composition() -> None:
    pol = make_policy("sched", base="threshold", tau=0.95, tau_low=0.0)
    assert isinstance(pol.selector, Supervised) and pol.selector.selector == Threshold(tau=0.95)
    assert pol.stopper == SchED(tau_low=0.0) and not pol.selector.capabilities.budgeted
    pro = make_policy("prophet").stopper
    assert (pro.tau_mode, pro.tau_high, pro.tau_mid, pro.tau_low) == ("piecewise", 7.5, 5.0, 2.5)
    assert (pro.region, pro.region_start, pro.region_end, pro.max_change_ratio) == \
        ("explicit", 0, 5, 1.0)
    with pytest.raises(ValueError, match="already has a stopper"):
        make_policy("sched", base="prophet")
    mem = make_policy("sched", base="klass").selector.init_memory(2, 9, torch.device("cpu"))
    assert isinstance(mem, PairedMemory) and isinstance(mem.selector, KLASSMemory)
    assert isinstance(make_policy("sched", base=CCD()).selector.selector, CCD)


def test_stateless_stopper_needs_gate_off() -> None:
    prompt = _prompt(1, 3, 8)
    free = Policy(selector=TopK(), stopper=SchED(tau_high=-INF, tau_low=-INF,
                                                 max_change_ratio=1.0))
    assert DiffusionSampler(MODELS["llada"], free, gen_length=6).generate(prompt).forwards == 1
    # a bare Policy hands a stopper with memory its memory: the selector supervises it
    gated = Policy(selector=TopK(), stopper=SchED())
    assert isinstance(gated.selector, Supervised) and gated.selector.stopper is gated.stopper
    out = DiffusionSampler(MODELS["llada"], gated, gen_length=6).generate(prompt)
    preset = DiffusionSampler(MODELS["llada"], "sched", base=TopK(), gen_length=6)
    assert torch.equal(out.tokens, preset.generate(prompt).tokens)

    def bare(state, commit) -> None:  # without its memory the gated stopper refuses to run
        SchED().should_stop(replace(state, memory=None))

    with pytest.raises(ValueError, match="needs its memory"):
        DiffusionSampler(MODELS["llada"], "low_confidence", gen_length=6).generate(
            prompt, on_step=bare)
