"""``DllmDecode`` at SGLang's server start, through SGLang's own code on a CPU.

* an untested SGLang version is refused by SGLang's server-args resolution in one line (the
  stand-in is a real ``DllmAlgorithm`` subclass), and an SGLang without a dLLM registry gets
  one findable ERROR with the remedy;
* the algorithm starts up when SGLang builds it (``TpModelWorker._init_dllm_algorithm``: after
  ``publish``, from the runtime context): the YAML resolved, the policy bound, one warm-up
  step; ``run`` never binds; an error there is one line raised from ``__init__``;
* tensor parallelism is decided at server start: a Learn2PD filter's fingerprint hashes the
  checkpoint's output head, never a rank's shard; without the head it is refused in one line;
* registration is thin (the policy stack is imported only when ``DllmDecode`` is used), the
  inert ``capture_input_preparation`` key is refused, and what differs between SGLang versions
  is one module (``versions``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

if os.environ.get("CI") == "true":  # CI installs requirements/sglang-cpu.txt: never skip
    import sglang  # noqa: F401
sglang = pytest.importorskip("sglang", reason="install requirements/sglang-cpu.txt (README)")

from sglang.srt.dllm.algorithm.base import DllmAlgorithm  # noqa: E402
from sglang.srt.dllm.config import DllmConfig  # noqa: E402
from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402

from dllm_decode.integrations.sglang import (  # noqa: E402
    BASE_ATTRIBUTES,
    SUPPORTED_SGLANG,
    compat,
    register,
    unsupported_message,
)
from dllm_decode.integrations.sglang import algorithm as algo  # noqa: E402
from dllm_decode.integrations.sglang.algorithm import DllmDecodeAlgorithm  # noqa: E402
from dllm_decode.integrations.sglang.spec import ServedModel, serving_spec  # noqa: E402
from dllm_decode.models.loading import ASSETS  # noqa: E402
from dllm_decode.policies.base import top1_mask  # noqa: E402
from tests.sglang_serving import Req, ScriptedRunner, serve, synthetic_logits  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ASSETS / "tiny-sdar"
CONFIG = json.loads((TINY / "config.json").read_text())
K, MASK, EOS, VOCAB = CONFIG["block_size"], CONFIG["mask_token_id"], CONFIG["eos_token_id"], \
    CONFIG["vocab_size"]
FILTER = TINY / f"learn2pd_k{K}.safetensors"  # trained for tiny-sdar
OTHER_FILTER = ASSETS / "tiny-llada" / "learn2pd_k32.safetensors"  # trained for another model


def checkpoint(folder: Path, *, weights: bool = True) -> str:
    """A checkpoint folder SGLang's server args resolve: the bundled ``tiny-sdar`` (its
    ``model_type`` spelled ``qwen3``, SDAR's base, which transformers parses without remote
    code), with its weights or without them (a launcher before the download)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**CONFIG, "model_type": "qwen3"}))
    for name in ("tokenizer.json", "tokenizer_config.json") + (("model.safetensors",)
                                                               if weights else ()):
        shutil.copy(TINY / name, folder / name)
    return str(folder)


def resolve_server_args(**kwargs) -> str:
    """SGLang's server-args resolution on the CPU: ``"ok"`` or the error."""
    from sglang.srt.server_args import ServerArgs

    try:
        ServerArgs(dllm_algorithm="DllmDecode", device="cpu", **kwargs).resolve_once()
    except (RuntimeError, ValueError) as err:
        return f"error: {err}"
    return "ok"


@pytest.fixture
def registered(monkeypatch):
    """``DllmDecode`` in SGLang's registry for this test (the registry restored after)."""
    from sglang.srt.dllm import algorithm as registry

    monkeypatch.setitem(registry.algo_name_to_cls, "DllmDecode", DllmDecodeAlgorithm)
    return registry


