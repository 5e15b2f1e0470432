"""The newcomer's small slips of issue 54, one test each: ``--gen-length 0``, an unknown
``Capabilities`` keyword, raw markup in ``--help``, a one-process eval run's rows files, and
``tools/house.py``'s circles."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dllm_decode import Capabilities
from dllm_decode.cli import build_parser, main
from dllm_decode.eval.parallelbench import reference_answer
from dllm_decode.eval.parallelbench.codec import useful_length
from dllm_decode.eval.parallelbench.grid import DecodeConfig, parse_grid
from dllm_decode.eval.parallelbench.rows import ROWS_FILE, read_rows
from dllm_decode.eval.runner import load_records, run_grid

ROOT = Path(__file__).resolve().parents[1]


def test_cli_gen_length_zero_is_the_apis_error(capsys: pytest.CaptureFixture[str]) -> None:
    # before: 0 read as "not given" and 64 tokens were decoded (exit 0)
    assert main(["generate", "hi", "--gen-length", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dllm-decode: error: gen_length must be an int >= 1, got 0"


def test_capabilities_unknown_keyword_names_the_fix_and_the_caller() -> None:
    line = sys._getframe().f_lineno + 2
    with pytest.raises(TypeError) as info:
        Capabilities(budgted=False)
    message = str(info.value)
    assert "\n" not in message and "'budgted' (did you mean 'budgeted'?)" in message
    assert f"{__file__}:{line}" in message and "valid names" not in message
    base = Capabilities(budgeted=False, needs_logits=True)
    assert dataclasses.replace(base, full_span=True) == Capabilities(
        budgeted=False, needs_logits=True, full_span=True)
    line = sys._getframe().f_lineno + 3  # through dataclasses.replace: still this file
    with pytest.raises(TypeError, match=rf"'needslogits' \(did you mean 'needs_logits'\?\) "
                                        rf"at .*{Path(__file__).name}:{line}"):
        dataclasses.replace(base, needslogits=True)
    with pytest.raises(TypeError, match="'zzz' at .*; valid names: budgeted, "):
        Capabilities(zzz=1)


def test_help_has_no_raw_markup(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "dllm-decode: generate | serve-check" in text
    assert "``" not in (build_parser().description or "")


class _Codec:
    """Character codec whose prompt is the reference answer."""

    eos_token_ids = (1,)
    pad_token_id = 0

    def encode(self, task: str, record: dict) -> list[int]:
        return [ord(c) for c in reference_answer(record)]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids[: useful_length(ids, self.eos_token_ids)])


def _copy(prompt_ids: torch.Tensor, mask: torch.Tensor, config: DecodeConfig) -> SimpleNamespace:
    """Copies the prompt into the answer (one step per token)."""
    batch = prompt_ids.shape[0]
    answer = torch.full((batch, config.gen_length), 1, dtype=torch.long)
    for row in range(batch):
        text = prompt_ids[row][mask[row].bool()][: config.gen_length]
        answer[row, : len(text)] = text
    return SimpleNamespace(answer=answer, nfe=torch.full((batch,), 4, dtype=torch.long),
                           commit_step=torch.arange(config.gen_length).expand(batch, -1))


def test_one_process_eval_run_writes_only_rows_jsonl(tmp_path: Path) -> None:
    grid = parse_grid({"tasks": ["waiting_line/copy"], "source": "generated", "num_samples": 4,
                       "sweeps": [{"policy": "low_confidence", "gen_length": 64}]})
    records = load_records(grid)
    calls = {"n": 0}

    def crashing(*args: object) -> SimpleNamespace:
        calls["n"] += 1
        if calls["n"] > 2:
            raise RuntimeError("boom")
        return _copy(*args)  # type: ignore[arg-type]

    def run(out: Path, decode=_copy):  # noqa: ANN001, ANN202
        return run_grid(grid, records, out, decode=decode, codec=_Codec(), model="fake",
                        progress=False)

    done = run(tmp_path / "one")
    assert sorted(p.name for p in (tmp_path / "one").glob("rows*")) == [ROWS_FILE]
    assert len(read_rows(done.rows_path)) == 4
    with pytest.raises(RuntimeError, match="boom"):  # interrupted: the rank journal stays
        run(tmp_path / "resumed", decode=crashing)
    assert sorted(p.name for p in (tmp_path / "resumed").glob("rows*")) == ["rows.rank0.jsonl"]
    again = run(tmp_path / "resumed")
    assert (again.resumed, again.written) == (2, 2)
    assert sorted(p.name for p in (tmp_path / "resumed").glob("rows*")) == [ROWS_FILE]
    def stable(path: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in read_rows(path)]

    assert stable(again.rows_path) == stable(done.rows_path)


def _house():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("house", ROOT / "tools" / "house.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_house_tells_module_circles_from_rooms_that_import_each_other() -> None:
    house = _house()
    graph = {"dllm_decode.eval.runner": {"dllm_decode.tokenizer.train"},
             "dllm_decode.tokenizer.train": {"dllm_decode.eval.tasks"},
             "dllm_decode.eval.tasks": set(),
             "dllm_decode.samplers.loop": {"dllm_decode.text.decode"},
             "dllm_decode.text.decode": {"dllm_decode.samplers.util"},
             "dllm_decode.samplers.util": set()}
    layers = {"dllm_decode.eval": 4, "dllm_decode.tokenizer": 4, "dllm_decode.text": 5,
              "dllm_decode.samplers": 6}
    lines = list(house.report(house.house(graph, layers), "t"))
    assert "0 import circles between modules;" in lines[0]
    assert "  rooms that import each other (allowed: one layer, ':'): eval, tokenizer" in lines
    assert ("  rooms that import each other (NOT allowed: across layers): samplers, text"
            in lines)
    assert not any("in a circle" in line for line in lines)
