"""The test bed: calibrated oracle, word-level tokenizer/codec, distillation trainer, eval
defaults that fit the bundled checkpoints."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import yaml

from dllm_decode.eval.runner import left_pad
from dllm_decode.models.calibration import Calibration
from dllm_decode.models.oracle import NEG_LOGIT
from dllm_decode.train.state import load_state, save_state
from dllm_decode.train.testbed import (
    TESTBED_GEN_LENGTH,
    TESTBED_NAMES,
    grade,
    prompt_text,
    waiting_line_oracle,
    waiting_line_records,
    write_tokenizer,
)
from dllm_decode.train.testbed_eval import EVEN_SPLIT, decode_tasks

ROOT = Path(__file__).resolve().parents[1]
G = TESTBED_GEN_LENGTH


def _answer_logits(oracle, task: str, n: int = 4):
    recs = waiting_line_records(task, n)
    prompts = [oracle.encode_prompt(task, r) for r in recs]
    ids, attn = left_pad(prompts, oracle.pad_token_id)
    canvas = torch.cat([ids, torch.full((n, G), oracle.mask_token_id)], 1)
    pos = torch.arange(canvas.shape[1]).expand_as(canvas)
    return oracle(canvas, pos)[:, ids.shape[1]:], recs


# ---- calibrated oracle ----------------------------------------------------------------------

def test_default_calibration_is_the_exact_oracle() -> None:
    exact = waiting_line_oracle()
    assert exact.calibration.exact
    logits, _ = _answer_logits(exact, "shuffle")
    assert logits.min() == NEG_LOGIT  # impossible tokens keep the exact oracle's logit


def test_floor_makes_margins_finite_and_keeps_the_argmax() -> None:
    exact = waiting_line_oracle()
    cal = exact.calibrated(floor=1e-6)
    for task in ("copy", "insert_random"):
        e, _ = _answer_logits(exact, task)
        c, _ = _answer_logits(cal, task)
        assert torch.equal(e.argmax(-1), c.argmax(-1))
        top2 = c.topk(2, dim=-1).values
        margin = top2[..., 0] - top2[..., 1]
        assert margin.max() == pytest.approx(-torch.log(torch.tensor(1e-6)).item(), rel=1e-4)
        assert c.min() > -14.0


def test_temperature_scales_and_noise_is_seeded_per_prompt() -> None:
    base = waiting_line_oracle().calibrated(floor=1e-6)
    hot = waiting_line_oracle().calibrated(floor=1e-6, temperature=2.0)
    a, _ = _answer_logits(base, "copy")
    b, _ = _answer_logits(hot, "copy")
    assert torch.allclose(b, a / 2)
    noisy = waiting_line_oracle().calibrated(floor=1e-6, noise=0.5, seed=3)
    n1, _ = _answer_logits(noisy, "copy")
    n2, _ = _answer_logits(noisy, "copy")
    assert torch.equal(n1, n2) and not torch.equal(n1, a)
    other = waiting_line_oracle().calibrated(floor=1e-6, noise=0.5, seed=4)
    assert not torch.equal(_answer_logits(other, "copy")[0], n1)


def test_confusion_moves_mass_to_a_name_with_the_same_first_name() -> None:
    cal = waiting_line_oracle().calibrated(floor=1e-9, confusion=0.2)
    logits, recs = _answer_logits(cal, "copy", 1)
    probs = logits.double().softmax(-1)[0]
    first = json.loads(recs[0]["input"]["context"])[0]
    pos = 1  # the first name of the answer
    top2 = probs[pos].topk(2)
    assert cal.vocab[int(top2.indices[0])] == first
    assert top2.values[0].item() == pytest.approx(0.8, abs=1e-4)
    assert top2.values[1].item() == pytest.approx(0.2, abs=1e-4)
    assert cal.vocab[int(top2.indices[1])].split()[0] == first.split()[0]


@pytest.mark.parametrize("bad", [{"floor": -1.0}, {"temperature": 0.0}, {"noise": float("nan")},
                                 {"confusion": 1.0}, {"temperature": "hot"}, {"seed": 1.5}])
def test_calibration_rejects_bad_knobs(bad: dict) -> None:
    with pytest.raises(ValueError, match="calibration"):
        Calibration(**bad)


def _sched_run(oracle, tau_low: float) -> tuple[float, float]:
    rows = decode_tasks(oracle, oracle, 6, policy="sched", base="low_confidence",
                        tau_low=tau_low, tau_high=max(7.5, tau_low))
    flat = [r for v in rows.values() for r in v]
    return (sum(r["valid"] for r in flat) / len(flat), sum(r["nfe"] for r in flat) / len(flat))


def test_sched_responds_to_tau_low_on_the_calibrated_oracle(one_thread: None) -> None:
    """On the exact oracle SchED exits at NFE 2 whatever tau_low; on the calibrated one its
    NFE and accuracy move monotonically with tau_low (0 -> 2.5 -> 5)."""
    exact = waiting_line_oracle()
    assert _sched_run(exact, 0.0) == _sched_run(exact, 5.0)
    cal = waiting_line_oracle().calibrated(floor=1e-6, temperature=2.0)
    runs = [_sched_run(cal, t) for t in (0.0, 2.5, 5.0)]
    accs, nfes = zip(*runs, strict=True)
    assert nfes[0] < nfes[1] < nfes[2]
    assert accs[0] < accs[1] <= accs[2]


# ---- word-level vocabulary, tokenizer, records -------------------------------------------------

def test_tokenizer_round_trips_the_oracle_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    oracle = waiting_line_oracle()
    write_tokenizer(oracle, tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == oracle.vocab_size
    for task in ("insert_index", "replace_random", "reverse"):
        for rec in waiting_line_records(task, 3):
            ids = oracle.encode_prompt(task, rec)
            assert tok(prompt_text(oracle, ids))["input_ids"] == ids
    assert tok.mask_token_id == oracle.mask_token_id and tok.eos_token_id == oracle.eos_token_ids[0]


def test_records_use_the_pool_and_splits_are_disjoint() -> None:
    test = waiting_line_records("copy", 40)
    train = waiting_line_records("copy", 40, seed=1, split="train")
    names = set(TESTBED_NAMES)
    for rec in test + train:
        items = json.loads(rec["input"]["context"])
        assert 3 <= len(items) <= 5 and set(items) <= names
    assert not {r["input"]["context"] for r in test} & {r["input"]["context"] for r in train}


def test_grade_accepts_any_valid_answer() -> None:
    rec = waiting_line_records("insert_random", 1, length=3)[0]
    items = json.loads(rec["input"]["context"])
    word = rec["input"]["word"]
    assert grade("insert_random", rec, json.dumps([word, *items]))
    assert grade("insert_random", rec, json.dumps([*items, word]))
    assert not grade("insert_random", rec, json.dumps(items))
    assert not grade("insert_random", rec, "not json")


# ---- distillation trainer -----------------------------------------------------------------------

def test_distill_runs_resumes_and_exports(tmp_path: Path, one_thread: None) -> None:
    from dllm_decode import load_model
    from dllm_decode.train.distill import DistillConfig, distill

    common = dict(family="dream", hidden=32, layers=1, heads=2, intermediate=64, batch_size=4,
                  log_every=2, ckpt_every=2, eval_every=0, eval_size=1)
    straight = distill(DistillConfig(out=str(tmp_path / "a"), steps=4, **common))
    distill(DistillConfig(out=str(tmp_path / "b"), steps=2, **common))
    distill(DistillConfig(out=str(tmp_path / "b"), steps=4, resume=True, **common))
    a = (tmp_path / "a/loss.csv").read_text().splitlines()
    b = (tmp_path / "b/loss.csv").read_text().splitlines()
    assert [r.split(",")[:3] for r in a] == [r.split(",")[:3] for r in b]  # step, loss, kl
    assert straight["steps_done"] == 4
    model = load_model(tmp_path / "a/model")
    assert model.vocab_size == waiting_line_oracle().vocab_size
    with pytest.raises(FileExistsError, match="--resume"):
        distill(DistillConfig(out=str(tmp_path / "a"), steps=4, **common))



def test_weight_average_is_exported_and_resumes_exactly(tmp_path: Path, one_thread: None) -> None:
    from dllm_decode import load_model
    from dllm_decode.train.distill import (
        DistillConfig,
        distill,
        export_checkpoint,
        export_weights,
    )
    from dllm_decode.train.ema import WeightAverage

    common = dict(family="llada", hidden=32, layers=1, heads=2, intermediate=64, batch_size=4,
                  log_every=2, ckpt_every=2, eval_every=0, eval_size=1, ema=0.5,
                  log_error_weight=0.5, rank_error_weight=1.0)
    distill(DistillConfig(out=str(tmp_path / "a"), steps=4, **common))
    distill(DistillConfig(out=str(tmp_path / "b"), steps=2, **common))
    distill(DistillConfig(out=str(tmp_path / "b"), steps=4, resume=True, **common))
    a = load_state(tmp_path / "a/checkpoint.safetensors")
    b = load_state(tmp_path / "b/checkpoint.safetensors")
    for name, value in a["ema"].items():  # the average continues exactly across a resume
        assert torch.equal(value, b["ema"][name]), name
    # decay 0.5 over 4 steps: the average differs from the last iterate, and the exported
    # model (fp16) is the average, not the iterate
    key = next(k for k, v in a["ema"].items() if k.startswith("layers.0") and v.dim() == 2)
    assert not torch.equal(a["ema"][key], a["model"][key])
    exported = load_model(tmp_path / "a/model").state_dict()
    assert torch.equal(exported[key].float(), a["ema"][key].half().float())
    export_checkpoint(tmp_path / "a", tmp_path / "again")
    assert torch.equal(load_model(tmp_path / "again").state_dict()[key], exported[key])
    # the run's evaluation schedule survives an export (model cards read it from run.json):
    # from the checkpoint, else from the run.json already there, else absent
    run_json = tmp_path / "a/run.json"
    assert json.loads(run_json.read_text())["eval_schedule"] == EVEN_SPLIT
    old = dict(a)
    del old["eval_schedule"]  # a checkpoint written before the key existed
    save_state(tmp_path / "a/checkpoint.safetensors", old)
    assert export_checkpoint(tmp_path / "a", tmp_path / "again")["eval_schedule"] == EVEN_SPLIT
    run_json.unlink()
    assert "eval_schedule" not in export_checkpoint(tmp_path / "a", tmp_path / "again")
    save_state(tmp_path / "a/checkpoint.safetensors", a)  # its run.json now lacks the key
    assert export_checkpoint(tmp_path / "a", tmp_path / "again")["eval_schedule"] == EVEN_SPLIT
    export_weights(tmp_path / "a", tmp_path / "weights.safetensors")  # the averaged weights
    kept = load_state(tmp_path / "weights.safetensors")
    assert set(kept) == {"model", "step", "wall_s", "config"}
    assert torch.equal(kept["model"][key].float(), exported[key].float())
    # --grow-average continues from the average (what was evaluated), not the last iterate
    from dllm_decode.train.distill import _grow_weights

    ckpt = str(tmp_path / "a/checkpoint.safetensors")
    start = _grow_weights(DistillConfig(grow_from=ckpt, grow_average=True, **common))
    assert torch.equal(start[key], a["ema"][key]) and set(start) == set(a["model"])
    assert torch.equal(_grow_weights(DistillConfig(grow_from=ckpt, **common))[key],
                       a["model"][key])
    grown = distill(DistillConfig(out=str(tmp_path / "c"), steps=2, grow_from=ckpt,
                                  grow_average=True, **common))
    assert "--grow-average" in grown["command"]
    with pytest.raises(ValueError, match="holds no weight average"):
        _grow_weights(DistillConfig(grow_from=str(tmp_path / "weights.safetensors"),
                                    grow_average=True))
    with pytest.raises(ValueError, match="grow_average needs grow_from"):
        DistillConfig(grow_average=True)
    with pytest.raises(ValueError, match="ema must lie in"):
        DistillConfig(ema=1.0)
    with pytest.raises(ValueError, match="decay must lie in"):
        WeightAverage(torch.nn.Linear(2, 2), 0.0)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_growing_depth_keeps_the_shallow_models_function(tmp_path: Path, family: str,
                                                         one_thread: None) -> None:
    from dllm_decode.train.distill import (
        DistillConfig,
        build_student,
        distill,
        distill_loss,
        grow_into,
        make_batch,
    )

    oracle = waiting_line_oracle()
    common = dict(family=family, hidden=32, heads=2, intermediate=64, batch_size=4,
                  log_every=2, ckpt_every=2, eval_every=0, eval_size=1)
    shallow_cfg = DistillConfig(out=str(tmp_path / "s"), steps=2, layers=2, **common)
    distill(shallow_cfg)
    state = load_state(tmp_path / "s/checkpoint.safetensors")["model"]
    shallow = build_student(shallow_cfg, oracle)
    shallow.load_state_dict(state)
    deep = build_student(DistillConfig(layers=5, seed=3, **common), oracle)
    grow_into(deep, state)
    batch = make_batch(shallow_cfg, oracle, 7)
    with torch.no_grad():
        assert torch.equal(distill_loss(shallow.eval(), *batch)[0],
                           distill_loss(deep.eval(), *batch)[0])
        assert torch.count_nonzero(deep.layers[1].attn.o_proj.weight) == 0
    assert torch.equal(deep.state_dict()["layers.2.attn.q_proj.weight"],
                       shallow.state_dict()["layers.1.attn.q_proj.weight"])
    # wider too: hidden 32 -> 64, heads 2 -> 4 (same head size), MLP 64 -> 96; the function is
    # kept up to the RMSNorm epsilon (the mean square now runs over zero dimensions too), which
    # is negligible once activations are trained-size (here: embeddings scaled to rms ~0.4)
    state = {k: v * 20 if k in ("embed.weight", "head.weight") else v for k, v in state.items()}
    shallow.load_state_dict(state)
    wide = build_student(DistillConfig(**(common | dict(hidden=64, heads=4, intermediate=96)),
                                       layers=3, seed=4), oracle)
    grow_into(wide, state)
    with torch.no_grad():
        logits = [m.eval()(batch[0], m.rope_positions(batch[1]), mask=batch[1]).float()
                  for m in (shallow, wide)]
    torch.testing.assert_close(logits[1], logits[0], atol=2e-4, rtol=1e-4)
    wide.train()
    loss = distill_loss(wide, *batch)[0]
    loss.backward()
    assert wide.layers[0].attn.o_proj.weight.grad[32:].abs().sum() > 0  # zeroed writers learn
    with pytest.raises(ValueError, match="cannot grow hidden size 32 into 16"):
        grow_into(build_student(DistillConfig(**(common | dict(hidden=16)), layers=2), oracle),
                  state)
    with pytest.raises(ValueError, match="cannot grow a 2-layer model into 1 layers"):
        grow_into(build_student(DistillConfig(layers=1, **common), oracle), state)
    with pytest.raises(ValueError, match="grow_from must be a training state"):
        DistillConfig(grow_from=str(tmp_path / "missing.safetensors"))
    grown = distill(DistillConfig(out=str(tmp_path / "g"), steps=2, layers=3,
                                  grow_from=str(tmp_path / "s/checkpoint.safetensors"),
                                  **common))
    assert grown["config"]["layers"] == 3 and "--grow-from" in grown["command"]


def test_eos_cut_rows_end_after_the_first_eos_like_an_eotp_canvas() -> None:
    from dllm_decode.train.distill import DistillConfig, make_batch

    oracle = waiting_line_oracle()
    eos = oracle.eos_token_ids[0]
    full = make_batch(DistillConfig(), oracle, 5)
    tokens, valid, masked, targets, p = make_batch(DistillConfig(eos_cut_frac=1.0), oracle, 5)
    assert torch.equal(tokens, full[0]) and torch.equal(targets, full[3])
    answers = targets.argmax(-1)  # soft targets of an EOS position are one-hot
    for row in range(tokens.shape[0]):
        first = int((answers[row] == eos).nonzero()[0])
        assert valid[row, p:p + first + 1].all() and not valid[row, p + first + 1:].any()
        assert not masked[row, first + 1:].any()
        assert torch.equal(masked[row, :first + 1], full[2][row, :first + 1])
    with pytest.raises(ValueError, match="eos_cut_frac must lie in"):
        DistillConfig(eos_cut_frac=1.5)

@pytest.mark.parametrize("name", ["testbed-llada", "testbed-dream"])
def test_onpolicy_rows_follow_the_students_greedy_decode_and_stay_consistent(name: str) -> None:
    from dllm_decode import load_model
    from dllm_decode.train.distill import DistillConfig, make_batch
    from dllm_decode.train.onpolicy import onpolicy_rows

    oracle = waiting_line_oracle()
    model = load_model(name)  # a trained student (rows stop before an invalid commit)
    batch = make_batch(DistillConfig(eos_cut_frac=0.5, batch_size=12), oracle, 7)
    tokens, valid, masked, targets, p = batch
    out = onpolicy_rows(model, oracle, 0.5, 3, tokens, valid, masked, targets, p)
    assert all(torch.equal(a, b) for a, b in zip(batch[:4], (tokens, valid, masked, targets),
                                                 strict=True))  # inputs untouched
    t2, v2, m2, tg2 = out
    changed = [i for i in range(12) if not torch.equal(t2[i], tokens[i])]
    assert 0 < len(changed) <= 6 and not model.training
    committed = 0
    for i in changed:
        region, prompt = t2[i, p:], t2[i, :p][v2[i, :p]].tolist()
        table = oracle.answer_table(prompt, 16)
        known = region != oracle.mask_token_id
        assert ((table == region) | ~known).all(-1).any()  # consistent with a valid answer
        assert v2[i, p:].all() and torch.equal(m2[i], ~known)
        want = oracle.marginals(table, region[None])[0].float()
        assert torch.allclose(tg2[i], want)
        committed += int(known.sum())
    assert committed > 0
    # a row's committed tokens are its greedy low-confidence decode of the same prompt, in order
    i = max(changed, key=lambda r: int((t2[r, p:] != oracle.mask_token_id).sum()))
    k = int((t2[i, p:] != oracle.mask_token_id).sum())
    from dllm_decode import DiffusionSampler

    # one commit per step whatever the family (Dream's own time grid commits 0, 1, ..., 2)
    greedy = DiffusionSampler(model, "low_confidence", gen_length=16, steps=16, block_length=16,
                              schedule="llada").generate(t2[i:i + 1, :p][v2[i:i + 1, :p]][None])
    order = greedy.commit_step[0]
    assert torch.equal(order.sort().values, torch.arange(16))
    first_k = order < k
    assert torch.equal(first_k, t2[i, p:] != oracle.mask_token_id)
    assert torch.equal(greedy.answer[0][first_k], t2[i, p:][first_k])
    assert onpolicy_rows(model, oracle, 0.0, 3, *batch)[0] is tokens
    with pytest.raises(ValueError, match="onpolicy_frac must lie in"):
        DistillConfig(onpolicy_frac=2.0)


def test_onpolicy_rows_of_a_parallel_decode_keep_whole_steps() -> None:
    """``per_step=4``: the states of a 4-tokens-per-step decode (G = 16: four steps), each
    keeping the first j steps' commits of the student's own parallel decode."""
    from dllm_decode import DiffusionSampler, load_model
    from dllm_decode.train.distill import DistillConfig, make_batch
    from dllm_decode.train.onpolicy import onpolicy_rows

    oracle = waiting_line_oracle()
    model = load_model("testbed-llada")
    tokens, valid, masked, targets, p = make_batch(DistillConfig(batch_size=12), oracle, 5)
    t2, v2, m2, _ = onpolicy_rows(model, oracle, 1.0, 4, tokens, valid, masked, targets, p,
                                  per_step=4)
    mask_id = oracle.mask_token_id
    counts = set()
    for i in range(12):
        prompt = t2[i:i + 1, :p][v2[i:i + 1, :p]][None]
        decode = DiffusionSampler(model, "low_confidence", gen_length=16, steps=4,
                                  block_length=16, schedule="llada").generate(prompt)
        known = t2[i, p:] != mask_id
        j = int(known.sum()) // 4
        assert int(known.sum()) == 4 * j  # whole steps only
        assert torch.equal(known, decode.commit_step[0] < j)
        assert torch.equal(t2[i, p:][known], decode.answer[0][known])
        assert torch.equal(m2[i], ~known)
        counts.add(j)
    assert len(counts) > 1  # states after different numbers of steps
    with pytest.raises(ValueError, match="onpolicy_k must be >= 1"):
        DistillConfig(onpolicy_k=0)


def test_onpolicy_hard_rows_stop_at_the_first_disagreement_with_the_oracle() -> None:
    """``hard=1``: every row stops just before the first step of the student's 4-per-step
    rollout that commits a token the exact oracle does not rank first at that state (checked
    step by step here); a student that never disagrees (the exact oracle itself) keeps the
    random stops, so ``hard`` changes nothing for it."""
    from dllm_decode import DiffusionSampler
    from dllm_decode.train.distill import DistillConfig, make_batch
    from dllm_decode.train.onpolicy import onpolicy_rows

    oracle = waiting_line_oracle()
    mask_id = oracle.mask_token_id
    batch = make_batch(DistillConfig(batch_size=16, task_weight="insert_random=20"), oracle, 9)
    tokens, valid, masked, targets, p = batch
    student = oracle.calibrated(floor=1e-6, noise=0.7, seed=5)  # disagrees at near-ties
    t2, v2, m2, tg2 = onpolicy_rows(student, oracle, 1.0, 4, tokens, valid, masked, targets, p,
                                    per_step=4, hard=1.0)
    stopped = 0
    for i in range(16):
        # the same left-padded canvas as the rollout (the noise is keyed on the prompt ids)
        run = DiffusionSampler(student, "low_confidence", gen_length=16, steps=4,
                               block_length=16, schedule="llada").generate(
            t2[i:i + 1, :p], v2[i:i + 1, :p].long())
        table = oracle.answer_table(t2[i, :p][v2[i, :p]].tolist(), 16)
        order, answer = run.commit_step[0], run.answer[0]
        first = None
        for j in range(4):
            state = torch.where((order >= 0) & (order < j), answer, mask_id)
            probs = oracle.marginals(table, state[None])[0]
            step = order == j
            if (probs[step].max(-1).values > probs[step, answer[step]] + 1e-9).any():
                first = j
                break
        known = t2[i, p:] != mask_id
        if first is not None:
            stopped += 1
            assert torch.equal(known, (order >= 0) & (order < first))
            assert torch.equal(t2[i, p:][known], answer[known])
        assert torch.equal(m2[i], ~known)
        assert torch.allclose(tg2[i], oracle.marginals(table, t2[i:i + 1, p:])[0].float())
    assert stopped >= 4
    plain = onpolicy_rows(oracle, oracle, 1.0, 4, *batch[:4], p, per_step=4)
    hard = onpolicy_rows(oracle, oracle, 1.0, 4, *batch[:4], p, per_step=4, hard=1.0)
    assert all(torch.equal(a, b) for a, b in zip(plain, hard, strict=True))
    with pytest.raises(ValueError, match="onpolicy_hard must lie in"):
        DistillConfig(onpolicy_hard=-0.5)


def test_ambiguous_state_fit_is_zero_for_the_oracle_and_measures_a_students_error() -> None:
    """The oracle fits its own ambiguous states exactly; a learned model does not (the
    test-bed students misrank the contested names of insert_random); a deterministic task has
    no ambiguous position."""
    from dllm_decode import load_model
    from dllm_decode.train.testbed_eval import ambiguous_state_fit

    oracle = waiting_line_oracle()
    exact = ambiguous_state_fit(oracle, oracle, 8, "insert_random", seed=3)
    assert exact["positions"] >= 4 and abs(exact["kl"]) < 1e-4
    assert exact["argmax_miss"] == exact["prompts_missed"] == 0.0
    student = ambiguous_state_fit(load_model("testbed-llada"), oracle, 8, "insert_random", seed=3)
    assert student["positions"] == exact["positions"] and student["kl"] > 0.01
    assert ambiguous_state_fit(oracle, oracle, 4, "copy")["positions"] == 0.0


def test_insert_slot_calibration_is_the_oracle_for_the_oracle() -> None:
    """Per list length and slot: the oracle reproduces its own marginals (inserted name
    1 / (n + 1), left neighbour s / (n + 1), right (n - s) / (n + 1)) and never ranks the
    inserted name first; a student's rows have the same layout and are probabilities."""
    from dllm_decode import load_model
    from dllm_decode.train.testbed_eval import insert_slot_calibration

    oracle = waiting_line_oracle()
    rows = insert_slot_calibration(oracle, oracle, 12, seed=2)
    assert {r["length"] for r in rows} <= {3, 4, 5} and rows
    for r in rows:
        n, s = r["length"], r["slot"]
        assert r["oracle_x"] == pytest.approx(1 / (n + 1))
        assert r["oracle_left"] == pytest.approx(s / (n + 1))
        assert r["oracle_right"] == pytest.approx((n - s) / (n + 1))
        for side in ("x", "left", "right"):
            assert r[f"model_{side}"] == pytest.approx(r[f"oracle_{side}"], abs=1e-6)  # fp32
        assert r["argmax_x"] == 0.0
    student = insert_slot_calibration(load_model("testbed-llada"), oracle, 12, seed=2)
    assert [(r["length"], r["slot"]) for r in student] == [(r["length"], r["slot"]) for r in rows]
    assert all(0 <= r["model_x"] + r["model_left"] + r["model_right"] <= 1 + 1e-9
               for r in student)


