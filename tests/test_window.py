"""Window-Diffusion (arXiv 2601.20332): planner invariants, pruned-forward exactness, presets."""

from __future__ import annotations

import importlib

import pytest
import torch

import dllm_decode.samplers.mask_setup as sampler_module  # the mask kind builds the plan
from dllm_decode import DiffusionSampler, make_policy
from dllm_decode.cache.window import WindowPlan
from tests.helpers import EOS, MASK, tiny_model


@pytest.fixture(autouse=True, scope="module")
def _register_presets() -> None:
    """Register the presets at run time, not at collection: ``test_sampler`` runs every preset
    on every model family, and these ones are family-specific."""
    importlib.import_module("dllm_decode.policies.window")


MODELS = {f: tiny_model(f, seed=13) for f in ("llada", "dream")}


def _prompt(b: int, p: int, seed: int) -> torch.Tensor:
    return torch.randint(0, EOS, (b, p), generator=torch.Generator().manual_seed(seed))


def _padded_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    prompt = _prompt(2, 5, seed)
    prompt[0, :2] = EOS
    return prompt, torch.tensor([[0, 0, 1, 1, 1], [1] * 5])


@pytest.mark.parametrize("family,policy", [("llada", "low_confidence"), ("dream", "entropy")])
def test_full_window_and_refresh_every_step_equals_base(family: str, policy: str) -> None:
    prompt, mask = _padded_batch(1)
    kw = dict(gen_length=12, steps=12)
    base = DiffusionSampler(MODELS[family], policy, **kw).generate(prompt, mask)
    win = DiffusionSampler(MODELS[family], policy, cache="window", window_tokens=12,
                           active_tokens=12, refresh_every=1, debug=True,
                           **kw).generate(prompt, mask)
    assert torch.equal(base.tokens, win.tokens)
    assert base.forwards == win.forwards and torch.equal(base.nfe, win.nfe)


def _canvas(model, rows: list[list[int]], p: int = 4, g: int = 16, seed: int = 0):
    """Prompt + masked generation; ``rows[b]`` lists generation offsets already decoded."""
    b = len(rows)
    canvas = torch.cat([_prompt(b, p, seed), torch.full((b, g), MASK)], 1)
    gen = torch.Generator().manual_seed(seed + 1)
    for r, offs in enumerate(rows):
        for o in offs:
            canvas[r, p + o] = int(torch.randint(0, EOS, (1,), generator=gen))
    valid = torch.ones_like(canvas, dtype=torch.bool)
    valid[1, :1] = False  # a left-padded row: per-row RoPE positions for Dream
    return canvas, valid, model.rope_positions(valid)


def _step(plan: WindowPlan, canvas, i: int, lo: int):
    host = plan.prepare(canvas, i, lo).tolist()
    return plan.forward(canvas, (lo, canvas.shape[1]), lo, i, lo, False, host=host)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("truncate", [False, True])
def test_pruned_forward_equals_masked_full_forward(family: str, truncate: bool) -> None:
    """Right after a full step (no token changed): pruned logits == a full forward whose
    attention hides the far field from every query that the pruned step recomputes (with
    ``truncate`` the full step hid it from every query too)."""
    model = MODELS[family]
    canvas, valid, pos = _canvas(model, [[0, 1, 5], [2, 3]])
    plan = WindowPlan(model, valid, pos, window=6, active=3, refresh=4, truncate=truncate)
    with torch.no_grad():
        _step(plan, canvas, 0, 4)
        k_full = plan.cache.k.clone()
        fed = _step(plan, canvas, 1, 4)
    assert not plan.full.any() and fed.rows.dim() == 2
    keys = (plan.window | (canvas != MASK)) & valid
    length = canvas.shape[1]
    seen = valid[:, None, :].expand(-1, length, -1).clone()
    recomputed = plan.active.clone()
    if model.logit_shift:
        recomputed[:, :-1] |= plan.active[:, 1:]
    rows = recomputed | plan.window if truncate else recomputed
    seen[rows] = keys[:, None, :].expand(-1, length, -1)[rows]
    with torch.no_grad():
        ref = model(canvas, pos, mask=seen)
    idx, live = fed.rows, fed.live
    assert live.sum(1).tolist() == plan.active.sum(1).tolist() == [3, 3]
    want = ref.gather(1, idx[..., None].expand(-1, -1, ref.shape[-1]))
    # fp32 logits of magnitude ~10 from GEMMs of other shapes: ~10 ulps of reassociation
    assert (fed.logits - want).abs()[live].max().item() <= 2e-5
    # RoPE at absolute positions: recomputed keys equal the full step's keys there (every
    # layer once the far field is hidden everywhere, the first layer in any case)
    act = plan.active[:, None, :, None].expand(-1, k_full.shape[2], -1, k_full.shape[4])
    layers = range(k_full.shape[0]) if truncate else [0]
    for layer in layers:
        diff = (plan.cache.k[layer] - k_full[layer]).abs()[act]
        assert diff.max().item() <= 1e-5


