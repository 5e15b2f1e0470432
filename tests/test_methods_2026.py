"""The 2026 training-free methods as parts of the one loop: Fast-dLLM++'s Fréchet profile rule
(``frechet``), the DUS dilated schedule (``dus``) and CreditDecoding's credit fusion
(``credit``): the spec's test vectors, the compositions that must equal their parts, and the
front ends (``DiffusionSampler``, ``make_policy`` / ``compose``, the CLI, grids)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.policies import Factor, Threshold, compose, make_policy
from dllm_decode.policies.credit import Credit, CreditMemory
from dllm_decode.policies.dilated import DilatedSchedule, dilated_levels
from dllm_decode.policies.frechet import Frechet
from dllm_decode.types import Proposal, StepState
from tests.helpers import prompt_ids, tiny_model
from tests.mock_models import ScriptedLM, by_step, from_probs, single_thread  # noqa: F401

torch.manual_seed(0)


def _state(prob: list[list[float]], eligible: list[list[bool]] | None = None, *,
           block: tuple[int, int] | None = None, block_step: int = 0) -> StepState:
    p = torch.tensor(prob, dtype=torch.float32)
    e = torch.ones_like(p, dtype=torch.bool) if eligible is None else torch.tensor(eligible)
    tokens = torch.zeros_like(p, dtype=torch.long)
    start, end = block or (0, p.shape[1])
    return StepState(proposal=Proposal(tokens, p), eligible=e, masked=e, fresh=e, canvas=tokens,
                     step=0, block=0, block_start=start, block_end=end, gen_start=0,
                     steps_left=None, budget=None, progress=0.0, generator=None,
                     forward_start=0, forward_width=p.shape[1], block_step=block_step)


# ---- Fréchet ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("profile", "delta", "count"), [
    # methods-2026 Appendix A.2 (delta 0.25): G = inf, .979, .929, .759, .559, -.091, ...
    ([0.999, 0.99, 0.97, 0.9, 0.85, 0.6, 0.3], 0.25, 5),
    ([0.95] * 6, 0.25, 6),
    ([0.99, 0.99, 0.99, 0.80, 0.5], 0.25, 4),
    ([0.3, 0.2], 0.25, 1),  # rank 1 always
    ([0.99, 0.99, 0.99, 0.5], 0.0, 3),
])
def test_frechet_vectors(profile: list[float], delta: float, count: int) -> None:
    perm = torch.randperm(len(profile))  # the rule sorts: order on the canvas is irrelevant
    state = _state([[profile[i] for i in perm]])
    assert int(Frechet(delta=delta).select(state).sum()) == count


def test_frechet_commits_the_most_confident_prefix() -> None:
    state = _state([[0.6, 0.99, 0.3, 0.97, 0.999]], [[True, True, True, False, True]])
    commit = Frechet(delta=0.25).select(state)[0].tolist()
    assert commit == [False, True, False, False, True]  # 0.999, 0.99; 0.6 fails, 0.97 ineligible


def test_frechet_equal_confidences_is_factor() -> None:
    """Cor. 4.2: equal confidences -> Fast-dLLM's factor rule with f = 1 - delta."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 12, (1,), generator=gen))
        c = float(torch.rand(1, generator=gen)) ** 0.2
        delta = float(torch.rand(1, generator=gen)) * 0.5
        # away from the boundary c = 1 - (1 - delta) / (n + 1), where > and >= differ
        ns = torch.arange(1, n + 1)
        if ((c - (1 - (1 - delta) / (ns + 1))).abs() < 1e-6).any():
            continue
        state = _state([[c] * n])
        got = Frechet(delta=delta).select(state)
        assert torch.equal(got, Factor(factor=1 - delta).select(state)), (n, c, delta)


def test_frechet_commits_at_least_factor() -> None:
    """Prop. 4.3: the profile bonus B_n >= 0, so Fréchet never commits fewer than factor with
    f = 1 - delta (heterogeneous profiles; strictly more on some)."""
    gen = torch.Generator().manual_seed(1)
    more = 0
    for _ in range(300):
        n = int(torch.randint(2, 16, (1,), generator=gen))
        prob = torch.rand(1, n, generator=gen) ** 0.15
        state = _state(prob.tolist())
        fr = int(Frechet(delta=0.25).select(state).sum())
        fa = int(Factor(factor=0.75).select(state).sum())
        assert fr >= fa
        more += fr > fa
    assert more > 0


def test_frechet_checks_parameters() -> None:
    for bad in ({"delta": -0.1}, {"delta": 1.5}, {"delta": "big"}, {"score": "neg_entropy"}):
        with pytest.raises(ValueError):
            Frechet(**bad)


