"""Official-data loader and the task registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dllm_decode.eval.parallelbench import generate_task, prompt_template, reference_answer
from dllm_decode.eval.parallelbench.graders import GRADERS
from dllm_decode.eval.parallelbench.loader import available_tasks, load_task, load_tasks
from dllm_decode.eval.parallelbench.tasks import BENCHMARK_TASKS, TASK_SPECS, task_spec

OFFICIAL = Path(__file__).resolve().parents[1] / ".." / "shared/data/parallelbench/output/test"


def write_tree(root: Path, task: str, records: list[dict], metric: str) -> None:
    category = root / task.split("/")[0]
    category.mkdir(parents=True, exist_ok=True)
    config = {task: {"metric": metric, "prompt": prompt_template(task)}}
    (category / "task_config.yaml").write_text(yaml.safe_dump(config))
    (root / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_registry() -> None:
    assert len(TASK_SPECS) == 45 and len(BENCHMARK_TASKS) == 17
    assert all(spec.metric in GRADERS for spec in TASK_SPECS.values())
    budgets = {spec.category: spec.max_tokens for spec in TASK_SPECS.values()}
    assert budgets == {"waiting_line": 32, "waiting_line_n15": 128, "text_writing": 64,
                       "puzzle": 64, "variants": 64}  # fmt: skip
    assert task_spec("puzzle/sudoku_n4_6").metric == "sudoku_score"
    assert task_spec("waiting_line/insert_random").metric == "list_random_insert_score"
    with pytest.raises(KeyError, match="unknown ParallelBench task"):
        task_spec("waiting_line/teleport")


def test_synthetic_tree_roundtrip(tmp_path: Path) -> None:
    records = generate_task("waiting_line/shuffle", 5, seed=0)
    write_tree(tmp_path, "waiting_line/shuffle", records, "list_shuffle_score")
    loaded = load_task(tmp_path, "waiting_line/shuffle")
    assert loaded.records == records and loaded.metric == "list_shuffle_score"
    assert loaded.prompt == prompt_template("waiting_line/shuffle")
    for record in loaded.records:
        assert loaded.spec.grade(reference_answer(record), record)["score"] == 1.0
    assert available_tasks(tmp_path) == ["waiting_line/shuffle"]
    assert list(load_tasks(tmp_path, ["waiting_line"])) == ["waiting_line/shuffle"]


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        load_tasks(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="task_config.yaml"):
        load_tasks(tmp_path)
    records = generate_task("waiting_line/copy", 2, seed=0)
    write_tree(tmp_path, "waiting_line/copy", records, "list_match_score")
    with pytest.raises(KeyError, match="not in"):
        load_task(tmp_path, "waiting_line/sort")
    with pytest.raises(FileNotFoundError, match="missing task config"):
        load_task(tmp_path, "puzzle/sudoku_n4_12")
    path = tmp_path / "waiting_line/copy.jsonl"
    path.write_text(path.read_text() + "{broken\n")
    with pytest.raises(ValueError, match=r"copy.jsonl:3: invalid JSON"):
        load_task(tmp_path, "waiting_line/copy")
    path.unlink()
    with pytest.raises(FileNotFoundError, match="missing task data"):
        load_task(tmp_path, "waiting_line/copy")
    write_tree(tmp_path, "waiting_line/copy", records, "bleu")
    with pytest.raises(ValueError, match="unknown metric"):
        load_task(tmp_path, "waiting_line/copy")


def test_official_benchmark() -> None:
    if not OFFICIAL.is_dir():
        pytest.skip(f"official ParallelBench data not found at {OFFICIAL} (not redistributable)")
    tasks = load_tasks(OFFICIAL.parent)  # a parent directory resolves to .../test
    assert list(tasks) == list(BENCHMARK_TASKS)
    assert sum(len(t.records) for t in tasks.values()) == 1708
    assert len(tasks["puzzle/sudoku_n4_12"].records) == 108
    for name, task in tasks.items():
        assert task.metric == task.spec.metric and task.prompt == prompt_template(name)
    assert len(available_tasks(OFFICIAL)) == 45
