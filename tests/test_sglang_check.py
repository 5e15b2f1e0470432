"""``dllm-decode serve-check`` and the server start's YAML resolution, with and without SGLang.

``serve-check POLICY.yaml --model PATH`` resolves the YAML with the code a server start runs
(``integrations.sglang.check``): these tests run the command on a checkpoint folder made from
the bundled tiny-sdar (exit 0 and the plan; a bad YAML exits 2 with the one-line message SGLang's
real ``ServerArgs.resolve_once`` gives), in a process where SGLang cannot be imported, and check
the served model's stop set against SGLang's own (``ModelConfig.hf_eos_token_id`` and the
tokenizer SGLang loads), the refusal of EOS parts on a checkpoint without a stop token, and that
a Hub id is never downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_decode.cli import main
from dllm_decode.integrations.sglang.check import plan_serving, resolve_yaml, served_from_path
from dllm_decode.integrations.sglang.checkpoint import (
    ADDITIONAL_STOP_TEXTS,
    SGLANG_DLLM_PARAMS,
)
from dllm_decode.integrations.sglang.requests import WHY
from dllm_decode.models.loading import ASSETS

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
TINY = ASSETS / "tiny-sdar"


def need_sglang():
    if os.environ.get("CI") == "true":  # CI installs requirements/sglang-cpu.txt: never skip
        import sglang
        return sglang
    return pytest.importorskip("sglang", reason="install requirements/sglang-cpu.txt (README)")


def checkpoint(folder: Path, *, eos=1, generation=None, tokenizer: str | None = None) -> Path:
    """A checkpoint folder SGLang resolves: tiny-sdar's config (``model_type`` spelled
    ``qwen3``, SDAR's base, which transformers parses without remote code) with ``eos`` as
    ``eos_token_id`` (``None``: none), ``generation`` as ``generation_config.json`` and a
    tokenizer: ``"plain"`` (tiny-sdar's), ``"eom"`` (its ``<|system|>`` renamed
    ``<|eom_id|>``, a token SGLang also stops on) or ``"legacy"`` (no ``added_tokens_decoder``:
    ``special_tokens_map.json`` names the EOS, ``<|assistant|>``)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((TINY / "config.json").read_text()) | {"model_type": "qwen3"}
    config.pop("eos_token_id")
    if eos is not None:
        config["eos_token_id"] = eos
    (folder / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    if tokenizer is None:
        return folder
    fast = (TINY / "tokenizer.json").read_text()
    tok_config = json.loads((TINY / "tokenizer_config.json").read_text())
    if tokenizer == "eom":
        fast = fast.replace("<|system|>", "<|eom_id|>")
        tok_config = json.loads(json.dumps(tok_config).replace("<|system|>", "<|eom_id|>"))
    if tokenizer == "legacy":
        tok_config.pop("added_tokens_decoder")
        (folder / "special_tokens_map.json").write_text(json.dumps(
            {"eos_token": {"content": "<|assistant|>", "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False}}))
    (folder / "tokenizer.json").write_text(fast)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return folder


def serve_check(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["serve-check", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- the plan ---------------------------------------------------------------------------------
def test_good_yaml_prints_what_will_run(tmp_path, capsys) -> None:
    ckpt = checkpoint(tmp_path / "ckpt", tokenizer="eom")
    yaml = write(tmp_path / "policy.yaml", "policy: eb\nparams: {gamma: 0.01}\n"
                                           "truncator: eotp\n")
    rc, out, err = serve_check(capsys, yaml, "--model", ckpt)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[:3] == [
        f"--dllm-algorithm-config {yaml} with --model {ckpt}: OK (DllmDecode's server-start "
        "checks pass)",
        "model: SDARForCausalLM (family sdar), block size 4 (SGLang's for SDARForCausalLM), "
        "mask id 151669 (outside the vocabulary [0, 1644): SGLang 0.5.23 uses this id for "
        "every SDARForCausalLM checkpoint, and this config's mask_token_id is 2)",
        "policy: eb+eotp"]
    assert "  selector: EntropyBounded(gamma=0.01)" in lines
    assert "  truncator: EoTP(eos_token_ids=None)" in lines
    assert "  parameters (YAML): {'gamma': 0.01}" in lines
    assert any(line.startswith("steps per block: adaptive: at most 4") for line in lines)
    assert ("stop tokens (SGLang's stop set; a request also stops on its own stop_token_ids): "
            "1, 3") in lines
    assert ("  from: config.json eos_token_id 1; generation_config.json absent; tokenizer "
            "eos_token '<|endoftext|>' = 1, turn-final added tokens [3]") in lines
    assert "per-request policy memory: none (the policy keeps no state between steps)" in lines
    refused = lines[lines.index("refused per request (SGLang answers 400 with the reason):")
                     + 1:]
    assert [line.split(":")[0].strip() for line in refused] == [
        "return_logprob, top_logprobs_num, token_ids_logprob, return_flat_raw_top_logprobs",
        "return_sampling_mask", "json_schema, regex, ebnf, structural_tag",
        "logit_bias, frequency_penalty, presence_penalty, repetition_penalty, min_p, "
        "custom_logit_processor, watermark", "min_new_tokens", "sampling_seed",
        "temperature, top_p, top_k", "ignore_eos"]
    assert f"  sampling_seed: {WHY['seed']}" in refused


def test_block_size_steps_and_memory(tmp_path, capsys) -> None:
    ckpt = checkpoint(tmp_path / "ckpt")
    yaml = write(tmp_path / "policy.yaml", "policy: low_confidence\nparams: {steps: 4}\n"
                                           "block_size: 8\n")
    rc, out, _ = serve_check(capsys, yaml, "--model", ckpt)
    assert rc == 0
    assert "block size 8 (the YAML's block_size)" in out
    assert "steps per block: 4 scheduled (steps=4 per block of 8)" in out
    assert "  settings: {'steps': 4}" in out
    rc, out, _ = serve_check(capsys, yaml, "--model", ckpt, "--block-size", "16")
    assert rc == 0 and "block size 16 (--block-size)" in out
    write(yaml, "policy: klass\n")
    rc, out, _ = serve_check(capsys, yaml, "--model", ckpt)
    assert rc == 0 and "per-request policy memory: " in out and "bytes per running" in out
    write(yaml, "policy: learn2pd\n")  # what binding warns is printed, not raised
    rc, out, err = serve_check(capsys, yaml, "--model", ckpt)
    assert (rc, err) == (0, "")
    assert "\nwarning (binding the policy to the model): learn2pd: no trained filter" in out


def test_generation_config_request_defaults_are_shown(tmp_path, capsys) -> None:
    ckpt = checkpoint(tmp_path / "ckpt", generation={"temperature": 0.6, "top_p": 0.95})
    yaml = write(tmp_path / "policy.yaml", "policy: eb\n")
    rc, out, _ = serve_check(capsys, yaml, "--model", ckpt)
    assert rc == 0
    assert ("request defaults from generation_config.json {'temperature': 0.6, 'top_p': 0.95}: "
            "SGLang fills them into OpenAI-API requests that leave them unset "
            "(--sampling-defaults model, its default); such requests pass, and decode with the "
            "YAML's\n") in out


def test_bundled_name_is_a_model(tmp_path, capsys) -> None:
    yaml = write(tmp_path / "policy.yaml", "policy: default\n")
    rc, out, _ = serve_check(capsys, yaml, "--model", "tiny-sdar")
    assert rc == 0 and "policy: low_confidence_dynamic" in out


# ---- errors: one line, exit 2, the server start's message -----------------------------------
BAD = [
    ("policy: eb\nparams: {gama: 0.01}\n", "unknown keyword(s) ['gama']"),
    ("policy: thresold\n", "unknown policy 'thresold' (did you mean 'threshold'?)"),
    ("policy: [eb\n", "not valid YAML (line 2)"),
    ("- eb\n", "must be a YAML mapping"),
    ("policy: s2d2\n", "policy 's2d2' cannot run inside SGLang: it runs extra model forwards"),
    ("policy: threshold\nparams: {cache: dual}\n", "cache='block_causal'"),
    ("policy: eb\nplicy: 1\n", "unknown DllmDecode config key(s) ['plicy']"),
]


@pytest.mark.parametrize(("text", "needle"), BAD, ids=[b[1][:24] for b in BAD])
def test_bad_yaml_exits_2_in_one_line(tmp_path, capsys, text, needle) -> None:
    yaml = write(tmp_path / "policy.yaml", text)
    rc, out, err = serve_check(capsys, yaml, "--model", checkpoint(tmp_path / "ckpt"))
    assert (rc, out) == (2, "")
    assert err.startswith(f"dllm-decode: error: --dllm-algorithm-config {yaml}: ")
    assert needle in err and err.count("\n") == 1


def test_bad_yaml_message_is_the_server_starts(tmp_path, capsys, monkeypatch) -> None:
    """The same files through SGLang's real ``ServerArgs.resolve_once``."""
    need_sglang()
    from sglang.srt.dllm import algorithm as registry

    from dllm_decode.integrations.sglang.algorithm import DllmDecodeAlgorithm
    from tests.test_sglang import resolve_server_args

    monkeypatch.setitem(registry.algo_name_to_cls, "DllmDecode", DllmDecodeAlgorithm)
    ckpt = checkpoint(tmp_path / "ckpt")
    for i, (text, _) in enumerate(BAD[:5]):
        yaml = write(tmp_path / f"policy{i}.yaml", text)
        rc, _, err = serve_check(capsys, yaml, "--model", ckpt)
        server = resolve_server_args(str(ckpt), str(yaml))
        assert rc == 2 and err == f"dllm-decode: error: {server.removeprefix('error: ')}\n"


def test_block_size_errors(tmp_path, capsys) -> None:
    ckpt = checkpoint(tmp_path / "ckpt")
    yaml = write(tmp_path / "policy.yaml", "policy: eb\nblock_size: four\n")
    rc, _, err = serve_check(capsys, yaml, "--model", ckpt)
    assert rc == 2 and err == (f"dllm-decode: error: --dllm-algorithm-config {yaml}: "
                               "block_size must be an int >= 1 (SGLang's dLLM block), got "
                               "'four'\n")
    rc, _, err = serve_check(capsys, yaml, "--model", ckpt, "--block-size", "0")
    assert rc == 2 and err == "dllm-decode: error: --block-size must be >= 1, got 0\n"


def test_missing_model_and_uncached_hub_id_never_download(tmp_path, capsys,
                                                          monkeypatch) -> None:
    import huggingface_hub

    yaml = write(tmp_path / "policy.yaml", "policy: eb\n")
    calls = []
    real = huggingface_hub.snapshot_download

    def spy(*args, **kwargs):
        calls.append(kwargs.get("local_files_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    rc, _, err = serve_check(capsys, yaml, "--model", "someone/not-downloaded")
    assert rc == 2 and calls == [True]
    assert err == (f"dllm-decode: error: --model someone/not-downloaded: not a local folder and "
                   f"not in the local Hugging Face cache {tmp_path / 'hub'}; nothing is "
                   f"downloaded here: run `hf download someone/not-downloaded` first, or pass "
                   f"the checkpoint folder\n")
    rc, _, err = serve_check(capsys, yaml, "--model", tmp_path / "nothing")
    assert rc == 2 and "no such folder" in err and err.count("\n") == 1


def test_runs_where_sglang_cannot_be_imported(tmp_path) -> None:
    yaml = write(tmp_path / "policy.yaml", "policy: eb\n")
    ckpt = checkpoint(tmp_path / "ckpt", tokenizer="plain")
    code = ("import sys; sys.modules['sglang'] = None\n"  # `import sglang` raises ImportError
            "from dllm_decode.cli import main\n"
            f"rc = main(['serve-check', {str(yaml)!r}, '--model', {str(ckpt)!r}])\n"
            "assert sys.modules['sglang'] is None\n"
            "raise SystemExit(rc)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "policy: eb\n" in res.stdout


# ---- the stop set -----------------------------------------------------------------------------
STOPS = [  # (config eos, generation_config, tokenizer, eos_token_ids, without the tokenizer)
    ([7, 8], {"eos_token_id": 9}, "eom", (7, 8, 1, 3, 9), (7, 8, 9)),
    (7, {"eos_token_id": [9, 7]}, "plain", (7, 1, 9), (7, 9)),
    (None, {"eos_token_id": 0}, None, (), ()),  # SGLang skips a generation eos of 0
    (None, None, "legacy", (5,), ()),
    (1, None, None, (1,), (1,)),
]


@pytest.mark.parametrize(("eos", "generation", "tokenizer", "expected", "untokenized"), STOPS)
def test_stop_set_from_the_files(tmp_path, eos, generation, tokenizer, expected,
                                 untokenized) -> None:
    ckpt = checkpoint(tmp_path / "ckpt", eos=eos, generation=generation, tokenizer=tokenizer)
    assert served_from_path(ckpt).eos_token_ids == expected
    assert served_from_path(ckpt, skip_tokenizer=True).eos_token_ids == untokenized


@pytest.mark.parametrize(("eos", "generation", "tokenizer", "expected", "untokenized"), STOPS)
def test_stop_set_is_sglangs(tmp_path, eos, generation, tokenizer, expected,
                             untokenized) -> None:
    """SGLang's own: ``ModelConfig.hf_eos_token_id`` (the request's ``eos_token_ids``) and the
    tokenizer SGLang loads (its ``eos_token_id`` and ``additional_stop_token_ids``)."""
    need_sglang()
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    ckpt = checkpoint(tmp_path / "ckpt", eos=eos, generation=generation, tokenizer=tokenizer)
    model_stops = set(ModelConfig(str(ckpt)).hf_eos_token_id or ())
    assert set(untokenized) == model_stops
    stops = set(model_stops)
    if tokenizer is not None:
        tok = get_tokenizer(str(ckpt))
        stops |= {tok.eos_token_id} - {None} | set(tok.additional_stop_token_ids or ())
    assert set(expected) == stops


def test_sglang_tables_are_the_adapters(tmp_path) -> None:
    need_sglang()
    from sglang.srt.dllm.config import DllmConfig
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.hf_transformers import common

    assert ADDITIONAL_STOP_TEXTS == common._ADDITIONAL_STOP_TOKEN_TEXTS
    ckpt = checkpoint(tmp_path / "ckpt")
    args = ServerArgs(model_path=str(ckpt), dllm_algorithm="LowConfidence", device="cpu")
    args.resolve_once()
    dllm = DllmConfig.from_server_args(args)
    assert SGLANG_DLLM_PARAMS["SDARForCausalLM"] == (dllm.block_size, dllm.mask_id)
    served = served_from_path(ckpt)
    assert (served.block_size, served.mask_token_id) == (dllm.block_size, dllm.mask_id)


# ---- a checkpoint without a stop token --------------------------------------------------------
@pytest.mark.parametrize(("text", "name", "users"), [
    ("policy: eotp\n", "eotp", "truncator EoTP"),
    ("policy: eb\ntruncator: eos_cut\n", "eb+eos_cut", "truncator EosCut"),
    ("policy: low_confidence\nparams: {logits_eos_inf: true}\n", "low_confidence",
     "logits_eos_inf"),
])
def test_eos_parts_are_refused_without_a_stop_token(tmp_path, capsys, text, name,
                                                     users) -> None:
    ckpt = checkpoint(tmp_path / "ckpt", eos=None)
    yaml = write(tmp_path / "policy.yaml", text)
    served = served_from_path(ckpt)
    assert served.eos_token_ids == ()
    with pytest.raises(ValueError) as err:
        resolve_yaml(yaml, served)
    assert str(err.value) == (
        f"--dllm-algorithm-config {yaml}: policy {name!r} acts on EOS ({users}) and the "
        f"checkpoint has no stop token (no eos_token_id in config.json or generation_config."
        f"json, no tokenizer eos_token), so SGLang would never end a request there: add the "
        f"EOS id to config.json (eos_token_id) or serve a policy without them")
    rc, _, err_text = serve_check(capsys, yaml, "--model", ckpt)
    assert rc == 2 and err_text == f"dllm-decode: error: {err.value}\n"
    # the same checkpoint with a stop token serves it
    assert plan_serving(yaml, checkpoint(tmp_path / "eos", eos=1)).served.eos_token_ids == (1,)


def test_eos_refusal_is_the_server_starts(tmp_path, capsys, monkeypatch) -> None:
    need_sglang()
    from sglang.srt.dllm import algorithm as registry

    from dllm_decode.integrations.sglang.algorithm import DllmDecodeAlgorithm
    from tests.test_sglang import resolve_server_args

    monkeypatch.setitem(registry.algo_name_to_cls, "DllmDecode", DllmDecodeAlgorithm)
    ckpt = checkpoint(tmp_path / "ckpt", eos=None)
    yaml = write(tmp_path / "policy.yaml", "policy: eotp\n")
    rc, _, err = serve_check(capsys, yaml, "--model", ckpt)
    server = resolve_server_args(str(ckpt), str(yaml))
    assert "acts on EOS (truncator EoTP)" in server
    assert rc == 2 and err == f"dllm-decode: error: {server.removeprefix('error: ')}\n"


def test_policies_without_eos_parts_serve_without_a_stop_token(tmp_path) -> None:
    ckpt = checkpoint(tmp_path / "ckpt", eos=None)
    yaml = write(tmp_path / "policy.yaml", "policy: eb\nstopper: sched\n")
    assert resolve_yaml(yaml, served_from_path(ckpt)).policy.name == "eb+sched"


def test_the_tokenizer_folder_is_sglangs_tokenizer_path(tmp_path) -> None:
    ckpt = checkpoint(tmp_path / "ckpt", eos=None)
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / name, tok / name)
    assert served_from_path(ckpt, tokenizer_path=tok).eos_token_ids == (1,)
