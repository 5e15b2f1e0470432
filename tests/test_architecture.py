"""The house rules of ``docs/architecture.md``, checked on the import graph (grimp).

* no import circle between modules (lazy imports inside functions and ``TYPE_CHECKING``
  imports count: grimp reads them all);
* the import-linter contracts in ``pyproject.toml`` hold (the layers and the "never" rules;
  ``lint-imports`` runs the same check on the command line);
* nothing inside the package imports its root (``dllm_decode/__init__.py`` is the public face);
* serving adapters (``dllm_decode.integrations``) are imported by their engines' entry points
  only, never by another module of the package;
* ``docs/architecture.md`` names every room (``dllm_decode.X``) the package has.

``python tools/house.py`` prints the same graph in numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dllm_decode"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None)


def _digraph(graph: grimp.ImportGraph) -> nx.DiGraph:
    g = nx.DiGraph()
    for module in graph.modules:
        g.add_node(module)
        g.add_edges_from((module, m) for m in graph.find_modules_directly_imported_by(module))
    return g


def test_no_import_circle_between_modules(graph) -> None:
    circles = [sorted(c) for c in nx.strongly_connected_components(_digraph(graph))
               if len(c) > 1]
    detail = []
    for circle in circles:
        edges = [f"{a} -> {b}" for a in circle
                 for b in sorted(graph.find_modules_directly_imported_by(a)) if b in circle]
        detail.append(" <-> ".join(circle) + "\n    " + "\n    ".join(edges))
    assert not circles, "import circles (break each at its cause):\n" + "\n".join(detail)


def test_import_linter_contracts_hold() -> None:
    # in a child process: import-linter configures logging (dictConfig), which would disable
    # the loggers of the package that later tests read
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, "
            "no_cache=True, no_logo=True))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]


def test_nothing_inside_imports_the_package_root(graph) -> None:
    importers = sorted(graph.find_modules_that_directly_import(PACKAGE))
    assert not importers, (f"{importers} import the package root {PACKAGE!r}: import the "
                           "module that defines the name instead")


#: the one importer of ``integrations`` inside the package: ``dllm-decode serve-check`` runs the
#: server start's YAML resolution (``integrations.sglang.check``, which imports no SGLang)
SERVE_CHECK = {(f"{PACKAGE}.cli", f"{PACKAGE}.integrations.sglang.check")}


def test_integrations_are_imported_only_by_entry_points(graph) -> None:
    adapters = f"{PACKAGE}.integrations"
    inside = {m for m in graph.modules if m == adapters or m.startswith(adapters + ".")}
    edges = {(m, target) for target in inside
             for m in graph.find_modules_that_directly_import(target)} - SERVE_CHECK
    importers = sorted({m for m, _ in edges} - inside)
    assert not importers, f"{importers} import {adapters}: only an entry point may"


def test_architecture_doc_names_every_room(graph) -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    rooms = sorted({".".join(m.split(".")[:2]) for m in graph.modules} - {PACKAGE})
    missing = [r for r in rooms if f"`{r.split('.', 1)[1]}" not in doc]
    assert not missing, f"docs/architecture.md does not place {missing}"
