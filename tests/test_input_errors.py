"""Loading, CLI and grid errors name the file (and line) and say how to fix it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm_decode.cli import main
from dllm_decode.eval.parallelbench.grid import load_grid, parse_grid
from dllm_decode.models import save_model
from dllm_decode.models.loading import CheckpointError, load_model
from tests.helpers import tiny_config, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(params=["llada", "dream", "sdar"])
def saved(request, tmp_path: Path) -> Path:
    return save_model(tiny_model(request.param, seed=1), tmp_path / request.param)


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def test_nan_weights_name_the_tensor(saved: Path) -> None:
    tensors = load_file(str(saved / "model.safetensors"))
    name = sorted(tensors)[3]
    tensors[name][0] = float("nan")
    save_file(tensors, str(saved / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"{name}.*NaN or inf"):
        load_model(saved)
    load_model(saved, check_finite=False)  # still inspectable


def test_truncated_safetensors_names_the_file(saved: Path) -> None:
    data = (saved / "model.safetensors").read_bytes()
    (saved / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read.*truncated"):
        load_model(saved)
    (saved / "model.safetensors").write_bytes(b"\x00" * 3)
    with pytest.raises(CheckpointError, match=str(saved)):
        load_model(saved)


def test_sharded_checkpoint_errors_name_the_shard_and_tensor(tmp_path: Path) -> None:
    """The shard-at-a-time reader keeps the checks: a truncated shard is named (before any
    tensor data is read), a NaN in a later shard names its tensor, an invalid index its line."""
    path = save_model(tiny_model("sdar", seed=1), tmp_path / "s", max_shard_bytes=20_000)
    shards = sorted(path.glob("model-*.safetensors"))
    assert len(shards) > 2
    last = load_file(str(shards[-1]))
    name = sorted(last)[-1]
    last[name].view(-1)[-1] = float("inf")
    save_file(last, str(shards[-1]))
    with pytest.raises(CheckpointError, match=f"{name}.*NaN or inf"):
        load_model(path)
    load_model(path, check_finite=False)
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) - 7])
    with pytest.raises(CheckpointError, match=rf"{shards[1].name}: cannot read.*truncated"):
        load_model(path)
    (path / "model.safetensors.index.json").write_text('{"weight_map": {,}}')
    with pytest.raises(CheckpointError, match=r"index\.json: invalid JSON at line 1"):
        load_model(path)


def test_invalid_json_names_file_and_line(saved: Path) -> None:
    text = (saved / "config.json").read_text().splitlines()
    text[3] = text[3] + ",,"
    (saved / "config.json").write_text("\n".join(text))
    with pytest.raises(CheckpointError, match=r"config\.json: invalid JSON at line 4"):
        load_model(saved)


def test_model_type_of_another_family(saved: Path) -> None:
    family = json.loads((saved / "config.json").read_text())["model_type"].lower()
    other = {"llada": "sdar", "dream": "llada", "sdar": "llada"}[family]
    _edit_config(saved, model_type=other)
    with pytest.raises(CheckpointError, match=r"config\.json|model_type"):
        load_model(saved)


def test_qwen_tensors_under_another_qwen_type(tmp_path: Path) -> None:
    path = save_model(tiny_model("dream", seed=1), tmp_path / "d")
    _edit_config(path, model_type="sdar", head_dim=8)
    with pytest.raises(CheckpointError, match=r"(unexpected|missing) tensor.*declares model_type"):
        load_model(path)


@pytest.mark.parametrize("field", ["mask_token_id", "eos_token_id", "pad_token_id"])
def test_token_ids_outside_the_vocabulary(saved: Path, field: str) -> None:
    _edit_config(saved, **{field: 10_000})
    with pytest.raises(CheckpointError, match=f"{field} 10000 is outside the vocabulary"):
        load_model(saved)


def test_hidden_size_not_divisible_by_heads(tmp_path: Path) -> None:
    path = save_model(tiny_model("llada", seed=1), tmp_path / "l")
    _edit_config(path, n_heads=5, n_kv_heads=5)
    with pytest.raises(CheckpointError, match="not divisible by the number of attention heads 5"):
        load_model(path)


@pytest.mark.parametrize("change,match", [
    ({"vocab_size": "abc"}, "invalid literal"), ({"num_attention_heads": 0}, "heads must be >= 1"),
    ({"mask_token_id": -1}, "mask_token_id -1 is outside"), ({"model_type": None}, "unknown"),
])
def test_malformed_config_fields(tmp_path: Path, change: dict, match: str) -> None:
    path = save_model(tiny_model("dream", seed=1), tmp_path / "d")
    _edit_config(path, **change)
    with pytest.raises(CheckpointError, match=rf"config\.json: .*{match}"):
        load_model(path)


@pytest.mark.parametrize("family,field", [("llada", "n_heads"), ("sdar", "num_attention_heads"),
                                          ("dream", "num_attention_heads")])
def test_changed_head_count_is_caught(tmp_path: Path, family: str, field: str) -> None:
    path = save_model(tiny_model(family, seed=1), tmp_path / family)
    kv = {"llada": "n_kv_heads", "sdar": "num_key_value_heads", "dream": "num_key_value_heads"}
    _edit_config(path, **{field: 8, kv[family]: 8})  # 32 / 8 = 4: LLaDA's shapes still fit
    with pytest.raises(CheckpointError, match="was n_heads changed|has shape"):
        load_model(path)


def test_head_count_of_a_release_llada_config_is_documented_as_unchecked(tmp_path) -> None:
    cfg = tiny_config("llada", n_heads=8, n_kv_heads=8)  # no head_dim, as in release configs
    path = save_model(tiny_model("llada", seed=1), tmp_path / "l")
    (path / "config.json").write_text(json.dumps(cfg))
    assert load_model(path).spec.num_heads == 8  # loads: undetectable (see loading docstring)


def test_bundled_checkpoints_still_load() -> None:
    for name in ("tiny-llada", "tiny-dream", "tiny-sdar"):
        assert load_model(name) is not None


# ---- grid and CLI ---------------------------------------------------------------------------
GRID = {"tasks": ["waiting_line/copy"], "source": "generated", "sweeps": [{"policy": "random"}]}


def test_grid_with_a_nonexistent_task_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown task or category 'waiting_line/cpy'.*"
                                         r"did you mean 'waiting_line/copy'.*task ids"):
        parse_grid({**GRID, "tasks": ["waiting_line/cpy"]})
    with pytest.raises(ValueError, match="unknown task or category 'nope'.*categories"):
        parse_grid({**GRID, "tasks": ["nope"]})


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text("tasks: [a, b\nsweeps:\n  - policy: random\n")
    with pytest.raises(ValueError, match=r"grid\.yaml: invalid YAML at line \d+, column \d+"):
        load_grid(path)


def test_grid_params_that_are_sampler_fields() -> None:
    sweep = {"policy": "threshold", "params": {"tau": 0.9, "gen_length": 16}}
    with pytest.raises(ValueError, match=r"\['gen_length'\] are sweep keys"):
        parse_grid({**GRID, "sweeps": [sweep]})
    sweep = {"policy": "threshold", "params": {"tau": 0.9, "refresh_every": 2}}
    parse_grid({**GRID, "sweeps": [sweep]})  # other sampler fields pass on to the sampler


def test_grid_unknown_policy_or_policy_param() -> None:
    with pytest.raises(ValueError, match=r"unknown policy 'treshold' \(did you mean 'threshold'"):
        parse_grid({**GRID, "sweeps": [{"policy": "treshold"}]})
    with pytest.raises(ValueError, match=r"\['tauu'\] are neither parameters of policy"):
        parse_grid({**GRID, "sweeps": [{"policy": "threshold", "params": {"tauu": [0.9]}}]})
    parse_grid({**GRID, "sweeps": [{"policy": "sched", "params": {"base": "threshold",
                                                                  "tau": [0.8, 0.9]}}]})


def test_cli_param_that_is_a_sampler_field(capsys) -> None:
    code = main(["generate", "hi", "--model", "tiny-llada", "--param", "gen_length=16"])
    assert code == 2
    assert "use --gen-length 16" in capsys.readouterr().err


def test_cli_reports_a_bad_policy_parameter(capsys) -> None:
    code = main(["generate", "hi", "--model", "tiny-llada", "--policy", "threshold",
                 "--param", "tau=high"])
    assert code == 2
    assert "tau must be" in capsys.readouterr().err


def test_tensor_cast_keeps_finite_check_on_stored_values(tmp_path: Path) -> None:
    path = save_model(tiny_model("llada", seed=1), tmp_path / "l")
    model = load_model(path, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("grid", sorted((Path(__file__).parents[1] / "benchmarks" / "grids")
                                        .glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_grids_pass_the_stricter_checks(grid: Path) -> None:
    load_grid(grid)
