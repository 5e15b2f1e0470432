"""Loaders and graders for the lm-eval ParallelBench task pack (``custom_dataset`` tasks).

Data: ``metadata.data_dir`` or the ``DLLM_DECODE_PARALLELBENCH_DIR`` environment variable
points at the released ``output/test`` tree; without either, the clean-room generator's held-out
``test`` split is used (Waiting Line and Puzzle tasks only). Paths never resolve against the
working directory (lm-eval pitfall 1).

Each doc: ``doc_id``, ``task``, ``prompt`` (demonstrations and query joined by newlines, the
no-chat-template rendering), ``messages`` (JSON chat turns, used by ``dllm_decode`` with
``doc_messages=true``), ``reference`` and ``record`` (the JSON record, for grading).
"""

from __future__ import annotations

import json
import os
from typing import Any

from dllm_decode.eval.parallelbench.prompts import (
    NoReferenceError,
    reference_answer,
    render_messages,
)
from dllm_decode.eval.parallelbench.tasks import task_spec

DATA_ENV = "DLLM_DECODE_PARALLELBENCH_DIR"


def _records(task_id: str, data_dir: str | None, num_samples: int,
             icl_examples: int | None) -> list[dict[str, Any]]:
    root = data_dir or os.environ.get(DATA_ENV)
    if root:
        from dllm_decode.eval.parallelbench.loader import load_task

        records = load_task(root, task_id).records
        if icl_examples is None:
            return records
        return [{**r, "input": {**r["input"],
                                "icl_examples": (r["input"].get("icl_examples") or [])
                                [:icl_examples]}} for r in records]
    from dllm_decode.eval.parallelbench.generate import TASKS, generate_task, split_seed

    if task_id not in TASKS:
        raise ValueError(
            f"{task_id} has no clean-room generator; set {DATA_ENV} or metadata.data_dir to the "
            "released ParallelBench test directory"
        )
    shots = 1 if icl_examples is None else icl_examples
    return generate_task(task_id, num_samples, split_seed(task_id, "test"), split="test",
                         icl_examples=shots)


def load_docs(
    task_id: str, data_dir: str | None = None, num_samples: int = 100,
    icl_examples: int | None = None, **_: Any
) -> dict[str, Any]:
    """``custom_dataset`` loader: ``{"test": Dataset}`` for one ParallelBench task.

    ``icl_examples``: demonstrations per prompt (``None``: the released count, one; the
    ``*_0shot`` tasks set 0, the format the bundled tiny checkpoints were trained on).
    """
    import datasets

    if icl_examples is not None and int(icl_examples) < 0:
        raise ValueError(f"icl_examples must be >= 0, got {icl_examples!r}")
    shots = None if icl_examples is None else int(icl_examples)
    docs = []
    for doc_id, record in enumerate(_records(task_id, data_dir, int(num_samples), shots)):
        messages = render_messages(task_id, record)
        try:
            reference = reference_answer(record)
        except NoReferenceError:
            reference = ""
        docs.append({
            "doc_id": doc_id, "task": task_id,
            "prompt": "\n".join(m["content"] for m in messages),
            "messages": json.dumps(messages), "reference": reference,
            "record": json.dumps(record),
        })  # fmt: skip
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """Grade the first response with the task's v1 metric (``score`` and ``score_strict``)."""
    graded = task_spec(doc["task"]).grade(results[0], json.loads(doc["record"]))
    return {"score": float(graded["score"]), "score_strict": float(graded["score_strict"])}
