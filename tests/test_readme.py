"""Every Python snippet of README.md runs as ``python snippet.py`` from any folder and prints
clean text.

The snippets are read from README.md, so the README cannot drift from the library. Rule:
a snippet runs here unless it needs a GPU or the network, i.e. it mentions ``cuda`` or a
Hugging Face Hub id (a quoted ``"org/name"`` string that is not a file path); those are only
compiled. Each runnable snippet is written to ``snippet.py`` in a folder of its own and run by
a fresh interpreter started in *another* folder, without ``PYTHONPATH`` (the repository root is
not importable, as for a user of the installed package); a snippet that imports ``my_policy``
gets the README's policy class saved beside it as ``my_policy.py``, as the README says to.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a quoted "org/name" (Hub id), not a path with a file suffix or a folder with more parts
_HUB_ID = re.compile(r"""["']([A-Za-z0-9][\w.-]*/[\w.-]+)["']""")
_FILE_SUFFIX = re.compile(r"\.(py|ya?ml|png|json|csv|md|txt|safetensors)$")
#: the README section whose snippets ``test_readme_policy`` runs (with stricter checks)
POLICY_SECTION = "## Write your own policy"


def readme_snippets(section: str | None = None) -> list[tuple[int, str]]:
    """``(line, code)`` of every ```python block of README.md (indented ones dedented), or of
    the blocks of one ``## section``."""
    text = (ROOT / "README.md").read_text()
    out = []
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, flags=re.M | re.S):
        line = text[:m.start()].count("\n") + 1
        if section is None or _section_of(text, m.start()) == section:
            out.append((line, textwrap.dedent(m.group(2))))
    return out


def _section_of(text: str, offset: int) -> str:
    heads = re.findall(r"^## .*$", text[:offset], flags=re.M)
    return heads[-1] if heads else ""


def needs_gpu_or_hub(code: str) -> bool:
    """The rule (module docstring): ``cuda`` or a Hub id means the snippet is only compiled."""
    if "cuda" in code:
        return True
    return any(not _FILE_SUFFIX.search(m) for m in _HUB_ID.findall(code))


def run_snippet(code: str, tmp_path: Path, name: str = "snippet.py",
                timeout: float = 900) -> subprocess.CompletedProcess:
    """``python <folder>/snippet.py`` started in ``tmp_path/elsewhere`` (what it writes lands
    there), ``my_policy.py`` beside it when it imports one; one intra-op thread."""
    folder, cwd = tmp_path / "script", tmp_path / "elsewhere"
    folder.mkdir(exist_ok=True)
    cwd.mkdir(exist_ok=True)
    (folder / name).write_text(code)
    if re.search(r"^from my_policy import", code, flags=re.M):
        policy_class = readme_snippets(POLICY_SECTION)[0][1]
        (folder / "my_policy.py").write_text(policy_class)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, str(folder / name)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def check_clean(result: subprocess.CompletedProcess, where: str, code: str) -> str:
    """The snippet exited 0 without a warning and printed clean text; returns stdout."""
    printed = result.stdout + result.stderr
    assert result.returncode == 0, f"{where} failed:\n{printed}"
    for junk in ("<|", "<eos>", "<pad>", "[MASK]", "tensor(", "Traceback"):
        assert junk not in printed, f"{where} printed {junk!r}:\n{printed}"
    assert "Warning:" not in result.stderr, f"{where} warned:\n{result.stderr}"
    if "print(" in code:
        assert result.stdout.strip(), f"{where} prints nothing"
    return result.stdout


SNIPPETS = readme_snippets()
OWN = {line for line, _ in readme_snippets(POLICY_SECTION)}


def test_the_rule_finds_snippets_of_both_kinds() -> None:
    assert len(SNIPPETS) >= 6
    runnable = [code for _, code in SNIPPETS if not needs_gpu_or_hub(code)]
    assert len(runnable) >= 5 and len(runnable) < len(SNIPPETS)
    assert needs_gpu_or_hub('load_model("GSAI-ML/LLaDA-8B-Instruct")')
    assert not needs_gpu_or_hub('plot_decoding(out, "runs/confident_runs.png")')
    assert len(OWN) == 3  # test_readme_policy runs these


@pytest.mark.parametrize(("line", "code"), SNIPPETS, ids=[f"line{n}" for n, _ in SNIPPETS])
def test_readme_snippet_runs_as_a_script(line, code, tmp_path) -> None:
    compile(code, f"README.md:{line}", "exec")
    if needs_gpu_or_hub(code):
        pytest.skip("needs a GPU or a Hub download (compiled only)")
    if line in OWN:
        pytest.skip("run by tests/test_readme_policy.py")
    if "plot_decoding" in code:
        pytest.importorskip("matplotlib")
    check_clean(run_snippet(code, tmp_path), f"README.md:{line}", code)


def test_readme_and_grid_comments_agree_on_out() -> None:
    """A grid whose header comment gives its command and the README's command for it name the
    same --out folder."""
    readme = (ROOT / "README.md").read_text()
    pattern = r"--grid (benchmarks/grids/[\w.]+\.yaml) --out (\S+)"
    shown = dict(re.findall(pattern, readme))
    assert shown, "the README shows no grid command"
    for grid, out in shown.items():
        comment = [m for m in re.findall(pattern, (ROOT / grid).read_text()) if m[0] == grid]
        assert all(o == out for _, o in comment), (grid, out, comment)
        assert f"eval analyze {out}" in readme or "analyze" not in readme
