"""The README's lm-eval command, run as a new user runs it, scores the bundled model; the
adapter renders prompts with the tokenizer's chat template by default (``chat``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'dllm-decode[eval]')")

from dllm_decode.eval.lm_eval import DllmDecodeLM  # noqa: E402
from tests.docs_text import docs_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: the bundled model and the zero-shot task it was trained for (the README leaves them open)
MODEL, TASK = "tiny-llada", "parallelbench_waiting_line_copy_0shot"


def readme_command() -> list[str]:
    """The docs' one ``python -m dllm_decode.eval.lm_eval`` line (``docs/evaluation.md``), as
    argv."""
    lines = [line.strip() for line in docs_text().splitlines()
             if line.strip().startswith("python -m dllm_decode.eval.lm_eval")]
    assert len(lines) == 1, f"expected one lm-eval command in README.md and docs/, found {lines}"
    return shlex.split(lines[0])


def test_readme_lm_eval_command_scores_the_bundled_model(tmp_path: Path) -> None:
    """Measured: 1.0 on 8 prompts with the chat template, 0.0 with the flat prompt."""
    argv = readme_command()
    assert argv[:3] == ["python", "-m", "dllm_decode.eval.lm_eval"]
    assert "--apply_chat_template" not in argv  # the adapter's default must be right alone
    args = [re.sub(r"\bDIR\b", MODEL, a) for a in argv[3:]]
    args = [TASK if a == "..." else a for a in args]
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    env.pop("DLLM_DECODE_PARALLELBENCH_DIR", None)  # the clean-room test split, no download
    done = subprocess.run([sys.executable, "-m", "dllm_decode.eval.lm_eval", *args,
                           "--limit", "8", "--output_path", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (results_file,) = out.rglob("results_*.json")
    result = json.loads(results_file.read_text())
    assert result["config"]["model_args"]["pretrained"] == MODEL
    assert result["results"][TASK]["score,none"] >= 0.75


def _request(context: str, doc: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(args=(context, {}), doc=doc)


def test_chat_template_is_the_default_and_can_be_turned_off() -> None:
    lm = DllmDecodeLM(pretrained=MODEL)
    tok = lm.tokenizer
    text = "Copy the list: Ann Lee"
    turn = [{"role": "user", "content": text}]
    rendered = tok.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    chat_ids = list(tok(rendered, add_special_tokens=False)["input_ids"])
    flat_ids = list(tok(text)["input_ids"])
    assert chat_ids != flat_ids
    assert lm._context_ids(_request(text)) == chat_ids  # default: one user turn
    # the task pack's own turns win (doc_messages, default on)
    doc = {"messages": json.dumps([{"role": "user", "content": "Other"}])}
    other = tok.apply_chat_template([{"role": "user", "content": "Other"}],
                                    add_generation_prompt=True, tokenize=False)
    assert lm._context_ids(_request(text, doc)) == list(
        tok(other, add_special_tokens=False)["input_ids"])
    assert DllmDecodeLM(pretrained=MODEL, doc_messages="false")._context_ids(
        _request(text, doc)) == chat_ids
    # lm-eval's --apply_chat_template renders through the adapter: not rendered twice
    harness = lm.apply_chat_template(turn)
    assert lm._context_ids(_request(harness)) == chat_ids
    off = DllmDecodeLM(pretrained=MODEL, chat="false")
    assert off._context_ids(_request(text)) == flat_ids
    # loglikelihood contexts are rendered the same way
    pair = SimpleNamespace(args=(text, " Ann Lee"), doc=None)
    assert lm.loglikelihood([pair]) != off.loglikelihood([pair])


def test_chat_setting_errors() -> None:
    model = DllmDecodeLM(pretrained=MODEL).model
    bare = SimpleNamespace(eos_token_id=1, pad_token_id=0)  # no chat template
    assert DllmDecodeLM(model=model, tokenizer=bare, device="cpu").chat is False
    with pytest.raises(ValueError, match="chat=true needs a tokenizer with a chat template"):
        DllmDecodeLM(model=model, tokenizer=bare, device="cpu", chat="true")
    with pytest.raises(ValueError, match="chat must be auto, true or false"):
        DllmDecodeLM(model=model, tokenizer=bare, device="cpu", chat="maybe")
