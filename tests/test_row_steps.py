"""Per-row step values (``Capabilities.row_steps``, ``policies.rows``): one call over rows at
different steps of their blocks gives every row exactly what a call on that row alone, with
host-scalar step values, gives — commits, Selection tokens, edits, fused logits, stopper and
truncator outputs, and the per-request memory afterwards (gathered from and scattered into a
pool, as a serving engine keeps it), over consecutive steps with rows joining at different
rounds (SGLang's first-done-first-out batches)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor

from dllm_decode.integrations.sglang.pool import RequestPool, gather_rows
from dllm_decode.kernels import mix_seeds
from dllm_decode.policies import make_policy
from dllm_decode.policies.base import bind_of, init_memory_of
from dllm_decode.policies.capabilities import Capabilities, capabilities_of, policy_capabilities
from dllm_decode.policies.confidence import Origin, TopK
from dllm_decode.policies.editing import MinimalTopK
from dllm_decode.policies.fastdllm2 import SubBlockThreshold
from dllm_decode.policies.history import KLASS
from dllm_decode.policies.learn2pd import Learn2PD, filter_window, filter_windows
from dllm_decode.policies.learn2pd_filter import L2PFilter
from dllm_decode.policies.rows import lookup, span_mask, uniform
from dllm_decode.policies.sched import SchED
from dllm_decode.policies.window import EosCut
from dllm_decode.types import Proposal, ScoreKind, Selection, StepState

pytestmark = pytest.mark.usefixtures("one_thread")

K, V, MASK, EOS = 8, 12, 11, 0
#: per request: block start (its prompt tail), scheduled steps T, the round it joins
ROWS = [(0, 4, 0), (2, 3, 1), (0, 6, 2), (3, 5, 0), (1, 8, 3), (0, 5, 4)]
ROUNDS = 8
MODEL = SimpleNamespace(mask_token_id=MASK, eos_token_ids=(EOS,), block_size=K,
                        attention="block_causal", family="sdar")
torch.manual_seed(0)
FILTER = L2PFilter(K).eval()  # random weights: accepts some positions at 0.5


def _cfg(**kw: Any) -> SimpleNamespace:
    base = dict(block_length=K, steps=4, gen_length=K, temperature=0.0, top_p=None)
    return SimpleNamespace(**{**base, **kw})


# ---- what runs: every part of the presets served inside SGLang ---------------------------
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # id: (preset, parameters, sampler settings the parts bind to)
    "low_confidence": ("low_confidence", {}, {}),
    "maskgit_plus": ("maskgit_plus", {}, {}),
    "topk_margin": ("topk_margin", {}, {}),
    "entropy": ("entropy", {}, {}),
    "entropy_alg_temp": ("entropy", {"alg_temp": 0.5}, {}),
    "random": ("random", {}, {}),
    "low_confidence_dynamic": ("low_confidence_dynamic", {"tau": 0.8}, {}),
    "ccd": ("ccd", {"warm_up": 2}, {}),
    "ccd_no_seek": ("ccd", {"warm_up": 3, "seek_mode": False, "score": "prob"}, {}),
    "klass": ("klass", {"conf_threshold": 0.3, "kl_threshold": 0.5}, {}),
    "klass_max_conf": ("klass", {"conf_threshold": 0.3, "kl_threshold": 0.5, "history": 3,
                                 "unmask_strategy": "max_conf"}, {}),
    "learn2pd": ("learn2pd", {"filter": FILTER, "accept_thres": 0.55}, {}),
    "threshold": ("threshold", {"tau": 0.7}, {}),
    "threshold_random": ("threshold", {"tau": 0.7, "score": "random"}, {}),
    "factor": ("factor", {"factor": 2.0}, {}),
    "factor_random": ("factor", {"factor": 2.0, "score": "random"}, {}),
    "eb": ("eb", {"gamma": 0.5}, {}),
    "entropy_threshold": ("entropy_threshold", {}, {}),
    "ete": ("ete", {"tau": 0.9, "budget_nats": 0.5, "explore": 1}, {}),
    "fastdllm_v2": ("fastdllm_v2", {"threshold": 0.5, "small_block_size": 4}, {}),
    # a sub-block that does not divide the block (the per-row path's other branch)
    "fastdllm_v2_sub3": ("fastdllm_v2", {"threshold": 0.5, "small_block_size": 3}, {}),
    "fastdllm_v2_sampled": ("fastdllm_v2", {"threshold": 0.3, "small_block_size": 4,
                                            "mask_in_softmax": True}, {"temperature": 0.8}),
    "llada2": ("llada2", {"threshold": 0.6}, {}),
    "frechet": ("frechet", {"delta": 0.05}, {}),
    "dus": ("dus", {}, {}),
    "dus_confidence_skip": ("dus", {"order": "confidence", "threshold": 0.3}, {}),
    "dus_skip": ("dus", {"threshold": 0.3}, {}),
    "wide_in": ("wide_in", {"threshold": 0.4, "accept_min": 1, "accept_max": 3}, {}),
    "credit": ("credit", {"tau": 0.8}, {}),
    "credit_klass": ("credit", {"base": "klass", "conf_threshold": 0.3,
                                "kl_threshold": 0.5}, {}),
    "llada21": ("llada21", {"threshold": 0.6, "editing_threshold": 0.3}, {}),
    "edit": ("edit", {"tau": 0.7, "editing_threshold": 0.3}, {}),
    "sched": ("sched", {"tau_high": 1.0, "tau_low": 0.2}, {}),
    "sched_median_gate": ("sched", {"tau_high": 1.0, "tau_low": 0.2, "stat": "median",
                                    "patience_steps": 1, "min_progress": 0.2,
                                    "tau_mode": "exp", "region": "tail",
                                    "max_change_ratio": 0.5}, {}),
    "sched_quantile_use": ("sched", {"tau_high": 2.0, "tau_low": 0.5, "stat": "quantile",
                                     "stale": "use", "max_change_ratio": 0.5,
                                     "average_over_masked": False, "tau_mode": "linear"}, {}),
    "prophet": ("prophet", {"answer_offset": 1, "answer_length": 3, "tau_high": 3.0,
                            "tau_mid": 2.0, "tau_low": 0.5}, {}),
    "eotp": ("eotp", {"eos_token_ids": (EOS,)}, {}),
    "learn2pd_eot": ("learn2pd_eot", {"filter": FILTER, "accept_thres": 0.55,
                                      "eos_token_ids": (EOS,)}, {}),
}


#: events each case must show in some rows and not in all (``_run``'s counts)
EXPECT: dict[str, tuple[str, ...]] = {
    "low_confidence_dynamic": ("beyond",), "ccd": ("beyond",), "klass": ("beyond",),
    "credit_klass": ("beyond",), "learn2pd": ("beyond",), "learn2pd_eot": ("beyond", "cut"),
    "llada21": ("edit",), "edit": ("edit",), "sched": ("stop",),
    "sched_median_gate": ("stop",), "sched_quantile_use": ("stop",), "prophet": ("stop",),
    "eotp": ("cut",), "fastdllm_v2_sampled": ("drawn",),
}


def _built(case: str) -> tuple[Any, Any, Any, SimpleNamespace]:
    name, params, settings = CASES[case]
    policy = make_policy(name, **params)
    cfg = _cfg(**settings)
    parts = [bind_of(p, MODEL, cfg) if p is not None else None
             for p in (policy.selector, policy.stopper, policy.truncator)]
    return parts[0], parts[1], parts[2], cfg


# ---- the rows' steps and inputs --------------------------------------------------------
def _schedule(n_open: int, total: int, i: int) -> int:
    """LLaDA's even split of half a block's open positions over its steps (so a block's last
    scheduled step has more left than its budget, and budgets of 0 occur)."""
    base, rem = divmod(n_open // 2, total)
    return base + (i < rem) if i < total else 0


def _propose(logits: Tensor, canvas: Tensor, fresh: Tensor) -> Proposal:
    """The proposal of ``logits [b, K, V]``, each row computed alone (unscored: the canvas
    token, zeros), so a batch's rows are bitwise those of single-row calls."""
    rows = []
    for j in range(logits.shape[0]):
        z = logits[j:j + 1].float().clone()
        z[..., MASK] = -torch.inf
        logp = torch.log_softmax(z, -1)
        p = logp.exp()
        top_z = z.topk(2, -1).values
        top_p = p.topk(2, -1).values
        fields = (z.argmax(-1), top_p[..., 0], top_p[..., 0] - top_p[..., 1],
                  top_z[..., 0] - top_z[..., 1], torch.where(p > 0, p * logp, 0.0).sum(-1))
        live = fresh[j:j + 1]
        rows.append([torch.where(live, fields[0], canvas[j:j + 1])]
                    + [torch.where(live, f, 0.0) for f in fields[1:]])
    tokens, prob, margin, lmargin, negent = (torch.cat(col) for col in zip(*rows, strict=True))
    return Proposal(tokens, prob, margin, lmargin, negent)


