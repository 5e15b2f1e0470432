"""The README commands leave ``git status`` clean (issue 36); the whole run is checked by
``pytest_sessionfinish`` in ``conftest.py``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dllm_decode import cli
from tests.conftest import git_changes

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
PROMPT = ("You are managing a waiting line at a customer service desk.\n"
          "You need to record the following people in the order they arrived:\n"
          '["Maya Doyle", "Ivan Bennett", "Pedro Lindqvist"]\n'
          "Please copy the list exactly and provide only the final list.\n")


@pytest.fixture
def clean_check(monkeypatch):
    before = git_changes(ROOT)
    if before is None:
        pytest.skip("not a git checkout")
    monkeypatch.chdir(ROOT)  # the README commands run from the repository root
    yield
    assert git_changes(ROOT) == before


def test_main_command_and_doctor_write_nothing(clean_check, monkeypatch, capfd) -> None:
    assert cli.main(["generate", PROMPT, "--gen-length", "32", "--policy", "threshold"]) == 0
    out, err = capfd.readouterr()
    assert out == '["Maya Doyle", "Ivan Bennett", "Pedro Lindqvist"]\n'
    # the field's figure first: answer tokens (up to EOS) per forward, then the budget one
    assert "tokens/forward=10.00 (10 answer tokens up to EOS / 1 forward)" in err
    assert "tokens/step=32.00 (the 32-token budget, EOS fill included)" in err
    argv = ["doctor", "--shape", "small", "--prompt-length", "8", "--gen-length", "8",
            "--block-length", "8", "--steps", "2"]  # plain doctor, smaller
    # kernel verdicts are test_doctor's business (they need TRITON_INTERPRET set before triton
    # is imported); here only what doctor writes counts
    assert cli.main(argv) in (0, 1)
    assert "no row written (pass --out FILE.csv" in capfd.readouterr().out


def test_readme_outputs_are_ignored_by_git() -> None:
    if git_changes(ROOT) is None:
        pytest.skip("not a git checkout")
    paths = ["runs/runs.png", "runs/confident_runs.png", "runs/pb/rows.jsonl", "runs.png",
             "confident_runs.png"]
    res = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.stdout.split() == paths