@pytest.fixture
def published(registered):
    """``publish(server_args, role="scheduler")`` as a tensor-parallel worker does before it
    builds its model runner and dLLM algorithm; the runtime context reset after."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    def publish(**kwargs) -> None:
        runtime_context.publish(ServerArgs(dllm_algorithm="DllmDecode", device="cpu",
                                           **kwargs), role="scheduler")

    yield publish
    runtime_context.reset_context()


def dllm_config(algorithm_config: dict, max_running: int = 8) -> DllmConfig:
    """The ``DllmConfig`` SGLang hands ``__init__``, at tiny-sdar's block size and mask id
    (SGLang's table gives SDAR's released mask id, outside tiny-sdar's vocabulary)."""
    return DllmConfig(algorithm="DllmDecode", algorithm_config=algorithm_config, block_size=K,
                      mask_id=MASK, max_running_requests=max_running,
                      first_done_first_out_mode=True)


class ShardedRunner(ScriptedRunner):
    """A scripted runner shaped like 0.5.23's ``ModelRunner`` on one rank of two: its model's
    ``lm_head`` holds half the vocabulary, and it has no ``tp_size`` attribute."""

    def __init__(self) -> None:
        head = torch.nn.Linear(CONFIG["hidden_size"], VOCAB // 2, bias=False)
        super().__init__(synthetic_logits(VOCAB, MASK),
                         type("Config", (), dict(CONFIG, architectures=["SDARForCausalLM"])),
                         torch.nn.Module())
        self.model.lm_head = head
        del self.tp_size


def serve_some(algorithm: DllmDecodeAlgorithm) -> list[Req]:
    reqs = [Req(rid, p, 9) for rid, p in {"a": [5, 6, 7], "b": [8, 9, 10, 11, 12],
                                          "c": [13] * 6}.items()]
    serve(algorithm, ShardedRunner(), reqs, k=K, mask_id=MASK, stop_ids=(EOS,), fdfo=True)
    return reqs


# ---- untested versions and missing registries -------------------------------------------
def test_untested_version_is_refused_by_sglangs_server_args(tmp_path, monkeypatch) -> None:
    from sglang.srt.dllm import algorithm as registry

    monkeypatch.setattr(sglang, "__version__", "0.5.99")
    monkeypatch.setitem(registry.algo_name_to_cls, "DllmDecode", None)
    register()
    stand_in = registry.algo_name_to_cls["DllmDecode"]
    assert issubclass(stand_in, DllmAlgorithm)
    got = resolve_server_args(model_path=checkpoint(tmp_path / "ckpt"))
    assert got == f"error: {unsupported_message('0.5.99')}"
    assert "sglang==0.5.23" in got and "\n" not in got
    with pytest.raises(RuntimeError, match="0.5.99"):
        stand_in(None)


def test_stand_in_without_a_base_class_has_the_bases_attributes(monkeypatch) -> None:
    """Where an untested SGLang's base class cannot be imported, the stand-in carries every
    class attribute 0.5.23's ``DllmAlgorithm`` has (what SGLang reads before building one)."""
    from dllm_decode.integrations import sglang as adapter

    public = {name: value for name, value in vars(DllmAlgorithm).items()
              if not name.startswith("_") and not callable(value)
              and not isinstance(value, (staticmethod, classmethod))}
    assert public == BASE_ATTRIBUTES
    monkeypatch.setitem(sys.modules, "sglang.srt.dllm.algorithm.base", None)
    stand_in = adapter._unsupported("0.9.0")
    assert not issubclass(stand_in, DllmAlgorithm)
    assert {name: getattr(stand_in, name) for name in BASE_ATTRIBUTES} == BASE_ATTRIBUTES
    with pytest.raises(RuntimeError, match="0.9.0"):
        stand_in.configure_server_args(None)


@pytest.mark.parametrize(("version", "needle"), [
    ("0.4.0", "install a tested version (pip install 'dllm-decode[sglang]'"),
    ("0.5.23", "reinstall it (pip install 'dllm-decode[sglang]')")])
def test_no_dllm_registry_logs_one_error_with_the_remedy(monkeypatch, caplog, version,
                                                         needle) -> None:
    import sglang.srt.dllm as dllm_package

    monkeypatch.setattr(sglang, "__version__", version)
    monkeypatch.delattr(dllm_package, "algorithm")
    monkeypatch.setitem(sys.modules, "sglang.srt.dllm.algorithm", None)
    with caplog.at_level("INFO"):
        assert register() is None  # returns: SGLang's load_plugins would only log a raise
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].name == "dllm_decode.integrations.sglang"
    message = errors[0].getMessage()
    assert "DllmDecode is not registered" in message and version in message
    assert needle in message and "\n" not in message


# ---- start-up at server start -----------------------------------------------------------
CALLS: list[int] = []  # the rows of each CountingRule call


@dataclass(frozen=True)
class CountingRule:
    """A user rule that commits the most confident position and records its calls."""

    def select(self, state):
        CALLS.append(state.eligible.shape[0])
        return top1_mask(state.proposal.prob, state.eligible)


class FailingRule:
    def select(self, state):
        raise KeyError("boom")


def test_start_up_happens_when_sglang_builds_the_algorithm(tmp_path, published,
                                                           monkeypatch) -> None:
    """After ``publish``, ``__init__`` resolves, binds and warms up (one policy call on a block
    of masks), reading the model, device and tensor-parallel width from the runtime context;
    ``run`` then never binds."""
    yaml_path = tmp_path / "policy.yaml"
    yaml_path.write_text("policy: eb\n")
    published(model_path=checkpoint(tmp_path / "ckpt"), dllm_algorithm_config=str(yaml_path))
    CALLS.clear()
    algorithm = DllmDecodeAlgorithm(dllm_config({"policy": f"{__name__}:CountingRule"}))
    assert algorithm.decoder is not None and CALLS == [1]  # the warm-up step
    assert algorithm.config_path == str(yaml_path) and algorithm.tp_size == 1
    assert algorithm.decoder.served.eos_token_ids[0] == EOS

    def no_binding(*args, **kwargs):
        raise AssertionError("run bound the policy")

    monkeypatch.setattr(DllmDecodeAlgorithm, "start", no_binding)
    monkeypatch.setattr(DllmDecodeAlgorithm, "_served_from_runner", no_binding)
    for r in serve_some(algorithm):
        assert r.finished and MASK not in r.output
    assert len(CALLS) > 1


def test_sglangs_worker_path_builds_and_starts_the_algorithm(tmp_path, published) -> None:
    """What ``TpModelWorker._init_dllm_algorithm`` runs after ``publish`` (its module needs
    GPU-only packages to import): ``DllmAlgorithm.from_server_args`` (``DllmConfig`` with
    SGLang's block size and mask id for SDAR), then ``__init__``. A config whose vocabulary
    holds that mask id starts (no weights needed: no part fingerprints); tiny-sdar's (mask 2)
    is refused in one line."""
    from sglang.srt import runtime_context

    sdar_mask = 151669  # SGLang's DLLM_PARAMS for SDARForCausalLM
    wide = tmp_path / "wide"
    checkpoint(wide, weights=False)
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "vocab_size": sdar_mask + 1}))
    published(model_path=str(wide), max_running_requests=6)
    assert runtime_context.get_exec().dllm.dllm_algorithm == "DllmDecode"
    algorithm = DllmAlgorithm.from_server_args(runtime_context.get_server_args())
    assert isinstance(algorithm, DllmDecodeAlgorithm) and algorithm.decoder is not None
    assert (algorithm.mask_id, algorithm.block_size, algorithm.max_requests) == (sdar_mask, 4, 6)
    runtime_context.reset_context()
    published(model_path=checkpoint(tmp_path / "ckpt"))
    with pytest.raises(ValueError) as err:
        DllmAlgorithm.from_server_args(runtime_context.get_server_args())
    assert str(err.value).startswith("DllmDecode cannot start: SGLang's mask id 151669 for "
                                     "this architecture is outside the checkpoint's vocabulary "
                                     f"[0, {VOCAB})") and "\n" not in str(err.value)