@dataclasses.dataclass
class World:
    """The requests' canvases, lengths and step counters, shared by both runs."""

    canvas: Tensor  # [N, K]
    lengths: Tensor  # [N]
    steps: list[int]
    seeds: Tensor  # [N] int64
    times: Tensor  # [T_max + 1] float32, Dream's grid


def _world() -> World:
    gen = torch.Generator().manual_seed(7)
    n = len(ROWS)
    canvas = torch.full((n, K), MASK)
    for r, (bs, _, _) in enumerate(ROWS):
        canvas[r, :bs] = torch.randint(0, MASK, (bs,), generator=gen)  # EOS (0) too
    lengths = torch.tensor([K - bs for bs, _, _ in ROWS])
    seeds = torch.randint(0, 2**62, (n,), generator=gen)
    return World(canvas, lengths, [0] * n, seeds, torch.linspace(1.0, 1e-3, 9))


def _state(world: World, rows: list[int], rnd: int, logits: Tensor, memory: Any,
           budgeted: bool, edits: bool, per_row: bool, total_given: bool = True,
           timed: bool | None = None) -> StepState:
    """The step of ``rows``: per-row ``[B]`` step values, or (one row) host scalars.
    ``timed``: a fixed schedule of steps (``steps_left``; default: ``budgeted``)."""
    timed = budgeted if timed is None else timed
    canvas = world.canvas[rows].clone()
    bs = [ROWS[r][0] for r in rows]
    pos = torch.arange(K)
    fresh = pos[None] >= torch.tensor(bs)[:, None]
    masked = (canvas == MASK) & fresh
    steps = [world.steps[r] for r in rows]
    totals = [ROWS[r][1] if timed else K - ROWS[r][0] for r in rows]
    left = [max(ROWS[r][1] - i, 1) for r, i in zip(rows, steps, strict=True)]
    progress = [i / max(t - 1, 1) for i, t in zip(steps, totals, strict=True)]
    budget = torch.tensor([_schedule(K - ROWS[r][0], ROWS[r][1], i)
                           for r, i in zip(rows, steps, strict=True)]) if budgeted else None
    t = torch.stack([world.times[i] for i in steps])
    s = torch.stack([world.times[i + 1] for i in steps])
    if per_row:
        values = dict(step=torch.tensor(steps), block_step=torch.tensor(steps),
                      block_start=torch.tensor(bs), gen_start=torch.tensor(bs),
                      steps_left=torch.tensor(left) if timed else None,
                      progress=torch.tensor(progress, dtype=torch.float64), times=(t, s))
        total: Any = torch.tensor(totals)
    else:
        values = dict(step=steps[0], block_step=steps[0], block_start=bs[0], gen_start=bs[0],
                      steps_left=left[0] if timed else None, progress=progress[0],
                      times=(t[0], s[0]))
        total = totals[0]
    prop = _propose(logits, canvas, fresh)
    extras = {"lengths": world.lengths[rows].clone(), "eos_token_ids": (EOS,),
              "n_masked": int(masked.sum())}
    if total_given:
        extras["total_steps"] = total
    return StepState(
        proposal=prop, eligible=masked, masked=masked, fresh=fresh, canvas=canvas, block=0,
        block_end=K, budget=budget, generator=None, forward_start=0, forward_width=K,
        memory=memory, logits=logits, extras=extras, rows=torch.arange(K),
        refreshed=torch.tensor(steps) == 0, model=MODEL,
        editable=~masked & fresh if edits else None,
        row_seeds=mix_seeds(world.seeds[rows], rnd), **values)


