"""Repository hygiene: CI runs the README's test command; the CLI works."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command() -> None:
    commands = _readme_commands()
    assert len(commands) == 2, "the README must give exactly two set-up commands"
    assert "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci


def test_readme_is_short_and_starts_with_the_set_up_commands() -> None:
    """Issue 54: at most 250 lines, both set-up commands within the first 60 (one screen)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"
    first = "\n".join(lines[:60])
    for command in _readme_commands():
        assert command in first, f"set-up command not in README's first 60 lines: {command[:60]}"


def test_cli_generate_runs() -> None:
    res = subprocess.run([sys.executable, "-m", "dllm_decode.cli", "generate", "hi",
                          "--gen-length", "8", "--policy", "threshold"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "NFE=" in res.stderr


def test_cli_reports_bad_input_cleanly() -> None:
    res = subprocess.run([sys.executable, "-m", "dllm_decode.cli", "generate", "hi",
                          "--gen-length", "10", "--block-length", "4"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2
    assert "divisible by block_length" in res.stderr and "Traceback" not in res.stderr
