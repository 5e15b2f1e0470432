"""Test-bed students of the 2026 families: LLaDA2.1's editing mixture, DiffusionGemma's
uniform-noise recipe, training from the CLI, exact resume and the release-format export."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest
import torch

from dllm_decode.models.uniform_oracle import ALPHAS, noisy_posterior
from dllm_decode.train.distill_config import DistillConfig
from dllm_decode.train.testbed import (
    TESTBED_GEN_LENGTH,
    waiting_line_oracle,
    waiting_line_records,
)

pytestmark = pytest.mark.usefixtures("one_thread")
G = TESTBED_GEN_LENGTH
SMALL = dict(hidden=32, layers=2, heads=2, intermediate=64, experts=4, top_k=2,
             moe_intermediate=16, batch_size=4, log_every=2, ckpt_every=2, eval_every=0,
             eval_size=1)


def test_noisy_posterior_is_the_enumerated_posterior() -> None:
    """Brute force over a 3-token vocabulary: every answer, keep probability and canvas."""
    answers = torch.tensor([[0, 1, 2], [1, 0, 2], [2, 2, 1]])
    keep = torch.tensor([0.3, 0.9], dtype=torch.float64)
    known = torch.tensor([True, False, True])
    for canvas in itertools.product(range(3), repeat=3):
        x = torch.tensor(canvas)
        got = noisy_posterior(answers, x[None], keep, 3, noise_tokens=4, known=known[None])[0]
        weights = []
        for ans in answers.tolist():
            lik = [math.prod(a * (x[i] == ans[i]) + (1 - a) / 4 for i in range(3)
                             if known[i]) for a in keep.tolist()]
            weights.append(sum(lik) / len(lik))
        total = sum(weights)
        want = torch.zeros(3, 3, dtype=torch.float64)
        for ans, w in zip(answers.tolist(), weights, strict=True):
            for i, t in enumerate(ans):
                want[i, t] += w / total
        assert torch.allclose(got, want, atol=1e-12), canvas


def test_editing_stream_corrupts_visible_answer_tokens_only() -> None:
    from dllm_decode.train.distill import make_batch
    from dllm_decode.train.edit_objective import edit_targets, editing_rows

    oracle = waiting_line_oracle()
    cfg = DistillConfig(family="llada2", batch_size=16, edit_frac=0.5, edit_rate=1.0, seed=3)
    tokens, valid, masked, targets, p = make_batch(cfg, oracle, 7)
    assert tokens.shape[1] <= 32  # prompt and answer inside one block of 32
    new, supervised, new_targets = editing_rows(cfg, oracle, tokens, valid, masked, targets,
                                                p, 7)
    again = editing_rows(cfg, oracle, tokens, valid, masked, targets, p, 7)
    assert torch.equal(new, again[0]) and torch.equal(new_targets, again[2])  # (seed, step)
    changed = new != tokens
    assert not changed[:, :p].any() and not (changed[:, p:] & masked).any()
    assert not (new[:, p:][changed[:, p:]] == oracle.mask_token_id).any()
    rows = (supervised & ~masked).any(1)  # the editing rows supervise visible positions
    assert rows.any() and changed[rows].any() and not changed[~rows].any()
    assert torch.equal(new_targets[~rows], targets[~rows])
    i = int(rows.nonzero()[0])
    prompt = tokens[i, :p][valid[i, :p]].tolist()
    region = new[i, p:]
    want = edit_targets(oracle, [prompt], region[None], (~masked[i] & valid[i, p:])[None], 1.0)
    assert torch.equal(new_targets[i], want[0])
    # the clean answer stays likely where it is visible, a corrupted token does not
    table = oracle.answer_table(prompt, G)
    assert (new_targets[i].argmax(-1)[supervised[i]] != oracle.mask_token_id).all()
    assert table.shape[1] == G


def test_editing_targets_restore_the_original_tokens() -> None:
    """At every corrupted position the target prefers the token that was there before the
    corruption (the clean answer) to the corrupting one; clean visible positions keep theirs."""
    from dllm_decode.train.distill import make_batch
    from dllm_decode.train.edit_objective import editing_rows

    oracle = waiting_line_oracle()
    cfg = DistillConfig(family="llada2", batch_size=32, edit_frac=1.0, edit_rate=0.3, seed=1)
    step = cfg.scramble_steps + 3
    tokens, valid, masked, targets, p = make_batch(cfg, oracle, step)
    new, supervised, new_targets = editing_rows(cfg, oracle, tokens, valid, masked, targets,
                                                p, step)
    original, region = tokens[:, p:], new[:, p:]
    hit = region != original
    assert hit.sum() >= 10
    p_orig = new_targets.gather(-1, original[..., None])[..., 0]
    p_noise = new_targets.gather(-1, region[..., None])[..., 0]
    assert (p_orig[hit] > p_noise[hit]).all()
    kept = supervised & ~masked & ~hit
    assert (new_targets.argmax(-1)[kept] == original[kept]).float().mean() > 0.95


def test_draft_rows_keep_the_students_own_commits() -> None:
    from dllm_decode.train.distill import build_student, make_batch
    from dllm_decode.train.edit_objective import draft_rows

    oracle = waiting_line_oracle()
    cfg = DistillConfig(family="llada2", mtf_frac=0.5, **SMALL)
    model = build_student(cfg, oracle)
    tokens, valid, masked, targets, p = make_batch(cfg, oracle, 0)
    new, new_valid, supervised, _ = draft_rows(model, cfg, oracle, tokens, valid, masked,
                                               targets, p, 0)
    rows = supervised.all(1) & ~masked.all(1)
    assert rows.sum() >= 1 and model.training  # eval for the draft, then restored
    assert (new[rows, p:] != oracle.mask_token_id).any()  # at least one step committed
    assert new_valid[rows, p:].all() and torch.equal(new[:, :p], tokens[:, :p])


def test_expert_balance_moves_the_bias_toward_idle_experts() -> None:
    from dllm_decode.train.distill import build_student
    from dllm_decode.train.edit_objective import ExpertBalance

    model = build_student(DistillConfig(family="llada2", **SMALL), waiting_line_oracle())
    balance = ExpertBalance(model, 0.01)
    router = balance.routers[0]
    with torch.no_grad():
        router.weight.zero_()
        router.weight[0] += 1.0  # every token prefers expert 0
    idx, _ = router(torch.ones(8, router.weight.shape[1]))
    busy = torch.zeros(4, dtype=torch.bool)
    busy[idx.unique()] = True  # every token picks the same top-2
    balance.update()
    assert busy[0] and busy.sum() == 2
    assert (router.expert_bias[busy] < 0).all() and (router.expert_bias[~busy] > 0).all()
    assert all(c.sum() == 0 for c in balance.counts)
    balance.close()


def test_uniform_training_forward_equals_the_inference_forward() -> None:
    """The differentiable encoder / decoder of the recipe give ``encode`` + ``decode``'s
    logits, padding, a sliding window shorter than the prompt and self-conditioning included."""
    from dllm_decode.models.gemma_loading import build_diffusion_gemma
    from dllm_decode.train.testbed_students import gemma_student_config
    from dllm_decode.train.uniform_objective import (
        decode_canvas,
        encode_clean,
        self_conditioning,
        uniform_batch,
    )

    oracle = waiting_line_oracle()
    cfg = DistillConfig(family="gemma", **SMALL)
    config = gemma_student_config(32, 2, 2, 64, 4, 2, 16, oracle)
    config["text_config"]["sliding_window"] = 6
    model = build_diffusion_gemma(config, seed=1, init_std=0.1)
    step = next(s for s in range(50) if not uniform_batch(cfg, oracle, s)[1].all())
    clean, valid, canvas, _, _, width = uniform_batch(cfg, oracle, step)  # left padding
    rows = torch.tensor([True, False, True, True])
    with torch.no_grad():
        kv, _ = encode_clean(model, clean, valid)
        first = decode_canvas(model, kv, valid[:, :width], canvas, None)
        second = decode_canvas(model, kv, valid[:, :width], canvas,
                               self_conditioning(model, first, rows))
        cache = model.new_cache(4, width + G)
        model.encode(clean[:, :width], cache, valid[:, :width])
        ref = model.decode(canvas, cache)
        ref2 = model.decode(canvas, cache, ref)
    assert torch.allclose(first, ref, atol=1e-4)
    assert torch.allclose(second[rows], ref2[rows], atol=1e-4)
    assert torch.allclose(second[~rows], ref[~rows], atol=1e-4)  # zero self-conditioning


@pytest.mark.parametrize("family", ["llada2", "gemma"])
def test_students_train_resume_exactly_and_export_release_formats(
        family: str, tmp_path: Path) -> None:
    from dllm_decode import DiffusionSampler, load_model
    from dllm_decode.train.distill import distill
    from dllm_decode.train.state import STATE_FILE, load_state

    extra = ({"mtf_frac": 0.25, "tie_embeddings": True} if family == "llada2" else
             {"onpolicy_frac": 0.5, "rollout_every": 2})  # gemma: its own sampler's canvases
    common = dict(family=family, **SMALL, **extra)
    distill(DistillConfig(out=str(tmp_path / "a"), steps=4, **common))
    distill(DistillConfig(out=str(tmp_path / "b"), steps=2, **common))
    distill(DistillConfig(out=str(tmp_path / "b"), steps=4, resume=True, **common))
    a = (tmp_path / "a/loss.csv").read_text().splitlines()
    b = (tmp_path / "b/loss.csv").read_text().splitlines()
    assert [r.split(",")[:3] for r in a] == [r.split(",")[:3] for r in b]
    # the resumed run ends in the same state, exactly: weights (the expert bias included),
    # optimizer moments and step
    sa, sb = load_state(tmp_path / "a" / STATE_FILE), load_state(tmp_path / "b" / STATE_FILE)
    assert sa["step"] == sb["step"] == 4 and sa["model"].keys() == sb["model"].keys()
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    if family == "llada2":
        assert any(k.endswith("expert_bias") for k in sa["model"])
    oa, ob = sa["opt"]["state"], sb["opt"]["state"]
    assert oa.keys() == ob.keys()
    assert all(torch.equal(oa[i][n], ob[i][n]) for i in oa for n in oa[i])
    model = load_model(tmp_path / "a/model")
    assert model.family == {"llada2": "llada2_moe", "gemma": "diffusion_gemma"}[family]
    oracle = waiting_line_oracle()
    prompt = torch.tensor([oracle.encode_prompt("copy", waiting_line_records("copy", 1)[0])])
    out = DiffusionSampler(model, gen_length=G).generate(prompt)  # the family default
    assert out.answer.shape == (1, G)


def test_llada2_student_attends_in_its_blocks() -> None:
    """The trainer's mask is the model's own block-causal one (blocks of 32 from position 0):
    a test-bed canvas is one block, a longer one is not."""
    from dllm_decode.models.functional import block_causal_mask
    from dllm_decode.train.distill import build_student

    model = build_student(DistillConfig(family="llada2", **SMALL), waiting_line_oracle())
    assert model.attention == "block_causal" and model.block_size == 32
    pos = torch.arange(40)[None]
    mask = block_causal_mask(pos, pos, model.block_size)
    assert mask[0, :32, :32].all() and not mask[0, :32, 32:].any()


#: the family's conformance checkpoint (reference-format tensor names)
CONFORMANCE = Path(__file__).resolve().parents[1] / ".." / "shared" / "conformance"
TINY_FLAGS = ["--hidden", "32", "--layers", "2", "--heads", "2", "--intermediate", "64",
              "--experts", "4", "--top-k", "2", "--moe-intermediate", "16", "--batch-size", "4",
              "--log-every", "1", "--ckpt-every", "2", "--eval-every", "0", "--eval-size", "1"]


def _name_pattern(directory: Path) -> set[str]:
    """The text model's tensor names of a checkpoint (no vision tower: the students are text
    only) with layer / expert indices replaced by ``N``."""
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return {re.sub(r"\.\d+(?=\.)", ".N", name) for name in f.keys()  # noqa: SIM118
                if "vision" not in name}


@pytest.mark.parametrize(("family", "reference"), [("llada2", "llada2-tiny"),
                                                   ("gemma", "diffusiongemma-tiny")])
def test_cli_trains_each_recipe_and_exports_the_released_tensor_names(
        family: str, reference: str, tmp_path: Path, capsys) -> None:
    from dllm_decode import load_model
    from dllm_decode.cli import main

    out = tmp_path / family
    argv = ["train", "testbed", "--family", family, "--out", str(out), "--steps", "3",
            *TINY_FLAGS]
    assert main(argv) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["steps_done"] == 3 and run["config"]["family"] == family
    assert run["command"].startswith(f"dllm-decode train testbed --family {family}")
    losses = [float(r.split(",")[1]) for r in (out / "loss.csv").read_text().splitlines()[1:]]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    files = sorted(p.name for p in (out / "model").iterdir())
    assert "model.safetensors" in files and not any(f.endswith((".pt", ".bin")) for f in files)
    model = load_model(out / "model")
    assert model.family == {"llada2": "llada2_moe", "gemma": "diffusion_gemma"}[family]
    if not CONFORMANCE.is_dir():
        pytest.skip("../shared/conformance is absent: no reference tensor names to compare")
    assert _name_pattern(out / "model") == _name_pattern(CONFORMANCE / reference)


def test_no_editing_is_the_plain_mask_objective() -> None:
    """``--no-editing``: the step's loss is the mask objective on the mask batch, exactly; with
    editing on, the same step supervises corrupted and visible positions (another loss)."""
    from dllm_decode.train.distill import build_student, make_batch, parse_args, step_loss
    from dllm_decode.train.distill_objective import distill_loss

    oracle = waiting_line_oracle()
    cfg = parse_args(["--family", "llada2", "--no-editing", *TINY_FLAGS])
    assert cfg.no_editing and not cfg.editing
    assert DistillConfig(family="llada2").editing
    model = build_student(cfg, oracle)
    step = cfg.scramble_steps + 5
    with torch.no_grad():
        got = step_loss(model, cfg, oracle, step)
        want = distill_loss(model, *make_batch(cfg, oracle, step))
        edited = step_loss(model, DistillConfig(family="llada2", edit_frac=1.0, **SMALL),
                           oracle, step)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(edited[0], want[0])


def test_uniform_noise_and_self_conditioning_rows_are_as_specified() -> None:
    """Canvas = the clean answer with each position replaced, at a per-row rate ``t ~ U(eps,
    1)``, by a token uniform over the whole vocabulary (special ids included: no mask token);
    ``--self-cond`` decides the share of self-conditioned rows; targets are the exact
    posterior of the clean answer; a function of ``(seed, step)``."""
    from dllm_decode.train.uniform_objective import uniform_batch

    oracle = waiting_line_oracle()
    v = oracle.vocab_size
    cfg = DistillConfig(family="gemma", batch_size=256, seed=5)
    step = cfg.scramble_steps + 1
    clean, valid, canvas, targets, sc_rows, width = uniform_batch(cfg, oracle, step)
    again = uniform_batch(cfg, oracle, step)
    assert torch.equal(canvas, again[2]) and torch.equal(targets, again[3])
    answers = clean[:, width:]
    assert valid[:, width:].all() and canvas.shape == answers.shape == (256, G)
    changed = canvas != answers
    # E[share changed] = E[t] (1 - 1/V) ~ 0.5; per-row t spreads the rows out over (0, 1)
    assert abs(changed.float().mean().item() - 0.5 * (1 - 1 / v)) < 0.06
    per_row = changed.float().mean(1)
    assert (per_row < 0.2).any() and (per_row > 0.8).any()
    noise = canvas[changed]
    assert (noise < oracle._first_name).any() and (noise >= oracle._first_name).any()
    assert noise.min() >= 0 and noise.max() < v
    assert abs(sc_rows.float().mean().item() - cfg.self_cond) < 0.1
    keep = torch.tensor(ALPHAS, dtype=torch.float64)
    prompt = clean[0, :width][valid[0, :width]].tolist()
    want = noisy_posterior(oracle.answer_table(prompt, G), canvas[:1], keep, v)
    assert torch.equal(targets[:1], want.float())
    for share, expect in ((0.0, False), (1.0, True)):
        rows = uniform_batch(DistillConfig(family="gemma", batch_size=8, self_cond=share),
                             oracle, step)[4]
        assert (rows == expect).all()


def test_name_noise_rows_corrupt_names_only_with_their_exact_posterior() -> None:
    """``--name-noise-frac``: those rows keep every list symbol and EOS clean, corrupt names at
    the row's rate, and their targets are the posterior with only the name positions as
    evidence; with the share 0 the batch is the release recipe's, draw for draw."""
    from dllm_decode.train.uniform_objective import uniform_batch

    oracle = waiting_line_oracle()
    v, first = oracle.vocab_size, oracle._first_name
    step = DistillConfig(family="gemma").scramble_steps + 1
    plain = uniform_batch(DistillConfig(family="gemma", batch_size=64, seed=3), oracle, step)
    zero = uniform_batch(DistillConfig(family="gemma", batch_size=64, seed=3,
                                       name_noise_frac=0.0), oracle, step)
    assert all(torch.equal(a, b) for a, b in zip(plain[:5], zero[:5], strict=True))
    cfg = DistillConfig(family="gemma", batch_size=64, seed=3, name_noise_frac=1.0)
    clean, valid, canvas, targets, _, width = uniform_batch(cfg, oracle, step)
    answers = clean[:, width:]
    names = answers >= first
    assert torch.equal(canvas[~names], answers[~names])
    assert (canvas[names] != answers[names]).float().mean() > 0.3
    keep = torch.tensor(ALPHAS, dtype=torch.float64)
    for i in range(3):
        prompt = clean[i, :width][valid[i, :width]].tolist()
        table = oracle.answer_table(prompt, G)
        want = noisy_posterior(table, canvas[i:i + 1], keep, v, known=names[i:i + 1])
        assert torch.equal(targets[i:i + 1], want.float())
    with pytest.raises(ValueError, match="name_noise_frac"):
        DistillConfig(family="gemma", name_noise_frac=1.5)