def _run_recording(monkeypatch, model, policy: str, prompt, mask=None, **kw):
    plans, steps = [], []
    real = sampler_module.make_plan

    def capture(*args, **kwargs):
        plans.append(real(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(sampler_module, "make_plan", capture)

    def record(state, commit):
        plan = plans[-1]
        steps.append(dict(full=plan.full.clone(), window=plan.window.clone(),
                          active=plan.active.clone(), in_phase=plan.in_phase.clone(),
                          masked=state.masked.clone(), eligible=state.eligible.clone(),
                          commit=commit.clone(), refreshed=state.refreshed.clone()))

    out = DiffusionSampler(model, policy, cache="window", debug=True, **kw).generate(
        prompt, mask, on_step=record)
    return out, steps


@pytest.mark.parametrize("family,policy", [("llada", "window"), ("dream", "window_dream")])
def test_plan_invariants(monkeypatch, family: str, policy: str) -> None:
    prompt, mask = _padded_batch(2)
    out, steps = _run_recording(monkeypatch, MODELS[family], policy, prompt, mask,
                                gen_length=24, window_tokens=8, active_tokens=3,
                                refresh_every=5)
    assert (out.answer != MASK).all()
    assert any(not s["full"].all() for s in steps)  # pruned steps really happened
    prev = None
    for s in steps:
        pruned = ~s["full"]
        assert torch.equal(s["refreshed"], s["full"])
        far = s["masked"] & ~s["window"]
        assert not (far & s["window"]).any()
        assert not (s["active"] & far).any()
        # active is inside the window or was decoded in this phase
        outside = s["active"] & ~(s["window"] | s["in_phase"] | ~s["masked"])
        assert not outside[pruned].any()
        # commits on pruned steps: active masked positions only, at most A candidates
        assert not (s["commit"] & ~(s["active"] & s["masked"]))[pruned].any()
        assert ((s["eligible"].sum(1) <= 3) | s["full"]).all()
        if prev is not None:  # the window set is constant within a row's phase (LLaDA fixes
            same = pruned & ~prev["full"]  # it after the full step's commits)
            assert torch.equal(s["window"][same], prev["window"][same])
        prev = s


def test_dream_full_steps_commit_the_leftmost_masked_position(monkeypatch) -> None:
    prompt, mask = _padded_batch(3)
    _, steps = _run_recording(monkeypatch, MODELS["dream"], "window_dream", prompt, mask,
                              gen_length=20, window_tokens=6, active_tokens=3,
                              refresh_every=4)
    full_steps = 0
    for s in steps:
        first = s["masked"].long().argmax(1)
        for r in range(2):
            if s["full"][r] and s["masked"][r].any():
                full_steps += 1
                assert s["commit"][r].nonzero().flatten().tolist() == [int(first[r])]
    assert full_steps >= 4


@pytest.mark.parametrize("family,policy", [("llada", "window"), ("dream", "window_dream")])
def test_batch_equals_rows_alone(family: str, policy: str) -> None:
    prompt, mask = _padded_batch(4)
    s = DiffusionSampler(MODELS[family], policy, gen_length=16, window_tokens=6,
                         active_tokens=2, refresh_every=3)
    out = s.generate(prompt, mask)
    alone = [s.generate(prompt[r:r + 1, int((mask[r] == 0).sum()):]) for r in range(2)]
    for r in range(2):
        assert torch.equal(out.answer[r], alone[r].answer[0])
        assert out.nfe[r] == alone[r].nfe[0]


def test_windows_prune_compute() -> None:
    """Pruned steps feed fewer positions: count the rows fed per forward."""
    model = MODELS["llada"]
    fed_rows = []
    forward = model.forward

    def counting(tokens, positions, **kw):
        fed_rows.append(tokens.shape[1])
        return forward(tokens, positions, **kw)

    model.forward = counting
    try:
        out = DiffusionSampler(model, "window", gen_length=32, window_tokens=16,
                               active_tokens=4, refresh_every=8).generate(_prompt(1, 8, 5))
    finally:
        del model.forward
    assert out.forwards == 32 and len(fed_rows) == 32
    assert [i for i, n in enumerate(fed_rows) if n == 40] == [0, 8, 16, 24]
    assert max(n for i, n in enumerate(fed_rows) if i % 8) <= 4 + 7


def test_eos_early_stop_cuts_and_forces_full_steps(monkeypatch) -> None:
    model = tiny_model("dream", seed=5)
    with torch.no_grad():
        model.head.weight[EOS] += 3.0
    prompt = _prompt(1, 4, 6)
    out, steps = _run_recording(monkeypatch, model, "window_dream", prompt, early_stop=True,
                                gen_length=24, window_tokens=8, active_tokens=4,
                                refresh_every=6)
    cut = int(out.lengths[0])
    assert cut < 24 and out.answer[0, cut - 1] == EOS and (out.answer[0, cut:] == EOS).all()
    first_cut = next(i for i, s in enumerate(steps)
                     if (s["commit"][0] & (torch.arange(28) >= 4 + cut - 1)).any()) + 1
    assert all(bool(s["full"][0]) for s in steps[first_cut:] if s["masked"][0].any())


def test_presets_and_errors() -> None:
    assert DiffusionSampler(MODELS["llada"], "window").config.cache.value == "window"
    assert make_policy("window_dream", early_stop=True).truncator is not None
    with pytest.raises(ValueError, match="bidirectional"):
        DiffusionSampler(tiny_model("sdar"), "window", gen_length=4).generate(_prompt(1, 3, 0))
    with pytest.raises(ValueError, match="rng='compact'"):
        DiffusionSampler(MODELS["llada"], "window", gen_length=8, window_tokens=4,
                         active_tokens=2, temperature=0.5, rng="reference").generate(
                             _prompt(1, 3, 0))
    with pytest.raises(ValueError, match="active_tokens"):
        DiffusionSampler(MODELS["llada"], "window", window_tokens=4, active_tokens=8)
    cfg_out = DiffusionSampler(MODELS["llada"], "window", gen_length=8, window_tokens=4,
                               active_tokens=2, cfg_scale=1.0).generate(_prompt(2, 3, 1))
    assert (cfg_out.answer != MASK).all()