def test_an_error_at_start_is_one_line_from_init(tmp_path, published) -> None:
    published(model_path=checkpoint(tmp_path / "ckpt"))
    with pytest.raises(RuntimeError) as err:
        DllmDecodeAlgorithm(dllm_config({"policy": f"{__name__}:FailingRule"}))
    message = str(err.value)
    assert message.startswith("DllmDecode cannot start: its warm-up step (a block of masks) "
                              "failed") and "boom" in message and "\n" not in message
    with pytest.raises(ValueError) as bad:
        DllmDecodeAlgorithm(dllm_config({"policy": "eb", "params": {"gama": 1}}))
    assert "unknown keyword(s) ['gama']" in str(bad.value) and "\n" not in str(bad.value)


# ---- tensor parallelism and Learn2PD's fingerprint --------------------------------------
def test_tensor_parallel_learn2pd_takes_the_checkpoints_fingerprint(tmp_path,
                                                                    published) -> None:
    """TP size 2 (SGLang's own ``--tp-size``, read as ``get_parallel().tp_size``) and a filter
    trained for this model: the fingerprint hashes the checkpoint's head, so the filter binds
    at server start, and serving with a runner whose head is a shard never raises."""
    published(model_path=checkpoint(tmp_path / "ckpt"), tp_size=2)
    assert algo.COMPAT.tp_size() == 2
    algorithm = DllmDecodeAlgorithm(dllm_config({"policy": "learn2pd",
                                                 "params": {"filter": str(FILTER)}}))
    assert algorithm.tp_size == 2
    assert algorithm.decoder.selector.filter is not None  # the filter fires
    assert algorithm.decoder.served.head is None  # the checkpoint's mapping let go
    for r in serve_some(algorithm):
        assert r.finished and MASK not in r.output


