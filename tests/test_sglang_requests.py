"""``DllmDecodeAlgorithm.validate_request``: SGLang's per-request check, on real ``Req`` objects.

SGLang's scheduler asks ``DllmConfig.validate_request(req)`` (which asks the algorithm class)
about every new request and answers a string with HTTP 400. These tests build SGLang's real
``Req`` and ``SamplingParams`` (they construct on a CPU) and go through that call: every
feature the adapter does not honor is refused with its name and the reason, a plain request
passes, and per-request sampling is compared with the YAML the server was started with, read
from SGLang's runtime context (a published context of a resolved ``ServerArgs``).
"""

from __future__ import annotations

import json
import os
from array import array

import pytest

if os.environ.get("CI") == "true":  # CI installs requirements/sglang-cpu.txt: never skip
    import sglang  # noqa: F401
sglang = pytest.importorskip("sglang", reason="install requirements/sglang-cpu.txt (README)")

from sglang.srt.dllm.config import DllmConfig  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams  # noqa: E402

from dllm_decode.integrations.sglang import check as ck  # noqa: E402
from dllm_decode.integrations.sglang import requests as rq  # noqa: E402
from dllm_decode.integrations.sglang.algorithm import DllmDecodeAlgorithm  # noqa: E402
from dllm_decode.integrations.sglang.requests import (  # noqa: E402
    WHY,
    ServedSampling,
    request_error,
)
from dllm_decode.models.loading import ASSETS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def make_req(*, req: dict | None = None, **sampling) -> Req:
    """SGLang's ``Req`` as its scheduler builds it (``_create_generation_req``'s fields)."""
    params = SamplingParams(max_new_tokens=16, **sampling)
    return Req("r1", "", array("q", [5, 6, 7]), params, vocab_size=1644, **(req or {}))


def scheduler_check(req: Req, monkeypatch) -> str | None:
    """What SGLang's scheduler asks: ``DllmConfig.validate_request`` (the registry's class)."""
    from sglang.srt.dllm import algorithm as registry

    monkeypatch.setitem(registry.algo_name_to_cls, "DllmDecode", DllmDecodeAlgorithm)
    config = DllmConfig(algorithm="DllmDecode", algorithm_config={}, block_size=4, mask_id=2,
                        max_running_requests=4)
    return config.validate_request(req)


# (feature, how the request asks for it, the reason's group)
FEATURES = [
    ("return_logprob", {"req": {"return_logprob": True}}, "logprobs"),
    ("top_logprobs_num", {"req": {"top_logprobs_num": 3}}, "logprobs"),
    ("token_ids_logprob", {"req": {"token_ids_logprob": [7, 8]}}, "logprobs"),
    ("return_flat_raw_top_logprobs", {"req": {"return_flat_raw_top_logprobs": True}},
     "logprobs"),
    ("return_sampling_mask", {"req": {"return_sampling_mask": True}}, "sampling_mask"),
    ("custom_logit_processor", {"req": {"custom_logit_processor": "{}"}}, "logits"),
    ("json_schema", {"json_schema": '{"type": "string"}'}, "grammar"),
    ("regex", {"regex": "[a-z]+"}, "grammar"),
    ("ebnf", {"ebnf": 'root ::= "a"'}, "grammar"),
    ("structural_tag", {"structural_tag": "{}"}, "grammar"),
    ("logit_bias", {"logit_bias": {"9": 2.0}}, "logits"),
    ("frequency_penalty", {"frequency_penalty": 0.5}, "logits"),
    ("presence_penalty", {"presence_penalty": -0.5}, "logits"),
    ("repetition_penalty", {"repetition_penalty": 1.2}, "logits"),
    ("min_p", {"min_p": 0.05}, "logits"),
    ("watermark", {"watermark": {"enabled": True}}, "logits"),
    ("min_new_tokens", {"min_new_tokens": 4}, "min_new_tokens"),
    ("sampling_seed", {"sampling_seed": 0}, "seed"),  # seed 0 is a seed
]


@pytest.mark.parametrize(("name", "asks", "group"), FEATURES, ids=[f[0] for f in FEATURES])
def test_each_unhonored_feature_is_refused_with_its_name(name, asks, group, monkeypatch) -> None:
    req = make_req(**asks)
    got = scheduler_check(req, monkeypatch)
    assert got == DllmDecodeAlgorithm.validate_request(req)
    assert got == f"DllmDecode does not support request-level {name}: {WHY[group]}"


def test_every_refusal_group_is_tested() -> None:
    assert {f[2] for f in FEATURES} == set(WHY)
    assert {f[0] for f in FEATURES} == {name for name, *_ in rq.FEATURES}