# ---- DUS --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("length", "base", "levels"), [
    # methods-2026 Appendix A.1 (a = 2, k = 1 unless given)
    (4, 2, [[0, 2], [1, 3]]),
    (8, 2, [[0, 4], [2, 6], [1, 3, 5, 7]]),
    (16, 2, [[0, 8], [4, 12], [2, 6, 10, 14], [1, 3, 5, 7, 9, 11, 13, 15]]),
    (12, 2, [[0, 6], [3, 9], [1, 2, 4, 5, 7, 8, 10, 11]]),
    (8, 3, [[0, 2, 4, 6], [1, 3, 5, 7]]),
])
def test_dus_levels(length: int, base: int, levels: list[list[int]]) -> None:
    assert [list(lv) for lv in dilated_levels(length, base)] == levels


def test_dus_level_sizes_32() -> None:
    assert [len(lv) for lv in dilated_levels(32)] == [2, 2, 4, 8, 16]
    for k in (5, 7, 24, 64):  # every position exactly once
        assert sorted(j for lv in dilated_levels(k) for j in lv) == list(range(k))


def test_dus_decodes_level_by_level() -> None:
    """One forward per level, each level written whatever its confidence."""
    model = ScriptedLM(by_step([torch.randn(40, 16)]), vocab_size=16)
    out = DiffusionSampler(model, "dus", gen_length=16, block_length=8).generate(
        torch.tensor([[1, 2, 3]]))
    assert out.forwards == 2 * 3 and int(out.nfe[0]) == 6
    steps = out.commit_step[0].tolist()
    want = [0] * 16
    for blk in range(2):
        for depth, level in enumerate(dilated_levels(8)):
            for j in level:
                want[blk * 8 + j] = blk * 3 + depth
    assert steps == want


def test_dus_skip_defers_to_the_next_level() -> None:
    prob = [[0.9, 0.1, 0.9, 0.9, 0.2, 0.9, 0.9, 0.9]]  # level 0 = {0, 4}: 4 is skipped
    rule = DilatedSchedule(threshold=0.3)
    assert rule.select(_state(prob))[0].nonzero().flatten().tolist() == [0]
    # next level {2, 6} plus the deferred 4 (now above the threshold)
    eligible = [[False] + [True] * 7]
    nxt = rule.select(_state([[0.9, 0.1, 0.9, 0.9, 0.5, 0.9, 0.9, 0.9]], eligible, block_step=1))
    assert nxt[0].nonzero().flatten().tolist() == [2, 4, 6]
    # the last level commits everything, confident or not
    last = [[False, True, False, True, False, True, False, True]]
    assert rule.select(_state(prob, last, block_step=2))[0].tolist() == last[0]
    assert rule.capabilities.may_commit_nothing and not DilatedSchedule().capabilities \
        .may_commit_nothing


def test_dus_confidence_order_takes_level_sizes() -> None:
    """The "Conf. increasing-k" ablation: |level i| positions per step, by confidence."""
    model = ScriptedLM(by_step([torch.randn(40, 16) * 3]), vocab_size=16)
    out = DiffusionSampler(model, "dus", order="confidence", gen_length=16,
                           block_length=16).generate(torch.tensor([[1, 2, 3]]))
    assert out.commits_per_step()[0].tolist() == [len(lv) for lv in dilated_levels(16)]


def test_dus_checks_parameters() -> None:
    for bad in ({"base": 1}, {"skip_exp": 0}, {"threshold": 1.5}, {"order": "random"}):
        with pytest.raises(ValueError):
            DilatedSchedule(**bad)


# ---- CreditDecoding -------------------------------------------------------------------------

def test_credit_fusion_vectors() -> None:
    """methods-2026 Appendix A.3 (dInfer semantics, alpha 0.7, gamma 0.2, beta 0.8): one
    masked position, raw top-1 probability 0.5 -> 0.6 -> 0.7 on the same token."""
    rule = Credit(Threshold(0.8))
    mem = rule.init_memory(1, 1, torch.device("cpu"))
    masked = torch.ones(1, 1, dtype=torch.bool)
    rows = torch.tensor([0])
    fused_p, credit = [], []
    for p in (0.5, 0.6, 0.7):
        rest = (1 - p) / 3
        logits = from_probs(torch.tensor([[[p, rest, rest, rest]]]))
        fused = rule.fuse_logits(logits, rows, masked, mem, (0, 1))
        fused_p.append(float(torch.softmax(fused, -1)[0, 0, 0]))
        credit.append(float(mem.credit[0, 0, 0]))
    assert fused_p == pytest.approx([0.6079, 0.7454, 0.8408], abs=1e-4)
    assert credit == pytest.approx([0.8706, 1.5993, 2.2106], abs=1e-4)


