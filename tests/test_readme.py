"""Every Python snippet of README.md runs pasted alone and prints clean text (issue 36).

The snippets are read from README.md, so the README cannot drift from the library. Rule:
a snippet runs here unless it needs a GPU or the network, i.e. it mentions ``cuda`` or a
Hugging Face Hub id (a quoted ``"org/name"`` string that is not a file path); those are only
compiled. Each runnable snippet gets a fresh namespace, the working directory is a temporary
folder (so what a snippet writes lands there), and the repository root is importable, as
when the snippet is pasted into ``python`` started at the repository root.
"""

from __future__ import annotations

import re
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
#: a quoted "org/name" (Hub id), not a path with a file suffix or a folder with more parts
_HUB_ID = re.compile(r"""["']([A-Za-z0-9][\w.-]*/[\w.-]+)["']""")
_FILE_SUFFIX = re.compile(r"\.(py|ya?ml|png|json|csv|md|txt|safetensors)$")


def readme_snippets() -> list[tuple[int, str]]:
    """``(line, code)`` of every ```python block of README.md (indented ones dedented)."""
    text = (ROOT / "README.md").read_text()
    out = []
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, flags=re.M | re.S):
        out.append((text[:m.start()].count("\n") + 1, textwrap.dedent(m.group(2))))
    return out


def needs_gpu_or_hub(code: str) -> bool:
    """The rule (module docstring): ``cuda`` or a Hub id means the snippet is only compiled."""
    if "cuda" in code:
        return True
    return any(not _FILE_SUFFIX.search(m) for m in _HUB_ID.findall(code))


SNIPPETS = readme_snippets()


def test_the_rule_finds_snippets_of_both_kinds() -> None:
    assert len(SNIPPETS) >= 6
    runnable = [code for _, code in SNIPPETS if not needs_gpu_or_hub(code)]
    assert len(runnable) >= 5 and len(runnable) < len(SNIPPETS)
    assert needs_gpu_or_hub('load_model("GSAI-ML/LLaDA-8B-Instruct")')
    assert not needs_gpu_or_hub('plot_decoding(out, "runs/confident_runs.png")')


@pytest.mark.parametrize(("line", "code"), SNIPPETS, ids=[f"line{n}" for n, _ in SNIPPETS])
def test_readme_snippet_runs_pasted_alone(line, code, tmp_path, monkeypatch, capsys) -> None:
    compiled = compile(code, f"README.md:{line}", "exec")
    if needs_gpu_or_hub(code):
        pytest.skip("needs a GPU or a Hub download (compiled only)")
    if "plot_decoding" in code:
        pytest.importorskip("matplotlib")
    if "hypothesis" in code:
        pytest.importorskip("hypothesis")
    module = types.ModuleType(f"readme_line{line}")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclasses look it up
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compiled, module.__dict__)  # noqa: S102
    out = capsys.readouterr()
    printed = out.out + out.err
    for junk in ("<|", "<eos>", "<pad>", "[MASK]", "tensor(", "Traceback"):
        assert junk not in printed, f"README.md:{line} printed {junk!r}:\n{printed}"
    assert not [str(w.message) for w in caught], f"README.md:{line} warned"
    if "print(" in code:
        assert printed.strip(), f"README.md:{line} prints nothing"


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
