"""The bundled test-bed checkpoints of the 2026 families (``testbed-llada2``, a masked
LLaDA2.x student; ``testbed-gemma``, a uniform-noise DiffusionGemma student).

It loads offline by name in its released format, ships the test bed's tokenizer and a model
card, decodes held-out prompts (a generator seed no card or benchmark uses) with the family's
default preset, and prints answers in the benchmark's list format through ``generate_text`` and
the CLI. The accuracy floors are below the cards' measured 50-prompt numbers by a margin, so a
CPU whose fp32 rounding flips one close decision still passes; the cards hold the exact numbers.
"""

from __future__ import annotations

import json

import pytest

from dllm_decode.train.testbed import RANDOM_TASKS, TESTBED_GEN_LENGTH, waiting_line_oracle
from dllm_decode.train.testbed_eval import decode_tasks

NAMES = ("testbed-llada2", "testbed-gemma")
PROMPT = "<reverse> [ Amelia Abbott , Bruno Adler , Carl Bell ] " + "<fill> " * 4 + "<answer>"
REVERSED = '["Carl Bell", "Bruno Adler", "Amelia Abbott"]'
#: held-out prompts per task and a generator seed offset the cards and benchmarks do not use
N, SEED = 10, 4242


def accuracy(rows: dict[str, list[dict]], task: str) -> float:
    return 100 * sum(r["valid"] for r in rows[task]) / len(rows[task])


@pytest.mark.parametrize("name", NAMES)
def test_bundled_checkpoint_is_a_release_format_directory(name: str) -> None:
    from dllm_decode.models.loading import bundled_models, resolve_path
    from dllm_decode.train.testbed import codec_for

    assert name in bundled_models()
    directory = resolve_path(name)
    assert (directory / "model.safetensors").stat().st_size <= 8 * 2**20
    assert not list(directory.glob("*.pt")) and not list(directory.glob("*optim*"))
    config = json.loads((directory / "config.json").read_text())
    architecture = {"testbed-llada2": "LLaDA2MoeModelLM",
                    "testbed-gemma": "DiffusionGemmaForBlockDiffusion"}[name]
    assert config["architectures"] == [architecture]
    codec = codec_for(directory)
    assert codec is not None and codec.vocab == waiting_line_oracle().vocab
    card = (directory / "README.md").read_text()
    assert "dllm-decode train testbed" in card and "Held-out results" in card


@pytest.mark.parametrize("name", NAMES)
def test_default_preset_answers_held_out_prompts(name: str, one_thread: None) -> None:
    """The family default through ``DiffusionSampler(model)``.

    ``testbed-llada2``: LLaDA2.0's ``llada2`` preset commits every position above 0.95 and at
    least one a step on a 16-token answer (its minimum splits the positions decoded, not the
    reference's padded block of 32, which forced two dependent names a step: shuffle 15-20 %):
    every task holds, the dependent ones (measured 83-100 % on 30 held-out prompts each) to a
    floor of 75. ``testbed-gemma``: ``gemma_renoise`` as released
    (48 steps, early stop; its entropy bound accepts about one uncertain name a step) answers
    the dependent tasks too; it samples, so those get 20 prompts and a floor far under the
    card's 50-prompt numbers (86-98 %)."""
    from dllm_decode import load_model

    model = load_model(name)
    uniform = getattr(model, "noise_kind", "mask") == "uniform"
    rows = decode_tasks(model, waiting_line_oracle(), N, seed=SEED, policy=None, steps=None,
                        sample_seed=0 if uniform else None)
    for task in rows:
        if task not in RANDOM_TASKS:
            assert accuracy(rows, task) >= 90, task
        elif not uniform:
            assert accuracy(rows, task) >= 75, task
    nfe = [r["nfe"] for task in rows for r in rows[task]]
    assert max(nfe) <= (48 if uniform else TESTBED_GEN_LENGTH // 2)
    if uniform:
        rows = decode_tasks(model, waiting_line_oracle(), 2 * N, seed=SEED, policy=None,
                            steps=None, sample_seed=0, tasks=RANDOM_TASKS)
        for task in RANDOM_TASKS:
            assert accuracy(rows, task) >= 60, task


def test_one_token_per_step_answers_the_dependent_tasks(one_thread: None) -> None:
    """At one token per step (``low_confidence``; LLaDA2.1's ``llada21`` quality mode, whose
    minimum is one commit a step, with token editing) ``testbed-llada2`` answers the dependent
    tasks, the test bed's target."""
    from dllm_decode import load_model

    model = load_model("testbed-llada2")
    for policy, params in (("low_confidence", {}), ("llada21", {"mode": "quality"})):
        rows = decode_tasks(model, waiting_line_oracle(), N, seed=SEED, policy=policy,
                            tasks=RANDOM_TASKS, **params)
        for task in RANDOM_TASKS:
            assert accuracy(rows, task) >= 80, (policy, task)


@pytest.mark.parametrize("name", NAMES)
def test_text_api_and_cli_print_the_benchmark_list_format(
        name: str, one_thread: None, capsys: pytest.CaptureFixture) -> None:
    from dllm_decode import DiffusionSampler, generate_text, load_model, load_tokenizer
    from dllm_decode.cli import main

    model, tok = load_model(name), load_tokenizer(name)
    sampler = DiffusionSampler(model, gen_length=TESTBED_GEN_LENGTH, seed=0)
    assert generate_text(sampler, tok, PROMPT).texts[0] == REVERSED
    assert main(["generate", PROMPT, "--model", name, "--seed", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == REVERSED
