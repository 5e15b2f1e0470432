"""ParallelBench graders: official references score 1, targeted corruptions score 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dllm_decode.eval.parallelbench import generate_task, reference_answer
from dllm_decode.eval.parallelbench.generate import TASKS, format_list
from dllm_decode.eval.parallelbench.graders import (
    GRADERS,
    grade,
    latin_square_score,
    list_match_score,
    list_random_insert_score,
    list_random_remove_score,
    list_random_replace_score,
    list_shuffle_score,
    parse_list,
    parse_list_strict,
    sudoku_score,
)
from dllm_decode.eval.parallelbench.text_graders import (
    UNAVAILABLE,
    TextBackends,
    paraphrase_score,
    sentence_to_words_score,
    summary_score,
)

OFFICIAL = Path(__file__).resolve().parents[1] / ".." / "shared/data/parallelbench/output/test"
RULE_CATEGORIES = ("waiting_line", "waiting_line_n15", "puzzle")


def official_tasks(categories: tuple[str, ...]) -> list[tuple[str, str, list[dict]]]:
    if not OFFICIAL.is_dir():
        pytest.skip(f"official ParallelBench data not found at {OFFICIAL} (not redistributable)")
    out = []
    for category in categories:
        config = yaml.safe_load((OFFICIAL / category / "task_config.yaml").read_text())
        for task, entry in sorted(config.items()):
            lines = (OFFICIAL / f"{task}.jsonl").read_text().splitlines()
            out.append((task, entry["metric"], [json.loads(line) for line in lines]))
    return out


# ---------------------------------------------------------------- acceptance on official data


def test_official_rule_based_references_score_one() -> None:
    tasks = official_tasks(RULE_CATEGORIES)
    assert len(tasks) == 22
    for task, metric, records in tasks:
        for record in records:
            demos = record["input"].get("icl_examples", [])
            for item in [record, *demos]:
                result = grade(metric, reference_answer(item), item)
                assert result["score"] == result["score_strict"] == 1.0, (task, item)


def test_official_corruptions_score_zero() -> None:
    for task, metric, records in official_tasks(("waiting_line",)):
        for record in records:
            names = parse_list(reference_answer(record))
            dropped = format_list(names[:-1])
            duplicated = format_list(names + names[:1])
            assert grade(metric, dropped, record)["score"] == 0.0, (task, "missing name")
            assert grade(metric, duplicated, record)["score"] == 0.0, (task, "duplicate")
            if metric == "list_match_score":
                swapped = format_list([names[1], names[0], *names[2:]])
                assert grade(metric, swapped, record)["score"] == 0.0, (task, "swapped pair")
            if task.endswith("shuffle"):
                identity = format_list(record["answer"]["input"])
                assert grade(metric, identity, record)["score"] == 0.0, (task, "identity")


def test_official_sort_is_by_first_name() -> None:
    (sort,) = [t for t in official_tasks(("waiting_line",)) if t[0] == "waiting_line/sort"]
    by_last = 0
    for record in sort[2]:
        names = parse_list(record["input"]["context"])
        assert list_match_score(format_list(sorted(names)), record)["score"] == 1.0
        last_sorted = sorted(names, key=lambda name: name.split()[-1])
        if last_sorted != sorted(names):
            assert list_match_score(format_list(last_sorted), record)["score"] == 0.0
            by_last += 1
    assert by_last >= 90


def test_official_text_tasks() -> None:
    for task, metric, records in official_tasks(("words_to_sentence", "paraphrase_summarize")):
        for record in records:
            if metric == "sentence_to_words_score":
                text = " ".join(record["answer"]["words"]) + "."
                result = grade(metric, text, record)
                assert result["inclusion_score"] == result["score"] == 1.0, task
                missing = " ".join(record["answer"]["words"][1:])
                if record["answer"]["words"][0] not in missing:  # substring rule: "sun" in "sunny"
                    assert grade(metric, missing, record)["score"] == 0.0, task
            else:
                result = grade(metric, reference_answer(record), record)
            assert result["grammar_score"] == UNAVAILABLE and result["complete"] is False
            if metric == "summary_score":
                assert result["rougeL"] == result["score"] == 1.0
            if metric == "paraphrase_score":  # rewards distance from the source: not 1.0
                assert result["score"] == pytest.approx(1.0 - result["bleu_source"])
                assert result["bertscore_f1"] == UNAVAILABLE


@pytest.mark.parametrize("task", TASKS)
def test_generated_references_score_one(task: str) -> None:
    metric = {
        "copy": "list_match_score", "reverse": "list_match_score", "sort": "list_match_score",
        "insert_index": "list_match_score", "remove_index": "list_match_score",
        "replace_index": "list_match_score", "shuffle": "list_shuffle_score",
        "insert_random": "list_random_insert_score", "remove_random": "list_random_remove_score",
        "replace_random": "list_random_replace_score", "latin_square_n4": "latin_square_score",
        "sudoku_n4_12": "sudoku_score",
    }[task.split("/")[1]]  # fmt: skip
    for record in generate_task(task, 12, seed=4):
        result = grade(metric, reference_answer(record), record)
        assert result["score"] == result["score_strict"] == 1.0


# ---------------------------------------------------------------- parsing and corruptions

BASE = ["Ann Lee", "Bo Kim", "Cy Park"]
RANDOM_RECORD = {"answer": {"input": BASE, "word": "Di Wu", "example": ""}}


def test_parse_list_lenient_and_strict() -> None:
    good = '["Ann Lee", "Bo Kim"]'
    assert parse_list(good) == parse_list_strict(good) == ["Ann Lee", "Bo Kim"]
    assert parse_list('Sure! ["X"] then ["Ann Lee", "Bo Kim"]') == ["Ann Lee", "Bo Kim"]
    assert parse_list('"Ann Lee", "Bo Kim"]') == ["Ann Lee", "Bo Kim"]  # missing "["
    assert parse_list("[Ann Lee,Bo Kim") == ["Ann Lee", "Bo Kim"]  # missing "]"
    assert parse_list("[]") == parse_list("") == [] == parse_list_strict(" [] ")
    for bad in ('"Ann Lee", "Bo Kim"]', '["Ann Lee","Bo Kim"]', "[Ann Lee, Bo Kim]",
                'List: ["Ann Lee"]', '["Ann "Lee"]', '["Ann Lee", "Bo Kim"'):  # fmt: skip
        assert parse_list_strict(bad) is None, bad


def test_list_match_corruptions() -> None:
    record = {"answer": format_list(BASE)}
    assert list_match_score(format_list(BASE), record)["score"] == 1.0
    for wrong in (BASE[::-1], BASE[:2], BASE + BASE[:1], [BASE[1], BASE[0], BASE[2]]):
        assert list_match_score(format_list(wrong), record) == {
            "score": 0.0, "score_strict": 0.0, "format_ok": 1.0}  # fmt: skip
    no_bracket = format_list(BASE)[:-1]
    result = list_match_score(no_bracket, record)
    assert (result["score"], result["score_strict"], result["format_ok"]) == (1.0, 0.0, 0.0)


def test_random_list_graders() -> None:
    shuffle = {"answer": {"input": BASE}}
    assert list_shuffle_score(format_list([BASE[2], BASE[0], BASE[1]]), shuffle)["score"] == 1.0
    assert list_shuffle_score(format_list(BASE), shuffle)["score"] == 0.0  # identity
    assert list_shuffle_score(format_list([BASE[1], BASE[0], BASE[0]]), shuffle)["score"] == 0.0
    for slot in range(4):
        inserted = BASE[:slot] + ["Di Wu"] + BASE[slot:]
        assert list_random_insert_score(format_list(inserted), RANDOM_RECORD)["score"] == 1.0
    assert list_random_insert_score(format_list(BASE), RANDOM_RECORD)["score"] == 0.0
    wrong_order = ["Di Wu", BASE[1], BASE[0], BASE[2]]
    assert list_random_insert_score(format_list(wrong_order), RANDOM_RECORD)["score"] == 0.0
    for gone in range(3):
        kept = BASE[:gone] + BASE[gone + 1 :]
        assert list_random_remove_score(format_list(kept), RANDOM_RECORD)["score"] == 1.0
        assert list_random_remove_score(format_list(kept[::-1]), RANDOM_RECORD)["score"] == 0.0
        replaced = BASE[:gone] + ["Di Wu"] + BASE[gone + 1 :]
        assert list_random_replace_score(format_list(replaced), RANDOM_RECORD)["score"] == 1.0
    assert list_random_remove_score(format_list(BASE), RANDOM_RECORD)["score"] == 0.0
    two_changed = ["Di Wu", "Di Wu", BASE[2]]
    assert list_random_replace_score(format_list(two_changed), RANDOM_RECORD)["score"] == 0.0
    assert list_random_replace_score(format_list(BASE), RANDOM_RECORD)["score"] == 0.0


def test_latin_square() -> None:
    record = {"input": {"symbols": "[A, 7, K, B]"}, "answer": {"symbols": ["A", "7", "K", "B"]}}
    square = "A,7,K,B\n7,K,B,A\nK,B,A,7\nB,A,7,K"
    assert latin_square_score(square, record) == {"score": 1.0, "score_strict": 1.0}
    chatty = "Here it is:\n\nA, 7, K, B\n7, K, B, A\nK, B, A, 7\nB, A, 7, K\nDone."
    assert latin_square_score(chatty, record) == {"score": 1.0, "score_strict": 0.0}
    bad_column = "A,7,K,B\n7,K,B,A\nK,B,A,7\nK,B,A,7"  # rows fine, columns repeat
    assert latin_square_score(bad_column, record)["score"] == 0.0
    three_rows = "A,7,K,B\n7,K,B,A\nK,B,A,7"
    assert latin_square_score(three_rows, record)["score"] == 0.0
    wrong_symbol = square.replace("B", "C")
    assert latin_square_score(wrong_symbol, record)["score"] == 0.0
    no_answer_symbols = {"input": {"symbols": "[A, 7, K, B]"}, "answer": "unused"}
    assert latin_square_score(square, no_answer_symbols)["score"] == 1.0


def test_sudoku() -> None:
    record = {"input": {"sudoku": "0042\n2031\n4023\n3214"}, "answer": "1342\n2431\n4123\n3214"}
    solution = record["answer"]
    assert sudoku_score(solution, record) == {"score": 1.0, "score_strict": 1.0, "valid": 1.0}
    spaced = "Output:\n1 3 4 2\n2,4,3,1\n4 1 2 3\n3 2 1 4\n"
    assert sudoku_score(spaced, record) == {"score": 1.0, "score_strict": 0.0, "valid": 1.0}
    wrong_cell = "1342\n2431\n4123\n3241"
    assert sudoku_score(wrong_cell, record) == {"score": 0.0, "score_strict": 0.0, "valid": 0.0}
    assert sudoku_score(solution + "\n1234", record)["score"] == 0.0  # five grid lines
    assert sudoku_score(solution[:-5], record)["score"] == 0.0  # three grid lines


def test_text_graders_with_backends() -> None:
    words = {"answer": {"words": ["dog", "park"]}}
    assert sentence_to_words_score("The Dog ran to the park.", words)["inclusion_score"] == 0.0
    fakes = TextBackends(grammar=lambda text: text.endswith("."), bertscore=lambda a, b: 0.5)
    good = sentence_to_words_score("A dog in the park.", words, backends=fakes)
    assert good["score"] == 1.0 and good["complete"] and good["unavailable"] == []
    ungrammatical = sentence_to_words_score("dog park", words, backends=fakes)
    assert ungrammatical["score"] == 0.0 and ungrammatical["grammar_score"] == 0.0
    summary = {"answer": {"text": "A: hi", "summary": "Ann greets Bob warmly."}}
    partial = summary_score("Ann greets Bob.", summary, backends=fakes)
    assert 0.0 < partial["rougeL"] < 1.0 and partial["score"] == partial["rougeL"]
    source = "The cat sat on the mat today."
    para = {"answer": {"text": source, "examples": "['A cat was sitting on the mat.']"}}
    copy = paraphrase_score(source, para, backends=fakes)
    assert copy["bleu_source"] == pytest.approx(1.0) and copy["score"] == pytest.approx(0.0)
    new = paraphrase_score("Today a feline rested upon the rug.", para, backends=fakes)
    assert new["score"] == pytest.approx(0.5 * (1.0 - new["bleu_source"])) and new["complete"]


def test_grade_dispatch() -> None:
    assert set(GRADERS) >= {"list_match_score", "sudoku_score", "paraphrase_score"}
    with pytest.raises(KeyError, match="unknown metric"):
        grade("exact_match", "", {})
    record = {"answer": format_list(BASE)}
    assert (
        grade("list_match_score", format_list(BASE), record, backends=TextBackends())["score"]
        == 1.0
    )
    with pytest.raises(ValueError, match="string answer"):
        list_match_score("[]", {"answer": {"input": BASE}})
