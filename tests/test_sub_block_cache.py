"""``cache="sub_block"`` (Fast-dLLM v2's block-level cache, ``cache.sub_block``) and
``separate_prefill`` on a tiny Fast-dLLM v2 model built from a config and a seed (blocks of 8,
sub-blocks of 4). The recorded ``use_block_cache`` cases: ``test_conformance_2026.py``."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.diagnostics.drift import measure_drift
from tests.helpers import EOS, tiny_model
from tests.moe_helpers import tiny_moe_model

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = tiny_moe_model("fastdllm2", bd_size=8)
PROMPT = torch.randint(0, EOS, (4, 11), generator=torch.Generator().manual_seed(1))
SETTINGS = dict(small_block_size=4, threshold=0.5, gen_length=30)


def test_right_after_a_refresh_equals_exact_and_drifts_between() -> None:
    """A refreshed row's logits equal a full forward without cache; the sub-block forwards
    between refreshes read stale block K/V (measured: nonzero drift)."""
    report = measure_drift(MODEL, PROMPT[:1], gen_length=30, block_length=None,
                           mode="sub_block", policy="fastdllm_v2", small_block_size=4,
                           threshold=0.5)
    assert report["refresh_max_abs"] < 1e-4
    assert report["max_abs_logit_drift"] > 1e-3 and report["argmax_agreement"] > 0.5


def test_sub_block_forwards_follow_the_refresh_rule() -> None:
    """A step that did not refresh fed only the row's current sub-block (4 rows), whose first
    position was already decided; the first step after a block's entry always refreshes when
    the entry committed the block's first (AR) token."""
    seen: list[tuple[int, bool, bool]] = []

    def watch(state, commit) -> None:
        refreshed = bool(state.refreshed[0])
        if state.block_step == 0:
            return
        first = int(torch.nonzero(state.eligible[0])[0]) if state.eligible[0].any() else None
        start = state.block_start - state.block_start % 8  # aligned block start
        sub = start + (first - start) // 4 * 4 if first is not None else None
        decided = sub is not None and bool(state.canvas[0, sub] != MODEL.mask_token_id)
        seen.append((state.block_step, refreshed, decided))
        if not refreshed:
            assert state.rows.shape[-1] == 4 and decided

    sampler = DiffusionSampler(MODEL, "fastdllm_v2", cache="sub_block", **SETTINGS)
    out = sampler.generate(PROMPT[:1], on_step=watch)
    assert any(not r for _, r, _ in seen) and any(r for _, r, _ in seen)
    assert all(r for step, r, d in seen if not d)  # an undecided sub-block start refreshes
    assert not (out.answer == MODEL.mask_token_id).any()


def test_batch_equals_rows_alone() -> None:
    """Each row decides its own forward: a batch whose rows disagree runs both calls in that
    step (``step_forwards`` 2) and every row gets its tokens and NFE alone."""
    sampler = DiffusionSampler(MODEL, "fastdllm_v2", cache="sub_block", debug=True, **SETTINGS)
    out = sampler.generate(PROMPT)
    assert 2 in out.step_forwards and out.forwards == sum(out.step_forwards)
    for r in range(PROMPT.shape[0]):
        alone = sampler.generate(PROMPT[r:r + 1])
        assert torch.equal(alone.tokens[0], out.tokens[r]), r
        assert int(alone.nfe[0]) == int(out.nfe[r]), r
    exact = DiffusionSampler(MODEL, "fastdllm_v2", cache="block_causal", **SETTINGS)
    assert not torch.equal(exact.generate(PROMPT).tokens, out.tokens)  # approximate


def test_sampled_decoding_terminates() -> None:
    sampler = DiffusionSampler(MODEL, "fastdllm_v2", cache="sub_block", temperature=0.8,
                               top_p=0.9, **SETTINGS)
    out = sampler.generate(PROMPT[:2], seed=[3, 4])
    assert not (out.answer == MODEL.mask_token_id).any()
    assert torch.equal(out.tokens[1], sampler.generate(PROMPT[1:2], seed=[4]).tokens[0])


def test_clear_errors_and_graph_fallback() -> None:
    with pytest.raises(ValueError, match="sub_block_size"):
        DiffusionSampler(MODEL, "threshold", cache="sub_block", gen_length=8).generate(
            PROMPT[:1])
    with pytest.raises(ValueError, match="block-diffusion"):
        DiffusionSampler(tiny_model("llada"), "threshold", cache="sub_block",
                         gen_length=8).generate(PROMPT[:1, :4])
    with pytest.raises(ValueError, match="classifier-free"):
        DiffusionSampler(MODEL, "fastdllm_v2", cache="sub_block", cfg_scale=1.0,
                         gen_length=8).generate(PROMPT[:1])
    with pytest.raises(ValueError, match="separate_prefill"):
        DiffusionSampler(MODEL, "threshold", cache="none", separate_prefill=True,
                         gen_length=8).generate(PROMPT[:1])
    sampler = DiffusionSampler(MODEL, "fastdllm_v2", cache="sub_block", graphs=True,
                               **SETTINGS)
    eager = DiffusionSampler(MODEL, "fastdllm_v2", cache="sub_block", **SETTINGS)
    assert torch.equal(sampler.generate(PROMPT[:1]).tokens, eager.generate(PROMPT[:1]).tokens)
    assert "sub_block" in (sampler.graph_reason or "")