def test_tensor_parallel_learn2pd_without_the_head_is_refused_in_one_line(tmp_path,
                                                                          published) -> None:
    """No weights in the checkpoint folder: the launcher defers the check (it may not have
    downloaded them yet) and the server start refuses, naming why, in one line."""
    published(model_path=checkpoint(tmp_path / "ckpt", weights=False), tp_size=2)
    with pytest.raises(ValueError) as err:
        DllmDecodeAlgorithm(dllm_config({"policy": "learn2pd",
                                         "params": {"filter": str(FILTER)}}))
    message = str(err.value)
    assert "Learn2PD filter was trained for another model" in message
    assert "lm_head_sha256" in message and "was not read" in message and "\n" not in message


def test_launcher_refuses_a_filter_of_another_model_in_one_line(tmp_path, registered) -> None:
    yaml_path = tmp_path / "policy.yaml"
    yaml_path.write_text(f"policy: learn2pd\nparams: {{filter: {OTHER_FILTER}}}\n")
    got = resolve_server_args(model_path=checkpoint(tmp_path / "ckpt"),
                              dllm_algorithm_config=str(yaml_path))
    assert got.startswith(f"error: --dllm-algorithm-config {yaml_path}: Learn2PD filter was "
                          "trained for another model; mismatch in: family"), got
    assert "\n" not in got


def test_the_tp_size_comes_from_the_runtime_context(tmp_path, published) -> None:
    assert algo.COMPAT.tp_size() == 1  # nothing published
    published(model_path=checkpoint(tmp_path / "ckpt"), tp_size=2)
    server = algo.COMPAT.server_model()
    assert (server.tp_size, server.device, server.model_path) == (2, "cpu",
                                                                   str(tmp_path / "ckpt"))


# ---- thin registration -------------------------------------------------------------------
HEAVY = ("dllm_decode.policies", "dllm_decode.samplers", "dllm_decode.kernels",
         "dllm_decode.models", "dllm_decode.config")
ROOT = Path(__file__).resolve().parents[1]