def test_gemma_onpolicy_rows_are_the_students_own_canvases() -> None:
    """``--onpolicy-frac`` for gemma (``train/uniform_onpolicy.py``): one rollout of the
    student's ``gemma_renoise`` decode serves ``rollout_every`` steps and records every canvas it
    decoded (the first is the sampler's fresh noise, later ones hold its accepted samples); the
    drawn states replace the batch's first rows, with the exact posterior of each canvas as
    target and one valid answer behind each prompt in the encoder's clean sequence."""
    from dllm_decode import DiffusionSampler
    from dllm_decode.eval.runner import left_pad
    from dllm_decode.train.distill import build_student
    from dllm_decode.train.uniform_objective import uniform_batch
    from dllm_decode.train.uniform_onpolicy import ROLLOUT_SALT, Rollouts

    oracle = waiting_line_oracle()
    v = oracle.vocab_size
    cfg = DistillConfig(family="gemma", **{**SMALL, "ckpt_every": 4}, onpolicy_frac=0.5,
                        onpolicy_k=2, rollout_every=4)
    model = build_student(cfg, oracle)
    rollouts = Rollouts()
    rollouts.refresh(model, cfg, oracle, 5)
    first = rollouts.canvases
    assert rollouts.step == 4 and first.shape == (G // 2, 4, G)  # 8 steps of 4 prompts
    rollouts.refresh(model, cfg, oracle, 7)  # the same period: no new rollout
    assert rollouts.canvases is first
    # the recorded canvases are the ones the sampler decodes: rerun it, same seed
    ids, attn = left_pad(rollouts.prompts, oracle.pad_token_id)
    seen: list[torch.Tensor] = []
    DiffusionSampler(model, "gemma_renoise", gen_length=G, steps=G // 2,
                     early_stop=False).generate(
        ids, attn, seed=(cfg.seed << 32) + 4 + ROLLOUT_SALT,
        on_step=lambda state, _: seen.append(state.canvas[:, -G:].clone()))
    assert torch.equal(torch.stack(seen), first)
    assert all(torch.equal(t, oracle.answer_table(p, G))
               for p, t in zip(rollouts.prompts, rollouts.tables, strict=True))
    rollouts.refresh(model, cfg, oracle, 8)  # the next period: a new rollout
    assert rollouts.step == 8 and not torch.equal(rollouts.canvases, first)

    prompts, tables, canvases = rollouts.draw(2, cfg, 9)
    assert len(prompts) == len(tables) == 2 and canvases.shape == (2, G)
    clean, valid, canvas, targets, _, width = uniform_batch(cfg, oracle, 9,
                                                            (prompts, tables, canvases))
    assert torch.equal(canvas[:2], canvases)
    keep = torch.tensor(ALPHAS, dtype=torch.float64)
    for i in range(2):
        assert clean[i, :width][valid[i, :width]].tolist() == prompts[i]
        assert (tables[i] == clean[i, width:]).all(-1).any()  # a valid answer
        want = noisy_posterior(tables[i], canvases[i:i + 1], keep, v)
        assert torch.equal(targets[i:i + 1], want.float())
    plain = uniform_batch(cfg, oracle, 9)
    assert torch.equal(canvas[2:], plain[2][2:])  # the other rows are the i.i.d. rows
    with pytest.raises(ValueError, match="multiple of rollout_every"):
        DistillConfig(family="gemma", onpolicy_frac=0.5, rollout_every=30)
    with pytest.raises(ValueError, match="onpolicy_hard"):
        DistillConfig(family="gemma", onpolicy_frac=0.5, onpolicy_hard=0.5)