def test_a_plain_request_passes(monkeypatch) -> None:
    """Defaults, and what SGLang itself honors: stop strings / ids, ignore_eos (no EOS parts),
    max_new_tokens, n, streaming."""
    assert scheduler_check(make_req(), monkeypatch) is None
    honored = make_req(stop=["\n\n"], stop_token_ids=[9], ignore_eos=True, n=1,
                       req={"stream": True})
    assert scheduler_check(honored, monkeypatch) is None


def test_several_features_are_one_line(monkeypatch) -> None:
    req = make_req(regex="a+", sampling_seed=3, presence_penalty=0.1, frequency_penalty=0.2,
                   req={"return_logprob": True})
    got = scheduler_check(req, monkeypatch)
    assert got == ("DllmDecode does not support request-level return_logprob: "
                   f"{WHY['logprobs']}; regex: {WHY['grammar']}; frequency_penalty, "
                   f"presence_penalty: {WHY['logits']}; sampling_seed: {WHY['seed']}")
    assert "\n" not in got


# ---- sampling against the YAML -------------------------------------------------------------
GREEDY = ServedSampling(0.0, policy="eb", source="--dllm-algorithm-config g.yaml")
HOT = ServedSampling(0.7, top_p=0.9, top_k=None, policy="low_confidence",
                     source="--dllm-algorithm-config t.yaml")


@pytest.mark.parametrize(("served", "sampling", "refused"), [
    (GREEDY, {}, None),
    (GREEDY, {"temperature": 0.0}, None),  # SGLang makes it top_k=1: greedy, as the YAML
    (GREEDY, {"top_k": 1}, None),
    (GREEDY, {"top_k": -1}, None),  # SGLang's "whole vocabulary"
    (GREEDY, {"temperature": 0.7}, "temperature=0.7"),
    (GREEDY, {"top_p": 0.9}, "top_p=0.9"),
    (GREEDY, {"top_k": 20}, "top_k=20"),
    (HOT, {}, None),
    (HOT, {"temperature": 0.7, "top_p": 0.9}, None),
    (HOT, {"temperature": 0.5}, "temperature=0.5"),
    (HOT, {"temperature": 0.0}, "temperature=0 (top_k=1)"),
    (HOT, {"top_p": 0.8, "top_k": 5}, "top_p=0.8, top_k=5"),
    (None, {}, None),
    (None, {"temperature": 0.0}, "temperature=0 (top_k=1)"),  # the YAML's is unknown
])
def test_sampling_is_the_yamls_or_unset(served, sampling, refused) -> None:
    got = request_error(make_req(**sampling), served)
    if refused is None:
        assert got is None
        return
    where = (f"every request decodes with the policy's sampling, {served.describe()} "
             f"({served.source}): leave them unset or set the same values" if served else
             "the YAML's sampling is not known in this process, so only SGLang's defaults "
             "(unset) are accepted")
    policy = f" (policy {served.policy!r})" if served else ""
    assert got == f"DllmDecode{policy} does not support request-level {refused}: {where}"


def test_the_servers_own_defaults_count_as_unset() -> None:
    """What the server fills into requests (the checkpoint's generation_config.json under
    SGLang's default ``--sampling-defaults model``) is no request feature."""
    served = ServedSampling(0.0, policy="eb", source="x",
                            defaults=rq.model_defaults({"temperature": 0.6, "top_k": 20,
                                                        "repetition_penalty": 1.05}))
    assert request_error(make_req(temperature=0.6, top_k=20, repetition_penalty=1.05),
                         served) is None
    got = request_error(make_req(temperature=0.5, repetition_penalty=1.1), served)
    assert got is not None and "repetition_penalty: " in got and "temperature=0.5: " in got
    greedy = rq.model_defaults({"temperature": 0.0}, {"top_k": -1})
    assert greedy == {"temperature": 1.0, "top_k": 1}  # SGLang's normalisation
    assert rq.model_defaults(None, {"temperature": 0.3}) == {"temperature": 0.3}


def test_sglang_constants_are_the_adapters() -> None:
    assert rq.TOP_K_ALL == TOP_K_ALL


def test_ignore_eos_is_refused_only_when_a_part_acts_on_eos() -> None:
    eotp = ServedSampling(0.0, eos_parts=("truncator EoTP",), policy="eotp", source="x")
    got = request_error(make_req(ignore_eos=True), eotp)
    assert got == ("DllmDecode (policy 'eotp') does not support request-level ignore_eos: the "
                   "policy's truncator EoTP acts on EOS, so the text after an EOS would be EOS "
                   "fill")
    assert request_error(make_req(ignore_eos=True), GREEDY) is None


