"""Test bed III (long answers): generators, graders, the exact oracle against brute force, the
oracle's refusals, and the students' trainer (batches, resume, export)."""

from __future__ import annotations

import itertools
import json
import random
import shlex
from dataclasses import replace

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.eval.parallelbench.testbed_long import (
    LONG_LENGTHS,
    LONG_NAMES,
    LONG_TASKS,
    draw_items,
    grade,
    is_test,
    long_codec,
    long_oracle,
    long_records,
)
from dllm_decode.models.long_answer import EOS, KEEP, MASK, SEP, LongCodec, long_codec_for
from dllm_decode.train.testbed_long import (
    STATE_FILE,
    LongTrainConfig,
    columns,
    export_student,
    make_batch,
    read_stages,
    train,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("gen_length", [128, 256])
@pytest.mark.parametrize("task", LONG_TASKS)
def test_records_are_seeded_held_out_and_in_range(task: str, gen_length: int) -> None:
    recs = long_records(task, 20, seed=3, gen_length=gen_length)
    assert recs == long_records(task, 20, seed=3, gen_length=gen_length)
    assert recs != long_records(task, 20, seed=4, gen_length=gen_length)
    lo, hi = LONG_LENGTHS[gen_length][task]
    codec = long_codec(gen_length)
    for rec in recs:
        assert lo <= len(rec["items"]) <= hi and is_test(task, rec["items"])
        assert len(codec.encode_prompt(rec)) == codec.prompt_length == gen_length
        assert grade(codec, rec, codec.reference_answer(rec))
    train_recs = long_records(task, 20, seed=3, split="train", gen_length=gen_length)
    assert not any(is_test(task, r["items"]) for r in train_recs)
    if task == "carry":
        assert all(r["items"][0] != KEEP for r in recs)
        assert any(KEEP in r["items"] for r in recs)


def test_graders_reject_what_is_wrong() -> None:
    codec = long_codec()
    sep, eos = codec.token_id[SEP], codec.token_id[EOS]
    copy = long_records("copy", 1, 0)[0]
    shuffle = long_records("shuffle", 1, 0)[0]
    carry = long_records("carry", 1, 0)[0]
    ref = codec.reference_answer(shuffle)
    perm = list(ref)
    perm[0], perm[2] = perm[2], perm[0]  # another order of the names: valid for shuffle only
    assert grade(codec, shuffle, perm) and perm != ref
    assert not grade(codec, {**shuffle, "task": "copy"}, perm)
    dup = list(ref)
    dup[2] = dup[0]  # a name twice
    assert not grade(codec, shuffle, dup)
    moved = list(ref)
    moved[1] = ref[0]  # a name where a separator belongs
    assert not grade(codec, shuffle, moved)
    for rec in (copy, carry):
        ans = codec.reference_answer(rec)
        n = ans.index(eos)
        assert not grade(codec, rec, ans[:n - 1] + [eos] * (len(ans) - n + 1))  # early EOS
        assert not grade(codec, rec, ans[:n] + [sep] + ans[n + 1:])  # content past the end
    assert not grade(codec, copy, codec.reference_answer(copy)[:-1])  # wrong length


def _brute_marginals(codec: LongCodec, items: tuple[str, ...], region: torch.Tensor
                     ) -> torch.Tensor:
    """Marginals by enumeration over every permutation consistent with ``region``."""
    answers = [codec.reference_answer({"task": "shuffle", "items": list(p)})
               for p in itertools.permutations(items)]
    table = torch.tensor(answers)
    known = region != codec.token_id[MASK]
    ok = ((table == region) | ~known).all(-1)
    if not ok.any():
        ok = torch.ones_like(ok)
    probs = torch.zeros(region.shape[0], codec.vocab_size, dtype=torch.float64)
    for ans in table[ok]:
        probs[torch.arange(region.shape[0]), ans] += 1
    return probs / ok.sum()


@pytest.mark.parametrize("k", [2, 3, 5])
def test_shuffle_posterior_equals_brute_force(k: int) -> None:
    codec = LongCodec(LONG_NAMES, gen_length=16)
    rng = random.Random(k)
    mask = codec.token_id[MASK]
    for _ in range(40):
        items = tuple(rng.sample(LONG_NAMES, k))
        answer = torch.tensor(codec.reference_answer({"task": "shuffle",
                                                      "items": list(rng.sample(items, k))}))
        region = answer.masked_fill(torch.rand(16, generator=torch.Generator().manual_seed(
            rng.randrange(99))) < rng.random(), mask)
        if rng.random() < 0.3:  # an impossible canvas: a name twice or off the list
            spot = rng.randrange(0, 2 * k - 1, 2)
            region[spot] = codec.tid(rng.choice(LONG_NAMES))
        got = codec.conditionals("shuffle", items, region[None])[0]
        torch.testing.assert_close(got, _brute_marginals(codec, items, region), rtol=0,
                                   atol=1e-12)


@pytest.mark.parametrize("gen_length", [128, 256])
def test_oracle_decodes_every_task_exactly(gen_length: int) -> None:
    oracle = long_oracle(gen_length)
    for task in LONG_TASKS:
        recs = long_records(task, 2, seed=1, gen_length=gen_length)
        prompts = oracle.prompt_batch(recs)
        for policy, kw in (("low_confidence", {"steps": gen_length}), ("threshold", {})):
            gen = DiffusionSampler(oracle, policy, gen_length=gen_length, block_length=32,
                                   **kw).generate(prompts)
            answers = gen.tokens[:, -gen_length:].tolist()
            assert all(grade(oracle.codec, r, a) for r, a in zip(recs, answers, strict=True))
        if task != "shuffle":  # one answer, every position certain: one forward per block
            assert gen.nfe.tolist() == [gen_length // 32] * 2


def test_calibrated_oracle_is_finite_seeded_and_still_exact_at_k1() -> None:
    oracle = long_oracle(noise=0.5, floor=1e-6, seed=2)
    recs = long_records("shuffle", 2, seed=5)
    prompts = oracle.prompt_batch(recs)
    canvas = torch.cat([prompts, torch.full((2, 128), oracle.mask_token_id)], dim=1)
    pos = torch.arange(canvas.shape[1]).expand_as(canvas)
    a, b = oracle(canvas, pos), oracle(canvas, pos)
    assert torch.isfinite(a).all() and torch.equal(a, b)
    assert not torch.equal(a, long_oracle(noise=0.5, floor=1e-6, seed=3)(canvas, pos))


def test_oracle_refuses_what_it_cannot_serve_exactly() -> None:
    oracle = long_oracle()
    prompts = oracle.prompt_batch(long_records("copy", 1, seed=0))
    canvas = torch.cat([prompts, torch.full((1, 128), oracle.mask_token_id)], dim=1)
    pos = torch.arange(256)[None]
    n = canvas.shape[1]
    with pytest.raises(ValueError, match="exactly"):
        oracle(canvas, pos, cache=object())
    with pytest.raises(ValueError, match="p, p \\+ 1"):
        oracle(canvas, pos.flip(1))
    packed = torch.ones(1, n, n, dtype=torch.bool)
    packed[0, :10, -5:] = False
    with pytest.raises(ValueError, match="different keys"):
        oracle(canvas, pos, mask=packed)
    with pytest.raises(ValueError, match="gen_length 128"):
        oracle(canvas[:, :-32], pos[:, :-32])
    with pytest.raises(NotImplementedError, match="no K/V cache"):
        DiffusionSampler(oracle, "threshold", gen_length=128, block_length=32,
                         cache="prefix").generate(prompts)


def test_codec_errors_name_the_problem() -> None:
    codec = long_codec()
    with pytest.raises(ValueError, match="does not fit"):
        codec.encode_prompt({"task": "copy", "items": [LONG_NAMES[0]] * 64})
    with pytest.raises(ValueError, match="distinct"):
        codec.encode_prompt({"task": "shuffle", "items": [LONG_NAMES[0]] * 3})
    with pytest.raises(ValueError, match="unknown long-answer task"):
        codec.encode_prompt({"task": "sort", "items": [LONG_NAMES[0]]})
    with pytest.raises(KeyError, match="not in the long-answer vocabulary"):
        codec.encode_prompt({"task": "copy", "items": ["Nobody Here"]})
    with pytest.raises(ValueError, match="lengths must lie"):
        long_records("copy", 1, 0, length=(10, 70))
    assert draw_items("carry", 5, random.Random(0))[0] in LONG_NAMES


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_training_batches_are_exact_and_seeded(family: str) -> None:
    cfg = LongTrainConfig(family=family, batch_size=8, curriculum=10, seed=1)
    codec = long_codec()
    block = cfg.block_size if family == "sdar" else None
    a, b = make_batch(cfg, codec, 3, block), make_batch(cfg, codec, 3, block)
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.testing.assert_close(a["targets"].sum(-1), torch.ones(8, 128))
    # every target puts its mass on the answer's own token where the answer is certain
    assert bool((a["targets"].gather(2, a["answers"][..., None]) > 0).all())
    full = make_batch(cfg, codec, 20, block)
    assert int(full["width"]) == 128 and int(a["width"]) < 128
    cols = columns(codec, int(a["width"]))
    assert cols[0] == 0 and 127 in cols.tolist() and cols.max() < 256


def test_block_view_targets_see_clean_earlier_blocks_and_no_later_ones() -> None:
    """A shuffle name slot of the block-causal student's block b is uniform over the names
    that neither the clean earlier blocks (its two-stream context) nor its own block's visible
    slots hold: later blocks are unseen, earlier ones clean (``bd_targets="noisy"``, the
    defect of earlier runs, masks them like the own block)."""
    cfg = LongTrainConfig(family="sdar", batch_size=16, curriculum=0, seed=0,
                          tasks="shuffle")
    codec = long_codec()
    batch = make_batch(cfg, codec, 0, cfg.block_size)
    old = make_batch(replace(cfg, bd_targets="noisy"), codec, 0, cfg.block_size)
    spans_two = 0
    for r in range(16):
        items = codec.parse_prompt(batch["prompts"][r].tolist())[1]
        for b0 in (0, 32):
            view = batch["noisy"][r].clone()
            view[b0 + 32:] = codec.token_id[MASK]
            noisy_want = codec.conditionals("shuffle", items, view[None])[0, b0:b0 + 32]
            view[:b0] = batch["answers"][r, :b0]
            want = codec.conditionals("shuffle", items, view[None])[0, b0:b0 + 32]
            torch.testing.assert_close(batch["targets"][r, b0:b0 + 32], want.float())
            torch.testing.assert_close(old["targets"][r, b0:b0 + 32], noisy_want.float())
        first = set(batch["answers"][r, :32].tolist())
        masked = batch["masked"][r, 32:64] & (batch["answers"][r, 32:64] >= codec.first_name)
        if len(items) > 16 and bool(masked.any()):  # block 1 holds an open name slot
            spans_two += 1
            j = 32 + int(masked.nonzero()[0])
            assert all(float(batch["targets"][r, j, t]) == 0.0 for t in first
                       if t >= codec.first_name)  # block 0's names are excluded
    assert spans_two > 0
    with pytest.raises(ValueError, match="bd_targets"):
        LongTrainConfig(bd_targets="other")


def test_resumed_training_equals_one_run_and_exports_a_loadable_student(tmp_path) -> None:
    common = {"batch_size": 2, "hidden": 32, "layers": 1, "heads": 2, "intermediate": 64,
              "curriculum": 2, "steps": 4, "ckpt_every": 1}
    train(LongTrainConfig(out=str(tmp_path / "one"), **common))
    train(LongTrainConfig(out=str(tmp_path / "two"), stop_after=2, **common))
    with pytest.raises(FileExistsError, match="--resume"):
        train(LongTrainConfig(out=str(tmp_path / "two"), **common))
    with pytest.raises(ValueError, match="other settings"):
        train(LongTrainConfig(out=str(tmp_path / "two"), resume=True, **{**common,
                                                                          "lr": 1e-3}))
    with (tmp_path / "two" / "loss.csv").open("a") as fh:  # logged past the state file
        fh.write("3,9.9,0.001,1.000,1.0\n")
    train(LongTrainConfig(out=str(tmp_path / "two"), resume=True, **common))
    steps = [int(r.split(",")[0]) for r in
             (tmp_path / "two" / "loss.csv").read_text().splitlines()[1:]]
    assert steps == [2, 4]  # the stale row is dropped, not duplicated
    from dllm_decode.train.state import load_state

    one = load_state(tmp_path / "one" / STATE_FILE)["model"]
    two = load_state(tmp_path / "two" / STATE_FILE)["model"]
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert load_state(tmp_path / "two" / STATE_FILE)["cpu_s"] > 0  # CPU time: pause-proof
    summary = json.loads((tmp_path / "two" / "run.json").read_text())
    assert summary["steps_done"] == 4 and "cpu_s" in summary and "wall_s" in summary
    stages = read_stages(tmp_path / "two", 4, summary["cpu_s"])  # the refused calls add none
    assert [(s["from_step"], s["to_step"]) for s in stages] == [(0, 2), (2, 4)]
    assert "--stop-after 2" in stages[0]["command"] and "--resume" in stages[1]["command"]
    assert all(s["cpu_s"] >= 0 for s in stages)
    assert sum(s["cpu_s"] for s in stages) == pytest.approx(summary["cpu_s"], abs=0.2)
    out = export_student(tmp_path / "two", tmp_path / "student")
    exported = json.loads((out / "run.json").read_text())
    assert "cpu_s" in exported and exported["stages"] == stages
    model = load_model(str(out))
    codec = long_codec_for(out)
    assert codec is not None and codec.vocab == long_codec().vocab
    assert model.vocab_size == codec.vocab_size
    from dllm_decode import load_tokenizer
    from dllm_decode.text import testbed_gen_length

    tok = load_tokenizer(str(out))  # the CLI's default answer length, and text round trips
    ids = codec.encode_prompt(long_records("shuffle", 1, 0)[0])
    assert testbed_gen_length(tok) == 128
    assert tok(codec.decode(ids), add_special_tokens=False)["input_ids"] == ids
    prompts = torch.tensor([codec.encode_prompt(long_records("copy", 1, 0)[0])])
    gen = DiffusionSampler(model, "threshold", gen_length=128, block_length=32
                           ).generate(prompts)
    assert gen.tokens.shape == (1, 256)


def test_bd_warmup_trains_the_bidirectional_student_on_two_streams(monkeypatch) -> None:
    import dllm_decode.train.testbed_long as tl

    calls = []
    real = tl.two_stream_mask
    monkeypatch.setattr(tl, "two_stream_mask", lambda *a: calls.append(a[3]) or real(*a))
    cfg = LongTrainConfig(batch_size=2, hidden=32, layers=1, heads=2, intermediate=64,
                          curriculum=2, bd_warmup=3)
    codec = long_codec()
    model = tl.build_student(cfg, codec)
    for step in range(5):
        assert torch.isfinite(tl.step_loss(model, cfg, codec, step))
    assert calls == [32, 32, 32]  # steps 0-2 on the block objective, then the mask objective
    calls.clear()
    mixed = replace(cfg, bd_every=2)  # after the warm-up, every second step on the block one
    for step in range(3, 7):
        assert torch.isfinite(tl.step_loss(model, mixed, codec, step))
    assert calls == [32, 32]  # steps 4 and 6
    with pytest.raises(ValueError, match="bd_every"):
        replace(cfg, bd_every=-1)


def test_semi_share_sets_the_llada_mask_mix() -> None:
    """``semi_share`` 1: every row is semi-AR (clean blocks, one noisy block, masked rest);
    the default 0.5 draws the same batches as before the knob existed (same random draws)."""
    codec = long_codec()
    cfg = LongTrainConfig(batch_size=24, curriculum=0, semi_share=1.0)
    masked = make_batch(cfg, codec, 7, None)["masked"]
    blocks = masked.view(24, -1, 32)
    for row in blocks:
        full = row.all(-1)
        none = ~row.any(-1)
        b = int((~none).nonzero()[0]) if (~none).any() else len(row)
        assert none[:b].all() and full[b + 1:].all()
    base = make_batch(LongTrainConfig(batch_size=24, curriculum=0), codec, 7, None)
    assert not torch.equal(base["masked"], masked)
    with pytest.raises(ValueError, match="semi_share"):
        LongTrainConfig(semi_share=1.5)


@pytest.mark.parametrize("field", ["log_error_weight", "support_mass_weight"])
def test_loss_weights_add_their_term_linearly(field: str) -> None:
    """``log_error_weight`` adds ``support_log_error`` (the squared log-probability error over
    each position's possible tokens), ``support_mass_weight`` adds ``support_log_mass``, each
    linearly to the soft cross-entropy; 0 leaves it alone; a negative weight is refused and a
    resumed run may change either."""
    import dllm_decode.train.testbed_long as tl
    from dllm_decode.train.testbed_long_config import NOT_PINNED

    codec = long_codec()
    cfg = LongTrainConfig(batch_size=3, hidden=32, layers=1, heads=2, intermediate=64,
                          curriculum=0, tasks="shuffle")
    model = tl.build_student(cfg, codec).eval()
    with torch.no_grad():
        loss = [float(tl.step_loss(model, replace(cfg, **{field: w}), codec, 3))
                for w in (0.0, 1.0, 2.0)]
    assert loss[1] > loss[0]
    assert loss[2] - loss[0] == pytest.approx(2 * (loss[1] - loss[0]), rel=1e-5)
    assert field in NOT_PINNED
    with pytest.raises(ValueError, match=field):
        replace(cfg, **{field: -1.0})


def test_support_log_mass_is_minus_the_log_mass_on_plausible_tokens() -> None:
    """``support_log_mass`` is ``-log`` of the mass on the target's support: 0 however the mass
    splits inside it, the cross-entropy on a one-hot target, and its gradient lowers only the
    leaked tokens' logits relative to the support's."""
    from dllm_decode.train.distill_objective import support_log_mass

    targets = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]])
    p = torch.tensor([[[0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.6, 0.1]]])
    value = support_log_mass(p.log(), targets)
    assert torch.allclose(value, -torch.tensor([[0.7, 0.6]]).log())
    inside = torch.tensor([[[0.9, 0.1, 0.0, 0.0]]]).clamp_min(1e-45)
    assert support_log_mass(inside.log(), targets[:, :1]).abs().max() < 1e-6
    logits = p.log().requires_grad_(True)
    support_log_mass(logits.log_softmax(-1), targets).sum().backward()
    assert (logits.grad[0, 0, 2:] > 0).all() and (logits.grad[0, 0, :2] < 0).all()


