"""What a newcomer trips over: typos get a "did you mean", help names what exists, errors say
only what is true, piped output keeps its lines, analysis says what it did and did not get."""

from __future__ import annotations

import argparse
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dllm_decode import Capabilities, DiffusionSampler, StepState, cli, load_model
from dllm_decode.policies import topk_mask
from dllm_decode.samplers.contract import PolicyContractError

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def test_cli_policy_typo_gets_the_closest_preset(capsys) -> None:
    assert cli.main(["generate", "x", "--policy", "thresold"]) == 2
    assert "unknown policy 'thresold' (did you mean 'threshold'?)" in capsys.readouterr().err


def test_load_model_typo_gets_the_closest_bundled_name() -> None:
    with pytest.raises(FileNotFoundError, match="did you mean the bundled 'tiny-llada'"):
        load_model("tiny-lada")


def _help_texts(parser: argparse.ArgumentParser) -> list[str]:
    texts = [parser.description or ""]
    for action in parser._actions:
        texts.append(action.help or "")
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                texts += _help_texts(sub)
    return texts


def test_help_names_example_classes_that_exist() -> None:
    named = {m for text in _help_texts(cli.build_parser())
             for m in re.findall(r"(examples/\w+\.py):(\w+)", text)}
    assert named, "the help names no example class"
    for path, name in named:
        assert re.search(rf"^class {name}\b", (ROOT / path).read_text(), flags=re.M), (path, name)