# ---- the YAML read from SGLang's runtime context --------------------------------------------
@pytest.fixture(scope="module")
def server_context(tmp_path_factory):
    """A resolved ``ServerArgs`` (``--dllm-algorithm DllmDecode`` on a folder with the bundled
    tiny-sdar's config) published in a context of its own, as a scheduler process has it."""
    from sglang.srt.dllm import algorithm as registry
    from sglang.srt.runtime_context import create_context
    from sglang.srt.server_args import ServerArgs

    root = tmp_path_factory.mktemp("served")
    config = json.loads((ASSETS / "tiny-sdar" / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": 1,
                                                             "temperature": 0.6}))
    greedy = root / "greedy.yaml"
    greedy.write_text("policy: eb\nparams: {gamma: 0.01}\n")
    hot = root / "hot.yaml"
    hot.write_text("policy: low_confidence\nparams: {temperature: 0.7, top_p: 0.9}\n")
    eotp = root / "eotp.yaml"
    eotp.write_text("policy: eotp\n")
    saved = registry.algo_name_to_cls.get("DllmDecode")
    registry.algo_name_to_cls["DllmDecode"] = DllmDecodeAlgorithm
    try:
        args = ServerArgs(model_path=str(root), dllm_algorithm="DllmDecode",
                          dllm_algorithm_config=str(greedy), device="cpu")
        args.resolve_once()
        yield create_context(args, role="scheduler"), {"greedy": greedy, "hot": hot,
                                                       "eotp": eotp}
    finally:
        if saved is None:
            registry.algo_name_to_cls.pop("DllmDecode", None)
        else:
            registry.algo_name_to_cls["DllmDecode"] = saved


def test_the_servers_yaml_decides_sampling(server_context) -> None:
    from sglang.srt.runtime_context import get_exec, use_context

    context, yamls = server_context
    ck._resolved.cache_clear()
    with use_context(context):
        assert DllmDecodeAlgorithm.validate_request(make_req(temperature=0.0)) is None
        assert DllmDecodeAlgorithm.validate_request(make_req(ignore_eos=True)) is None
        got = DllmDecodeAlgorithm.validate_request(make_req(temperature=0.7))
        assert got == ("DllmDecode (policy 'eb') does not support request-level "
                       "temperature=0.7: every request decodes with the policy's sampling, "
                       f"temperature 0 (greedy) (--dllm-algorithm-config {yamls['greedy']}): "
                       "leave them unset or set the same values")
        with get_exec().dllm.override(dllm_algorithm_config=str(yamls["hot"])):
            assert DllmDecodeAlgorithm.validate_request(
                make_req(temperature=0.7, top_p=0.9)) is None
            got = DllmDecodeAlgorithm.validate_request(make_req(temperature=0.0))
            assert got is not None and "temperature=0 (top_k=1)" in got
            assert "temperature=0.7, top_p=0.9 (--dllm-algorithm-config" in got
        with get_exec().dllm.override(dllm_algorithm_config=str(yamls["eotp"])):
            got = DllmDecodeAlgorithm.validate_request(make_req(ignore_eos=True))
            assert got is not None and "ignore_eos: the policy's truncator EoTP" in got
        # resolved once per YAML, not per request
        assert DllmDecodeAlgorithm.validate_request(make_req()) is None
        # an OpenAI chat request that sets no sampling: SGLang fills in generation_config.json's
        # temperature 0.6 (--sampling-defaults model, its default): not the request's
        assert DllmDecodeAlgorithm.validate_request(chat_req(str(context.server_args
                                                                 .model_path))) is None
    info = ck._resolved.cache_info()
    assert (info.misses, info.hits) == (3, 5)  # 3 YAMLs, 8 requests


def chat_req(model_path: str) -> Req:
    """SGLang's own path from a chat request with no sampling fields to the ``Req``."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    defaults = ModelConfig(model_path, sampling_defaults="model").get_default_sampling_params()
    assert defaults == {"temperature": 0.6}
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                 max_completion_tokens=16)
    params = SamplingParams(**chat.to_sampling_params(stop=[], model_generation_config=defaults))
    assert params.temperature == 0.6
    return Req("chat", "", array("q", [5, 6, 7]), params, vocab_size=1644)


def test_outside_a_server_only_the_defaults_pass() -> None:
    from sglang.srt.runtime_context import ParallelContext, RuntimeContext, use_context

    with use_context(RuntimeContext(parallel=ParallelContext())):  # nothing published
        assert ck.runtime_sampling() is None
        assert DllmDecodeAlgorithm.validate_request(make_req()) is None
        got = DllmDecodeAlgorithm.validate_request(make_req(temperature=0.0))
    assert got is not None and got.endswith("only SGLang's defaults (unset) are accepted")
