"""Every ```python block of README.md and docs/*.md runs (issue 54), so the docs cannot rot.

Each block is written to a file of its own and run as ``python block.py`` would run it (as
``__main__``, a fresh namespace, its folder first on ``sys.path``) in a process of its own with
the repository root as the current folder, one intra-op thread, the Hugging Face Hub offline,
and ``examples/`` importable (a block that imports ``my_policy`` gets ``examples/my_policy.py``,
the class the policy docs show). Every block is compiled. The processes are forked from one
runner that has imported torch and ``dllm_decode`` once (``_RUNNER``): an interpreter start
costs ~3 s here, more than most blocks; each block still starts from that pristine state.

A block that needs what the test machines lack says so on its first line, and is then only
compiled and skipped with the reason::

    # needs: gpu          a CUDA device (runs where one is present)
    # needs: hub          weights downloaded from the Hugging Face Hub (never run here)
    # needs: gpu, hub     both

The API pages (docs/api/) hold mkdocstrings directives, not examples: they are not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what a ``# needs:`` marker may name, with the reason a skip gives
NEEDS = {"gpu": "needs a CUDA device", "hub": "needs weights from the Hugging Face Hub"}
_MARKER = re.compile(r"^#\s*needs:\s*(.*)$")
_BLOCK = re.compile(r"^( *)```python[ \t]*\n(.*?)^\1```", flags=re.M | re.S)
#: a block that takes longer than this is named in the failure (keep the docs' examples small)
BLOCK_TIMEOUT_S = 180


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown file under docs/ except the API pages."""
    docs = sorted(p for p in (root / "docs").rglob("*.md")
                  if "api" not in p.relative_to(root / "docs").parts[:1])
    return [root / "README.md", *docs]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of every ```python block of ``path``; indented blocks (in a list item)
    are dedented."""
    text = path.read_text()
    return [(text[:m.start()].count("\n") + 1, textwrap.dedent(m.group(2)))
            for m in _BLOCK.finditer(text)]


def block_needs(code: str) -> set[str]:
    """What the ``# needs:`` marker on the block's first line names (empty without one)."""
    first = code.lstrip("\n").split("\n", 1)[0].strip()
    m = _MARKER.match(first)
    if not m:
        return set()
    needs = {n.strip() for n in m.group(1).split(",") if n.strip()}
    unknown = needs - set(NEEDS)
    if unknown or not needs:
        raise ValueError(f"'{first}': a needs marker names some of {sorted(NEEDS)}, "
                         f"got {sorted(unknown) or 'nothing'}")
    return needs


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def skip_reason(needs: set[str]) -> str | None:
    """Why a block with these needs does not run here (None: it runs)."""
    if "hub" in needs:
        return NEEDS["hub"] + " (compiled only)"
    if "gpu" in needs and not _cuda():
        return NEEDS["gpu"] + " (compiled only)"
    return None


BLOCKS = [(path, line, code) for path in doc_files() for line, code in python_blocks(path)]


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_blocks_are_found_in_readme_and_docs() -> None:
    files = {path.name for path, _, _ in BLOCKS}
    assert "README.md" in files and len(files) >= 2, f"python blocks found only in {files}"
    assert not any("docs/api" in _where(p, n) for p, n, _ in BLOCKS)


def test_marker_parsing(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n- item:\n\n  ```python\n  # needs: gpu, hub\n  x = 1\n  ```\n\n"
                    "```python\nprint(1)\n```\n\n```text\nnot python\n```\n")
    blocks = python_blocks(page)
    assert blocks == [(5, "# needs: gpu, hub\nx = 1\n"), (10, "print(1)\n")]
    assert block_needs(blocks[0][1]) == {"gpu", "hub"} and block_needs(blocks[1][1]) == set()
    assert skip_reason({"gpu", "hub"}) == "needs weights from the Hugging Face Hub (compiled only)"
    with pytest.raises(ValueError, match="names some of"):
        block_needs("# needs: network\nx = 1\n")


