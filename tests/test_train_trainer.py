"""The tiny trainer: data, schedule, CLI, run directory, export and exact resume."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from dllm_decode.eval.parallelbench import reference_answer
from dllm_decode.models import load_model
from dllm_decode.tokenizer import load_tokenizer
from dllm_decode.train.config import TrainConfig, parse_args
from dllm_decode.train.data import TaskData, max_items_at
from dllm_decode.train.state import load_state
from dllm_decode.train.trainer import command_line, lr_at, train, train_tiny_main

TINY = ["--hidden", "32", "--layers", "1", "--heads", "2", "--intermediate", "64",
        "--batch-size", "4", "--tasks", "waiting_line/copy,waiting_line/reverse",
        "--min-items", "2", "--max-items", "3", "--gen-length", "16", "--warmup", "1",
        "--log-every", "1", "--ckpt-every", "2", "--eval-every", "0", "--eval-size", "2",
        "--threads", "1"]


@pytest.fixture(scope="module")
def data() -> TaskData:
    return TaskData(load_tokenizer(), ["waiting_line/copy", "waiting_line/shuffle"], 32)


def test_collate_left_pads_prompts_and_eos_pads_answers(data: TaskData) -> None:
    examples = data.draw(seed=0, step=0, batch_size=6, min_items=2, max_items=4)
    batch = data.collate(examples)
    tok = data.tokenizer
    p = batch.prompt_length
    assert batch.tokens.shape == (6, p + 32)
    for row, (task, record) in enumerate(examples):
        prompt = data.codec.encode(task, record)
        assert batch.tokens[row, p - len(prompt):p].tolist() == prompt
        assert not batch.valid[row, :p - len(prompt)].any()
        assert (batch.tokens[row, :p - len(prompt)] == data.pad_id).all()
        answer = batch.answer[row]
        n = int(batch.content[row].sum())
        assert tok.decode(answer[:n].tolist()) == reference_answer(record)
        assert (answer[n:] == data.eos_id).all()


def test_draw_is_a_function_of_seed_and_step(data: TaskData) -> None:
    a = data.draw(1, 7, 8, 2, 5)
    assert a == data.draw(1, 7, 8, 2, 5)
    assert a != data.draw(1, 8, 8, 2, 5)
    assert all(2 <= r["metadata"]["length"] <= 5 for _, r in a)
    with pytest.raises(ValueError, match="gen-length"):
        TaskData(data.tokenizer, ["waiting_line/copy"], 8).collate(a)


def test_curriculum_and_lr_schedule() -> None:
    assert [max_items_at(s, 100, 2, 6, 0.4) for s in (0, 10, 20, 39, 40, 99)] == \
        [3, 3, 4, 5, 6, 6]
    assert max_items_at(0, 100, 3, 6, 0.0) == 6
    cfg = TrainConfig(steps=100, warmup=10, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(99, cfg) == pytest.approx(1e-4, rel=1e-2)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 99))


def test_config_validation_and_cli_flags() -> None:
    cfg = parse_args(["--family", "sdar", "--batch-size", "8", "--resume", "--lr", "2e-3"])
    assert (cfg.family, cfg.batch_size, cfg.resume, cfg.lr) == ("sdar", 8, True, 2e-3)
    assert cfg.kv_heads_resolved == 2
    assert "--family sdar" in command_line(cfg) and "--batch-size 8" in command_line(cfg)
    with pytest.raises(ValueError, match="family"):
        TrainConfig(family="gpt")
    with pytest.raises(ValueError, match="max_items"):
        TrainConfig(min_items=5, max_items=3)
    with pytest.raises(SystemExit):
        parse_args(["--family", "nope"])


def _rows(path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_resume_continues_exactly(tmp_path, family: str) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    flags = ["--family", family, "--steps", "4", "--eval-size", "1", *TINY]
    train_tiny_main([*flags, "--out", str(straight)])
    train(TrainConfig(**{**parse_args([*flags, "--out", str(split)]).to_dict(), "steps": 2}))
    with pytest.raises(FileExistsError, match="--resume"):
        train_tiny_main([*flags, "--out", str(split)])
    with pytest.raises(ValueError, match="other settings"):
        train_tiny_main([*flags, "--out", str(split), "--resume", "--lr", "0.5"])
    train_tiny_main([*flags, "--out", str(split), "--resume"])
    a = load_state(straight / "checkpoint.safetensors")
    b = load_state(split / "checkpoint.safetensors")
    assert a["step"] == b["step"] == 4
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    loss_a = [(r["step"], r["loss"]) for r in _rows(straight / "loss.csv")]
    loss_b = [(r["step"], r["loss"]) for r in _rows(split / "loss.csv")]
    assert loss_a == loss_b and len(loss_a) == 4


def test_run_directory_and_export(tmp_path) -> None:
    out = tmp_path / "run"
    summary = train(parse_args(["--family", "dream", "--steps", "3", "--out", str(out),
                                "--export", str(tmp_path / "export"), *TINY]))
    for name in ("checkpoint.safetensors", "loss.csv", "eval.csv", "run.json", "train_config.json"):
        assert (out / name).is_file(), name
    run = json.loads((out / "run.json").read_text())
    assert run["command"].startswith("dllm-decode train tiny --family dream")
    # wall_s is rounded to 0.1 s: three tiny steps may round to 0.0
    assert run["seed"] == 0 and run["wall_s"] >= 0 and run["parameters"] == summary["parameters"]
    assert {"exact_match", "token_acc", "content_acc"} <= set(run["final_eval"])
    for directory in (out / "model", tmp_path / "export"):
        model = load_model(directory)
        assert model.family == "dream" and model.logit_shift == 1
        assert (directory / "tokenizer.json").is_file() and (directory / "README.md").is_file()
        tok = load_tokenizer(directory)
        assert model.mask_token_id == tok.mask_token_id and model.vocab_size == len(tok)
    weights = (out / "model" / "model.safetensors").stat().st_size
    assert run["export_bytes"] == weights < 2 * run["parameters"] + 100_000  # float16


def test_tied_training_exports_untied_equal_weights(tmp_path) -> None:
    from dllm_decode.train.config import build_tiny_model, untie

    cfg = TrainConfig(hidden=32, layers=1, heads=2, intermediate=64, tie_embeddings=True)
    model = build_tiny_model(cfg, 50, 49, 1, 0)
    assert model.head.weight is model.embed.weight
    assert sum(p.numel() for p in model.parameters()) < sum(
        p.numel() for p in build_tiny_model(TrainConfig(hidden=32, layers=1, heads=2,
                                                        intermediate=64), 50, 49, 1, 0
                                            ).parameters())
    untied = untie(model)
    assert untied.head.weight is not untied.embed.weight
    assert torch.equal(untied.head.weight, untied.embed.weight)
    out = tmp_path / "run"
    train(parse_args(["--family", "llada", "--steps", "2", "--out", str(out),
                      "--tie-embeddings", *TINY]))
    loaded = load_model(out / "model")  # the release format stores both matrices
    assert torch.equal(loaded.head.weight, loaded.embed.weight)


def test_repeated_tasks_weight_training_but_not_the_eval_set() -> None:
    data = TaskData(load_tokenizer(), ["waiting_line/copy"] * 3 + ["waiting_line/reverse"], 32)
    drawn = [task for step in range(20) for task, _ in data.draw(0, step, 8, 2, 3)]
    assert drawn.count("waiting_line/copy") > 2 * drawn.count("waiting_line/reverse")
    evals = [task for task, _ in data.eval_examples(4, 2, 3)]
    assert evals.count("waiting_line/copy") == evals.count("waiting_line/reverse") == 2


def test_scrambled_copies_share_random_tokens_between_prompt_and_answer() -> None:
    import random

    data = TaskData(load_tokenizer(), ["waiting_line/copy", "waiting_line/reverse"], 32)
    examples = data.draw(0, 3, 8, 3, 3)
    plain = data.collate(examples)
    mixed = data.collate(examples, scramble=random.Random(0))
    again = data.collate(examples, scramble=random.Random(0))
    assert torch.equal(mixed.tokens, again.tokens)  # a function of the generator
    pool = set(data.scramble_pool())
    p = plain.prompt_length
    for row, (task, _) in enumerate(examples):
        n = int(plain.content[row].sum())
        answer = mixed.tokens[row, p:p + n].tolist()
        if task.endswith("copy"):
            assert set(answer) <= pool and answer != plain.tokens[row, p:p + n].tolist()
            prompt = mixed.tokens[row, :p].tolist()
            assert any(prompt[i:i + n] == answer for i in range(p - n + 1))
            changed = (mixed.tokens[row] != plain.tokens[row]).sum()
            assert changed <= 2 * n  # only the list and the answer text
        else:
            assert torch.equal(mixed.tokens[row], plain.tokens[row])
    assert {"'", '"', "[", "]", ","}.isdisjoint(
        "".join(data.tokenizer.decode([i]) for i in pool))  # names only, no list syntax
