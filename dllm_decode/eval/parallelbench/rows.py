"""Result-rows files: crash-safe append-only JSONL, resume keys, merge.

A row is keyed by ``(config_hash, task, doc_id)``. Writers append one line per row and flush +
fsync it; readers drop a truncated last line (a crash mid-write) and writers cut it off before
appending, so a resumed run neither loses nor duplicates rows.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

ROWS_FILE: Final[str] = "rows.jsonl"
RANK_FILE: Final[str] = "rows.rank{rank}.jsonl"
PLAN_FILE: Final[str] = "run.json"
Key = tuple[str, str, int]


def row_key(row: Mapping[str, Any]) -> Key:
    """``(config_hash, task, doc_id)`` of a row."""
    return (str(row["config_hash"]), str(row["task"]), int(row["doc_id"]))


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a truncated (unparseable) *last* line is ignored.

    Raises:
        ValueError: a malformed line that is not the last one.
    """
    path = Path(path)
    lines = path.read_text().splitlines() if path.is_file() else []
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: corrupt row") from None
    return rows


def rows_files(out_dir: str | Path) -> list[Path]:
    """The merged and per-rank rows files present in ``out_dir``."""
    out = Path(out_dir)
    return sorted({*out.glob(ROWS_FILE), *out.glob("rows.rank*.jsonl")})


def load_rows(out_dir: str | Path) -> list[dict[str, Any]]:
    """All rows of a run directory, deduplicated by key and sorted by it."""
    unique: dict[Key, dict[str, Any]] = {}
    for path in rows_files(out_dir):
        for row in read_rows(path):
            unique.setdefault(row_key(row), row)
    return [unique[key] for key in sorted(unique)]


def merge_rows(out_dir: str | Path) -> Path:
    """Write ``rows.jsonl`` = every rows file deduplicated and sorted (atomic replace)."""
    out = Path(out_dir)
    target, tmp = out / ROWS_FILE, out / (ROWS_FILE + ".tmp")
    with tmp.open("w") as handle:
        for row in load_rows(out):
            handle.write(json.dumps(row) + "\n")
    os.replace(tmp, target)
    return target


class RowWriter:
    """Append-only JSONL writer: one line per row, flushed and fsynced (crash-safe resume)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_partial_tail()
        self._handle = self.path.open("a")

    def _drop_partial_tail(self) -> None:
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        try:  # a complete row that only lacks its newline is kept (readers counted it)
            json.loads(data[cut:])
        except json.JSONDecodeError:
            with self.path.open("r+b") as handle:
                handle.truncate(cut)
        else:
            with self.path.open("ab") as handle:
                handle.write(b"\n")

    def write(self, row: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


def write_plan(out_dir: str | Path, config_hashes: Iterable[str]) -> Path:
    """Record what a run is meant to produce: ``run.json`` = rows expected per config hash
    (one entry per work unit), so ``eval analyze`` can tell a finished run from one that was
    interrupted (or is still running). Replaced atomically by every run into ``out_dir``."""
    out = Path(out_dir)
    target, tmp = out / PLAN_FILE, out / (PLAN_FILE + ".tmp")
    tmp.write_text(json.dumps({"expected_rows": dict(Counter(config_hashes))}, indent=1) + "\n")
    os.replace(tmp, target)
    return target


def read_plan(out_dir: str | Path) -> dict[str, int] | None:
    """Rows expected per config hash (``write_plan``), or ``None`` for a run without one."""
    path = Path(out_dir) / PLAN_FILE
    if not path.is_file():
        return None
    return {str(k): int(v) for k, v in json.loads(path.read_text())["expected_rows"].items()}