def _rising_script() -> ScriptedLM:
    """Position 3 (the generation's first) climbs 0.5, 0.61, 0.72, 0.83 on token 1; two
    positions are sure, three sit at 0.75 / 0.74 / 0.73 (the threshold's fallback takes them
    first)."""
    def row(top: int, p: float) -> list[float]:
        probs = [(1 - p) / 14] * 16
        probs[top] = p
        return probs

    steady = [row(2, 0.99)] * 2 + [row(5, 0.75), row(6, 0.74), row(7, 0.73)]
    tables = [from_probs(torch.tensor([row(0, 0.99)] * 3 + [row(1, 0.5 + 0.11 * s)] + steady))
              for s in range(6)]
    return ScriptedLM(by_step(tables), vocab_size=16)


def test_credit_commits_consistent_tokens_earlier() -> None:
    prompt = torch.tensor([[4, 5, 6]])
    plain = DiffusionSampler(_rising_script(), "threshold", tau=0.8, gen_length=6).generate(
        prompt)
    fused = DiffusionSampler(_rising_script(), "credit", tau=0.8, gen_length=6).generate(prompt)
    # raw: above 0.8 only at the 4th forward (the fallback takes 0.75, then 0.74 first)
    assert plain.commit_step[0].tolist() == [3, 0, 0, 1, 2, 4]
    # fused: 0.75 / 0.74 / 0.73 cross 0.8 at once (0.827 / 0.819 / 0.811), position 3 follows
    assert fused.commit_step[0].tolist() == [1, 0, 0, 0, 0, 0]
    assert (fused.forwards, plain.forwards) == (2, 5)
    assert torch.equal(fused.tokens, plain.tokens)


@pytest.mark.parametrize("base", [("threshold", {"tau": 0.7}), ("frechet", {"delta": 0.1}),
                                  ("eb", {"gamma": 0.5}), ("factor", {"factor": 1.0}),
                                  ("low_confidence", {"steps": 8})])
def test_credit_alpha_zero_is_its_base(base: tuple[str, dict]) -> None:
    name, params = base
    model = tiny_model("llada", seed=3, init_std=1.0)
    prompt = prompt_ids(2, 5, seed=4)
    kw = {"gen_length": 16, "block_length": 8}
    want = DiffusionSampler(model, name, **params, **kw).generate(prompt)
    got = DiffusionSampler(model, "credit", base=name, credit_alpha=0.0, **params,
                           **kw).generate(prompt)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.nfe, want.nfe)


@pytest.mark.parametrize("base", ["threshold", "frechet", "eb"])
def test_credit_changes_its_base(base: str) -> None:
    """With alpha > 0 the fused score reaches the base: fewer forwards on a tiny model."""
    model = tiny_model("llada", seed=3, init_std=1.0)
    prompt = prompt_ids(4, 5, seed=4)
    kw = {"gen_length": 32, "block_length": 8}
    plain = DiffusionSampler(model, base, **kw).generate(prompt)
    fused = DiffusionSampler(model, "credit", base=base, credit_alpha=2.0, **kw).generate(prompt)
    assert fused.forwards < plain.forwards


def test_credit_under_sched_reads_fused_margins() -> None:
    """A stopper composed with credit reads the fused logit margins: the state it sees is the
    one the base selector sees, built from the fused logits."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_step(state: StepState, commit: torch.Tensor) -> None:
        seen.append((state.proposal.logit_margin.clone(), state.proposal.prob.clone()))

    policy = compose("credit", stopper="sched", params={"tau": 0.8, "stopper.tau_low": -1e9,
                                                         "stopper.tau_high": 1e9})
    assert policy.name == "credit+sched"
    out = DiffusionSampler(_rising_script(), policy, gen_length=6).generate(
        torch.tensor([[4, 5, 6]]), on_step=on_step)
    assert out.commit_step[0, 0] == 1
    # step 1: the fused top-1 probability of position 3 is 0.7534 (raw 0.61; see above)
    assert float(seen[1][1][0, 3]) == pytest.approx(0.7534, abs=2e-3)


def test_credit_memory_is_per_block_and_per_row() -> None:
    model = tiny_model("llada", seed=3, init_std=1.0)
    prompt = prompt_ids(3, 5, seed=7)
    sampler = DiffusionSampler(model, "credit", credit_alpha=1.0, gen_length=16,
                               block_length=8)
    batch = sampler.generate(prompt)
    for i in range(3):  # each row alone == its row in the batch
        alone = sampler.generate(prompt[i:i + 1])
        assert torch.equal(alone.tokens[0], batch.tokens[i])
        assert int(alone.nfe[0]) == int(batch.nfe[i])
    rule = make_policy("credit").selector
    mem = rule.init_memory(1, 8, torch.device("cpu"))
    assert isinstance(mem, CreditMemory) and mem.credit is None
    logits = torch.randn(1, 8, 16)
    masked = torch.ones(1, 8, dtype=torch.bool)
    rule.fuse_logits(logits.clone(), torch.arange(8), masked, mem, (0, 4))
    rule.fuse_logits(logits.clone(), torch.arange(8), masked, mem, (0, 4))
    assert mem.steps == 2 and mem.credit.shape == (1, 4, 16)
    rule.fuse_logits(logits.clone(), torch.arange(8), masked, mem, (4, 8))
    assert mem.steps == 1 and mem.block == (4, 8)  # a new block starts from zero credit


def test_threshold_tie_window_is_dinfers_rule() -> None:
    """dInfer's threshold: ``conf >= min(max - 1e-5, tau)`` (parity option, off by default)."""
    state = _state([[0.5, 0.499995, 0.4, 0.499]])
    assert Threshold(0.9).select(state)[0].tolist() == [True, False, False, False]
    got = Threshold(0.9, tie_window=1e-5).select(state)[0].tolist()
    assert got == [True, True, False, False]
    sure = _state([[0.95, 0.949995, 0.3]])
    assert Threshold(0.9, tie_window=1e-5).select(sure)[0].tolist() == [True, True, False]