def _decide(parts: tuple[Any, Any, Any], state: StepState) -> dict[str, Tensor]:
    """What the engine takes from one call: commits, tokens, probabilities, edits, the stop
    flags and the truncated lengths."""
    selector, stopper, truncator = parts
    chosen = selector.select(state)
    sel = chosen if isinstance(chosen, Selection) else Selection(chosen)
    prop = state.proposal
    edit = sel.edit if sel.edit is not None else torch.zeros_like(sel.commit)
    tokens = prop.tokens if sel.tokens is None else sel.tokens
    prob = prop.prob if sel.prob is None else sel.prob
    out = {"commit": sel.commit, "edit": edit,
           "tokens": torch.where(sel.commit | edit, tokens, -1),
           "prob": torch.where(sel.commit, prob.to(prop.prob.dtype), 0.0)}
    if stopper is not None:
        if isinstance(stopper, SchED):  # what it decides from, beside the decision
            out["region"] = stopper.region_mask(state)
            out["statistic"] = stopper.statistic(state)
            tau = stopper.threshold(stopper.clock(state))
            out["tau"] = torch.as_tensor(tau, dtype=torch.float32).expand(sel.commit.shape[0])
        out["stop"] = stopper.should_stop(state)
    if truncator is not None:
        out["cut"] = truncator.truncate(state, sel.commit)
    return out


