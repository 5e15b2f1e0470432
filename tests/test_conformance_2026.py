"""Conformance of the 2026 families' decoders, token for token, NFE included: every recorded
LLaDA2.0 / LLaDA2.1 ``generate`` case (``../shared/conformance/llada2-tiny``) and every
Fast-dLLM v2 case (``fastdllm2-tiny``: ``use_block_cache`` through ``cache="sub_block"``, the
reference's prefill forward through ``separate_prefill``; batched cases row by row, their
NFE the reference's lockstep count of the rows' steps). LLaDA-MoE's cases (LLaDA's
``generate``) are in ``test_models_2026.py``. Skips when ``../shared`` is absent."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from tests.conformance import (
    CONFORMANCE,
    UnmappedCaseField,
    cut_at_eos,
    fastdllm2_batch_forwards,
    fastdllm2_settings,
    llada2_settings,
    load_cases,
    require_shared,
    tensors,
)

pytestmark = pytest.mark.usefixtures("one_thread")

LLADA2 = load_cases("llada2-tiny")
_MODELS: dict[str, object] = {}


def _model(name: str, mask_id: int):
    if name not in _MODELS:
        _MODELS[name] = load_model(require_shared(CONFORMANCE / name), mask_token_id=mask_id)
    return _MODELS[name]


@pytest.mark.parametrize("case", LLADA2, ids=[c["name"] for c in LLADA2])
def test_llada2_case(case: dict) -> None:
    """Recorded: tokens (cut at EOS as ``generate`` returns them) and NFE; machine-independent
    (unchanged under the fp32 perturbations of ``test_conformance.test_llada_case``)."""
    args = case["args"]
    model = _model("llada2-tiny", args["mask_id"]).with_block_size(args["block_length"])
    policy, params = llada2_settings(case, model)
    prompt, mask = tensors(case)
    out = DiffusionSampler(model, policy, debug=True, **params).generate(prompt, mask)
    got = cut_at_eos(out.tokens, prompt.shape[1], args["gen_length"], args["eos_id"])
    assert got == case["output_ids"][0], case["name"]
    assert out.forwards == case["nfe"], case["name"]


FDV2 = load_cases("fastdllm2-tiny")


class _StopAs:
    """The model with the case's stop token as its EOS (the reference's ``stop_token``)."""

    def __init__(self, model, stop: int) -> None:
        self._model, self.eos_token_ids = model, (stop,)

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)


SINGLE = [c for c in FDV2 if len(c["prompt_ids"]) == 1]


@pytest.mark.parametrize("case", SINGLE, ids=[c["name"] for c in SINGLE])
def test_fastdllm2_case(case: dict) -> None:
    """Recorded (machine-independent, as ``test_llada2_case``): tokens and NFE
    (``Generation.forwards``, the reference's prefill forward included by
    ``separate_prefill``); with ``use_block_cache`` also each forward's kind: the reference's
    full-block forwards are the steps that refreshed, its sub-block forwards the others."""
    try:
        policy, params, stop = fastdllm2_settings(case)
    except UnmappedCaseField as err:  # a reference bug the library does not reproduce
        pytest.skip(f"not reproduced: {err}")
    args = case["args"]
    base = _model("fastdllm2-tiny", args["mask_id"]).with_block_size(args["block_size"])
    model = _StopAs(base, stop)
    prompt, _ = tensors(case)
    out = DiffusionSampler(model, policy, debug=True, **params).generate(prompt)
    p = prompt.shape[1]
    got = cut_at_eos(out.tokens, p, out.tokens.shape[1] - p, stop)
    want = cut_at_eos(torch.tensor(case["output_ids"]), p, len(case["output_ids"][0]) - p, stop)
    assert got == want, case["name"]
    assert out.forwards == case["nfe"] == int(out.nfe[0]), case["name"]
    if args.get("use_block_cache"):
        fed = [len(ids[0]) for ids in case["forward_input_ids"]]
        kinds = [w == args["block_size"] for w in fed[out.forwards - out.steps:]]
        assert out.refreshed[0].tolist() == kinds, case["name"]
    if case["reference_function"] == "batch_sample":  # the lockstep count, one row
        assert fastdllm2_batch_forwards(case, [out]) == case["nfe"], case["name"]


BATCHED = [c for c in FDV2 if len(c["prompt_ids"]) > 1]


@pytest.mark.parametrize("case", BATCHED, ids=[c["name"] for c in BATCHED])
def test_fastdllm2_batched_case(case: dict) -> None:
    """Recorded (machine-independent, as ``test_llada2_case``): a batched ``batch_sample``
    case row by row: each row decoded alone gives the
    reference's tokens (rows do not interact), and the reference's batch NFE is the lockstep
    count of the rows' steps (``fastdllm2_batch_forwards``: the reference moves the batch
    sub-block by sub-block together; the library's rows move independently and ragged
    prompts decode as separate phase groups, so its own ``forwards`` for the batch is not
    the reference's)."""
    args = case["args"]
    base = _model("fastdllm2-tiny", args["mask_id"]).with_block_size(args["block_size"])
    rows = []
    for row, ids in enumerate(case["prompt_ids"]):
        try:
            policy, params, stop = fastdllm2_settings(case, row)
        except UnmappedCaseField as err:  # a reference bug the library does not reproduce
            pytest.skip(f"not reproduced: {err}")
        out = DiffusionSampler(_StopAs(base, stop), policy, **params).generate(
            torch.tensor([ids]))
        p = len(ids)
        want = torch.tensor([case["output_ids"][row]])
        assert cut_at_eos(out.tokens, p, out.tokens.shape[1] - p, stop) == cut_at_eos(
            want, p, want.shape[1] - p, stop), (case["name"], row)
        rows.append(out)
    assert fastdllm2_batch_forwards(case, rows) == case["nfe"], case["name"]
