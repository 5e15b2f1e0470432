"""lm-evaluation-harness adapter and ParallelBench task pack, fully offline."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'dllm-decode[eval]')")

from dllm_decode.eval.lm_eval import TASK_PACK, DllmDecodeLM, main  # noqa: E402
from dllm_decode.eval.parallelbench.loader import write_generated_tree  # noqa: E402

TOKENIZER = Path(__file__).resolve().parents[1] / "dllm_decode/models/assets/tiny-tokenizer"
CONFIG = {
    "model_type": "llada", "d_model": 32, "n_layers": 1, "n_heads": 2, "mlp_hidden_size": 64,
    "vocab_size": 2048, "embedding_size": 2048, "mask_token_id": 2, "eos_token_id": 1,
    "max_sequence_length": 1024,
}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (TOKENIZER / "tokenizer.json").is_file():
        pytest.skip("bundled tiny tokenizer not built yet")
    try:
        from dllm_decode.models.loading import build_model, save_model
    except ImportError as err:
        pytest.skip(f"model API not available yet: {err}")
    directory = tmp_path_factory.mktemp("tiny-llada")
    save_model(build_model(CONFIG, seed=0), directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, directory / name)
    return directory


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("DLLM_DECODE_PARALLELBENCH_DIR", raising=False)


def test_registered_without_hiding_builtins() -> None:
    from lm_eval.api.registry import get_model, model_registry

    assert get_model("dllm_decode") is DllmDecodeLM
    assert {"hf", "vllm"} <= set(model_registry.keys())  # pitfall 3: built-ins still listed


def test_decode_settings_gen_kwargs_win(checkpoint: Path) -> None:
    lm = DllmDecodeLM(pretrained=str(checkpoint), policy="threshold", tau="0.9",
                      block_length="8", steps="none")  # fmt: skip
    sampler, generate = lm.decode_settings({"max_gen_toks": 20, "until": ["\n"]})
    # cache None: the policy's preferred one (the family's with the default policy)
    assert sampler == {"policy": "threshold", "cache": None, "tau": 0.9}
    assert generate["gen_length"] == 24 and generate["block_length"] == 8  # rounded up
    assert generate["steps"] is None
    sampler, generate = lm.decode_settings(
        {
            "max_gen_toks": 32,
            "policy": "low_confidence",
            "tokens_per_step": 4,
            "tau": 0.5,
            "block_length": 32,
            "do_sample": False,
        }  # fmt: skip
    )
    assert sampler["policy"] == "low_confidence" and sampler["tau"] == 0.5
    assert (generate["gen_length"], generate["steps"], generate["temperature"]) == (32, 8, 0.0)
    assert DllmDecodeLM.truncate("abc</s>def\n\nx", ["\n\n", "</s>", ""]) == "abc"
    assert DllmDecodeLM.truncate("abc", []) == "abc"


def test_loglikelihood_monte_carlo(checkpoint: Path) -> None:
    lm = DllmDecodeLM(pretrained=str(checkpoint), mc_num=8, mc_batch_size=4)
    requests = [SimpleNamespace(args=("Copy: Ann Lee", " Ann Lee")),
                SimpleNamespace(args=("Copy: Ann Lee", " Ann Lee Bo Kim Cy Park")),
                SimpleNamespace(args=("Copy: Ann Lee", ""))]  # fmt: skip
    first = lm.loglikelihood(requests)
    assert first == lm.loglikelihood(requests)  # seeded
    (short, _), (long, _), (empty, greedy) = first
    assert math.isfinite(short) and short < 0 and long < short  # more tokens, lower log p
    assert (empty, greedy) == (0.0, True)
    with pytest.raises(ValueError, match="multiple of mc_batch_size"):
        DllmDecodeLM(pretrained=str(checkpoint), mc_num=6, mc_batch_size=4)
    with pytest.raises(NotImplementedError):
        lm.loglikelihood_rolling(requests)


def _local_tree(tmp_path: Path) -> Path:
    return write_generated_tree(tmp_path / "data", ["waiting_line/copy"], n=4)


def _check_outputs(data: Path, samples: list[dict], speed: Path) -> None:
    records = [json.loads(line) for line in (data / "waiting_line/copy.jsonl").open()]
    assert [json.loads(s["doc"]["record"]) for s in samples] == records[:2]  # local data used
    speed_rows = [json.loads(line) for line in speed.read_text().splitlines()]
    assert sorted(r["doc_id"] for r in speed_rows) == [0, 1]
    assert {(r["task"], r["nfe"], r["gen_tokens_budget"]) for r in speed_rows} == {
        ("parallelbench_waiting_line_copy", 4, 32)  # 32 tokens at 8 per step
    }


def test_simple_evaluate_offline_local_jsonl(
    checkpoint: Path, tmp_path: Path, offline: None
) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    data, speed = _local_tree(tmp_path), tmp_path / "speed.jsonl"
    manager = TaskManager(include_path=str(TASK_PACK), include_defaults=False,
                          metadata={"data_dir": str(data)})  # fmt: skip
    result = simple_evaluate(
        model="dllm_decode", tasks=["parallelbench_waiting_line_copy"], limit=2,
        model_args=f"pretrained={checkpoint},speed_log={speed},doc_messages=true",
        gen_kwargs="tokens_per_step=8", task_manager=manager, log_samples=True,
    )  # fmt: skip
    scores = result["results"]["parallelbench_waiting_line_copy"]
    assert {"score,none", "score_strict,none"} <= set(scores)
    _check_outputs(data, result["samples"]["parallelbench_waiting_line_copy"], speed)


def test_launcher_adds_task_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval.__main__

    seen = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: seen.append(list(sys.argv)))
    assert main(["--tasks", "x"]) == 0
    assert seen == [["lm_eval", "--tasks", "x", "--include_path", str(TASK_PACK)]]
    assert main(["--include_path", "/p"]) == 0 and seen[-1] == ["lm_eval", "--include_path", "/p"]


@pytest.mark.slow
def test_launcher_cli_offline(checkpoint: Path, tmp_path: Path, offline: None) -> None:
    """The real CLI (slow: lm-eval indexes every built-in task first)."""
    data, speed, out = _local_tree(tmp_path), tmp_path / "speed.jsonl", tmp_path / "out"
    code = main([
        "--model", "dllm_decode",
        "--model_args", f"pretrained={checkpoint},speed_log={speed},doc_messages=true",
        "--tasks", "parallelbench_waiting_line_copy", "--limit", "2",
        "--gen_kwargs", "tokens_per_step=8",
        "--metadata", json.dumps({"data_dir": str(data)}),
        "--output_path", str(out), "--log_samples",
    ])  # fmt: skip
    assert code == 0
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]["parallelbench_waiting_line_copy"]
    assert {"score,none", "score_strict,none"} <= set(results)
    (samples_file,) = out.rglob("samples_parallelbench_waiting_line_copy_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    _check_outputs(data, samples, speed)


def test_chat_template_hooks(checkpoint: Path) -> None:
    lm = DllmDecodeLM(pretrained=str(checkpoint))
    chat = [{"role": "user", "content": "hi"}]
    assert lm.chat_template() and lm.tokenizer_name
    assert lm.apply_chat_template(chat) == "<|user|>\nhi<|endoftext|><|assistant|>\n"


def test_zero_shot_pack_scores_the_bundled_model(offline: None) -> None:
    """The ``*_0shot`` tasks render prompts as the bundled tiny checkpoints were trained
    (no demonstration), so lm-eval scores above 0 on copy; the one-shot task is out of their
    training format."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASK_PACK), include_defaults=False)
    task = "parallelbench_waiting_line_copy_0shot"
    result = simple_evaluate(
        model="dllm_decode", tasks=[task], limit=4,
        model_args="pretrained=tiny-llada,doc_messages=true", task_manager=manager,
        log_samples=True,
    )  # fmt: skip
    assert result["results"][task]["score,none"] > 0
    prompts = [json.loads(s["doc"]["messages"]) for s in result["samples"][task]]
    assert all(len(p) == 1 for p in prompts)  # one user turn: no demonstration
