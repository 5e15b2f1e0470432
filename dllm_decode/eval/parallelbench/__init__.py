"""ParallelBench-compatible tasks: clean-room generators, v1 prompts, graders, official loader.

Record schema (the released JSONL; one JSON object per line):

* ``input``: template fields (``context`` = list literal, ``word``, ``index``, ``size``,
  ``symbols``, ``sudoku``, ``words``, ``text``) and ``icl_examples`` (demonstration records).
* ``answer``: the reference string, or a dict for tasks with many valid answers
  (``{input, word?, example}``, ``{symbols, example}``, ``{words, example?}``,
  ``{text, summary}``, ``{text, examples}``).
* ``output_format`` (optional): the infill skeleton ``["[MASK]", ...]``.
* ``metadata``: ``length`` and, for insert/remove/replace, ``index`` / ``word``.

The released data is not redistributable; :mod:`.loader` reads it from a user directory.
Modules: ``generate`` (+ ``names``), ``prompts``, ``graders`` (+ ``text_graders``), ``tasks``
(registry), ``loader``, ``grid`` (sweep files), ``codec`` (prompt ids), ``rows`` (result
files), ``plots``, ``lm_eval_tasks`` (lm-eval task pack).
"""

from dllm_decode.eval.parallelbench.generate import (
    SPLITS,
    TASKS,
    generate_task,
    record_key,
    split_of,
    split_seed,
)
from dllm_decode.eval.parallelbench.graders import GRADERS, grade
from dllm_decode.eval.parallelbench.loader import LoadedTask, load_task, load_tasks
from dllm_decode.eval.parallelbench.prompts import (
    PROMPT_TEMPLATES,
    NoReferenceError,
    format_prompt,
    prompt_template,
    reference_answer,
    render_messages,
)
from dllm_decode.eval.parallelbench.tasks import BENCHMARK_TASKS, TASK_SPECS, TaskSpec, task_spec
from dllm_decode.eval.parallelbench.text_graders import TextBackends

__all__ = [
    "BENCHMARK_TASKS",
    "GRADERS",
    "PROMPT_TEMPLATES",
    "SPLITS",
    "TASKS",
    "TASK_SPECS",
    "LoadedTask",
    "NoReferenceError",
    "TaskSpec",
    "TextBackends",
    "format_prompt",
    "generate_task",
    "grade",
    "load_task",
    "load_tasks",
    "prompt_template",
    "record_key",
    "reference_answer",
    "render_messages",
    "split_of",
    "split_seed",
    "task_spec",
]
