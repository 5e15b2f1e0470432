"""One meaning of "tokens per forward" (``dllm_decode.speed``): answer tokens up to EOS per
forward, the same number wherever the library prints it for the same decode."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from dllm_decode import (
    DiffusionSampler,
    check_policy,
    cli,
    generate_text,
    load_model,
    load_tokenizer,
)
from dllm_decode.speed import answer_lengths, tokens_per_forward
from tests.test_clean_tree import PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def test_answer_lengths_stop_at_the_first_stop_token_or_the_cut() -> None:
    answer = torch.tensor([[5, 6, 9, 9], [5, 6, 7, 8], [9, 5, 6, 7]])
    assert answer_lengths(answer, [9]) == [2, 4, 0]
    assert answer_lengths(answer, [9], lengths=torch.tensor([1, 3, 4])) == [1, 3, 0]
    assert tokens_per_forward([2, 4, 0], [2, 4, 2]) == pytest.approx(6 / 8)
    with pytest.raises(ValueError, match="NFE"):
        tokens_per_forward([1], [0])


def test_cli_plot_example_and_check_policy_report_one_figure(tmp_path, monkeypatch,
                                                             capfd) -> None:
    """low_confidence at one token per step: 10 answer tokens, then EOS fill, in 32 forwards.
    The CLI line, the ``--plot`` title, ``examples/compare_policies.py`` and ``check_policy``
    all say 10 / 32 = 0.31 tokens/forward (before: 0.31, 1.00, 1.00 and 1.00)."""
    import dllm_decode.plot as plot

    figures = []

    def keep(*args, **kwargs):
        figures.append(original(*args, **kwargs))
        return figures[-1]

    original = plot.plot_decoding
    monkeypatch.setattr(plot, "plot_decoding", keep)
    argv = ["generate", PROMPT, "--gen-length", "32", "--policy", "low_confidence",
            "--plot", str(tmp_path / "order.png")]
    assert cli.main(argv) == 0
    err = capfd.readouterr().err
    printed = float(re.search(r"tokens/forward=([0-9.]+)", err).group(1))
    assert "(10 answer tokens up to EOS / 32 forwards)" in err
    assert "tokens/step=1.00 (the 32-token budget, EOS fill included)" in err
    title = figures[0]._suptitle.get_text()
    assert f"{10 / 32:.2f} tokens/forward (10 answer tokens up to EOS" in title
    assert printed == pytest.approx(10 / 32, abs=0.005)

    model, tok = load_model("tiny-llada"), load_tokenizer("tiny-llada")
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delitem(sys.modules, "examples.compare_policies", raising=False)
    from examples.compare_policies import compare

    rows = compare(model, tok, PROMPT, 32, runs=[("low_confidence", "none", {}),
                                                 ("threshold", "none", {"tau": 0.9})])
    assert [r["nfe"] for r in rows] == [32, 1]
    assert [r["tpf"] for r in rows] == pytest.approx([10 / 32, 10 / 1])

    prompt = generate_text(DiffusionSampler(model, "threshold", gen_length=32), tok,
                           PROMPT).prompt_ids
    report = check_policy("low_confidence", model, prompt, gen_length=32)
    assert report.nfe == [32] and report.tokens_per_forward == pytest.approx(10 / 32)


def test_plot_without_stop_ids_names_what_it_counts_and_labels_both_step_axes() -> None:
    pytest.importorskip("matplotlib")
    from dllm_decode import plot_decoding

    model = load_model("tiny-llada")
    out = DiffusionSampler(model, "low_confidence", gen_length=8).generate(
        torch.tensor([[10, 11, 12]]))
    fig = plot_decoding(out)
    assert "committed positions/forward" in fig._suptitle.get_text()
    assert "tokens/forward" not in fig._suptitle.get_text()
    fig.canvas.draw()
    top = fig.axes[0]  # the commit-order panel shares the steps axis with the bar panel
    assert any(label.get_visible() and label.get_text() for label in top.get_xticklabels())
