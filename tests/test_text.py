"""Text in, text out: chat template, batched left padding, stop tokens, the CLI and examples."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dllm_decode import DiffusionSampler, TextGeneration, generate_text, load_model, load_tokenizer
from dllm_decode.models import build_model, save_model
from dllm_decode.text import decode_answers, encode_prompts, stop_token_ids
from dllm_decode.tokenizer import BUNDLED_TOKENIZER, EOS_TOKEN, PAD_TOKEN
from tests.helpers import lay_out_cache, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
WAITING_LINE = (
    "You are managing a waiting line at a customer service desk.\n"
    "You need to record the following people in the order they arrived:\n"
    "{}\nPlease copy the list exactly and provide only the final list.\n"
)
LISTS = ['["Maya Doyle", "Ivan Bennett", "Pedro Lindqvist"]', '["Ivan Bennett", "Maya Doyle"]']


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.mark.parametrize(("name", "block"), [("tiny-llada", 32), ("tiny-dream", 32),
                                             ("tiny-sdar", 4)])
def test_strings_in_strings_out_on_every_family(name, block, tok) -> None:
    model = load_model(name)
    sampler = DiffusionSampler(model, "low_confidence", gen_length=32, block_length=block)
    out = generate_text(sampler, tok, [WAITING_LINE.format(x) for x in LISTS])
    assert isinstance(out, TextGeneration)
    assert out.texts == LISTS  # correct, clean: no EOS, no padding
    assert out.stopped == [True, True]
    assert out.attention_mask[1, 0] == 0 and out.attention_mask[0].all()  # left padding
    single = generate_text(sampler, tok, WAITING_LINE.format(LISTS[1]))
    assert single.texts == [LISTS[1]]
    assert out.generation.answer.shape == (2, 32)


def test_chat_messages_equal_plain_strings(tok) -> None:
    text = WAITING_LINE.format(LISTS[0])
    ids, mask = encode_prompts(tok, text)
    ids2, _ = encode_prompts(tok, [{"role": "user", "content": text}])
    assert torch.equal(ids, ids2) and mask.all()
    rendered = tok.decode(ids[0])
    assert rendered.startswith("<|user|>\n") and rendered.endswith("<|assistant|>\n")
    raw, _ = encode_prompts(tok, text, chat=False)
    assert raw.shape[1] < ids.shape[1]
    convs = [[{"role": "system", "content": "s"}, {"role": "user", "content": "a"}],
             [{"role": "user", "content": "a longer one"}]]
    ids, mask = encode_prompts(tok, convs)
    assert ids.shape[0] == 2 and (mask.sum(1) > 0).all()
    assert ids[0, 0] == tok.pad_token_id or ids[1, 0] == tok.pad_token_id


def test_bad_prompts_are_explained(tok) -> None:
    with pytest.raises(ValueError, match="empty"):
        encode_prompts(tok, [])
    with pytest.raises(TypeError, match="list of strings"):
        encode_prompts(tok, [1, 2])
    no_template = load_tokenizer()
    no_template.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        encode_prompts(no_template, [{"role": "user", "content": "x"}])


def test_stop_ids_from_generation_config_and_the_chat_template(tmp_path) -> None:
    d = tmp_path / "tok"
    shutil.copytree(BUNDLED_TOKENIZER, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    # an assistant turn closed by a dedicated end-of-turn special (here <|system|>), as
    # LLaDA-Instruct closes it with <|eot_id|> and Qwen with <|im_end|>
    cfg["chat_template"] = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content']"
                            " + '<|system|>' }}{% endfor %}"
                            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [5]}))
    tok = load_tokenizer(d)
    eot, eos = tok.convert_tokens_to_ids("<|system|>"), tok.convert_tokens_to_ids(EOS_TOKEN)
    ids = stop_token_ids(tok)
    assert eot in ids and eos in ids and 5 in ids
    pad = tok.convert_tokens_to_ids(PAD_TOKEN)
    body = tok.encode("Maya Doyle")
    answer = torch.tensor([body + [eot, eos] + [pad] * 3, body + [pad, pad, pad, pad, pad]])
    texts, stopped = decode_answers(tok, answer, ids)
    assert texts == ["Maya Doyle", "Maya Doyle"] and stopped == [True, False]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return {**env, **extra}


@pytest.mark.parametrize("script", ["generate.py", "compare_policies.py"])
def test_examples_print_clean_answers(script) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "examples" / script)], env=_env(),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    answers = [line for line in res.stdout.splitlines() if LISTS[0] in line]
    assert answers, res.stdout
    assert "<|" not in res.stdout and "[MASK]" not in res.stdout
    if script == "generate.py":
        assert res.stdout.splitlines()[:2] == LISTS
    else:  # every policy row ends with the clean answer
        rows = [line for line in res.stdout.splitlines()[2:] if line.strip()]
        assert len(rows) == 7 and all(line.endswith(LISTS[0]) for line in rows)


def test_cli_generate_takes_hub_ids_dtype_and_device(tmp_path) -> None:
    model = load_model("tiny-llada")
    ckpt = save_model(model, tmp_path / "ckpt", max_shard_bytes=2_000_000,
                      config_extra={"torch_dtype": "bfloat16"})
    for f in BUNDLED_TOKENIZER.iterdir():
        shutil.copy(f, ckpt / f.name)
    lay_out_cache(tmp_path / "hub", "org/tiny-llada", ckpt)
    env = _env(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "dllm_decode.cli", "generate", WAITING_LINE.format(LISTS[0]),
           "--model", "org/tiny-llada", "--dtype", "float32", "--device", "cpu",
           "--gen-length", "32"]
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == LISTS[0]
    assert "NFE=" in res.stderr


def test_cli_reports_a_missing_hub_id(tmp_path, monkeypatch, capsys) -> None:
    from dllm_decode import cli

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["generate", "hi", "--model", "org/absent", "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "org/absent" in err and "HF_HUB_OFFLINE" in err


def test_bf16_checkpoint_decodes_on_cpu(tmp_path, tok) -> None:
    ckpt = save_model(build_model(tiny_config("llada"), seed=1), tmp_path / "m",
                      config_extra={"torch_dtype": "bfloat16"})
    model = load_model(ckpt)
    assert model.head.weight.dtype == torch.bfloat16
    out = DiffusionSampler(model, "threshold", gen_length=8).generate(torch.tensor([[1, 2, 3]]))
    assert out.answer.shape == (1, 8) and not (out.answer == model.mask_token_id).any()


def test_end_of_turn_that_is_only_an_added_special_token(tok) -> None:
    """LLaDA-Instruct's ``<|eot_id|>`` is an added special token (not a named special); the
    template closes each turn with it, then the model pads with EOS."""
    tok = load_tokenizer()
    tok.add_tokens(["<|eot_id|>"], special_tokens=True)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    tok.chat_template = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] "
                         "+ '\\n<|eot_id|>' }}{% endfor %}"
                         "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
    ids = stop_token_ids(tok)
    assert eot in ids and tok.eos_token_id in ids
    answer = torch.tensor([tok.encode("Maya Doyle") + [eot] + [tok.eos_token_id] * 4])
    assert decode_answers(tok, answer, ids) == (["Maya Doyle"], [True])
