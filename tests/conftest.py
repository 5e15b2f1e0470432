"""Shared fixtures."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

# Property tests are deterministic by default: every run (CI included) draws the same examples,
# so a failure reproduces and a pass means the same thing twice. Hunting for new failures:
# ``pytest -m slow --hypothesis-profile=explore --hypothesis-seed=N`` (``derandomize`` would
# override the seed). No example database: nothing outside the repository changes a run.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile("deterministic")

# Triton picks interpreted or compiled kernels (its own @jit helpers included) when it is first
# imported, and any model build can import it (torch's meta-device init imports torch._dynamo,
# which imports triton). Without a GPU the interpreter is chosen here, before any test runs, as
# tests/kernels/conftest.py does: a subset of the suite (one without tests/kernels) then sees
# the same Triton as the whole suite (doctor's kernel checks failed after a load_model before).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny CPU workloads run fastest (and steadiest on a shared machine) on one intra-op
    thread; modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- the suite leaves the checkout as it found it (issue 36) ----------------------------------
def git_changes(root) -> set[str] | None:
    """``git status --porcelain`` lines of ``root`` (untracked files listed one by one), or
    ``None`` when ``root`` is not the top of a git work tree (an sdist, git missing)."""
    import subprocess
    from pathlib import Path

    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, text=True,
                             capture_output=True, timeout=30)
        if top.returncode or Path(top.stdout.strip()).resolve() != Path(root).resolve():
            return None
        res = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                             cwd=root, text=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(res.stdout.splitlines()) if res.returncode == 0 else None


#: suffixes of files a developer edits by hand (outputs are .png, .csv, .json, .jsonl, ...)
EDITED_WHILE_TESTING = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg")


def pytest_sessionstart(session) -> None:
    session.config._git_before = git_changes(session.config.rootpath)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail a passing run that left new or modified files in the repository (a test must write
    under ``tmp_path``). Edits to sources and docs (``EDITED_WHILE_TESTING``) are not counted:
    a developer may be editing them while the suite runs."""
    before = getattr(session.config, "_git_before", None)
    after = git_changes(session.config.rootpath) if before is not None else None
    if after is None:
        return
    stray = sorted(line for line in after - before
                   if not line.rstrip().endswith(EDITED_WHILE_TESTING))
    if stray:
        import sys

        print("\nthe test run changed the repository (git status):\n  " + "\n  ".join(stray),
              file=sys.stderr)
        if exitstatus == 0:
            session.exitstatus = 1