def same_values(a: Tensor, b: Tensor) -> bool:
    """Exact for integer and bool tensors; float tensors to the last bits (1e-6 relative).
    Transcendentals (``pow``, ``log``, ``softmax``) of the same element can round differently
    with the batch's size on some CPUs (a vector body vs a scalar tail; e.g.
    ``ATEN_CPU_CAPABILITY=default``): the commits and tokens stay compared exactly."""
    if a.is_floating_point() and b.is_floating_point():
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-7,
                                                     equal_nan=True)
    return torch.equal(a, b)


def _same_memory(pooled: Any, alone: Any, where: str) -> None:
    """Every tensor field of a request's pooled memory equals its single-row memory (a
    pooled field wider along dim 1, the credit over ``[0, end)``, is compared on its tail)."""
    if not dataclasses.is_dataclass(alone):
        return
    for f in dataclasses.fields(alone):
        a, b = getattr(pooled, f.name), getattr(alone, f.name)
        if isinstance(b, Tensor):
            assert isinstance(a, Tensor), f"{where}: {f.name} missing from the pool"
            if a.dim() > 1 and a.shape[1] != b.shape[1]:
                a = a[:, a.shape[1] - b.shape[1]:]
            assert same_values(a, b), f"{where}: memory field {f.name} differs"
        elif dataclasses.is_dataclass(b) and dataclasses.is_dataclass(a):
            _same_memory(a, b, f"{where}.{f.name}")


