"""ParallelBench v1 prompt templates and chat-message assembly.

The template strings are part of the benchmark specification and are identical to the released
``task_config.yaml`` text (Python ``str.format`` templates over a record's ``input`` fields).
The Sudoku template contains literal ``\\n`` sequences; like v1, :func:`format_prompt` turns
every literal backslash-n into a newline *after* formatting.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any, Final

_WAITING_LINE_INTRO: Final[str] = "You are managing a waiting line at a customer service desk.\n"

#: Templates keyed by task id; ``waiting_line_n15/<op>`` shares ``waiting_line/<op>``.
PROMPT_TEMPLATES: Final[dict[str, str]] = {
    "waiting_line/copy": _WAITING_LINE_INTRO
    + "You need to record the following people in the order they arrived:\n{context}\n"
    "Please copy the list exactly and provide only the final list.\n",
    "waiting_line/reverse": _WAITING_LINE_INTRO
    + "The previous staff member put the waiting line in the wrong order.\n"
    "Please reverse the order of the following people in the waiting line to correct it:\n"
    "{context}\nPlease reverse the order of the list and provide only the final list.\n",
    "waiting_line/sort": _WAITING_LINE_INTRO
    + "The following people should be organized alphabetically by last name for efficient "
    "processing:\n{context}\n"
    "Please sort the list in alphabetical order and provide only the final list.\n",
    "waiting_line/shuffle": _WAITING_LINE_INTRO
    + "The waiting line should be randomly shuffled to ensure fair service distribution:\n"
    "{context}\nPlease randomly shuffle the list and provide only the final list.\n"
    "Ensure the sequence is different from the original.\n",
    "waiting_line/insert_index": _WAITING_LINE_INTRO
    + 'A new person "{word}" is inserted into the line at position {index}:\n{context}\n'
    "Please put the new person at the specified position and provide only the final list.\n",
    "waiting_line/insert_random": _WAITING_LINE_INTRO
    + 'A new person "{word}" is inserted into the line at a random position:\n{context}\n'
    "Please put the new person in the random position and provide only the final list.\n",
    "waiting_line/remove_index": _WAITING_LINE_INTRO
    + "The person at position {index} has left the waiting line:\n{context}\n"
    "Please remove the person at the specified position and provide only the final list.\n",
    "waiting_line/remove_random": _WAITING_LINE_INTRO
    + "One person has left the waiting line:\n{context}\n"
    "Please remove a random person and provide only the final list.\n",
    "waiting_line/replace_index": _WAITING_LINE_INTRO
    + 'The person at position {index} must be replaced with "{word}":\n{context}\n'
    'Please replace the person at the specified position with "{word}" and provide only the '
    "final list.\n",
    # The released replace_random template has no trailing newline.
    "waiting_line/replace_random": _WAITING_LINE_INTRO
    + 'One person in the waiting line must be replaced with "{word}":\n{context}\n'
    'Please replace one random person with "{word}" and provide only the final list.',
    "puzzle/latin_square_n4": "Generate a Latin square of size {size} with the symbols "
    "{symbols}. Only output the final result as CSV.",
    "puzzle/sudoku_n4_12": "Fill the positions where the values are 0 in a 4x4 grid with digits "
    "1-4 so that each column, each row, and each of the four 2x2 subgrids that compose the grid "
    "contains all of the digits from 1 to 4.\\n\\nInput:\\n{sudoku}\\nOutput:\\n",
    "paraphrase_summarize/chatgpt-paraphrases": "Paraphrase the following sentence. Only output "
    "the final result.\n\nSentence: {text}\n\nParaphrase:",
    "paraphrase_summarize/samsum": "Summarize the following conversation. Only output the final "
    "result.\n\n{text}\n\nSummary:",
    "words_to_sentence": "Construct a single, coherent sentence using the words {words}.",
    "words_to_sentence/n1": "Construct a single, coherent sentence using the word {words}.",
}


class NoReferenceError(ValueError):
    """The record carries no reference text (e.g. ``words_to_sentence/*_n1`` word lists)."""


def prompt_template(task: str) -> str:
    """The v1 template of a task id (including ``waiting_line_n15/*``, words-to-sentence
    difficulty/size variants, ``puzzle/sudoku_n4_<givens>`` and ``puzzle/latin_square_n<k>``).

    Raises:
        KeyError: for an unknown task, listing the known templates.
    """
    family, _, name = task.partition("/")
    if family == "waiting_line_n15":
        key = f"waiting_line/{name}"
    elif family == "words_to_sentence":
        key = "words_to_sentence/n1" if name.endswith("_n1") else "words_to_sentence"
    elif family == "puzzle" and re.fullmatch(r"sudoku_n4_\d+", name):
        key = "puzzle/sudoku_n4_12"
    elif family == "puzzle" and re.fullmatch(r"latin_square_n\d+", name):
        key = "puzzle/latin_square_n4"
    else:
        key = task
    if key not in PROMPT_TEMPLATES:
        raise KeyError(f"no prompt template for task {task!r}; known: {sorted(PROMPT_TEMPLATES)}")
    return PROMPT_TEMPLATES[key]


def format_prompt(template: str, inputs: Mapping[str, Any]) -> str:
    """``template.format(**inputs)`` with literal ``\\n`` sequences turned into newlines."""
    try:
        text = template.format(**inputs)
    except KeyError as err:
        raise KeyError(f"record input lacks template field {err}; has {sorted(inputs)}") from None
    return text.replace("\\n", "\n")


def reference_answer(record: Mapping[str, Any]) -> str:
    """The reference output text of a record.

    The answer string itself, else ``answer["example"]`` (one valid answer of a multi-answer
    task), else the SAMSum ``summary``, else the first stored paraphrase.

    Raises:
        NoReferenceError: when the record has none of these (some words-to-sentence variants).
    """
    answer = record["answer"]
    if isinstance(answer, str):
        return answer
    if "example" in answer:
        return str(answer["example"])
    if "summary" in answer:
        return str(answer["summary"])
    if "examples" in answer:
        examples = answer["examples"]
        if isinstance(examples, str):  # released as a stringified Python list
            examples = ast.literal_eval(examples)
        if examples:
            return str(examples[0])
    raise NoReferenceError(f"record has no reference text; answer keys: {sorted(answer)}")


def render_messages(
    task: str, record: Mapping[str, Any], *, template: str | None = None
) -> list[dict[str, str]]:
    """Chat messages for a record: each demonstration as a user/assistant pair, then the query.

    Args:
        task: task id (selects the template unless ``template`` is given).
        record: a record in the released JSONL schema.
        template: override the template (e.g. the one read from a ``task_config.yaml``).

    Returns:
        ``[{"role": "user"|"assistant", "content": str}, ...]`` ending with the user query;
        apply the model's chat template with ``add_generation_prompt=True``.
    """
    template = prompt_template(task) if template is None else template
    messages: list[dict[str, str]] = []
    for example in record["input"].get("icl_examples") or []:
        messages.append({"role": "user", "content": format_prompt(template, example["input"])})
        messages.append({"role": "assistant", "content": reference_answer(example)})
    messages.append({"role": "user", "content": format_prompt(template, record["input"])})
    return messages