def test_shuffle_training_answers_are_random_valid_permutations() -> None:
    """Clean shuffle answers are seeded random permutations (valid answers, most not in prompt
    order: a student must read "written" from the names, not from the slot); the targets stay
    the exact conditionals given them; ``reference`` keeps prompt order."""
    codec = long_codec()
    cfg = LongTrainConfig(batch_size=8, curriculum=0, tasks="shuffle")
    batch = make_batch(cfg, codec, 11, None)
    in_order = 0
    for r in range(8):
        items = codec.parse_prompt(batch["prompts"][r].tolist())[1]
        answer = batch["answers"][r].tolist()
        assert codec.valid("shuffle", items, answer)
        in_order += answer == codec.reference_answer({"task": "shuffle", "items": list(items)})
        want = codec.conditionals("shuffle", items, batch["noisy"][r][None])[0].float()
        torch.testing.assert_close(batch["targets"][r], want)
    assert in_order == 0
    again = make_batch(cfg, codec, 11, None)
    assert torch.equal(again["answers"], batch["answers"])
    ref = make_batch(replace(cfg, shuffle_answers="reference"), codec, 11, None)
    for r in range(8):
        items = codec.parse_prompt(ref["prompts"][r].tolist())[1]
        assert ref["answers"][r].tolist() == codec.reference_answer(
            {"task": "shuffle", "items": list(items)})
    with pytest.raises(ValueError, match="shuffle_answers"):
        replace(cfg, shuffle_answers="sorted")