def heavy_modules_after(code: str, *, stub_root: bool) -> list[str]:
    """The library's heavy modules in ``sys.modules`` after ``code`` in a fresh process;
    ``stub_root``: the package root replaced by a bare package (what the adapter itself
    imports, whatever the root imports)."""
    stub = (f"import types; root = types.ModuleType('dllm_decode'); "
            f"root.__path__ = [{str(ROOT / 'dllm_decode')!r}]; "
            f"sys.modules['dllm_decode'] = root" if stub_root else "pass")
    script = "\n".join(["import sys, warnings", "warnings.simplefilter('ignore')", stub,
                         textwrap.dedent(code),
                         f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own printed list


def test_register_imports_no_policy_stack() -> None:
    """In a fresh process (as SGLang's tokenizer manager or a server of another model), the
    entry point registers ``DllmDecode`` and imports none of the policy stack."""
    assert heavy_modules_after("""
        from dllm_decode.integrations.sglang import register
        register()
        from sglang.srt.dllm.algorithm import algo_name_to_cls
        assert algo_name_to_cls["DllmDecode"].__name__ == "DllmDecodeAlgorithm"
    """, stub_root=True) == []


def test_the_package_root_imports_no_policy_stack() -> None:
    """The real entry point imports the package root first: it loads its names lazily."""
    assert heavy_modules_after("import dllm_decode.integrations.sglang", stub_root=False) == []


# ---- the YAML key capture_input_preparation ---------------------------------------------
def test_capture_input_preparation_is_refused_with_the_reason(tmp_path, registered) -> None:
    served = ServedModel.from_config(type("C", (), dict(CONFIG, architectures=[
        "SDARForCausalLM"])), MASK, K)
    for value in (True, False):
        with pytest.raises(ValueError) as err:
            serving_spec({"policy": "eb", "capture_input_preparation": value}, served)
        assert str(err.value).startswith("capture_input_preparation is not a DllmDecode key: ")
        assert "Gemma4Renoise" in str(err.value) and "\n" not in str(err.value)
    yaml_path = tmp_path / "policy.yaml"
    yaml_path.write_text("policy: eb\ncapture_input_preparation: true\n")
    got = resolve_server_args(model_path=checkpoint(tmp_path / "ckpt"),
                              dllm_algorithm_config=str(yaml_path))
    assert got.startswith(f"error: --dllm-algorithm-config {yaml_path}: "
                          "capture_input_preparation is not a DllmDecode key"), got


# ---- what differs between versions ------------------------------------------------------
def test_supported_versions_are_the_version_modules() -> None:
    assert SUPPORTED_SGLANG == tuple(compat.VERSIONS) == ("0.5.23",)
    assert algo.COMPAT is compat.for_version("0.5.23") is compat.installed()


def test_a_version_passing_logits_processor_output_is_one_module(tmp_path, published,
                                                                 monkeypatch) -> None:
    """SGLang's main branch passes ``step`` the ``LogitsProcessorOutput``: a version module
    whose ``step_logits`` unwraps it is all the adapter needs."""
    published(model_path=checkpoint(tmp_path / "ckpt"))
    algorithm = DllmDecodeAlgorithm(dllm_config({"policy": "eb"}))
    main_branch = type(algo.COMPAT)("main_branch")
    main_branch.step_logits = lambda out: out.full_logits
    monkeypatch.setattr(algo, "COMPAT", main_branch)
    reqs = [Req("a", [5, 6, 7], 4)]
    from tests.sglang_serving import dllm_batch, start_block

    start_block(reqs[0], K, MASK)
    batch = dllm_batch(reqs, K)
    states = algorithm.init_step_state(batch)
    logits = synthetic_logits(VOCAB, MASK)(batch)
    done = algorithm.step(batch, LogitsProcessorOutput(next_token_logits=None,
                                                       full_logits=logits), states)
    assert done == [False] and (batch.input_ids != MASK).sum() > len(reqs[0].prompt) % K