def _run(selector: Any, stopper: Any, truncator: Any, *, total_given: bool = True,
         rounds: int = ROUNDS) -> dict[str, int]:
    """Both runs over ``rounds`` rounds; returns what happened (so the test cannot pass
    vacuously): ``mixed`` rounds with rows at different steps, and the rows that committed
    beyond their budget, stopped, were cut, edited, or took drawn tokens."""
    parts = (selector, stopper, truncator)
    caps = policy_capabilities(*parts)
    assert caps.row_steps
    sel_caps = caps.selector
    timed = sel_caps.budgeted or sel_caps.proposes_after_select  # Dream's grid: origin
    world, n = _world(), len(ROWS)
    pool = RequestPool(selector, K, n, torch.device("cpu"))  # SGLang's pool, slot r = row r
    alone: list[Any] = [None] * n
    done = [False] * n
    seen = dict.fromkeys(("mixed", "beyond", "stop", "cut", "edit", "drawn", "rows"), 0)
    gen = torch.Generator().manual_seed(11)
    base = torch.randn(n, K, V, generator=gen) * 3.0
    for rnd in range(rounds):
        for r, (_, _, join) in enumerate(ROWS):
            if join == rnd:  # a request joins: fresh memory, in the pool and alone
                alone[r] = init_memory_of(selector, 1, K, torch.device("cpu"))
                pool.reset(torch.tensor([r]))
        # each position's logits drift around a fixed preference (history rules can fire)
        logits = base + torch.randn(n, K, V, generator=gen)
        active = [r for r in range(n) if ROWS[r][2] <= rnd and not done[r]]
        if not active:
            continue
        seen["mixed"] += len({world.steps[r] for r in active}) > 1
        seen["rows"] += len(active)
        batch_logits = logits[active].clone()
        slots = torch.tensor(active)
        memory = pool.gather(slots)
        if sel_caps.fuses_logits:
            bs = torch.tensor([ROWS[r][0] for r in active])
            masked = (world.canvas[active] == MASK) & (torch.arange(K)[None] >= bs[:, None])
            batch_logits = selector.fuse_logits(
                batch_logits, torch.arange(K), masked, memory, (bs, K),
                block_step=torch.tensor([world.steps[r] for r in active]))
        batch = _decide(parts, _state(world, active, rnd, batch_logits, memory,
                                      sel_caps.budgeted, sel_caps.edits, True, total_given,
                                      timed))
        if memory is not None:
            pool.scatter(slots, memory)
        for j, r in enumerate(active):
            row_logits = logits[r:r + 1].clone()
            if sel_caps.fuses_logits:
                bs0 = ROWS[r][0]
                masked = (world.canvas[r:r + 1] == MASK) & (torch.arange(K)[None] >= bs0)
                row_logits = selector.fuse_logits(row_logits, torch.arange(K), masked,
                                                  alone[r], (bs0, K))
                assert torch.equal(batch_logits[j:j + 1], row_logits), f"row {r}: fused"
            state = _state(world, [r], rnd, row_logits, alone[r], sel_caps.budgeted,
                           sel_caps.edits, False, total_given, timed)
            one = _decide(parts, state)
            for key, value in one.items():
                assert torch.equal(batch[key][j:j + 1], value), \
                    f"round {rnd}, row {r} (step {world.steps[r]}): {key} differs"
            _same_memory(pool.gather(torch.tensor([r])), alone[r], f"row {r}")
            _count(seen, state, one)
            _advance(world, r, state, one)
            done[r] = not bool((world.canvas[r] == MASK).any())
    return seen


def _count(seen: dict[str, int], state: StepState, out: dict[str, Tensor]) -> None:
    if state.budget is not None and state.steps_left != 1:
        seen["beyond"] += int(out["commit"].sum() > state.budget.clamp(min=1).sum())
    seen["stop"] += int(out.get("stop", torch.zeros(1, dtype=torch.bool)).any())
    if "cut" in out:
        seen["cut"] += int((out["cut"] < state.extras["lengths"]).any())
    seen["edit"] += int(out["edit"].any())
    drawn = (out["tokens"] != state.proposal.tokens) & out["commit"]
    seen["drawn"] += int(drawn.any())


def _advance(world: World, r: int, state: StepState, out: dict[str, Tensor]) -> None:
    """The engine's write-back: commits and edits, the stopper's greedy fill, the block's
    last scheduled step; the truncated length; the row's step."""
    write = out["commit"] | out["edit"]
    tokens = torch.where(write, out["tokens"], state.proposal.greedy)
    fill = state.masked & state.fresh
    if "stop" in out:
        write = write | (out["stop"][:, None] & fill)
    if state.steps_left == 1:
        write = write | state.eligible
    world.canvas[r] = torch.where(write & (tokens != MASK), tokens, state.canvas)[0]
    if "cut" in out:
        world.lengths[r] = torch.minimum(world.lengths[r], out["cut"][0])
    world.steps[r] += 1


@pytest.mark.parametrize("case", list(CASES))
def test_one_call_equals_a_call_per_row(case: str) -> None:
    selector, stopper, truncator, _ = _built(case)
    seen = _run(selector, stopper, truncator)
    assert seen["mixed"] >= 4, seen
    for event in EXPECT.get(case, ()):
        assert 0 < seen[event] < seen["rows"], (event, seen)


def test_prophet_without_total_steps_derives_it_per_row() -> None:
    """Prophet's phase clock derives T from ``progress`` when ``total_steps`` is absent."""
    selector, stopper, truncator, _ = _built("prophet")
    seen = _run(selector, stopper, truncator, total_given=False)
    assert seen["mixed"] >= 4 and 0 < seen["stop"] < seen["rows"], seen


def test_origin_on_the_dream_grid_draws_per_row() -> None:
    """Dream's ``origin`` (refused inside SGLang, converted anyway): per-row ``times`` and
    ``steps_left``, draws from the row seeds."""
    assert _run(Origin(), None, None)["mixed"] >= 4


