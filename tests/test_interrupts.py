"""Ctrl-C keeps what was measured and says so in one line (exit 130, no traceback).

Each test starts the real command in a subprocess, waits until it has written its first result
(so the signal lands mid-run, whatever the machine's speed), sends SIGINT, and checks the exit
status, the one line on stderr and the rows on disk.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dllm_decode.eval.parallelbench.rows import load_rows

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to its default disposition. A job started in the
    background (``nohup ... &``) inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler, so the command would never see the user's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "dllm_decode.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)


def _interrupt(proc: subprocess.Popen, ready: callable, timeout: float = 120.0) -> tuple[str, str]:
    """Wait until ``ready()``, send SIGINT, return ``(stdout, stderr)`` after it exits."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended before its first row (rc {proc.returncode}):\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("no first row within the timeout")
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=timeout)


def test_bench_writes_rows_as_measured_and_ctrl_c_keeps_them(tmp_path) -> None:
    out = tmp_path / "decode.csv"
    # 8 gen lengths x 3 cache modes: minutes of work, interrupted after its first row
    proc = _start(["bench", "--gen-length", *map(str, range(16, 144, 16)), "--prompt-length", "8",
                   "--block-length", "8", "--steps-per-block", "2", "--repeats", "3",
                   "--out", str(out)], tmp_path)

    def first_row() -> bool:
        return out.is_file() and len(out.read_text().splitlines()) >= 2  # header + a row

    stdout, stderr = _interrupt(proc, first_row)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert 1 <= len(rows) < 8 * 3 * 6
    lines = stderr.splitlines()
    assert lines[0].startswith("bench: 144 rows")  # what will be measured, before any row
    assert "[1/144 rows" in lines[1]  # progress: one line per row as it is written
    assert lines[-1] == f"interrupted: {len(rows)} of 144 rows kept in {out}"
    assert not any(line.startswith("interrupted") for line in lines[:-1])
    assert "vs none" not in stdout  # the summary belongs to a finished run


def test_parallelbench_ctrl_c_says_what_was_kept_and_how_to_resume(tmp_path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "model": "tiny-llada", "source": "generated", "icl_examples": 0, "num_samples": 40,
        "batch_size": 1, "tasks": ["waiting_line/copy"],
        "sweeps": [{"policy": "low_confidence", "tokens_per_step": [1],
                    "block_length": "full"}],
    }))
    run = tmp_path / "run"
    proc = _start(["eval", "parallelbench", "--grid", str(grid), "--out", str(run),
                   "--no-progress"], tmp_path)

    def first_row() -> bool:
        return bool(load_rows(run)) if run.is_dir() else False

    _, stderr = _interrupt(proc, first_row)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    kept = len(load_rows(run))
    assert 1 <= kept < 40
    assert stderr.strip().splitlines() == [
        f"interrupted: {kept} result rows kept in {run}; run the same command again to resume "
        f"(rows already there are skipped), or `dllm-decode eval analyze {run}` to look at them"]
