"""The README's "Write your own policy" code runs as written (so it cannot rot): each script
as ``python script.py`` from another folder, with the class saved beside it as the README says
(``tests.test_readme.run_snippet``)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from tests.test_readme import POLICY_SECTION, check_clean, readme_snippets, run_snippet

pytest.importorskip("matplotlib")
ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_runs(tmp_path) -> None:
    blocks = [code for _, code in readme_snippets(POLICY_SECTION)]
    assert len(blocks) == 3
    policy, usage, prop = blocks
    assert policy in (ROOT / "examples" / "my_policy.py").read_text()  # the file matches
    assert len(policy.strip().splitlines()) <= 25

    printed = check_clean(run_snippet(usage, tmp_path), "README usage", usage).splitlines()
    assert printed[0] == '["Maya Doyle", "Ivan Bennett", "Pedro Lindqvist"] NFE 1'
    length = int(printed[1].rsplit("length", 1)[1])
    assert length < 32  # EoTP cut the row after its EOS
    assert printed[2].startswith("PolicyReport(steps=")
    assert int(re.search(r"forwards=(\d+)", printed[2]).group(1)) <= 32
    picture = tmp_path / "elsewhere" / "runs" / "confident_runs.png"  # under the current folder
    assert picture.stat().st_size > 5_000

    pytest.importorskip("hypothesis")
    done = check_clean(run_snippet(prop, tmp_path, "test_my_policy.py"), "README test", prop)
    assert done.strip() == "check_policy held on 10 drawn (tau, blocks, seed)"


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
