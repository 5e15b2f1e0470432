"""The shuffle probe of the long-answer students (``train/testbed_long_probe.py``)."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_decode.eval.parallelbench.testbed_long import long_codec, long_oracle
from dllm_decode.train.testbed_long import LongTrainConfig, build_student, train
from dllm_decode.train.testbed_long_probe import load_student, main, shuffle_probe

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("lists", [(4, 5), (16, 32)])
def test_the_exact_posterior_scores_exactly(lists: tuple[int, int]) -> None:
    """The oracle puts all its mass on the open names, none on written ones; the
    no-exclusion reference is the written share of the prompt's names (in (0, 1))."""
    out = shuffle_probe(long_oracle(128), long_codec(), lists=lists, n=12, seed=3)
    assert out["open_mass"] == pytest.approx(1.0) and out["written_mass"] == 0.0
    assert out["argmax_open"] == 1.0 and out["open_slots"] > 0
    assert 0 < out["uniform_written_mass"] < 1


def test_a_fresh_student_is_near_chance_and_the_probe_is_seeded() -> None:
    codec = long_codec()
    model = build_student(LongTrainConfig(hidden=32, layers=1, heads=2, intermediate=64),
                          codec).eval()
    out = shuffle_probe(model, codec, n=8, seed=1)
    assert out == shuffle_probe(model, codec, n=8, seed=1)
    assert 0 <= out["written_mass"] < out["uniform_written_mass"] + 0.2
    assert out["open_mass"] < 0.3  # ~5 of the 100 names open: chance is ~0.05
    assert shuffle_probe(model, codec, n=8, seed=2) != out
    widths = []
    forward = model.forward
    model.forward = lambda tokens, *a, **k: widths.append(tokens.shape[1]) or forward(
        tokens, *a, **k)
    cut = shuffle_probe(model, codec, n=8, seed=1, cut_down=True)  # the trainer's columns
    assert cut["open_slots"] == out["open_slots"]
    assert widths == [2 * (2 * 5 + 1) + 2]  # task token, region, <answer>, answer: 5 names
    with pytest.raises(ValueError, match="whole canvas"):  # the oracle refuses them
        shuffle_probe(long_oracle(128), codec, n=4, cut_down=True)


def test_the_cli_reads_a_run_directory(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    train(LongTrainConfig(out=str(run), batch_size=2, hidden=32, layers=1, heads=2,
                          intermediate=64, curriculum=2, steps=2))
    assert main([str(run), "--n", "4", "--lists", "3:4"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["step"] == 2 and line["lists"] == [3, 4] and 0 <= line["open_mass"] <= 1
    model, codec, step = load_student(run)
    assert step == 2 and codec.vocab_size == model.vocab_size
    assert isinstance(model, torch.nn.Module)
    with pytest.raises(ValueError, match="neither a testbed-long run"):
        load_student(tmp_path)
    with pytest.raises(SystemExit):
        main([str(run), "--lists", "4-5"])