def test_eos_cut_per_row() -> None:
    seen = _run(TopK(), None, EosCut())
    assert seen["mixed"] >= 4 and seen["cut"] > 0, seen


# ---- the declaration ----------------------------------------------------------------------
def test_every_served_preset_declares_row_steps() -> None:
    for case in CASES:
        selector, stopper, truncator, _ = _built(case)
        assert policy_capabilities(selector, stopper, truncator).row_steps, case
    for name in ("sched", "prophet"):  # the stoppers alone
        assert capabilities_of(make_policy(name).stopper, "stopper").row_steps


def test_undeclared_parts_keep_the_shared_form() -> None:
    class Mine:
        def select(self, state: StepState) -> Tensor:
            return state.eligible

    assert not Capabilities().row_steps
    assert not policy_capabilities(Mine()).row_steps
    assert not policy_capabilities(TopK(), stopper=None, truncator=_Plain()).row_steps
    assert policy_capabilities(TopK(), truncator=EosCut()).row_steps
    caps = capabilities_of(_Declared(), "truncator")  # any role may declare it
    assert caps.row_steps


class _Plain:
    def truncate(self, state: StepState, commit: Tensor) -> Tensor:
        return torch.full((commit.shape[0],), commit.shape[1])


class _Declared(_Plain):
    capabilities = Capabilities(row_steps=True)


# ---- helpers and windows ------------------------------------------------------------------
def test_helpers() -> None:
    table = torch.tensor([3, 2, 1])
    assert lookup(table, torch.tensor([0, 2, 3, -1])).tolist() == [3, 1, 0, 0]
    assert lookup(table[:0], torch.tensor([0, 1]), 5).tolist() == [5, 5]
    state = SimpleNamespace(eligible=torch.zeros(2, 5, dtype=torch.bool),
                            block_start=torch.tensor([1, 3]), block_end=4)
    assert span_mask(state).int().tolist() == [[0, 1, 1, 1, 0], [0, 0, 0, 1, 0]]
    shared = SimpleNamespace(eligible=state.eligible, block_start=2, block_end=4)
    assert span_mask(shared).int().tolist() == [[0, 0, 1, 1, 0]] * 2
    with pytest.raises(ValueError, match="row_seeds"):
        uniform(SimpleNamespace(row_seeds=None), (1, 2))


@dataclasses.dataclass
class _Inner:
    a: Tensor
    lazy: Tensor | None = None


@dataclasses.dataclass
class _Outer:
    inner: _Inner
    b: Tensor
    counter: int = 0


class _OuterPart:
    """A part whose memory is an ``_Outer`` (fresh rows: ``a`` -1, ``b`` 5)."""

    def init_memory(self, batch: int, length: int, device: torch.device) -> _Outer:
        if batch == 1:
            return _Outer(_Inner(torch.tensor([-1.0])), torch.full((1, 2), 5.0))
        return _Outer(_Inner(torch.arange(float(batch))), torch.zeros(batch, 2))


def test_memory_gather_scatter_and_reset() -> None:
    requests = RequestPool(_OuterPart(), K, 4, torch.device("cpu"))
    pool = requests.memory
    part = requests.gather(torch.tensor([3, 1]))
    assert type(part) is _Outer and part.inner.a.tolist() == [3.0, 1.0]
    part.b.add_(1.0)
    part.inner.lazy = torch.tensor([[7], [8]])  # allocated during the call
    part.inner.a = part.inner.a * 10  # a field replaced by a new tensor
    requests.scatter(torch.tensor([3, 1]), part)
    pool = requests.memory
    assert pool.inner.a.tolist() == [0.0, 10.0, 2.0, 30.0]
    assert pool.inner.lazy.tolist() == [[0], [8], [0], [7]]
    assert pool.b.sum(1).tolist() == [0.0, 2.0, 0.0, 2.0]
    requests.reset(torch.tensor([1]))
    pool = requests.memory
    assert pool.inner.a.tolist() == [0.0, -1.0, 2.0, 30.0]
    assert pool.inner.lazy.tolist() == [[0], [0], [0], [7]]
    assert pool.b[1].tolist() == [5.0, 5.0]


