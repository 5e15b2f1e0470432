"""The README's "Write your own policy" code runs as written (so it cannot rot)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def _section_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Write your own policy", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_example_runs(tmp_path, monkeypatch, capsys) -> None:
    blocks = _section_blocks()
    assert len(blocks) == 3
    policy, usage, prop = blocks
    assert policy in (ROOT / "examples" / "my_policy.py").read_text()  # the file matches
    assert len(policy.strip().splitlines()) <= 25
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # pasted at the repository root
    for name, code in (("readme_usage", usage), ("readme_prop", prop)):  # each one alone
        module = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, module)
        exec(compile(code, "README.md", "exec"), module.__dict__)  # noqa: S102
        if name == "readme_usage":
            assert module.report.forwards <= 32
            assert (tmp_path / "runs" / "confident_runs.png").stat().st_size > 5_000
            assert module.composed.generation.lengths[0] < 32  # EoTP cut the row after EOS
            printed = capsys.readouterr().out.splitlines()
            assert printed[0] == '["Maya Doyle", "Ivan Bennett", "Pedro Lindqvist"] NFE 1'
            assert printed[2].startswith("PolicyReport(steps=")
    module.test_confident_runs()


def test_readme_grid_runs(tmp_path, monkeypatch) -> None:
    from dllm_decode.eval.analyze import run_analyze
    from dllm_decode.eval.runner import run_sweep

    monkeypatch.chdir(ROOT)
    args = types.SimpleNamespace(grid="benchmarks/grids/my_policy.yaml", out=str(tmp_path),
                                 limit=1, no_progress=True, model=None)
    summary = run_sweep(args)
    assert summary.written == 3 * 9  # 9 configs x 3 tasks x 1 doc
    tables = run_analyze(types.SimpleNamespace(out=str(tmp_path)))
    methods = {row["method"] for row in tables["order"]}
    assert any("ConfidentRuns+sched+eotp" in m for m in methods)
    assert any(m.startswith("tiny-llada:threshold") for m in methods)
