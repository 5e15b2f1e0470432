"""v1 prompt templates and chat-message assembly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dllm_decode.eval.parallelbench import (
    NoReferenceError,
    generate_task,
    prompt_template,
    reference_answer,
    render_messages,
)

OFFICIAL = Path(__file__).resolve().parents[1] / ".." / "shared/data/parallelbench/output/test"


def official_dir() -> Path:
    if not OFFICIAL.is_dir():
        pytest.skip(f"official ParallelBench data not found at {OFFICIAL} (not redistributable)")
    return OFFICIAL


def test_templates_identical_to_released_config() -> None:
    configs = sorted(official_dir().glob("*/task_config.yaml"))
    checked = 0
    for config in configs:
        for task, entry in yaml.safe_load(config.read_text()).items():
            assert prompt_template(task) == entry["prompt"], task
            checked += 1
    assert checked == 45  # 10 + 10 waiting line, 2 puzzles, 2 text, 21 words-to-sentence


def test_render_copy_exact_text() -> None:
    record = {
        "input": {
            "context": '["Ann Lee", "Bo Kim"]',
            "icl_examples": [{"input": {"context": '["X Y"]'}, "answer": '["X Y"]'}],
        },
        "answer": '["Ann Lee", "Bo Kim"]',
    }
    messages = render_messages("waiting_line/copy", record)
    head = "You are managing a waiting line at a customer service desk.\n"
    assert messages == [
        {
            "role": "user",
            "content": head + "You need to record the following people in the order they "
            'arrived:\n["X Y"]\nPlease copy the list exactly and provide only the final list.\n',
        },
        {"role": "assistant", "content": '["X Y"]'},
        {
            "role": "user",
            "content": head + "You need to record the following people in the order they "
            'arrived:\n["Ann Lee", "Bo Kim"]\n'
            "Please copy the list exactly and provide only the final list.\n",
        },
    ]


def test_sudoku_literal_newlines_converted() -> None:
    record = generate_task("puzzle/sudoku_n4_12", 1, seed=0)[0]
    messages = render_messages("puzzle/sudoku_n4_12", record)
    assert len(messages) == 3
    query = messages[-1]["content"]
    assert "\\n" not in query and query.endswith("Output:\n")
    assert "Input:\n" + record["input"]["sudoku"] + "\nOutput:" in query
    assert messages[1]["content"] == record["input"]["icl_examples"][0]["answer"]


def test_multi_answer_demo_uses_example() -> None:
    record = generate_task("waiting_line/shuffle", 1, seed=0)[0]
    demo = record["input"]["icl_examples"][0]
    shown = render_messages("waiting_line/shuffle", record)[1]["content"]
    assert shown == demo["answer"]["example"]


def test_reference_answer_forms() -> None:
    assert reference_answer({"answer": "x"}) == "x"
    assert reference_answer({"answer": {"symbols": ["A"], "example": "A"}}) == "A"
    assert reference_answer({"answer": {"text": "t", "summary": "s"}}) == "s"
    assert reference_answer({"answer": {"text": "t", "examples": "['p1', 'p2']"}}) == "p1"
    with pytest.raises(NoReferenceError):
        reference_answer({"answer": {"words": ["dog"]}})


def test_unknown_task_and_missing_field() -> None:
    with pytest.raises(KeyError, match="no prompt template"):
        prompt_template("waiting_line/teleport")
    with pytest.raises(KeyError, match="lacks template field"):
        render_messages("waiting_line/insert_index", {"input": {"context": "[]"}, "answer": ""})


def test_official_records_render() -> None:
    root = official_dir()
    for path in sorted(root.glob("*/*.jsonl")):
        task = f"{path.parent.name}/{path.stem}"
        record = json.loads(path.open().readline())
        messages = render_messages(task, record)
        shots = len(record["input"].get("icl_examples", []))
        assert len(messages) == 2 * shots + 1, task
        assert [m["role"] for m in messages[:2]] == (["user", "assistant"] if shots else ["user"])
        assert all("\\n" not in m["content"] for m in messages if m["role"] == "user"), task
    n1 = json.loads((root / "words_to_sentence/easy_n1.jsonl").open().readline())
    assert (
        "using the word " + n1["input"]["words"]
        in render_messages("words_to_sentence/easy_n1", n1)[0]["content"]
    )