@pytest.mark.parametrize("length,end,start,gen", [
    (16, 16, 8, 8),  # the block is the window
    (16, 16, 10, 10),  # a first block cut by the prompt: the aligned window
    (12, 12, 8, 0),  # a last block cut by the canvas end: padded
    (16, 16, 10, 4),  # none of them: refused alone, accepts nothing per row
])
def test_learn2pd_windows_per_row(length: int, end: int, start: int, gen: int) -> None:
    gen_t = torch.Generator().manual_seed(3)
    prob = torch.rand(2, length, generator=gen_t)
    masked = torch.rand(2, length, generator=gen_t) > 0.3
    masked[:, :start] = False
    selector = Learn2PD(filter=FILTER, accept_thres=0.5)

    def state(bs: Any, gs: Any, rows: slice) -> StepState:
        return StepState(proposal=Proposal(torch.zeros(2, length, dtype=torch.long)[rows],
                                           prob[rows]),
                         eligible=masked[rows], masked=masked[rows], fresh=masked[rows],
                         canvas=torch.zeros(2, length, dtype=torch.long)[rows], step=0,
                         block=0, block_start=bs, block_end=end, gen_start=gs,
                         steps_left=None, budget=None, progress=0.0, generator=None,
                         forward_start=0, forward_width=length)

    rows = state(torch.tensor([start, start]), torch.tensor([gen, gen]), slice(None))
    got = selector.accepted(rows)
    valid = filter_windows(rows, K)[1]
    for j in range(2):
        alone = state(start, gen, slice(j, j + 1))
        try:
            filter_window(alone, K)
        except ValueError:
            assert not valid[j] and not got[j].any()
            continue
        assert valid[j] and torch.equal(got[j:j + 1], selector.accepted(alone))


def test_shared_form_keeps_host_values() -> None:
    """A state with host values (the library's loop) still takes the shared branches:
    ``MinimalTopK``'s schedule and ``SubBlockThreshold``'s AR token as before."""
    rule = MinimalTopK(threshold=0.99, block_length=4, block_steps=2, gen_length=4)
    assert rule.k(0) == 2 and rule.k(5) == 0
    assert rule.k_rows(torch.tensor([0, 1, 2, 5])).tolist() == [2, 2, 0, 0]
    sub = SubBlockThreshold(block_size=K)
    state = _state(_world(), [0], 0, torch.zeros(1, K, V), None, False, False, False)
    assert sub.select(state).nonzero().tolist() == [[0, 0]]  # the AR token alone


def test_topk_score_kinds_in_cases() -> None:
    """Every score kind of ``TopK`` is among the cases (Dream's presets differ only there)."""
    kinds = {_built(c)[0].score for c in CASES if isinstance(_built(c)[0], TopK)}
    assert kinds == {ScoreKind.PROB, ScoreKind.MARGIN, ScoreKind.NEG_ENTROPY}


# ---- what the round trip above cannot see -----------------------------------------------
def _plain(logits: Tensor, block_step: Any, memory: Any, **kw: Any) -> StepState:
    """A step over a block with nothing before it (shared or per-row ``block_step``)."""
    b = logits.shape[0]
    masked = torch.ones(b, K, dtype=torch.bool)
    canvas = torch.full((b, K), MASK)
    values = dict(step=block_step, block_start=0, gen_start=0, progress=0.0,
                  steps_left=None, budget=torch.ones(b, dtype=torch.long))
    values.update(kw)
    return StepState(proposal=_propose(logits, canvas, masked), eligible=masked,
                     masked=masked, fresh=masked, canvas=canvas, block=0, block_end=K,
                     generator=None, forward_start=0, forward_width=K, memory=memory,
                     logits=logits, rows=torch.arange(K), block_step=block_step, **values)


