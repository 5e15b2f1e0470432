"""The bundled byte-level BPE tokenizer: loading, chat template, exact round trips."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from dllm_decode.eval.parallelbench import (
    TASKS,
    NoReferenceError,
    generate_task,
    reference_answer,
    render_messages,
)
from dllm_decode.tokenizer import (
    BUNDLED_TOKENIZER,
    EOS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    build_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

OFFICIAL = Path(__file__).resolve().parents[1].parent / "shared/data/parallelbench/output/test"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_loads_with_auto_tokenizer() -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    auto = AutoTokenizer.from_pretrained(str(BUNDLED_TOKENIZER))
    assert isinstance(auto, PreTrainedTokenizerFast)
    assert auto.mask_token == MASK_TOKEN and auto.eos_token == EOS_TOKEN
    assert auto.pad_token == PAD_TOKEN and auto.unk_token is None
    assert [auto.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(6))
    assert len(auto) <= 4096
    assert auto.padding_side == "left"


def test_chat_template(tok) -> None:
    messages = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                {"role": "user", "content": "Q2"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|user|>\nQ1<|endoftext|><|assistant|>\nA1<|endoftext|>"
                    "<|user|>\nQ2<|endoftext|><|assistant|>\n")
    ids = encode(tok, text)
    assert ids.count(tok.eos_token_id) == 3 and tok.decode(ids) == text
    with pytest.raises(Exception, match="unknown chat role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


@pytest.mark.parametrize("task", TASKS)
def test_generated_prompts_round_trip_and_stay_short(tok, task: str) -> None:
    for record in generate_task(task, 8, 5, split="validation"):
        text = tok.apply_chat_template(render_messages(task, record), tokenize=False,
                                       add_generation_prompt=True)
        ids = encode(tok, text)
        assert tok.decode(ids) == text
        answer = reference_answer(record)
        answer_ids = encode(tok, answer)
        assert tok.decode(answer_ids) == answer
        assert min(answer_ids) >= len(SPECIAL_TOKENS)  # plain text never yields specials
        if task.startswith("waiting_line/"):
            # names of the generator's lists are one token per word
            assert len(answer_ids) <= 3 * record["metadata"]["length"] + 4
            assert len(ids) <= 160


def test_unseen_names_and_scripts_have_no_unknowns(tok) -> None:
    for text in ('["Zebediah Quixote-Smith", "Xiong Wei"]', "José Müller 😀", "\t\n  x"):
        ids = encode(tok, text)
        assert tok.decode(ids) == text
        assert all(0 <= i < len(tok) for i in ids)


def official_files() -> list[Path]:
    if not OFFICIAL.is_dir():
        pytest.skip(f"{OFFICIAL} is absent (the ../shared data is not in a user's clone)")
    return sorted(OFFICIAL.glob("*/*.jsonl"))


def test_official_prompts_round_trip(tok) -> None:
    """Every released prompt and reference (17 tasks + variants) encodes without unknowns
    (byte level) and decodes to the identical string."""
    count = 0
    for path in official_files():
        task = f"{path.parent.name}/{path.stem}"
        for line in path.read_text().splitlines():
            record = json.loads(line)
            texts = [tok.apply_chat_template(render_messages(task, record), tokenize=False,
                                             add_generation_prompt=True)]
            with contextlib.suppress(NoReferenceError):
                texts.append(reference_answer(record))
            for text in texts:
                ids = encode(tok, text)
                assert tok.decode(ids) == text, (task, text)
                count += 1
    assert count > 1000


def test_build_tokenizer_small_corpus(tmp_path: Path) -> None:
    corpus = ['["Ann Lee", "Bob Ray"]', "Please copy the list exactly."] * 50
    out = build_tokenizer(tmp_path / "tok", corpus, vocab_size=300)
    tok = load_tokenizer(out)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(6))
    assert tok.decode(encode(tok, '["Zed Quill"]')) == '["Zed Quill"]'
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(corpus, vocab_size=100)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "missing")