def test_credit_per_row_rows_equal_shared_rows() -> None:
    """Pruned forwards hand per-row canvas positions ``[B, R]``: the same fusion as shared
    ``[R]`` positions (the gather path vs the index_select path)."""
    rule = Credit(Threshold(0.9))
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 10, 16, generator=gen)
    masked = torch.rand(2, 12, generator=gen) > 0.3
    rows = torch.arange(2, 12)
    shared, per_row = (rule.init_memory(2, 12, torch.device("cpu")) for _ in range(2))
    for _ in range(3):
        a = rule.fuse_logits(logits.clone(), rows, masked, shared, (4, 8))
        b = rule.fuse_logits(logits.clone(), rows.expand(2, -1).clone(), masked, per_row, (4, 8))
        assert torch.equal(a, b) and torch.equal(shared.credit, per_row.credit)
    model = tiny_model("llada", seed=3, init_std=1.0)  # cache="window" feeds per-row rows
    out = DiffusionSampler(model, "credit", cache="window", gen_length=16,
                           block_length=8).generate(prompt_ids(2, 5, seed=4))
    assert not (out.answer == model.mask_token_id).any()


def test_credit_checks_parameters() -> None:
    for bad in ({"credit_alpha": -1.0}, {"boost_gamma": 0.0}, {"decay_beta": 1.5}):
        with pytest.raises(ValueError):
            make_policy("credit", **bad)
    with pytest.raises(ValueError, match="unknown parameter"):
        make_policy("credit", alpha=0.5)
    with pytest.raises(ValueError, match="Credit cannot wrap"):
        make_policy("credit", base="llada21")


# ---- front ends -------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "params"), [("frechet", {}), ("dus", {}), ("credit", {}),
                                              ("credit", {"base": "frechet"})])
def test_compiled_step_equals_eager(name: str, params: dict) -> None:
    """``compile=`` captures ``post_forward`` whole (the credit fusion included)."""
    model = tiny_model("llada", seed=3, init_std=1.0)
    prompt = prompt_ids(2, 5, seed=4)
    kw = {"gen_length": 16, "block_length": 8, **params}
    want = DiffusionSampler(model, name, **kw).generate(prompt)
    got = DiffusionSampler(model, name, compile="eager", **kw).generate(prompt)
    assert torch.equal(got.tokens, want.tokens) and got.forwards == want.forwards


def test_presets_run_from_the_cli(capsys) -> None:
    from dllm_decode.cli import main

    for args in (["--policy", "frechet", "--param", "delta=0.1"],
                 ["--policy", "dus", "--param", "base=2"],
                 ["--policy", "credit", "--param", "base=frechet", "--stopper", "sched"]):
        rc = main(["generate", "Please copy the list: [\"Ann Lee\"]", "--gen-length", "16",
                   "--model", "tiny-llada", *args])
        assert rc == 0, args
    assert "policy=credit+frechet+sched" in capsys.readouterr().err


def test_presets_in_grids() -> None:
    from dllm_decode.eval.parallelbench.grid import expand_configs, parse_grid

    grid = parse_grid({"tasks": ["waiting_line/copy"], "sweeps": [
        {"policy": "frechet", "params": {"delta": [0.1, 0.25]}},
        {"policy": "credit", "params": {"base": "eb", "gamma": 0.5}, "stopper": "sched"},
        {"policy": "dus", "params": {"threshold": 0.3}, "block_length": 8},
    ]})
    configs = expand_configs(grid, "waiting_line/copy", "m")
    assert [c.policy for c in configs] == ["frechet", "frechet", "credit", "dus"]
