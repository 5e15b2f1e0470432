"""Declared capabilities, composition by object / name / import path, grids and the CLI."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dllm_decode import Capabilities, DiffusionSampler, Policy, check_policy, make_policy
from dllm_decode.eval.parallelbench.grid import DecodeConfig, expand_configs, parse_grid
from dllm_decode.policies import EoTP, SchED, TopK, compose
from dllm_decode.policies.capabilities import NAMES, capabilities_of
from dllm_decode.policies.learn2pd import with_eotp
from dllm_decode.policies.sched import Supervised
from tests.helpers import EOS, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
LLADA = tiny_model("llada", seed=3)
PROMPT = torch.tensor([[5, 9, 17, 2], [33, 4, 8, 21]])
MINE = "examples/my_policy.py:ConfidentRuns"


def _tokens(policy, **kw) -> torch.Tensor:
    kw.setdefault("gen_length", 12)
    return DiffusionSampler(LLADA, policy, **kw).generate(PROMPT).tokens


class Legacy:
    needs_logits = True  # the pre-Capabilities style: must not be silently ignored

    def select(self, state):
        return TopK().select(state)


class Typo:
    need_logits = True

    def select(self, state):
        return TopK().select(state)


class NotAPolicy:
    def choose(self, state):
        return state.eligible


@dataclass(frozen=True)
class LogitsReader:
    seen: list
    capabilities = Capabilities(needs_logits=True)

    def select(self, state):
        self.seen.append(state.logits is not None)
        return TopK().select(state)


@dataclass(frozen=True)
class Remembering:
    def init_memory(self, batch, length, device):
        return []

    def truncate(self, state, commit):
        return state.extras["lengths"]


@dataclass(frozen=True)
class CountingStopper:
    """A user stopper with memory: stop every row once ``after`` steps have run."""

    after: int = 2

    def init_memory(self, batch, length, device):
        return torch.zeros(batch, dtype=torch.long, device=device)

    def should_stop(self, state):
        seen = state.memory.stopper  # the stopper's own memory inside the selector's pair
        seen += 1
        return seen >= self.after


@dataclass(frozen=True)
class BudgetStopper:
    capabilities = Capabilities(budgeted=False)  # a selector capability: not for a stopper

    def should_stop(self, state):
        return torch.zeros(state.masked.shape[0], dtype=torch.bool)


def test_capabilities_are_validated() -> None:
    with pytest.raises(TypeError, match="need_logits"):
        Capabilities(need_logits=True)
    with pytest.raises(ValueError, match="preferred_cache"):
        Capabilities(preferred_cache="dul")
    with pytest.raises(ValueError, match="lookahead"):
        Capabilities(lookahead=-1)
    with pytest.raises(ValueError, match="plain attribute"):
        DiffusionSampler(LLADA, Legacy())
    with pytest.raises(ValueError, match="did you mean the capability 'needs_logits'"):
        DiffusionSampler(LLADA, Typo())
    bad = type("Bad", (), {"capabilities": {"needs_logits": True}, "select": Legacy.select})
    with pytest.raises(TypeError, match="must be a dllm_decode.Capabilities"):
        DiffusionSampler(LLADA, bad())
    with pytest.raises(ValueError, match="selector capabilities"):
        DiffusionSampler(LLADA, Policy(TopK(), stopper=BudgetStopper()))


def test_declared_capabilities_are_read() -> None:
    seen: list = []
    DiffusionSampler(LLADA, LogitsReader(seen), gen_length=4).generate(PROMPT)
    assert seen and all(seen)
    sampler = DiffusionSampler(LLADA, "ete", lookahead=5)
    assert sampler.capabilities.selector == Capabilities(budgeted=False, lookahead=5,
                                                         proposal_fields=("neg_entropy",),
                                                         reads_masked_only=True,
                                                         row_steps=True)
    assert DiffusionSampler(LLADA, "eotp").capabilities.full_span
    assert capabilities_of(make_policy("sched").selector).budgeted  # the base's, forwarded


def test_no_capability_probes_left() -> None:
    """The sampler and helpers read ``capabilities``; no getattr probe names a capability."""
    pattern = re.compile(r"getattr\([^)]*[\"'](" + "|".join(NAMES) + r")[\"']")
    hits = [f"{path}:{n}" for path in (ROOT / "dllm_decode").rglob("*.py")
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_policy_composes_objects() -> None:
    policy = Policy(TopK(), stopper=SchED(), truncator=EoTP())
    assert isinstance(policy.selector, Supervised) and policy.selector.stopper is policy.stopper
    preset = make_policy("sched", base=TopK())
    assert torch.equal(_tokens(policy), _tokens(Policy(preset.selector, preset.stopper,
                                                        truncator=EoTP())))
    with pytest.raises(TypeError, match="stopper protocol"):
        Policy(TopK(), stopper=TopK())
    with pytest.raises(TypeError, match="selector protocol"):
        Policy(NotAPolicy())
    with pytest.raises(TypeError, match="compose"):
        Policy(TopK(), stopper="sched")
    with pytest.raises(TypeError, match="pass an instance"):
        DiffusionSampler(LLADA, TopK)
    with pytest.raises(ValueError, match="truncators keep no"):
        Policy(TopK(), truncator=Remembering())


def test_user_stopper_keeps_memory() -> None:
    policy = Policy(TopK(), stopper=CountingStopper(after=3))
    out = DiffusionSampler(LLADA, policy, gen_length=12).generate(PROMPT)
    assert out.steps == 3 and (out.commit_step[:, :] <= 2).all()


def test_compose_by_name_equals_presets() -> None:
    named = compose("low_confidence", stopper="sched", params={"stopper.tau_low": 1.0})
    assert named.name == "low_confidence+sched"
    preset = make_policy("sched", base="low_confidence", tau_low=1.0)
    assert torch.equal(_tokens(named), _tokens(preset))
    eotp = compose("threshold", truncator="eotp", params={"tau": 0.5,
                                                          "truncator.eos_token_ids": (EOS,)})
    ref = with_eotp(make_policy("threshold", tau=0.5), eos_token_ids=(EOS,))
    assert torch.equal(_tokens(eotp), _tokens(ref))
    assert compose("threshold", params={"tau": 0.5}) == make_policy("threshold", tau=0.5)
    prophet = compose("threshold", stopper="prophet", params={"stopper.answer_length": 3})
    assert prophet.stopper.region_end == 3 and prophet.stopper.tau_mode == "piecewise"


def test_compose_errors() -> None:
    with pytest.raises(ValueError, match="already has a stopper"):
        compose("sched", stopper="sched")
    with pytest.raises(ValueError, match="already has a truncator"):
        compose("eotp", truncator="eotp")
    with pytest.raises(ValueError, match="no stopper"):
        compose("threshold", params={"stopper.tau_low": 1.0})
    with pytest.raises(ValueError, match="prefix must be one of"):
        compose("threshold", params={"stoper.tau_low": 1.0})
    with pytest.raises(ValueError, match="unknown stopper"):
        compose("threshold", stopper="shed")
    with pytest.raises(ValueError, match="bad parameters for 'sched'"):
        compose("threshold", stopper="sched", params={"stopper.tau_lo": 1.0})


def test_import_paths(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    pol = make_policy(MINE, tau=0.5)
    assert type(pol.selector).__name__ == "ConfidentRuns" and pol.selector.tau == 0.5
    assert pol.name == MINE
    report = check_policy(MINE, LLADA, PROMPT, gen_length=12, block_length=4, tau=0.5)
    assert report.forwards <= 12 and len(report.nfe) == 2
    assert make_policy("tests.test_compose:LogitsReader", seen=[]).selector.seen == []
    with pytest.raises(TypeError, match="does not satisfy the selector protocol"):
        make_policy("tests.test_compose:NotAPolicy")
    with pytest.raises(ValueError, match="cannot import"):
        make_policy("no_such_module_xyz:Rule")
    with pytest.raises(ValueError, match="has no attribute"):
        make_policy("tests.test_compose:Missing")
    with pytest.raises(ValueError, match="bad parameters"):
        make_policy(MINE, tau_=1.0)
    with pytest.raises(ValueError, match="not found"):
        make_policy("nowhere/rule.py:Rule")
    stop = compose("threshold", stopper="tests.test_compose:BudgetStopper").stopper
    assert isinstance(stop, BudgetStopper)


def test_grid_composition() -> None:
    grid = parse_grid({"tasks": ["waiting_line/copy"], "sweeps": [
        {"policy": "threshold"},
        {"policy": ["threshold", MINE], "stopper": "sched", "truncator": [None, "eotp"],
         "params": {"tau": 0.8, "stopper.tau_low": [1.0, 2.0]}},
    ]})
    configs = expand_configs(grid, "waiting_line/copy", "m")
    assert len(configs) == 1 + 2 * 2 * 2
    plain = configs[0]
    assert "stopper" not in plain.as_dict() and "truncator" not in plain.as_dict()
    assert plain.config_hash == DecodeConfig(**{**plain.__dict__}).config_hash
    composed = [c for c in configs if c.truncator == "eotp" and c.policy == MINE]
    assert {dict(c.params)["stopper.tau_low"] for c in composed} == {1.0, 2.0}
    assert composed[0].as_dict()["stopper"] == "sched"
    for bad, match in (({"stopper": "shed"}, "unknown stopper"),
                       ({"params": {"stopper.tau_low": 1.0}}, "without a stopper"),
                       ({"params": {"stoper.x": 1}}, "prefix")):
        with pytest.raises(ValueError, match=match):
            parse_grid({"sweeps": [{"policy": "threshold", **bad}]})


def test_cli_composes_and_plots(tmp_path, monkeypatch, capsys) -> None:
    from dllm_decode.cli import main

    monkeypatch.chdir(ROOT)
    png = tmp_path / "order.png"
    rc = main(["generate", "Please copy the list: [\"Ann Lee\"]", "--gen-length", "16",
               "--policy", MINE, "--param", "tau=0.8", "--stopper", "sched",
               "--param", "stopper.tau_low=2.0", "--truncator", "eotp", "--plot", str(png)])
    assert rc == 0
    err = capsys.readouterr().err
    assert f"policy={MINE}+sched+eotp" in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["generate", "x", "--policy", "tests.test_compose:NotAPolicy"]) == 2
    assert "selector protocol" in capsys.readouterr().err
    assert main(["generate", "x", "--param", "gen_length=3"]) == 2


def test_lm_eval_adapter_composes() -> None:
    pytest.importorskip("lm_eval")
    from types import SimpleNamespace

    from dllm_decode.eval.lm_eval import DllmDecodeLM

    host = SimpleNamespace(_samplers={}, model=LLADA)
    sampler = DllmDecodeLM._sampler(host, {"policy": "threshold", "cache": "dual", "tau": 0.5,
                                           "stopper": "sched", "stopper.tau_low": 1.0})
    assert sampler.policy.name == "threshold+sched" and sampler.policy.stopper.tau_low == 1.0
    assert sampler.config.cache.value == "dual"
