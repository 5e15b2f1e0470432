"""Learn2PD data generation (EGP oracle), filter training and CLI (arXiv 2509.25188)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import Tensor

from dllm_decode import DiffusionSampler, make_policy
from dllm_decode.models.loading import load_model, save_model
from dllm_decode.policies.learn2pd import (
    FilterCard,
    ModelFingerprint,
    load_filter,
    save_filter,
)
from dllm_decode.tokenizer import BUNDLED_TOKENIZER
from dllm_decode.train.learn2pd import (
    EGP_KEY,
    EGPOracle,
    EGPStep,
    L2PSamples,
    filter_metrics,
    generate_egp_samples,
    train_filter,
)
from dllm_decode.train.learn2pd_cli import train_learn2pd_main
from dllm_decode.types import StepState
from tests.helpers import EOS, MASK, tiny_model

K = 8


pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(n: int, seed: int, lengths: tuple[int, ...] = (3, 5, 7)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, EOS, (lengths[i % len(lengths)],), generator=g).tolist()
            for i in range(n)]


@torch.inference_mode()
def _independent_argmax(model, canvas: Tensor) -> Tensor:
    """Greedy proposal of a full, unpadded forward (what the sampler computes with cache none)."""
    pos = torch.arange(canvas.shape[1]).expand_as(canvas)
    logits = model(canvas, pos)
    logits[..., model.mask_token_id] = -torch.inf
    return logits.argmax(-1)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_egp_replay_labels_and_stall_guard(family) -> None:
    model = tiny_model(family, seed=0)
    prompt = torch.tensor(_prompts(3, 1, (5,)))
    kw = dict(gen_length=4 * K, block_length=K, temperature=0.0)
    ref = DiffusionSampler(model, "low_confidence", schedule="llada", **kw).generate(prompt)
    feature = "llada_prob_all" if family == "llada" else "dream_negent_masked"
    steps: list[tuple[StepState, EGPStep, Tensor, Tensor]] = []

    def record(state: StepState, commit: Tensor) -> None:
        steps.append((state, state.extras[EGP_KEY], state.canvas.clone(), commit.clone()))

    out = DiffusionSampler(model, EGPOracle(ref.tokens, K, feature), debug=True, **kw).generate(
        prompt, on_step=record, max_steps_per_block=4 * K)
    assert torch.equal(out.tokens, ref.tokens)  # the replay reproduces y exactly
    stalls = 0
    prev: dict[int, Tensor] = {}
    for state, rec, canvas, commit in steps:
        bs, be = state.block_start, state.block_end
        argmax = _independent_argmax(model, canvas)[:, bs:be]
        assert torch.equal(rec.labels, argmax == ref.tokens[:, bs:be])
        assert torch.equal(rec.active, (canvas[:, bs:be] == MASK).any(1))
        repeated = (argmax == prev[state.block]).all(1) if state.block in prev else \
            torch.zeros_like(rec.active)
        assert torch.equal(rec.stalled, repeated & rec.active)  # fires iff the argmax repeats
        for r in range(prompt.shape[0]):
            masked = canvas[r, bs:be] == MASK
            if rec.stalled[r]:  # the guard commits the whole block with the reference
                assert torch.equal(commit[r, bs:be], masked)
            else:  # EGP: exactly the masked positions whose argmax equals y
                assert torch.equal(commit[r, bs:be], masked & rec.labels[r])
        stalls += int(rec.stalled.sum())
        prev[state.block] = argmax
        if family == "dream":
            assert (rec.features[canvas[:, bs:be] != MASK] == 0).all()
    assert stalls > 0  # the guard was exercised


def test_generate_samples_with_left_padding() -> None:
    model = tiny_model("llada", seed=0)
    samples, stats = generate_egp_samples(model, _prompts(5, 2), gen_length=2 * K,
                                          block_length=K, batch_size=3)
    assert stats["prompts"] == 5 and stats["blocks"] == 10
    assert len(samples) == stats["samples"] == samples.labels.shape[0]
    assert samples.features.shape == samples.labels.shape == (len(samples), K)
    assert 1 <= stats["mean_steps_per_block"] <= K + 1
    assert set(samples.labels.unique().tolist()) <= {0.0, 1.0}
    assert (samples.step[samples.step > 0] <= K).all()


def test_split_and_metrics() -> None:
    n = 100
    s = L2PSamples(torch.arange(n, dtype=torch.float32)[:, None].expand(n, K).clone(),
                   torch.zeros(n, K), torch.zeros(n, dtype=torch.long))
    train, val, test = s.split(seed=1)
    assert (len(train), len(val), len(test)) == (80, 10, 10)
    ids = torch.cat([train.features[:, 0], val.features[:, 0], test.features[:, 0]])
    assert torch.equal(ids.sort().values, torch.arange(n, dtype=torch.float32))
    logits = torch.tensor([[5.0, 5.0, -5.0, -5.0], [5.0, -5.0, 0.0, 5.0]])
    labels = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0]])
    m = filter_metrics(logits, labels, 0.9)
    assert m["false_positive"] == pytest.approx(1 / 4)  # FP / predicted positives
    assert m["false_negative"] == pytest.approx(2 / 4)  # FN / predicted negatives
    assert m["accuracy"] == pytest.approx(5 / 8)


def test_tiny_train_run_produces_a_loadable_filter(tmp_path) -> None:
    model = tiny_model("llada", seed=0)
    samples, stats = generate_egp_samples(model, _prompts(12, 3), gen_length=4 * K,
                                          block_length=K)
    filt, report = train_filter(samples, iters=300, eval_every=100, seed=0)
    assert report["split"]["train"] == int(0.8 * len(samples))
    assert report["history"][-1]["train_loss"] < report["first_train_loss"]
    card = FilterCard(K, "llada_prob_all", ModelFingerprint.of(model),
                      training={"data": stats, **report})
    save_filter(filt, card, tmp_path)
    policy = make_policy("learn2pd", filter=str(tmp_path), for_model=model)
    prompt = torch.tensor(_prompts(2, 4, (4,)))
    out = DiffusionSampler(model, policy, debug=True, gen_length=4 * K,
                           block_length=K).generate(prompt)
    assert (out.answer != MASK).all() and out.forwards <= 4 * K


def _cli(model_dir, out, *extra: str) -> dict:
    argv = ["--model", str(model_dir), "--gen-length", "16", "--block-length", str(K),
            "--out", str(out), *extra]
    assert train_learn2pd_main(argv) == 0
    side = json.loads((out / f"learn2pd_k{K}.json").read_text())
    assert load_filter(out, model=load_model(model_dir)).card.block_length == K
    return side


def test_cli_prompts_file_and_sample_reuse(tmp_path) -> None:
    model_dir = save_model(tiny_model("llada", seed=1), tmp_path / "m")
    prompts = tmp_path / "prompts.jsonl"
    rows = _prompts(6, 5)
    prompts.write_text("\n".join(json.dumps(r if i % 2 else {"prompt_ids": r})
                                 for i, r in enumerate(rows)) + "\n")
    reuse = tmp_path / "samples.safetensors"
    side = _cli(model_dir, tmp_path / "a", "--prompts", str(prompts), "--iters", "40",
                "--save-samples", str(reuse))
    assert side["training"]["iters"] == 40 and side["training"]["data"]["prompts"] == 6
    assert side["model_name"] == "m" and "--prompts" in side["training"]["command"]
    side = _cli(model_dir, tmp_path / "b", "--samples", str(reuse), "--iters", "10")
    assert side["training"]["data"]["samples_from"] == str(reuse)


def test_cli_task_generator(tmp_path) -> None:
    vocab = 1644  # the bundled tiny tokenizer: pad 0, EOS 1, mask 2
    model = tiny_model("llada", seed=2, vocab_size=vocab, embedding_size=vocab, mask_token_id=2,
                       eos_token_id=1, pad_token_id=0, max_sequence_length=1024)
    model_dir = save_model(model, tmp_path / "m")
    for f in BUNDLED_TOKENIZER.iterdir():
        shutil.copy(f, model_dir / f.name)
    side = _cli(model_dir, tmp_path / "o", "--task-generator", "--n-prompts", "2",
                "--tasks", "waiting_line/copy", "--iters", "10")
    assert side["training"]["data"]["prompts"] == 2
    from dllm_decode.train.learn2pd_cli import task_prompts

    shots = [task_prompts(model_dir, 2, tasks=["waiting_line/copy"], icl_examples=k)
             for k in (0, 1)]
    assert all(len(a) < len(b) for a, b in zip(*shots, strict=True))  # demonstrations dropped


def test_task_generator_on_a_test_bed_checkpoint_uses_its_word_level_prompts(tmp_path) -> None:
    """A test-bed checkpoint gets test-bed records (train split) in its own format, and a
    Dream-family reference decode can run on the even split (one commit per step)."""
    from dllm_decode.models.loading import resolve_path
    from dllm_decode.train.learn2pd_cli import task_prompts
    from dllm_decode.train.testbed import codec_for, waiting_line_records

    directory = resolve_path("testbed-dream")
    codec = codec_for(directory)
    prompts = task_prompts(directory, 4, tasks=["waiting_line/shuffle", "copy"])
    first = waiting_line_records("shuffle", 2, split="train")[0]
    assert len(prompts) == 4 and prompts[0] == codec.encode_prompt("shuffle", first)
    assert codec.decode(prompts[1]).startswith("<copy>")
    with pytest.raises(ValueError, match="unknown task"):
        task_prompts(directory, 2, tasks=["waiting_line/sort_by_age"])
    model = load_model(directory)
    samples, stats = generate_egp_samples(model, prompts[:2], gen_length=16, block_length=16,
                                          steps=16, schedule="llada")
    assert stats["prompts"] == 2 and len(samples) > 0
