"""``dllm-decode eval ...``: argument parsing, data generation, sweep + analyze end to end."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dllm_decode.eval import add_eval_subcommands
from dllm_decode.eval.parallelbench import reference_answer
from dllm_decode.eval.parallelbench.loader import load_tasks
from dllm_decode.eval.parallelbench.rows import read_rows

TOKENIZER = Path(__file__).resolve().parents[1] / "dllm_decode/models/assets/tiny-tokenizer"
CONFIG = {
    "model_type": "llada", "d_model": 32, "n_layers": 1, "n_heads": 2, "mlp_hidden_size": 64,
    "vocab_size": 2048, "embedding_size": 2048, "mask_token_id": 2, "eos_token_id": 1,
    "max_sequence_length": 1024,
}  # fmt: skip


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dllm-decode")
    add_eval_subcommands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_parsing() -> None:
    args = parse(["eval", "parallelbench", "--grid", "g.yaml", "--out", "o", "--limit", "3",
                  "--batch-size", "2"])  # fmt: skip
    assert (args.grid, args.out, args.limit, args.batch_size, args.model) == ("g.yaml", "o", 3,
                                                                              2, None)  # fmt: skip
    args = parse(["eval", "analyze", "runs/x", "--baseline", "abc"])
    assert (args.out, args.baseline, args.no_plots) == ("runs/x", "abc", False)
    args = parse(["eval", "lm-eval", "--tasks", "t", "--limit", "2"])
    assert args.lm_eval_args == ["--tasks", "t", "--limit", "2"]
    with pytest.raises(SystemExit):
        parse(["eval", "parallelbench", "--out", "o"])  # --grid is required


def test_generate_writes_loadable_tree(tmp_path: Path) -> None:
    args = parse(["eval", "generate", "--out", str(tmp_path), "--n", "6",
                  "--tasks", "waiting_line/sort", "puzzle/latin_square_n4"])  # fmt: skip
    assert args.func(args) == 0
    tasks = load_tasks(tmp_path, ["waiting_line", "puzzle"])
    assert list(tasks) == ["waiting_line/sort", "puzzle/latin_square_n4"]
    for task in tasks.values():
        assert len(task.records) == 6
        assert all(task.spec.grade(reference_answer(r), r)["score"] == 1.0 for r in task.records)


def tiny_run_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A random tiny LLaDA checkpoint (with the bundled tokenizer) and a 2-config grid."""
    try:
        from dllm_decode.models.loading import build_model, save_model
    except ImportError as err:
        pytest.skip(f"model API not available yet: {err}")
    if not (TOKENIZER / "tokenizer.json").is_file():
        pytest.skip("bundled tiny tokenizer not built yet")
    checkpoint = tmp_path / "tiny"
    save_model(build_model(CONFIG, seed=0), checkpoint)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, checkpoint / name)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "source": "generated", "num_samples": 2, "batch_size": 2,
        "tasks": ["waiting_line/copy", "puzzle/sudoku_n4_12"],
        "sweeps": [{"policy": "low_confidence", "tokens_per_step": [8, 32]}],
    }))  # fmt: skip
    return checkpoint, grid


def test_sweep_then_analyze_end_to_end(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    checkpoint, grid = tiny_run_inputs(tmp_path)
    out = tmp_path / "run"
    argv = ["eval", "parallelbench", "--model", str(checkpoint), "--grid", str(grid),
            "--out", str(out), "--no-progress"]  # fmt: skip
    args = parse(argv)
    assert args.func(args) == 0
    rows = read_rows(out / "rows.jsonl")
    assert len(rows) == 2 * 2 * 2
    assert {(r["task"], r["nfe"]) for r in rows} == {
        ("waiting_line/copy", 4),
        ("waiting_line/copy", 1),  # 32 tokens: k = 8, 32
        ("puzzle/sudoku_n4_12", 8),
        ("puzzle/sudoku_n4_12", 2),  # 64 tokens
    }
    assert all(r["prompt_tokens"] > 0 and r["config"]["model"] == str(checkpoint) for r in rows)
    first = capfd.readouterr()
    assert "8 rows written, 0 resumed; 8 rows in" in first.out
    # the tokenizer is loaded without transformers reading config.json as an unknown type
    assert "instantiate a model of type" not in first.err, first.err
    assert args.func(args) == 0 and "0 rows written, 8 resumed" in capfd.readouterr().out
    analyze = parse(["eval", "analyze", str(out)])
    assert analyze.func(analyze) == 0
    assert (out / "analysis" / "overall.md").is_file() and (out / "analysis/pareto.png").is_file()


@pytest.mark.slow
def test_torchrun_two_ranks_match_one(tmp_path: Path) -> None:
    """``torchrun --nproc_per_node 2`` (gloo) gives exactly the single-process rows."""
    checkpoint, grid = tiny_run_inputs(tmp_path)
    repo = Path(__file__).resolve().parents[1]
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.is_file():
        pytest.skip("torchrun not found next to the interpreter")
    common = ["eval", "parallelbench", "--model", str(checkpoint), "--grid", str(grid),
              "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(repo)}
    subprocess.run([str(torchrun), "--nproc_per_node", "2", "-m", "dllm_decode.cli", *common,
                    "--out", str(tmp_path / "dist")], check=True, env=env, cwd=repo)  # fmt: skip
    subprocess.run([sys.executable, "-m", "dllm_decode.cli", *common, "--out",
                    str(tmp_path / "one")], check=True, env=env, cwd=repo)  # fmt: skip

    def stable(path: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in read_rows(path)]

    assert (tmp_path / "dist" / "rows.rank1.jsonl").is_file()
    assert stable(tmp_path / "dist" / "rows.jsonl") == stable(tmp_path / "one" / "rows.jsonl")