#: the runner: imports once, then per request line ``{"script", "out", "timeout"}`` forks a
#: child that runs the script as ``__main__`` (stdout and stderr into ``out`` + ".out"/".err")
#: and answers ``{"rc": int}`` (-9: killed at the timeout)
_RUNNER = r"""
import json, os, runpy, signal, sys, time, traceback
import torch, dllm_decode, dllm_decode.samplers.sampler, dllm_decode.text  # the warm part
base_path = list(sys.path)
for request in sys.stdin:
    job = json.loads(request)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            out = os.open(job["out"] + ".out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            err = os.open(job["out"] + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.argv = [job["script"]]
            sys.path[:] = [os.path.dirname(job["script"])] + base_path
            runpy.run_path(job["script"], run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    deadline = time.monotonic() + job["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            rc = -9
            break
        time.sleep(0.02)
    print(json.dumps({"rc": rc}), flush=True)
"""


@pytest.fixture(scope="module")
def runner():
    """The warm runner process (``_RUNNER``), started in the repository root."""
    extra = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), *extra]))
    proc = subprocess.Popen([sys.executable, "-c", _RUNNER], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


def run_block(runner: subprocess.Popen, script: Path,
              timeout: float = BLOCK_TIMEOUT_S) -> tuple[int, str, str]:
    """Run ``script`` in a child of the runner: ``(exit code, stdout, stderr)``; -9 when it
    ran past ``timeout`` seconds and was killed."""
    out = script.with_suffix("")
    runner.stdin.write(json.dumps({"script": str(script), "out": str(out),
                                   "timeout": timeout}) + "\n")
    runner.stdin.flush()
    answer = runner.stdout.readline()
    assert answer, f"the block runner died (exit {runner.poll()})"
    rc = json.loads(answer)["rc"]
    read = lambda suffix: Path(str(out) + suffix).read_text(errors="replace")  # noqa: E731
    return rc, read(".out"), read(".err")


@pytest.mark.parametrize(("path", "line", "code"), BLOCKS,
                         ids=[_where(p, n) for p, n, _ in BLOCKS])
def test_doc_block_runs(path: Path, line: int, code: str, runner, tmp_path) -> None:
    where = _where(path, line)
    compile(code, where, "exec")
    reason = skip_reason(block_needs(code))
    if reason:
        pytest.skip(f"{where} {reason}")
    script = tmp_path / "block.py"
    script.write_text(code)
    start = time.monotonic()
    rc, out, err = run_block(runner, script)
    took = time.monotonic() - start
    assert rc != -9, f"{where} ran past {BLOCK_TIMEOUT_S} s: make the example smaller"
    assert rc == 0, (
        f"{where} failed (exit {rc}) after {took:.1f} s (a block that needs a GPU or the Hub "
        f"takes a '# needs: gpu' / '# needs: hub' first line):\n{out}\n{err}")


def test_runner_reports_a_failing_block(runner, tmp_path) -> None:
    """A block that raises fails with its traceback; one that exits 0 early passes; the
    namespace is fresh (a name another block defined is not there)."""
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\nraise ValueError('broken example')\n")
    rc, _, err = run_block(runner, bad)
    assert rc == 1 and "ValueError: broken example" in err
    early = tmp_path / "early.py"
    early.write_text("import sys\nprint('hi')\nsys.exit(0)\n")
    assert run_block(runner, early) == (0, "hi\n", "")
    fresh = tmp_path / "fresh.py"
    fresh.write_text("assert 'x' not in globals() and __name__ == '__main__'\n"
                     f"import os\nassert os.getcwd() == {str(ROOT)!r}\n")
    assert run_block(runner, fresh)[0] == 0
    endless = tmp_path / "endless.py"
    endless.write_text("while True:\n    pass\n")
    assert run_block(runner, endless, timeout=0.5)[0] == -9