def test_decode_tasks_commits_one_token_per_step_for_every_family(one_thread: None) -> None:
    """``steps = G`` is one token per step for a Dream-family model too (the even split), not
    Dream's time grid, whose last step commits two names at once on a random task."""
    oracle = waiting_line_oracle()
    dream_like = waiting_line_oracle()
    dream_like.family = "dream"  # the exact conditionals, decoded with Dream's defaults
    even = decode_tasks(dream_like, oracle, 12, tasks=("shuffle",))["shuffle"]
    assert all(r["valid"] and r["nfe"] == G for r in even)
    grid = decode_tasks(dream_like, oracle, 12, tasks=("shuffle",), schedule="dream")["shuffle"]
    assert sum(r["valid"] for r in grid) < len(grid) // 2  # tied names collide at the end


# ---- evaluation defaults that fit the bundled checkpoints ------------------------------------

def test_grids_naming_a_bundled_tiny_model_are_zero_shot() -> None:
    for path in sorted((ROOT / "benchmarks/grids").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if str(raw.get("model", "")).startswith("tiny-"):
            assert raw.get("icl_examples") == 0, f"{path.name} renders one-shot prompts"


def test_readme_grid_scores_above_zero_on_the_bundled_model(tmp_path: Path,
                                                            one_thread: None) -> None:
    from dllm_decode.eval.runner import run_sweep
    from tests.docs_text import docs_text

    assert "--grid benchmarks/grids/tiny_cpu.yaml" in docs_text()
    args = types.SimpleNamespace(grid=str(ROOT / "benchmarks/grids/tiny_cpu.yaml"),
                                 out=str(tmp_path / "pb"), limit=2, no_progress=True)
    summary = run_sweep(args)
    rows = [json.loads(line) for line in Path(summary.rows_path).read_text().splitlines()]
    copy = [r["score"] for r in rows if r["task"] == "waiting_line/copy"]
    assert copy and sum(copy) > 0


def test_slots_put_every_list_item_at_a_fixed_offset_from_answer() -> None:
    oracle = waiting_line_oracle()
    answer_id, first = oracle.token_id["<answer>"], oracle.token_id["["]
    for length in (3, 4, 5):
        rec = waiting_line_records("copy", 1, length=length)[0]
        ids = oracle.encode_prompt("copy", rec)
        assert len(ids) - ids.index(first) == 2 * oracle.slots + 2  # "[" .. fill, <answer>
        assert ids[-1] == answer_id
        assert oracle.parse_prompt(ids)[1] == tuple(json.loads(rec["input"]["context"]))
    with pytest.raises(ValueError, match="slots"):
        type(oracle)(TESTBED_NAMES[:10], max_items=3, slots=4)


def test_scrambled_copy_warm_up_matches_the_slot_geometry() -> None:
    from dllm_decode.train.distill import DistillConfig, make_batch

    oracle = waiting_line_oracle()
    cfg = DistillConfig(scramble_steps=10, scramble_fixed=10, scramble_items=11)
    tokens, valid, masked, targets, p = make_batch(cfg, oracle, 0)
    span = tokens[:, p - 12:p - 1]  # the 11 tokens before <answer>
    assert torch.equal(targets[:, :11].argmax(-1), span)  # copy at offset 12, as in tasks
    assert (tokens[:, p - 1] == oracle.token_id["<answer>"]).all()
    assert masked.any(-1).all()


def test_readme_test_bed_snippet_runs(one_thread: None, capsys: pytest.CaptureFixture) -> None:
    import re
    import textwrap

    from tests.docs_text import doc_section

    section = doc_section("## A test bed on which decoding methods differ")
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    exec(compile(textwrap.dedent(block.group(1)), "docs test bed", "exec"), {})
    answer = capsys.readouterr().out.split("]")[0] + "]"
    assert len(json.loads(answer)) >= 3


@pytest.mark.parametrize("name", ["testbed-llada", "testbed-dream"])
def test_bundled_testbed_checkpoints_copy_held_out_lists(name: str, one_thread: None) -> None:
    """The bundled word-level checkpoints load by name, fit the size budget, ship their codec
    and copy held-out lists at one token per step (other seeds than the card's)."""
    from dllm_decode import load_model
    from dllm_decode.models.loading import resolve_path
    from dllm_decode.train.testbed import codec_for

    directory = resolve_path(name)
    assert (directory / "model.safetensors").stat().st_size <= 8 * 2**20
    codec = codec_for(directory)
    assert codec is not None and codec.vocab == waiting_line_oracle().vocab
    model = load_model(name)
    rows = decode_tasks(model, codec, 10, seed=12345, tasks=("copy",))
    assert all(r["valid"] for r in rows["copy"])


def test_word_level_prompts_through_the_text_api(one_thread: None) -> None:
    from dllm_decode import DiffusionSampler, generate_text, load_model, load_tokenizer

    model, tok = load_model("testbed-llada"), load_tokenizer("testbed-llada")
    sampler = DiffusionSampler(model, "threshold", gen_length=G)
    prompt = "<reverse> [ Amelia Abbott , Bruno Adler , Carl Bell ] " + "<fill> " * 4 + "<answer>"
    out = generate_text(sampler, tok, prompt)
    # the benchmark's list format (what the graders read), not the word tokens
    assert out.texts[0] == '["Carl Bell", "Bruno Adler", "Amelia Abbott"]'
    with pytest.raises(ValueError, match="outside this tokenizer's vocabulary"):
        generate_text(sampler, tok, "<copy> [ Nobody Here ] <answer>")


def test_task_weight_overrides_the_draw_weights() -> None:
    from dllm_decode.train.distill import DistillConfig

    weights = DistillConfig(random_weight=3.0, task_weight="insert_random=8, copy=0").task_weights()
    assert weights["insert_random"] == 8.0 and weights["copy"] == 0.0
    assert weights["shuffle"] == 3.0 and weights["remove_random"] == 1.0
    for bad in ("sort=2", "insert_random", "shuffle=-1", "shuffle=x"):
        with pytest.raises(ValueError, match="task_weight"):
            DistillConfig(task_weight=bad)


def test_support_log_error_fits_the_log_probabilities_of_plausible_tokens() -> None:
    from dllm_decode.train.distill import DistillConfig
    from dllm_decode.train.distill_objective import support_log_error

    targets = torch.tensor([[[0.0, 0.2, 0.4, 0.4], [0.0, 0.0, 1.0, 0.0]]])
    exact = targets.clamp_min(1e-30).log() + 3.0  # any shift of the logits is the same fit
    exact[..., 0] = -40.0  # an impossible token at (almost) no mass
    assert support_log_error(exact.log_softmax(-1), targets).abs().max() < 1e-6
    # a 0.2 name pushed up by 0.6 nat: every plausible token's log-probability moves
    off = exact.clone()
    off[0, 0, 1] += 0.6
    logp = off.log_softmax(-1)
    value = support_log_error(logp, targets)
    d = logp[0, 0, 1:] - targets[0, 0, 1:].log()
    assert torch.allclose(value[0, 0], d.square().mean())
    assert value[0, 1].abs() < 1e-6  # a certain position predicted so adds nothing
    # mass moved onto an impossible token is an error too (a centred fit would not see it)
    leaky = exact.clone()
    leaky[0, 1, 0] = leaky[0, 1, 2]  # half the mass of the certain position leaks
    assert support_log_error(leaky.log_softmax(-1), targets)[0, 1] > 0.4
    # the gradient lowers the over-predicted name and raises the other two
    off.requires_grad_(True)
    support_log_error(off.log_softmax(-1), targets).sum().backward()
    assert off.grad[0, 0, 1] > 0 and (off.grad[0, 0, 2:] < 0).all()
    with pytest.raises(ValueError, match="log_error_weight"):
        DistillConfig(log_error_weight=-1.0)


def test_support_rank_error_charges_only_pairs_about_to_flip() -> None:
    from dllm_decode.train.distill import DistillConfig
    from dllm_decode.train.distill_objective import support_rank_error

    # slot 0: an original neighbour at 1/2 over two names at 1/4 (insert_random's middle
    # slot); slot 1: certain; slot 2: a three-way tie (shuffle): no order to keep
    targets = torch.tensor([[[0.0, 0.25, 0.5, 0.25], [0.0, 0.0, 1.0, 0.0],
                             [0.0, 1 / 3, 1 / 3, 1 / 3]]])
    exact = targets.clamp_min(1e-30).log()
    exact[..., 0] = -40.0
    assert support_rank_error(exact.log_softmax(-1), targets).abs().max() < 1e-6
    # a 1/4 name raised by 0.2 nat keeps more than half the log 2 ratio: no charge
    small = exact.clone()
    small[0, 0, 1] += 0.2
    assert support_rank_error(small.log_softmax(-1), targets)[0, 0].abs() < 1e-6
    # raised by 0.6 nat: the pair (2 over 1) falls 0.6 - log 2 / 2 short; 2 ordered pairs
    off = exact.clone()
    off[0, 0, 1] += 0.6
    value = support_rank_error(off.log_softmax(-1), targets)
    short = 0.6 - 0.5 * torch.tensor(2.0).log()
    assert torch.allclose(value[0, 0], short.square() / 2)
    assert value[0, 1:].abs().max() < 1e-6  # ties and certain slots add nothing
    # margin 1 charges any shrinking of the ratio
    assert support_rank_error(small.log_softmax(-1), targets, margin=1.0)[0, 0] > 0
    # the gradient lowers the name that overtakes and raises the one it overtakes
    off.requires_grad_(True)
    support_rank_error(off.log_softmax(-1), targets).sum().backward()
    assert off.grad[0, 0, 1] > 0 and off.grad[0, 0, 2] < 0
    with pytest.raises(ValueError, match="margin"):
        support_rank_error(exact, targets, margin=0.0)
    with pytest.raises(ValueError, match="rank_error_weight"):
        DistillConfig(rank_error_weight=-1.0)
    with pytest.raises(ValueError, match="rank_margin"):
        DistillConfig(rank_margin=1.5)