@pytest.mark.parametrize("p, extra", [(11, 1), (16, 0), (5, 0), (19, 1)])
@pytest.mark.parametrize("cache", ["block_causal", "sub_block"])
def test_separate_prefill_adds_the_references_forward(p: int, extra: int, cache: str) -> None:
    """The prompt's complete blocks in a forward of their own: the same tokens, one forward
    more (every row's NFE too) when the prompt ends inside a block after a complete one."""
    prompt = torch.randint(0, EOS, (2, p), generator=torch.Generator().manual_seed(p))
    kw = dict(SETTINGS, cache=cache)
    merged = DiffusionSampler(MODEL, "fastdllm_v2", **kw).generate(prompt)
    apart = DiffusionSampler(MODEL, "fastdllm_v2", separate_prefill=True, **kw).generate(prompt)
    assert torch.equal(merged.tokens, apart.tokens)
    assert apart.forwards == merged.forwards + extra
    assert torch.equal(apart.nfe, merged.nfe + extra)


def test_separate_prefill_on_the_static_step() -> None:
    """The static-buffer step (``graphs=True``; eager on the CPU) after a separate prefill
    equals the eager loop."""
    kw = dict(cache="block_causal", gen_length=21, separate_prefill=True, tau=0.5)
    graphed = DiffusionSampler(MODEL, "threshold", graphs=True, **kw)
    out = graphed.generate(PROMPT[:2])
    assert graphed.graph_reason is None
    eager = DiffusionSampler(MODEL, "threshold", **kw).generate(PROMPT[:2])
    assert torch.equal(out.tokens, eager.tokens) and out.forwards == eager.forwards


def test_plan_mixed_step_right_after_a_refresh_is_exact() -> None:
    """``SubBlockPlan`` by hand: after a block's entry forward, row 0 (its sub-block starts on
    a prompt token, canvas unchanged) runs a sub-block forward and row 1 (its next sub-block
    starts masked) a refresh, in one step of two calls; both rows' scored logits equal a full
    forward without cache, since nothing changed outside row 0's sub-block since its K/V."""
    from dllm_decode.cache.plans import ForwardPlan
    from dllm_decode.cache.table import make_plan
    from dllm_decode.config import SamplerConfig
    from dllm_decode.types import CacheMode

    mask = MODEL.mask_token_id
    canvas = torch.cat([PROMPT[:2], torch.full((2, 13), mask)], 1)  # P 11, blocks of 8
    valid = torch.ones_like(canvas, dtype=torch.bool)
    pos = MODEL.rope_positions(valid)
    plan = make_plan(MODEL, CacheMode.SUB_BLOCK, valid, pos, SamplerConfig(cache="sub_block"),
                     sub_block=4)
    with torch.no_grad():
        entry = plan.forward(canvas, (11, 16), 8, 0, 11, False)
        canvas[1, 11] = 5  # row 1 finishes sub-block [8, 12); its next one starts masked
        host = plan.prepare(canvas, 1, 11).tolist()
        fed = plan.forward(canvas, (11, 16), 8, 1, 11, False, host=host)
        full = ForwardPlan(MODEL, CacheMode.NONE, valid, pos).forward(
            canvas, (0, 24), 0, 0, 0, True).logits
    assert entry.refresh and host == [1, 1] and fed.calls == 2
    assert fed.refreshed.tolist() == [False, True]
    assert fed.rows.tolist() == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert fed.live.tolist() == [[False, True, True, True], [True] * 4]
    want = full.gather(1, fed.rows[..., None].expand(-1, -1, full.shape[-1]))
    assert ((fed.logits - want).abs() * fed.live[..., None]).max() < 1e-4


def test_plan_rows_keep_their_stale_block_cache_in_a_mixed_step() -> None:
    """Row 0's block K/V stay those of its last refresh through a step in which row 1
    refreshes (the refresh call's K/V of row 0 are put back): its logits over three steps
    equal row 0's alone, and differ from a full forward (stale K/V at position 14)."""
    from dllm_decode.cache.plans import ForwardPlan
    from dllm_decode.cache.table import make_plan
    from dllm_decode.config import SamplerConfig
    from dllm_decode.types import CacheMode

    mask = MODEL.mask_token_id

    def run(rows: list[int]) -> list[torch.Tensor]:
        canvas = torch.cat([PROMPT[:2], torch.full((2, 13), mask)], 1)[rows]
        valid = torch.ones_like(canvas, dtype=torch.bool)
        plan = make_plan(MODEL, CacheMode.SUB_BLOCK, valid, MODEL.rope_positions(valid),
                         SamplerConfig(cache="sub_block"), sub_block=4)
        out, full = [], ForwardPlan(MODEL, CacheMode.NONE, valid, MODEL.rope_positions(valid))
        with torch.no_grad():
            plan.forward(canvas, (11, 16), 8, 0, 11, False)
            for step in (1, 2, 3):
                canvas[:, 14] = 7 + step  # outside row 0's sub-block: its K/V go stale
                if 1 in rows:
                    canvas[rows.index(1), 11] = 5  # row 1 refreshes every step
                host = plan.prepare(canvas, step, 11).tolist()
                fed = plan.forward(canvas, (11, 16), 8, step, 11, False, host=host)
                exact = full.forward(canvas, (0, 24), 0, 0, 0, True).logits[rows.index(0)]
                assert (fed.logits[rows.index(0), 1:] - exact[9:12]).abs().max() > 1e-3
                out.append(fed.logits[rows.index(0)])
        return out

    for batch, alone in zip(run([0, 1]), run([0]), strict=True):
        assert torch.allclose(batch, alone, atol=1e-5)