def test_klass_warm_up_reads_each_rows_block_step() -> None:
    """KLASS's in-block warm-up on memory that already holds stable KLs (the library's loop
    carries it across blocks): per row it reads ``block_step``, alone its host counters."""
    klass = KLASS(conf_threshold=0.05, kl_threshold=1.0, history=3)
    steps = [0, 1, 2, 3]
    logits = torch.randn(1, K, V, generator=torch.Generator().manual_seed(5)).expand(4, -1, -1)
    logits = logits.contiguous()

    def settled(b: int) -> Any:  # KL 0 at every position from here on
        mem = klass.init_memory(b, K, torch.device("cpu"))
        mem.kl.zero_()
        mem.fresh_prev.fill_(True)
        z = logits[:b].clone()
        z[..., MASK] = -torch.inf
        mem.log_prev = torch.log(torch.softmax(z, -1) + 1e-12)
        return mem

    pool = settled(4)
    batch = klass.select(_plain(logits, torch.tensor(steps), pool))
    sizes = []
    for j, step in enumerate(steps):
        mem = gather_rows(settled(4), torch.tensor([j]))
        mem.block, mem.block_step = (-1, 0) if step == 0 else (0, step - 1)
        alone = klass.select(_plain(logits[j:j + 1], step, mem))
        assert torch.equal(batch[j:j + 1], alone)
        _same_memory(gather_rows(pool, torch.tensor([j])), mem, f"row {j}")
        sizes.append(int(alone.sum()))
    assert sizes[0] == sizes[1] == 1 and sizes[2] > 1  # warm-up, then the ready sets


def test_credit_restarts_at_a_block_start_whatever_the_pool_holds() -> None:
    """A row at its block's first step starts from zero credit even when its pool rows hold
    another request's (the shared form resets on a new block)."""
    from dllm_decode.policies.credit import Credit, CreditMemory

    credit = Credit(TopK())
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, K, V, generator=gen)
    masked = torch.ones(2, K, dtype=torch.bool)
    stale = CreditMemory(base=None, credit=torch.rand(2, K, V, generator=gen) * 5)
    fused = credit.fuse_logits(logits.clone(), torch.arange(K), masked, stale,
                               (torch.tensor([0, 3]), K), block_step=torch.tensor([0, 0]))
    for j, start in enumerate((0, 3)):
        fresh = credit.init_memory(1, K, torch.device("cpu"))
        alone = credit.fuse_logits(logits[j:j + 1].clone(), torch.arange(K), masked[j:j + 1],
                                   fresh, (start, K))
        assert same_values(fused[j:j + 1], alone)
        assert same_values(stale.credit[j:j + 1, start:], fresh.credit)
        assert not stale.credit[j, :start].any()


def test_sched_compares_per_row_thresholds_in_float32() -> None:
    """A host threshold is compared in the statistic's float32; so is a per-row one (at
    progress 1/7 the float64 threshold 18/7 rounds down in float32: a margin equal to the
    rounded value clears it, as it does alone)."""
    stopper = SchED(tau_mode="linear", tau_high=3.0, tau_low=0.0, max_change_ratio=1.0)
    tau = 3.0 * (1.0 - 1 / 7)
    rounded = torch.tensor(tau, dtype=torch.float32)
    assert rounded.item() < tau
    masked = torch.zeros(2, K, dtype=torch.bool)
    masked[:, 2] = True
    margin = torch.zeros(2, K).masked_fill(masked, rounded.item())
    tokens = torch.zeros(2, K, dtype=torch.long)

    def state(rows: slice, progress: Any, step: Any) -> StepState:
        return StepState(proposal=Proposal(tokens[rows], margin[rows], logit_margin=margin[rows]),
                         eligible=masked[rows], masked=masked[rows], fresh=masked[rows],
                         canvas=tokens[rows], step=step, block=0, block_start=0, block_end=K,
                         gen_start=0, steps_left=None, budget=None, progress=progress,
                         generator=None, forward_start=0, forward_width=K)

    rows = stopper.should_stop(state(slice(None), torch.full((2,), 1 / 7, dtype=torch.float64),
                                     torch.ones(2, dtype=torch.long)))
    alone = stopper.should_stop(state(slice(0, 1), 1 / 7, 1))
    assert alone.tolist() == [True] and rows.tolist() == [True, True]


def test_sched_per_row_thresholds_round_like_host_ones() -> None:
    """Per-row thresholds come from torch's float64 cos / exp, host ones from Python's math:
    they may differ in the last float64 bit (93 of 98,688 values here), never after the
    float32 rounding the decision uses, at every progress ``i / (T - 1)`` with T <= 256."""
    us = [i / max(t - 1, 1) for t in range(1, 257) for i in range(t)]
    for mode in ("cosine", "exp", "linear", "piecewise"):
        stopper = SchED(tau_mode=mode)
        rows = stopper.threshold(torch.tensor(us, dtype=torch.float64)).float()
        host = torch.tensor([stopper.threshold(u) for u in us], dtype=torch.float32)
        assert torch.equal(rows, host), mode
