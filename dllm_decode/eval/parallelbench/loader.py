"""Load the released ParallelBench test set from a user-supplied directory.

Expected layout (the released ``dataset/parallel_bench/data/output/test`` tree)::

    <root>/<category>/task_config.yaml     # task id -> {prompt, metric, ...}
    <root>/<category>/<task>.jsonl         # one record per line

The library never downloads or ships this data (it carries no licence).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dllm_decode.eval.parallelbench.graders import GRADERS
from dllm_decode.eval.parallelbench.tasks import BENCHMARK_TASKS, TaskSpec, task_spec

CONFIG_NAME = "task_config.yaml"
#: Sub-directories tried when ``root`` itself holds no category directories.
_NESTED_ROOTS = ("test", "output/test", "data/output/test")


@dataclass(frozen=True)
class LoadedTask:
    """One task's records plus what is needed to prompt and grade them.

    records: released records; ``doc_id`` of a record is its line index.
    metric: v1 metric name from ``task_config.yaml`` (a key of ``GRADERS``).
    prompt: the ``str.format`` template from ``task_config.yaml``.
    """

    name: str
    records: list[dict[str, Any]]
    metric: str
    prompt: str
    spec: TaskSpec
    config: dict[str, Any] = field(default_factory=dict)


def resolve_root(root: str | Path) -> Path:
    """The directory that holds ``<category>/task_config.yaml`` files.

    Accepts that directory or a parent of it (``test``, ``output/test``, ``data/output/test``).

    Raises:
        FileNotFoundError: when no such directory is found.
    """
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"ParallelBench data directory not found: {path}")
    for candidate in (path, *(path / sub for sub in _NESTED_ROOTS)):
        if any(candidate.glob(f"*/{CONFIG_NAME}")):
            return candidate
    raise FileNotFoundError(
        f"no <category>/{CONFIG_NAME} under {path}; point to the released "
        "'dataset/parallel_bench/data/output/test' directory"
    )


def _read_config(root: Path, category: str) -> dict[str, Any]:
    path = root / category / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"missing task config {path}")
    config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a mapping of task id -> config")
    return config


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file (blank lines skipped).

    Raises:
        FileNotFoundError: missing file. ValueError: a malformed line (with its number).
    """
    if not path.is_file():
        raise FileNotFoundError(f"missing task data {path}")
    records = []
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: invalid JSON ({err.msg})") from None
    return records


def load_task(root: str | Path, task: str) -> LoadedTask:
    """Load one released task, e.g. ``load_task(root, "waiting_line/copy")``.

    Raises:
        FileNotFoundError: missing directory / config / JSONL. KeyError: task not in its
        category's config. ValueError: malformed data or an unknown metric.
    """
    base = resolve_root(root)
    category, _, _ = task.partition("/")
    config = _read_config(base, category)
    if task not in config:
        where = base / category / CONFIG_NAME
        raise KeyError(f"task {task!r} not in {where}; has {sorted(config)}")
    entry = config[task]
    metric, prompt = entry.get("metric"), entry.get("prompt")
    if metric not in GRADERS:
        raise ValueError(f"{task}: unknown metric {metric!r}; known: {sorted(GRADERS)}")
    if not isinstance(prompt, str):
        raise ValueError(f"{task}: task config has no prompt template")
    records = read_jsonl(base / f"{task}.jsonl")
    return LoadedTask(task, records, metric, prompt, task_spec(task), entry)


def available_tasks(root: str | Path) -> list[str]:
    """Task ids listed by every ``task_config.yaml`` under ``root`` (sorted)."""
    base = resolve_root(root)
    categories = sorted(path.parent.name for path in base.glob(f"*/{CONFIG_NAME}"))
    return sorted(task for category in categories for task in _read_config(base, category))


def load_tasks(root: str | Path, tasks: Iterable[str] | None = None) -> dict[str, LoadedTask]:
    """Load several tasks (default: the 17 benchmark tasks), keyed by task id.

    A name without ``/`` selects every task of that category directory (e.g. ``puzzle``).
    """
    base = resolve_root(root)
    names: list[str] = []
    for name in BENCHMARK_TASKS if tasks is None else tasks:
        if "/" in name:
            names.append(name)
        else:
            names.extend(sorted(_read_config(base, name)))
    return {name: load_task(base, name) for name in dict.fromkeys(names)}


def write_generated_tree(
    root: str | Path,
    tasks: Iterable[str],
    n: int,
    *,
    split: str = "test",
    seed_offset: int = 0,
) -> Path:
    """Write clean-room sets in the released layout (loadable with :func:`load_tasks`).

    Each task uses ``split_seed(task, split) + seed_offset`` and keeps only instances of
    ``split``; ``task_config.yaml`` gets the v1 prompt and metric of every task.

    Returns:
        ``root``.
    """
    from dllm_decode.eval.parallelbench.generate import generate_task, split_seed
    from dllm_decode.eval.parallelbench.prompts import prompt_template

    base = Path(root)
    configs: dict[str, dict[str, Any]] = {}
    for task in tasks:
        records = generate_task(task, n, split_seed(task, split) + seed_offset, split=split)
        path = base / f"{task}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
        category = task.partition("/")[0]
        configs.setdefault(category, {})[task] = {
            "metric": task_spec(task).metric,
            "prompt": prompt_template(task),
            "num_samples": n,
            "split": split,
        }
    for category, entries in configs.items():
        path = base / category / CONFIG_NAME
        merged = {**(_read_config(base, category) if path.is_file() else {}), **entries}
        path.write_text(yaml.safe_dump(merged, sort_keys=True))
    return base
