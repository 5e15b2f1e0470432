"""Hub ids resolve offline through a Hub cache laid out on disk; dtype/device/device_map."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dllm_decode import load_model, load_tokenizer
from dllm_decode.models import build_model, placement, save_model
from dllm_decode.models import weights as weights_mod
from dllm_decode.models.hub import HubError, looks_like_hub_id
from dllm_decode.tokenizer import BUNDLED_TOKENIZER
from tests.helpers import go_offline, lay_out_cache, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = "test-org/tiny-llada-bf16"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    model = build_model(tiny_config("llada"), seed=5)
    out = save_model(model, tmp_path / "ckpt", max_shard_bytes=40_000,
                     config_extra={"torch_dtype": "bfloat16"})
    for f in BUNDLED_TOKENIZER.iterdir():
        shutil.copy(f, out / f.name)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 4]}))
    return out


@pytest.fixture
def offline_cache(tmp_path: Path, checkpoint: Path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    lay_out_cache(cache, REPO, checkpoint, commit=COMMIT)
    return go_offline(monkeypatch, cache)


def logits_of(model, n: int = 10) -> torch.Tensor:
    tokens = torch.arange(3, 3 + n)[None] % 60
    with torch.no_grad():
        return model(tokens, torch.arange(n)[None]).float()


def test_hub_id_loads_offline_like_the_local_directory(checkpoint, offline_cache) -> None:
    local = load_model(checkpoint)
    hub = load_model(REPO)
    assert local.dtype == hub.dtype == torch.bfloat16  # the config's torch_dtype
    assert torch.equal(logits_of(local), logits_of(hub))
    fp32 = load_model(REPO, dtype=torch.float32)
    assert fp32.head.weight.dtype == torch.float32
    assert torch.equal(logits_of(fp32), logits_of(load_model(checkpoint, dtype="fp32")))
    tok = load_tokenizer(REPO)
    assert tok.decode(tok.encode("Maya Doyle")) == "Maya Doyle"


def test_revision_picks_its_snapshot(checkpoint, offline_cache, tmp_path) -> None:
    other = save_model(build_model(tiny_config("llada"), seed=9), tmp_path / "other")
    lay_out_cache(offline_cache, REPO, other, commit="f" * 40, ref="v2")
    assert not torch.equal(logits_of(load_model(REPO, dtype="float32")),
                           logits_of(load_model(REPO, revision="v2")))
    assert torch.equal(logits_of(load_model(REPO, revision="f" * 40)),
                       logits_of(load_model(other)))


def test_offline_miss_names_the_id_and_the_fix(offline_cache) -> None:
    with pytest.raises(HubError, match=r"(?s)'test-org/absent'.*HF_HUB_OFFLINE.*local directory"):
        load_model("test-org/absent")
    with pytest.raises(HubError, match="'test-org/absent'"):
        load_tokenizer("test-org/absent")


def test_missing_shard_in_snapshot_is_named(offline_cache) -> None:
    snap = offline_cache / ("models--" + REPO.replace("/", "--")) / "snapshots" / COMMIT
    shard = sorted(snap.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(HubError, match=rf"(?s){REPO}.*{shard.name}.*hf download"):
        load_model(REPO)
    (snap / "config.json").unlink()
    with pytest.raises(HubError, match="config.json"):
        load_model(REPO)


def _bare(cls: type[Exception]) -> Exception:
    err = cls.__new__(cls)
    Exception.__init__(err, "server said no")
    return err


@pytest.mark.parametrize(("error", "expect"), [
    ("GatedRepoError", r"(?s)gated.*token.*HF_TOKEN"),
    ("RepositoryNotFoundError", r"(?s).org/model. is not a local directory.*token"),
    ("RevisionNotFoundError", "revision"),
    ("LocalEntryNotFoundError", r"(?s)'org/model'.*could not be reached.*hf download"),
    ("OfflineModeIsEnabled", r"(?s)could not fetch model 'org/model'.*network.*HF_HUB_OFFLINE"),
])
def test_hub_errors_are_explained(monkeypatch, error, expect) -> None:
    import huggingface_hub
    from huggingface_hub import errors

    def fake(*args, **kwargs):
        raise _bare(getattr(errors, error))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with pytest.raises(HubError, match=expect):
        load_model("org/model", local_files_only=False)


def test_hub_id_detection(tmp_path) -> None:
    assert looks_like_hub_id("GSAI-ML/LLaDA-8B-Instruct")
    assert looks_like_hub_id("Dream-org/Dream-v0-Instruct-7B")
    assert not looks_like_hub_id("tiny-llada")
    assert not looks_like_hub_id("a/b/c")
    assert not looks_like_hub_id(tmp_path)
    assert not looks_like_hub_id("./org/name")


def test_auto_dtype_and_bad_dtypes(checkpoint, monkeypatch) -> None:
    assert load_model("tiny-llada").head.weight.dtype == torch.float32  # no torch_dtype
    assert load_model(checkpoint, dtype="auto").head.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"(?s)'int8'.*bfloat16"):
        load_model(checkpoint, dtype="int8")
    with pytest.raises(ValueError, match="float64"):
        load_model(checkpoint, dtype=torch.float64)

    def cannot(dtype, device):
        raise RuntimeError(f'"addmm_impl_cpu_" not implemented for {dtype}')

    monkeypatch.setattr(placement, "probe_matmul", cannot)
    with pytest.raises(ValueError, match=r"(?s)bfloat16 cannot run a matmul on cpu.*--dtype"):
        load_model(checkpoint)


def test_bad_devices(checkpoint) -> None:
    with pytest.raises(ValueError, match="not a torch device"):
        load_model(checkpoint, device="gpu7")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            load_model(checkpoint, device="cuda")


def test_shards_are_read_one_at_a_time(checkpoint, monkeypatch) -> None:
    real = weights_mod.safe_open  # the header pass and the data pass each open every file
    state = {"open": 0, "max": 0, "files": 0}

    class Counting:
        def __init__(self, *args, **kwargs):
            self.inner = real(*args, **kwargs)

        def __enter__(self):
            state["open"] += 1
            state["files"] += 1
            state["max"] = max(state["max"], state["open"])
            return self.inner.__enter__()

        def __exit__(self, *exc):
            state["open"] -= 1
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(weights_mod, "safe_open", Counting)
    load_model(checkpoint, dtype="float32")
    assert state["files"] > 2 and state["max"] == 1


def test_device_map_cpu_only(checkpoint) -> None:
    pytest.importorskip("accelerate")
    want = logits_of(load_model(checkpoint, dtype="float32"))
    explicit = {"embed": "cpu", "layers.0": "cpu", "layers": "cpu", "norm": "cpu", "head": "cpu"}
    for device_map in ("auto", "sequential", explicit):
        got = load_model(checkpoint, dtype="float32", device_map=device_map)
        assert torch.equal(logits_of(got), want), device_map
    with pytest.raises(ValueError, match="head"):
        load_model(checkpoint, device_map={"embed": "cpu", "layers": "cpu", "norm": "cpu"})
    with pytest.raises(ValueError, match="balanced"):
        load_model(checkpoint, device_map="everywhere")


def test_only_the_needed_files_are_requested(monkeypatch, checkpoint, tmp_path) -> None:
    import huggingface_hub

    seen: list[dict] = []

    def fake(repo_id, **kwargs):
        seen.append({"repo_id": repo_id, **kwargs})
        return str(checkpoint)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: an import while another test had
    # it set (offline_cache) would leave it on for the rest of the session
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    load_model("org/model", revision="v1", token="hf_secret", dtype="float32")
    load_tokenizer("org/model", token="hf_secret")
    model_call, tok_call = seen
    assert model_call["repo_id"] == "org/model" and model_call["revision"] == "v1"
    assert model_call["token"] == "hf_secret" and model_call["local_files_only"] is False
    assert model_call["cache_dir"] == str(tmp_path / "cache")
    patterns = set(model_call["allow_patterns"])
    assert {"config.json", "generation_config.json", "*.safetensors",
            "model.safetensors.index.json"} <= patterns
    assert not any(p.endswith((".bin", ".pt", ".h5", "*")) and p != "*.safetensors"
                   for p in patterns)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(tok_call["allow_patterns"])
    assert not any("safetensors" in p for p in tok_call["allow_patterns"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    load_model("org/model", dtype="float32")
    assert seen[-1]["local_files_only"] is True
