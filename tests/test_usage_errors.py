"""Bad input a newcomer gives (issue 36): each one a one-line error naming the fix."""

from __future__ import annotations

import logging

import pytest

from dllm_decode import DiffusionSampler, generate_text, load_model, load_tokenizer
from dllm_decode.cli import main
from dllm_decode.text import encode_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_cli_empty_prompt_is_an_error(prompt, capsys) -> None:
    assert main(["generate", prompt, "--gen-length", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dllm-decode: error:") and "empty" in err


def test_empty_prompts_in_a_batch_or_conversation(tok) -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        encode_prompts(tok, ["a", ""])
    with pytest.raises(ValueError, match="no text"):
        encode_prompts(tok, [{"role": "user", "content": " "}])
    with pytest.raises(TypeError, match="'role' and 'content'"):
        encode_prompts(tok, [{"role": "user", "text": "hi"}])


def test_cli_param_without_equals_is_a_usage_error(capsys) -> None:
    assert main(["generate", "hi", "--param", "tau"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dllm-decode: error: --param expects KEY=VALUE, got 'tau'")
    assert "--param tau=0.9" in err


@pytest.mark.parametrize("prompts", [42, 4.5, None, b"bytes"])
def test_generate_text_names_what_prompts_may_be(prompts, tok) -> None:
    sampler = DiffusionSampler(load_model("tiny-llada"), "threshold", gen_length=8)
    with pytest.raises(TypeError, match="prompts must be a string, a list of strings, one "
                                        f"conversation .* got {type(prompts).__name__}"):
        generate_text(sampler, tok, prompts)


TESTBED_OK = "<copy> [ Aaron Abbott , Aaron Acosta , Aaron Adler ] <fill> <fill> <fill> <fill> "
TESTBED_OK += "<answer>"


@pytest.mark.parametrize(("prompt", "match"), [
    ("<copy> [ Aaron Abbott , Aaron Acosta , Aaron Adler ] <fill> <answer>",
     "3 names need 4 <fill> tokens .* got 1; did you mean '<copy> .* <fill> <fill> <answer>'"),
    ("<copy> [ Aaron Abbott , Aaron Acosta , Aaron Adler ] <answer>", "need 4 <fill>"),
    ("<copy> [ Aaron Abbott Aaron Acosta ] <fill> <fill> <fill> <fill> <fill> <fill> <answer>",
     r"expected <task> \[<index>\] \[word\] \[ name , ... \]"),
    ("<copy> [ Aaron Abbott , Aaron Acosta , Aaron Adler ] <fill> <fill> <fill> <fill>",
     "expected <task>"),
    ("[ Aaron Abbott ] <answer>", "not in the format"),
])
def test_testbed_prompt_format_is_checked(prompt, match) -> None:
    tok = load_tokenizer("testbed-llada")
    with pytest.raises(ValueError, match=match):
        encode_prompts(tok, prompt)
    ids, _ = encode_prompts(tok, TESTBED_OK)  # the well-formed one passes
    assert ids.shape == (1, 13)  # one token per name


def test_cli_testbed_prompt_with_wrong_fill_count(capsys) -> None:
    prompt = "<copy> [ Aaron Abbott , Aaron Acosta , Aaron Adler ] <fill> <answer>"
    assert main(["generate", prompt, "--model", "testbed-llada", "--gen-length", "16"]) == 2
    assert "need 4 <fill> tokens" in capsys.readouterr().err
    assert main(["generate", TESTBED_OK, "--model", "testbed-llada", "--gen-length", "16"]) == 0
    # the benchmark's list format, what the graders read (not the word tokens)
    assert capsys.readouterr().out.strip() == '["Aaron Abbott", "Aaron Acosta", "Aaron Adler"]'
    # without --gen-length a test-bed checkpoint answers in its trained 16 positions
    assert main(["generate", TESTBED_OK, "--model", "testbed-llada"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == '["Aaron Abbott", "Aaron Acosta", "Aaron Adler"]'
    assert "the 16-token budget" in captured.err


def test_too_long_prompt_errors_without_the_transformers_warning(capfd, caplog) -> None:
    long_prompt = "Maya Doyle " * 600
    with caplog.at_level(logging.WARNING):
        assert main(["generate", long_prompt, "--gen-length", "16"]) == 2
    err = capfd.readouterr().err
    assert "exceeds the model's max length 1024" in err
    assert "Token indices sequence length" not in err + caplog.text
    assert err.count("\n") == 1
