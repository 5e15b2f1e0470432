"""Sweep runner: grid expansion, row schema, resume, batching, torch.distributed sharding."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dllm_decode.eval.parallelbench import generate_task, reference_answer
from dllm_decode.eval.parallelbench.codec import TokenizerCodec, useful_length
from dllm_decode.eval.parallelbench.grid import DecodeConfig, expand_configs, parse_grid
from dllm_decode.eval.parallelbench.rows import RANK_FILE, read_rows
from dllm_decode.eval.runner import left_pad, load_records, run_grid

EOS, PAD = 1, 0
TASKS = ["waiting_line/copy", "puzzle/sudoku_n4_12"]
GRID = {
    "tasks": TASKS,
    "source": "generated",
    "num_samples": 5,
    "sweeps": [
        {"policy": "low_confidence", "tokens_per_step": [1, 4], "gen_length": 128},
        {"policy": "threshold", "params": {"tau": [0.5, 0.9]}, "gen_length": 128},
    ],
}
ROW_KEYS = {
    "task", "category", "doc_id", "prediction", "reference", "score", "score_strict",
    "components", "nfe", "gen_tokens_useful", "gen_tokens_budget", "wall_time_s",
    "prompt_tokens", "decoding_order_tau", "commit_steps", "config", "config_hash", "versions",
}  # fmt: skip


class CharCodec:
    """Character-level codec whose prompt is the reference answer (so a copier is perfect)."""

    eos_token_ids = (EOS,)
    pad_token_id = PAD

    def encode(self, task: str, record: dict) -> list[int]:
        return [ord(c) for c in reference_answer(record)]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids[: useful_length(ids, self.eos_token_ids)])


def copy_decode(prompt_ids: torch.Tensor, mask: torch.Tensor, config: DecodeConfig):
    """Copies the prompt into the answer; corrupts odd rows of the tau=0.5 config."""
    batch = prompt_ids.shape[0]
    answer = torch.full((batch, config.gen_length), EOS, dtype=torch.long)
    for row in range(batch):
        text = prompt_ids[row][mask[row].bool()]
        if dict(config.params).get("tau") == 0.5 and int(text.sum()) % 2:
            text = text.flip(0)
        answer[row, : len(text)] = text[: config.gen_length]
    steps = config.steps or config.gen_length // 2
    nfe = torch.full((batch,), steps, dtype=torch.long)
    commit = torch.arange(config.gen_length).expand(batch, -1) * steps // config.gen_length
    return SimpleNamespace(answer=answer, nfe=nfe, commit_step=commit)


def run(out: Path, grid: dict | None = None, decode=copy_decode, **kwargs):
    parsed = parse_grid({**GRID, **(grid or {})})
    return run_grid(parsed, load_records(parsed), out, decode=decode, codec=CharCodec(),
                    model="fake", progress=False, **kwargs)  # fmt: skip


def stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in rows]


def test_grid_expansion_and_validation() -> None:
    grid = parse_grid({
        "tasks": ["puzzle", "waiting_line/copy"],
        "sweeps": [{"policy": ["random", "low_confidence"], "tokens_per_step": [1, 3, 32],
                    "block_length": ["full", 8]},
                   {"policy": "low_confidence", "steps": [2, 8], "block_length": 8}],
    })  # fmt: skip
    assert grid.tasks == ("puzzle/latin_square_n4", "puzzle/sudoku_n4_12", "waiting_line/copy")
    configs = expand_configs(grid, "waiting_line/copy", "m")
    # k=3 never divides 32; k=32 (1 step) with 4 blocks is invalid; steps=2 with 4 blocks too.
    assert {(c.policy, c.block_length, c.steps) for c in configs} == {
        (p, b, s) for p in ("random", "low_confidence") for b, s in [(32, 32), (8, 32), (32, 1)]
    } | {("low_confidence", 8, 8)}
    assert len(configs) == 7 and any("k=3" in s for s in grid.skipped)
    assert expand_configs(grid, "puzzle/sudoku_n4_12", "m")[0].gen_length == 64
    a = DecodeConfig("m", "threshold", (("tau", 0.9),))
    assert a.config_hash == DecodeConfig("m", "threshold", (("tau", 0.9),)).config_hash
    assert a.config_hash != DecodeConfig("m", "threshold", (("tau", 0.8),)).config_hash
    assert a.tokens_per_step is None and DecodeConfig("m", "x", steps=8).tokens_per_step == 4
    both = {"policy": "x", "steps": 1, "tokens_per_step": 1}
    for bad, match in [({"sweeps": []}, "non-empty"), ({"sweeps": [{}]}, "needs a policy"),
                       ({"sweep": [{"policy": "x"}]}, "unknown keys"),
                       ({"sweeps": [both]}, "not both"),
                       ({"sweeps": [{"policy": "x"}], "tasks": ["nope"]}, "unknown task"),
                       ({"sweeps": [{"policy": "x"}], "source": "web"}, "source")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            parse_grid(bad)


def test_rows_schema_and_values(tmp_path: Path) -> None:
    summary = run(tmp_path)
    rows = read_rows(summary.rows_path)
    assert summary.written == len(rows) == 4 * 2 * 5 and summary.configs == 4  # shared
    assert all(set(row) == ROW_KEYS for row in rows)
    keys = [(r["config_hash"], r["task"], r["doc_id"]) for r in rows]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    for row in rows:
        corrupted = row["config"]["params"].get("tau") == 0.5
        assert row["score"] == (0.0 if corrupted and row["prediction"] != row["reference"] else 1.0)
        assert row["gen_tokens_useful"] == len(row["reference"]) == row["prompt_tokens"]
        assert row["gen_tokens_budget"] == 128 and row["decoding_order_tau"] > 0.9
        assert row["nfe"] == (row["config"]["steps"] or 64)
        assert set(row["config"]) == {"model", "policy", "params", "cache", "gen_length",
                                      "block_length", "steps", "temperature", "seed"}  # fmt: skip
        assert set(row["versions"]) == {"dllm_decode", "torch", "transformers"}
    assert 0 < sum(r["score"] for r in rows) < len(rows)


def test_batching_does_not_change_rows(tmp_path: Path) -> None:
    one = read_rows(run(tmp_path / "b1").rows_path)
    three = read_rows(run(tmp_path / "b3", {"batch_size": 3}).rows_path)
    assert stable(one) == stable(three)


def test_resume_after_crash_and_truncated_line(tmp_path: Path) -> None:
    reference = stable(read_rows(run(tmp_path / "ref").rows_path))
    calls = {"n": 0}

    def crashing(*args):
        calls["n"] += 1
        if calls["n"] > 7:
            raise RuntimeError("boom")
        return copy_decode(*args)

    with pytest.raises(RuntimeError, match="boom"):
        run(tmp_path / "run", decode=crashing)
    rank_file = tmp_path / "run" / RANK_FILE.format(rank=0)
    assert len(read_rows(rank_file)) == 7
    with rank_file.open("a") as handle:  # a crash mid-write leaves half a line
        handle.write('{"task": "waiting_line/co')
    counted = {"n": 0}

    def counting(*args):
        counted["n"] += 1
        return copy_decode(*args)

    summary = run(tmp_path / "run", decode=counting)
    assert (summary.resumed, summary.written, counted["n"]) == (7, 33, 33)
    assert stable(read_rows(summary.rows_path)) == reference
    again = run(tmp_path / "run", decode=counting)
    assert (again.written, counted["n"]) == (0, 33)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))  # fmt: skip
    summary = run(Path(out), {"batch_size": 2})
    (Path(out) / f"report.rank{rank}.txt").write_text(summary.report())


def test_two_process_gloo_matches_single_process(tmp_path: Path) -> None:
    one = run(tmp_path / "single")
    single = stable(read_rows(one.rows_path))
    assert one.report() == f"{len(single)} rows written, 0 resumed; {len(single)} rows in " \
                           f"{one.rows_path}"
    # fork (not spawn) so the children skip re-importing torch; the gloo group is real.
    torch.multiprocessing.start_processes(
        _worker, args=(2, _free_port(), str(tmp_path / "dist")), nprocs=2, join=True,
        start_method="fork",
    )  # fmt: skip
    assert (tmp_path / "dist" / "rows.rank1.jsonl").is_file()
    merged = stable(read_rows(tmp_path / "dist" / "rows.jsonl"))
    assert merged == single
    # rank 0 reports the merged total, not its own half (issue 36)
    n = len(single)
    report = (tmp_path / "dist" / "report.rank0.txt").read_text()
    assert report.startswith(f"{n} rows written by 2 ranks, 0 resumed; {n} rows in ")


def test_left_pad() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_tokenizer_codec() -> None:
    transformers = pytest.importorskip("transformers")
    assets = Path(__file__).resolve().parents[1] / "dllm_decode/models/assets/tiny-tokenizer"
    if not (assets / "tokenizer.json").is_file():
        pytest.skip("bundled tiny tokenizer not built yet")
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(assets))
    record = generate_task("waiting_line/copy", 1, seed=0)[0]
    codec = TokenizerCodec(tokenizer)
    text = codec.prompt_text("waiting_line/copy", record)
    assert text.endswith("<|assistant|>\n") and "Please copy the list" in text
    assert tokenizer.decode(codec.encode("waiting_line/copy", record)) == text
    answer = tokenizer(reference_answer(record))["input_ids"]
    assert codec.decode(answer + list(codec.eos_token_ids) + answer) == reference_answer(record)
    tokenizer.chat_template = None
    plain = TokenizerCodec(tokenizer).prompt_text("waiting_line/copy", record)
    assert plain.count("Please copy the list") == 2 and "<|user|>" not in plain


def test_integration_with_sampler_and_oracle(tmp_path: Path) -> None:
    try:
        from dllm_decode import DiffusionSampler  # noqa: F401
        from dllm_decode.models.oracle import WaitingLineOracle
    except ImportError as err:
        pytest.skip(f"decoder API not available yet: {err}")
    from dllm_decode.eval.parallelbench.codec import ModelCodec
    from dllm_decode.eval.runner import sampler_decode_fn

    grid = parse_grid({"tasks": ["waiting_line/copy"], "source": "generated", "num_samples": 2,
                       "batch_size": 2, "sweeps": [{"policy": "low_confidence",
                                                    "tokens_per_step": [1, 32]}]})  # fmt: skip
    records = load_records(grid)
    oracle = WaitingLineOracle.from_records(records["waiting_line/copy"])
    summary = run_grid(grid, records, tmp_path, decode=sampler_decode_fn(oracle),
                       codec=ModelCodec(oracle), model="oracle", progress=False)  # fmt: skip
    rows = read_rows(summary.rows_path)
    assert len(rows) == 4 and all(row["score"] == 1.0 for row in rows)  # copy: C = 0, any k
    assert sorted({row["nfe"] for row in rows}) == [1, 32]


def test_generated_source_icl_examples_option() -> None:
    base = {"tasks": ["waiting_line/copy"], "source": "generated", "num_samples": 3,
            "sweeps": [{"policy": "low_confidence"}]}
    with_demo = load_records(parse_grid(base))["waiting_line/copy"]
    zero_shot = load_records(parse_grid(base | {"icl_examples": 0}))["waiting_line/copy"]
    assert all(len(r["input"]["icl_examples"]) == 1 for r in with_demo)
    assert all("icl_examples" not in r["input"] for r in zero_shot)
    assert [r["answer"] for r in zero_shot] == [r["answer"] for r in with_demo]
    with pytest.raises(ValueError, match="icl_examples"):
        parse_grid(base | {"icl_examples": -1})
