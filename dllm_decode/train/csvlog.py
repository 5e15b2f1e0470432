"""The run directories' CSV logs (``loss.csv``, ``eval.csv``): append a row, cut a resumed tail.

One pair for both trainers (``train.trainer`` and ``train.distill``), LF line endings (the
committed logs' format; ``csv``'s default would write CRLF).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def append_row(path: Path, row: dict[str, Any], columns: Sequence[str] | None = None) -> None:
    """Append ``row`` to the CSV at ``path``, writing the header first if the file is new.

    ``columns`` fixes the header and order (missing keys are written empty); default: the
    row's own keys.
    """
    fields = list(row if columns is None else columns)
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerow({k: row.get(k, "") for k in fields})


def truncate_rows(path: Path, last_step: int) -> None:
    """Drop the rows of ``path`` logged after ``last_step`` (the tail an interrupted run left
    beyond the checkpoint being resumed); a missing file is left missing."""
    if not path.exists():
        return
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        kept = [r for r in reader if int(r["step"]) <= last_step]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
