"""The word-level Waiting Line test bed: name pool, records, vocabulary, tokenizer, grading.

The bundled ``testbed-*`` checkpoints and the exact oracle share one word-level vocabulary
(:class:`~dllm_decode.models.oracle.WaitingLineOracle`: one token per full name, per task, per
index and per list symbol), so a learned model and the oracle that taught it can be compared
on the same prompts token for token. Names come from a fixed pool of ``25 x 20`` first and last
names of the clean-room generator (500 full names: a vocabulary of ~530 keeps the models at a
few MB); lists hold 3-5 people, as in the test-bed spec. Records are the generator's
(``generate_task(..., names=TESTBED_POOL)``), so ``split="test"`` instances are never trained on.

Prompt: ``<task> [<index>] [word] [ name , ... ] <fill>.. <answer>`` (the list region padded
with ``<fill>`` to 5 slots, so list items sit at fixed offsets from ``<answer>``); answer
``[ name , ... ]`` then ``<eos>`` up to ``TESTBED_GEN_LENGTH`` (16) positions.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dllm_decode.eval.parallelbench.testbed import (  # noqa: F401 (re-exported)
    MAX_ITEMS,
    MIN_ITEMS,
    TESTBED_NAMES,
    TESTBED_POOL,
    waiting_line_records,
)
from dllm_decode.models.oracle import (  # noqa: F401 (VOCAB_FILE, codec_for re-exported)
    ANSWER,
    EOS,
    MASK,
    PAD,
    VOCAB_FILE,
    WaitingLineOracle,
    codec_for,
    record_fields,
    task_name,
    valid_answers,
)

#: answer region length: ``[`` + 6 names + 5 separators + ``]`` + EOS fits in 16
TESTBED_GEN_LENGTH: Final = 16
#: the tasks the test-bed models are trained and graded on (sort needs a sorting circuit the
#: tiny models do not have; it is graded but not trained)
TESTBED_TASKS: Final = ("copy", "reverse", "insert_index", "remove_index", "replace_index",
                        "shuffle", "insert_random", "replace_random", "remove_random")
DETERMINISTIC_TASKS: Final = ("copy", "reverse", "insert_index", "remove_index",
                              "replace_index")
RANDOM_TASKS: Final = ("shuffle", "insert_random", "replace_random", "remove_random")


def waiting_line_oracle(**knobs: Any) -> WaitingLineOracle:
    """The oracle over the test-bed vocabulary (``knobs`` go to ``WaitingLineOracle``)."""
    return WaitingLineOracle(TESTBED_NAMES, max_items=MAX_ITEMS + 1, slots=MAX_ITEMS, **knobs)


def draw_training_examples(seed: int, step: int, batch_size: int,
                           weights: Mapping[str, float]) -> list[tuple[str, dict[str, Any]]]:
    """One step's ``(task, record)`` pairs: tasks drawn by weight, lengths uniform in 3..5.

    A function of ``(seed, step)`` only, so resumed runs see the same data.
    """
    rng = random.Random(f"{seed}:{step}:data")
    names = sorted(weights)
    tasks = rng.choices(names, [weights[t] for t in names], k=batch_size)
    out = []
    for task in tasks:
        length = rng.randint(MIN_ITEMS, MAX_ITEMS)
        rec = waiting_line_records(task, 1, rng.randrange(2**31), split="train", length=length)[0]
        out.append((task, rec))
    return out


def grade(task: str, record: Mapping[str, Any], text: str) -> bool:
    """Whether decoded answer text is one of the record's valid answers (ParallelBench's
    rule for the random tasks: any valid answer counts; exact match for the others)."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return False
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return False
    return tuple(items) in valid_answers(task_name(task), *record_fields(record))


def write_tokenizer(oracle: WaitingLineOracle, directory: str | Path) -> None:
    """Write a word-level ``tokenizer.json`` (+ config) and the vocabulary file.

    Every vocabulary entry is an added token (names contain a space), so
    ``tokenizer("<copy> [ Amelia Abbott , Bruno Adler ] <answer>")`` gives the oracle's ids.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(oracle.vocab)}
    tok = Tokenizer(models.WordLevel(vocab))  # no unk: an unknown name is an error, not <pad>
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = {PAD, EOS, MASK}
    tok.add_tokens([AddedToken(t, normalized=False) for t in oracle.vocab if t not in specials])
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in (PAD, EOS, MASK)])
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD,
              "eos_token": EOS, "mask_token": MASK, "model_max_length": oracle.max_length,
              "clean_up_tokenization_spaces": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    spec = {"names": list(TESTBED_NAMES), "max_items": oracle.max_items, "slots": oracle.slots,
            "answer_token": ANSWER, "gen_length": TESTBED_GEN_LENGTH}
    (directory / VOCAB_FILE).write_text(json.dumps(spec, indent=1) + "\n")


def prompt_text(oracle: WaitingLineOracle, ids: Sequence[int]) -> str:
    """Prompt ids as the space-separated text the word-level tokenizer reads back."""
    return " ".join(oracle.vocab[int(i)] for i in ids)