def test_task_weights_draw_tasks_in_proportion_and_default_draws_are_unchanged() -> None:
    """``task_weights`` 1,2,1 draws shuffle about half the time (seeded); without weights the
    draw is ``random.choice`` over the tasks, as before the knob existed (resumed runs go on
    with the same data)."""
    from collections import Counter

    import dllm_decode.train.testbed_long as tl

    codec = long_codec()
    cfg = LongTrainConfig(batch_size=32, curriculum=0, task_weights="1,2,1")
    counts = Counter(t for s in range(20) for t, _ in tl.draw_batch(cfg, codec, s)[0])
    assert 0.42 < counts["shuffle"] / 640 < 0.58 and counts["copy"] and counts["carry"]
    assert tl.draw_batch(cfg, codec, 3) == tl.draw_batch(cfg, codec, 3)
    plain = LongTrainConfig(batch_size=8, curriculum=0)
    rng = random.Random(f"{plain.seed}:5:long-data")
    first = rng.choice(plain.task_list)  # the old draw's first row
    assert tl.draw_batch(plain, codec, 5)[0][0][0] == first
    only = LongTrainConfig(batch_size=16, curriculum=0, task_weights="0,1,0")
    assert {t for t, _ in tl.draw_batch(only, codec, 0)[0]} == {"shuffle"}
    for bad in ("1,2", "a,b,c", "0,0,0", "1,-1,1"):
        with pytest.raises(ValueError, match="task_weights"):
            LongTrainConfig(task_weights=bad)


