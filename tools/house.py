"""The package's house in numbers: rooms, floors, arrows, import circles, arrows back up a layer.

    python tools/house.py               # the working tree
    python tools/house.py --rev main    # any git revision (its dllm_decode/ unpacked to a temp dir)
    python tools/house.py --json        # the same as one JSON object

* **modules**: every module of ``dllm_decode`` (a package's ``__init__`` is the package); an
  **import** is a ``module -> module`` edge as grimp reads the source (lazy imports inside
  functions and ``TYPE_CHECKING`` imports count: they are imports all the same).
* **circles**: strongly connected components of more than one module in that graph (every
  module of one can reach every other one by imports); the no-circle test
  (``tests/test_architecture.py``) holds them at zero.
* **rooms**: the package root's children (``dllm_decode.samplers``, ``dllm_decode.types``,
  ...) plus the root itself (``dllm_decode``: its ``__init__``); an **arrow** is a pair of
  rooms with at least one import between them (the imports inside a room are not arrows).
* **rooms that import each other**: strongly connected components of more than one room in
  the graph of arrows. Not import circles (no module is in a circle); allowed when the rooms
  share a layer split by ``:`` (``eval : tokenizer``), else they are arrows back up.
* **floors**: the longest chain of arrows (rooms that import each other count as one).
* **arrows back up**: arrows from a room to a room on a higher layer of the layers contract
  in ``pyproject.toml`` (``[tool.importlinter]``; the layers of *this* checkout, also for
  ``--rev``), and arrows into the root from inside (nothing below the public face imports it).

``lint-imports`` checks the same contract (and the "never" contracts beside it) by chains,
not only by direct arrows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from io import BytesIO
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dllm_decode"


def import_graph(src: Path) -> dict[str, set[str]]:
    """``module -> modules it imports`` of ``PACKAGE`` under ``src`` (grimp, in a child
    process so that ``src`` comes first on its path)."""
    code = (
        "import json, grimp\n"
        f"g = grimp.build_graph({PACKAGE!r}, cache_dir=None)\n"
        "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) "
        "for m in g.modules}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", code], cwd=src, env=env, check=True,
                         capture_output=True, text=True).stdout
    return {k: set(v) for k, v in json.loads(out).items()}


def strong_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` (networkx, a torch dependency), each
    sorted, in sorted order."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(graph)
    g.add_edges_from((a, b) for a, bs in graph.items() for b in bs)
    return sorted(sorted(c) for c in nx.strongly_connected_components(g))


def room(module: str) -> str:
    """``dllm_decode.samplers.step`` -> ``dllm_decode.samplers``."""
    return ".".join(module.split(".")[:2])


def layer_order(pyproject: Path) -> dict[str, int]:
    """Room -> layer number (0 = top) from the layers contract, for rooms it names."""
    config = tomllib.loads(pyproject.read_text()).get("tool", {}).get("importlinter", {})
    order: dict[str, int] = {}
    for contract in config.get("contracts", []):
        if contract.get("type") != "layers":
            continue
        container = (contract.get("containers") or [PACKAGE])[0]
        for i, layer in enumerate(contract["layers"]):
            for name in layer.replace(":", "|").split("|"):
                order[f"{container}.{name.strip().strip('()')}"] = i
    return order


def house(graph: dict[str, set[str]], layers: dict[str, int]) -> dict:
    """The numbers (see the module docstring)."""
    circles = [c for c in strong_components(graph) if len(c) > 1]
    rooms = {room(m) for m in graph}
    arrows: dict[tuple[str, str], list[str]] = {}
    for src, dsts in graph.items():
        for dst in dsts:
            a, b = room(src), room(dst)
            if a != b:
                arrows.setdefault((a, b), []).append(f"{src} -> {dst}")
    room_graph = {r: {b for (a, b) in arrows if a == r} for r in rooms}
    room_circles = [c for c in strong_components(room_graph) if len(c) > 1]
    back_up = sorted(
        (a, b) for (a, b) in arrows
        if (b == PACKAGE and a != PACKAGE)
        or (a in layers and b in layers and layers[a] > layers[b]))
    return {
        "modules": len(graph),
        "imports": sum(len(v) for v in graph.values()),
        "circles": len(circles),
        "circle_modules": circles,
        "rooms": len(rooms),
        "floors": floors(room_graph),
        "arrows": len(arrows),
        "room_circles": room_circles,
        "room_circles_allowed": [same_layer(c, layers) for c in room_circles],
        "arrows_back_up": len(back_up),
        "back_up": {f"{a} -> {b}": arrows[(a, b)] for a, b in back_up},
        "unplaced_rooms": sorted(r for r in rooms if r not in layers and r != PACKAGE),
    }


def same_layer(rooms: list[str], layers: dict[str, int]) -> bool:
    """Whether ``rooms`` all sit on one layer of the contract (rooms of one layer that import
    each other are split by ``:``: those split by ``|`` are independent, which lint checks)."""
    return all(r in layers for r in rooms) and len({layers[r] for r in rooms}) == 1


def floors(room_graph: dict[str, set[str]]) -> int:
    """Rooms on the longest chain of arrows, each circle of rooms condensed to one."""
    comps = strong_components(room_graph)
    comp_of = {r: i for i, c in enumerate(comps) for r in c}
    dag = {i: {comp_of[d] for r in c for d in room_graph[r]} - {i} for i, c in enumerate(comps)}
    depth: dict[int, int] = {}

    def visit(i: int) -> int:
        if i not in depth:
            depth[i] = 1 + max((visit(j) for j in dag[i]), default=0)
        return depth[i]

    return max((visit(i) for i in dag), default=0)


def unpack(rev: str, into: Path) -> Path:
    """``dllm_decode/`` of git revision ``rev`` under ``into``."""
    data = subprocess.run(["git", "archive", rev, PACKAGE], cwd=ROOT, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def report(numbers: dict, label: str) -> Iterable[str]:
    """Human-readable lines."""
    yield (f"{label}: {numbers['modules']} modules, {numbers['imports']} imports; "
           f"{numbers['rooms']} rooms on {numbers['floors']} floors, {numbers['arrows']} "
           f"arrows; {numbers['circles']} import circles between modules; "
           f"{numbers['arrows_back_up']} arrows back up a layer")
    for circle in numbers["circle_modules"]:
        yield "  circle: " + " <-> ".join(m.removeprefix(PACKAGE + ".") for m in circle)
    for circle, allowed in zip(numbers["room_circles"], numbers["room_circles_allowed"],
                               strict=True):
        why = "allowed: one layer, ':'" if allowed else "NOT allowed: across layers"
        yield (f"  rooms that import each other ({why}): "
               + ", ".join(r.removeprefix(PACKAGE + ".") for r in circle))
    for arrow, imports in numbers["back_up"].items():
        yield f"  back up: {arrow} ({'; '.join(imports)})"
    if numbers["unplaced_rooms"]:
        yield "  rooms on no layer: " + ", ".join(numbers["unplaced_rooms"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="a git revision (default: the working tree)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    layers = layer_order(ROOT / "pyproject.toml")
    with tempfile.TemporaryDirectory() as tmp:
        src = unpack(args.rev, Path(tmp)) if args.rev else ROOT
        numbers = house(import_graph(src), layers)
    if args.json:
        print(json.dumps(numbers, indent=1))
    else:
        print("\n".join(report(numbers, args.rev or "working tree")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