def test_offline_hub_error_suggests_only_switches_that_are_on(monkeypatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants, errors

    from dllm_decode.models.hub import HubError

    def missing(*args, **kwargs):
        err = errors.LocalEntryNotFoundError.__new__(errors.LocalEntryNotFoundError)
        Exception.__init__(err, "not in the cache")
        raise err

    monkeypatch.setattr(huggingface_hub, "snapshot_download", missing)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(HubError) as no_network:  # downloads on, the Hub unreachable
        load_model("org/model")
    assert "could not be reached" in str(no_network.value)
    assert "HF_HUB_OFFLINE" not in str(no_network.value)
    assert "local_files_only" not in str(no_network.value)
    with pytest.raises(HubError) as asked:
        load_model("org/model", local_files_only=True)
    assert "downloads are off (local_files_only=True)" in str(asked.value)
    assert "call again without local_files_only=True" in str(asked.value)
    assert "HF_HUB_OFFLINE" not in str(asked.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match=r"without HF_HUB_OFFLINE=1\)"):
        load_model("org/model")


def test_piped_show_ends_its_last_frame_with_a_newline() -> None:
    from rich.console import Console

    from dllm_decode.show import CanvasView

    class Tok:
        def decode(self, ids):
            return "ab"[ids[0] % 2]

    sink = io.StringIO()
    view = CanvasView(Tok(), 9, 2, console=Console(file=sink, force_terminal=False))
    model = load_model("tiny-llada")
    with view:
        DiffusionSampler(model, "low_confidence", gen_length=4).generate(
            torch.tensor([[10, 11]]), on_step=view.update)
    assert sink.getvalue().endswith("\n") and "step" in sink.getvalue()


def test_step_and_block_step_are_documented_and_behave_so() -> None:
    from tests.docs_text import docs_text

    docs = docs_text()
    assert "`step` (a Python `int`" in docs and "`block_step` (an `int`" in docs
    seen = []

    @dataclass(frozen=True)
    class Record:
        def select(self, state: StepState) -> torch.Tensor:
            seen.append((state.step, state.block_step, state.block))
            return topk_mask(state.proposal.prob, state.eligible, state.budget)

    DiffusionSampler(load_model("tiny-llada"), Record(), gen_length=8, block_length=4,
                     steps=4).generate(torch.tensor([[10, 11]]))
    assert seen == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert all(type(s) is int and type(b) is int for s, b, _ in seen)


@dataclass(frozen=True)
class Greedy:
    """Commits every eligible position: a budget overrun unless it says it is adaptive."""

    def select(self, state: StepState) -> torch.Tensor:
        return state.eligible


@dataclass(frozen=True)
class GreedyAdaptive(Greedy):
    capabilities = Capabilities(budgeted=False)


def test_a_budgeted_selector_may_not_commit_more_than_its_budget() -> None:
    model = load_model("tiny-llada")
    prompt = torch.tensor([[10, 11, 12]])
    with pytest.raises(PolicyContractError, match=r"committed \[8\] positions at step 0 in "
                                                  r"rows \[0\], more than state.budget \[2\]"):
        DiffusionSampler(model, Greedy(), gen_length=8, steps=4).generate(prompt)
    out = DiffusionSampler(model, GreedyAdaptive(), gen_length=8).generate(prompt)
    assert int(out.nfe[0]) == 1


def _rows(config_params: list[tuple[dict, int | None]], docs: int) -> list[dict]:
    rows = []
    for h, (params, steps) in enumerate(config_params):
        config = {"model": "m", "policy": "p", "cache": "none", "gen_length": 8,
                  "block_length": 8, "steps": steps, "temperature": 0.0, "params": params}
        rows += [{"config": config, "config_hash": f"h{h}", "task": "waiting_line/copy",
                  "doc_id": i, "category": "waiting_line", "score": 1.0, "score_strict": 1.0,
                  "nfe": steps or 4, "gen_tokens_useful": 8,
                  "gen_tokens_budget": 8, "wall_time_s": 0.1, "decoding_order_tau": 1.0,
                  "commit_steps": list(range(8))} for i in range(docs)]
    return rows


def test_analyze_keeps_configs_that_differ_only_in_parameters_apart(tmp_path) -> None:
    from dllm_decode.eval.analyze import analyze_rows

    rows = _rows([({}, 8), ({}, 2), ({"growth": 1}, None), ({"growth": 2}, None)], docs=2)
    order = analyze_rows(rows, tmp_path, plots=False)["order"]
    assert len(order) == 4  # before: 2 (steps and params pooled per method)
    assert {r["config"] for r in order} == {"[steps=8] gen=8", "[steps=2] gen=8",
                                            "[growth=1] gen=8", "[growth=2] gen=8"}


def test_analyze_says_when_a_run_is_incomplete(tmp_path, capsys) -> None:
    import json

    from dllm_decode.eval.analyze import run_analyze
    from dllm_decode.eval.parallelbench.rows import RowWriter, write_plan

    rows = _rows([({}, 8), ({}, 2)], docs=3)
    writer = RowWriter(tmp_path / "rows.rank0.jsonl")
    for row in rows[:4]:  # interrupted: 4 of 6 rows
        writer.write(row)
    writer.close()
    write_plan(tmp_path, ["h0"] * 3 + ["h1"] * 3)
    run_analyze(argparse.Namespace(out=str(tmp_path), no_plots=True))
    out = capsys.readouterr().out
    note = "incomplete run: 4 of 6 result rows, 1 of 2 configs unfinished"
    assert out.startswith(note) and out.rstrip().splitlines()[-1].startswith(note)
    assert "tables (no plots: --no-plots) written to" in out
    assert "tables and plots written" not in out
    analysis = tmp_path / "analysis"
    assert (analysis / "README.md").read_text().startswith(f"**{note}")
    assert json.loads((analysis / "summary.json").read_text())["complete"] is False
    (tmp_path / "run.json").unlink()  # a run without a plan: unequal rows per task still show
    run_analyze(argparse.Namespace(out=str(tmp_path), no_plots=True))
    assert "possibly incomplete run: 1 config(s) have fewer rows" in capsys.readouterr().out


def test_pareto_panels_flat_scores_and_one_legend_beside_the_panels(tmp_path,
                                                                    monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    from dllm_decode.eval.analyze import cell_table
    from dllm_decode.eval.parallelbench import plots

    figures = []
    original = plots._save

    def keep(fig, axes, path):
        figures.append((fig, axes))
        return original(fig, axes, path)

    monkeypatch.setattr(plots, "_save", keep)
    rows = [{**r, "score": 0.0, "score_strict": 0.0, "task": task}
            for task in ("waiting_line/copy", "waiting_line/reverse")
            for r in _rows([({}, 8), ({}, 2)], docs=1)]
    cells = cell_table(rows)
    plots.pareto_plot(cells, tmp_path / "pareto.png")
    fig, axes = figures[0]
    for ax in axes:
        lo, hi = ax.get_ylim()
        assert lo <= 0 and hi - lo >= 10  # before: -0.04 .. 0.04
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
    assert plots.score_limits([100.0]) == (88.0, 102.0)
    assert plots.score_limits([20.0, 80.0]) == (18.0, 82.0)
