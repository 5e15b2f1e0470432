"""Every Python snippet of README.md runs as ``python snippet.py`` from any folder and prints
clean text (``tests/test_doc_blocks.py`` runs the docs pages' blocks from the repository root;
``tests/test_readme_policy.py`` runs the policy page's from another folder).

The snippets are read from the README, so it cannot drift from the library. Rule:
a snippet runs here unless it needs a GPU or the network, i.e. it mentions ``cuda`` or a
Hugging Face Hub id (a quoted ``"org/name"`` string that is not a file path); those are only
compiled. Each runnable snippet is written to ``snippet.py`` in a folder of its own and run by
a fresh interpreter started in *another* folder, without ``PYTHONPATH`` (the repository root is
not importable, as for a user of the installed package); a snippet that imports ``my_policy``
gets the docs' policy class saved beside it as ``my_policy.py``, as ``docs/policies.md`` says to.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.docs_text import doc_files, docs_text

ROOT = Path(__file__).resolve().parents[1]
#: a quoted "org/name" (Hub id), not a path with a file suffix or a folder with more parts
_HUB_ID = re.compile(r"""["']([A-Za-z0-9][\w.-]*/[\w.-]+)["']""")
_FILE_SUFFIX = re.compile(r"\.(py|ya?ml|png|json|csv|md|txt|safetensors)$")
#: the docs section whose snippets ``test_readme_policy`` runs (with stricter checks)
POLICY_SECTION = "## Write your own policy"


def readme_snippets(section: str | None = None,
                    files: list[Path] | None = None) -> list[tuple[str, str]]:
    """``("FILE:LINE", code)`` of every ```python block of ``files`` (default: README.md and
    ``docs/**/*.md``; indented ones dedented), or of the blocks of one ``## section``."""
    out = []
    for path in doc_files() if files is None else files:
        text, name = path.read_text(), path.relative_to(ROOT).as_posix()
        for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, flags=re.M | re.S):
            line = text[:m.start()].count("\n") + 1
            if section is None or _section_of(text, m.start()) == section:
                out.append((f"{name}:{line}", textwrap.dedent(m.group(2))))
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


SNIPPETS = readme_snippets(files=[ROOT / "README.md"])
OWN = {line for line, _ in readme_snippets(POLICY_SECTION)}


def test_the_rule_finds_snippets_of_both_kinds() -> None:
    assert len(SNIPPETS) >= 2
    runnable = [code for _, code in SNIPPETS if not needs_gpu_or_hub(code)]
    assert len(runnable) >= 1 and len(runnable) < len(SNIPPETS)
    assert needs_gpu_or_hub('load_model("GSAI-ML/LLaDA-8B-Instruct")')
    assert not needs_gpu_or_hub('plot_decoding(out, "runs/confident_runs.png")')
    assert len(OWN) == 3  # test_readme_policy runs these


@pytest.mark.parametrize(("where", "code"), SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_readme_snippet_runs_as_a_script(where, code, tmp_path) -> None:
    compile(code, where, "exec")
    if needs_gpu_or_hub(code):
        pytest.skip("needs a GPU or a Hub download (compiled only)")
    if where in OWN:
        pytest.skip("run by tests/test_readme_policy.py")
    if "plot_decoding" in code:
        pytest.importorskip("matplotlib")
    check_clean(run_snippet(code, tmp_path), where, code)


def test_readme_and_grid_comments_agree_on_out() -> None:
    """A grid whose header comment gives its command and the docs' command for it name the
    same --out folder."""
    readme = docs_text()
    pattern = r"--grid (benchmarks/grids/[\w.]+\.yaml) --out (\S+)"
    shown = dict(re.findall(pattern, readme))
    assert shown, "the docs show no grid command"
    for grid, out in shown.items():
        comment = [m for m in re.findall(pattern, (ROOT / grid).read_text()) if m[0] == grid]
        assert all(o == out for _, o in comment), (grid, out, comment)
        assert f"eval analyze {out}" in readme or "analyze" not in readme


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_docs_links_resolve_inside_docs() -> None:
    """Every relative link of README.md and the docs pages names an existing file, and a docs
    page links only inside ``docs/`` (``mkdocs build --strict`` fails on anything else)."""
    docs = ROOT / "docs"
    for path in doc_files():
        for target in _LINK.findall(path.read_text()):
            if re.match(r"[a-z]+:|#", target):
                continue  # a URL or an anchor on the same page
            resolved = (path.parent / target.split("#", 1)[0]).resolve()
            where = f"{path.relative_to(ROOT)}: ({target})"
            assert resolved.is_file(), f"{where} names no file"
            if path.is_relative_to(docs):
                assert resolved.is_relative_to(docs), f"{where} leaves docs/"


def test_getting_started_gives_the_readme_set_up_commands() -> None:
    """``docs/index.md`` repeats the README's two set-up commands exactly (none goes stale)."""
    commands = [re.findall(r"```bash\n(.*?)\n```", (ROOT / name).read_text(), flags=re.S)
                for name in ("README.md", "docs/index.md")]
    assert len(commands[0]) == 2 and commands[1] == commands[0]
