"""The run logs both trainers write: LF rows, a fixed header, a resumed tail cut exactly."""

from __future__ import annotations

from pathlib import Path

from dllm_decode.train.csvlog import append_row, truncate_rows


def test_append_writes_a_header_once_and_lf_rows(tmp_path: Path) -> None:
    path = tmp_path / "loss.csv"
    append_row(path, {"step": 10, "loss": 1.5, "lr": "2.000e-05"})
    append_row(path, {"step": 20, "loss": 1.25, "lr": "1.000e-05"})
    assert path.read_bytes() == b"step,loss,lr\n10,1.5,2.000e-05\n20,1.25,1.000e-05\n"


def test_append_with_columns_fixes_the_order_and_blanks_missing_keys(tmp_path: Path) -> None:
    path = tmp_path / "loss.csv"
    append_row(path, {"loss": 2.0, "step": 5}, columns=("step", "loss", "acc"))
    assert path.read_text() == "step,loss,acc\n5,2.0,\n"


def test_truncate_drops_rows_after_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "eval.csv"
    for step in (100, 200, 300):
        append_row(path, {"step": step, "copy": step / 1000})
    truncate_rows(path, 200)
    assert path.read_bytes() == b"step,copy\n100,0.1\n200,0.2\n"
    truncate_rows(path, 50)  # nothing kept: the header stays, so a resumed run appends rows
    assert path.read_text() == "step,copy\n"
    append_row(path, {"step": 100, "copy": 0.5})
    assert path.read_text() == "step,copy\n100,0.5\n"
    truncate_rows(tmp_path / "missing.csv", 10)  # no file yet: nothing to cut, nothing made
    assert not (tmp_path / "missing.csv").exists()