def test_shuffle_regrow_and_focus_restart_shuffle_lists_on_cut_down_canvases() -> None:
    """From ``START`` shuffle's lists grow again from 3 names over ``N`` steps; with
    ``shuffle_focus`` 3, three of every four steps in that window are shuffle-only and fed as
    cut-down canvases, the fourth is a mixed full-canvas step; after the window the lists
    have their full range and the shuffle-only steps go on (cut-down) until ``shuffle_focus``
    is 0."""
    import dllm_decode.train.testbed_long as tl

    codec = long_codec()
    cfg = LongTrainConfig(batch_size=32, curriculum=10, shuffle_regrow="100:40",
                          shuffle_focus=3)
    lo, hi = tl.lengths("shuffle", 128)
    before = tl.draw_batch(cfg, codec, 99)
    assert not before[1] and {t for t, _ in before[0]} == set(LONG_TASKS)
    for step in range(100, 148):
        rows, cut_down = tl.draw_batch(cfg, codec, step)
        k = [len(i) for t, i in rows if t == "shuffle"]
        grown = round(3 + (hi - 3) * min(1, (step - 99) / 40))
        assert k and max(k) <= grown
        if step >= 140:
            assert min(k) >= lo
        if (step - 100) % 4 < 3:
            assert {t for t, _ in rows} == {"shuffle"} and cut_down
            batch = make_batch(cfg, codec, step, None)
            assert int(batch["width"]) < codec.gen_length  # a cut-down canvas
        else:
            assert {t for t, _ in rows} == set(LONG_TASKS) and not cut_down
            assert int(make_batch(cfg, codec, step, None)["width"]) == codec.gen_length
    rows, cut_down = tl.draw_batch(replace(cfg, shuffle_focus=0), codec, 140)
    assert not cut_down and min(len(i) for t, i in rows if t == "shuffle") >= lo
    assert {t for t, _ in rows} == set(LONG_TASKS)
    assert tl.draw_batch(replace(cfg, shuffle_regrow=""), codec, 120) == tl.draw_batch(
        LongTrainConfig(batch_size=32, curriculum=10), codec, 120)
    for bad in ("100", "a:b", "-1:5", "5:0"):
        with pytest.raises(ValueError, match="shuffle_regrow"):
            LongTrainConfig(shuffle_regrow=bad)
    with pytest.raises(ValueError, match="shuffle_focus"):
        LongTrainConfig(shuffle_focus=-1)
    from dllm_decode.train.testbed_long_config import NOT_PINNED

    assert {"task_weights", "shuffle_regrow", "shuffle_focus"} <= set(NOT_PINNED)


def test_command_line_rebuilds_the_settings_it_quotes() -> None:
    from dllm_decode.train.testbed_long import parse_args
    from dllm_decode.train.testbed_long_config import command_line

    cfg = LongTrainConfig(family="sdar", out="runs/x y", lr=5e-4, task_weights="1,2,1",
                          shuffle_regrow="10:300", resume=True)
    line = command_line(cfg)
    assert line.startswith("dllm-decode train testbed-long --family sdar")
    assert "--resume" in line and "--seed" not in line  # defaults are left out
    assert parse_args(shlex.split(line)[3:]) == cfg
    assert command_line(LongTrainConfig()) == "dllm-decode train testbed-long --family llada"
