"""What a policy needs of a model, checked at bind: causal attention inside a block.

S2D2's verifier (block-size-1 mode), its ``draft_causal`` rows and AR-like prefix caching
(``causal_prefix``) run a block-causal model causally inside a block. ``testbed-llada2`` was
trained only in its own blocks (``supports_causal_in_block: false`` in its config.json): S2D2
with its defaults decoded 0 % of its held-out prompts (40 per task, nine tasks), and 0.6 % with
``draft_causal=False`` alone; it is refused there, naming the settings that run without that
need (measured 98.3 % on the same prompts: the fallback rule alone). ``tiny-sdar`` was trained
with block-size-1 steps (``ar_fraction`` 0.25) and declares ``true``.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.models.loading import resolve_path, save_model
from dllm_decode.models.weights import CheckpointError
from dllm_decode.policies.capabilities import capabilities_of
from dllm_decode.policies.speculative import s2d2
from dllm_decode.train.testbed import waiting_line_oracle
from dllm_decode.train.testbed_eval import decode_tasks, held_out_prompts
from tests.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

#: the S2D2 settings that never run the model causally inside a block
BASE_RULE_ALONE = {"router": "never", "draft_causal": False, "causal_prefix": False}


@pytest.fixture(scope="module")
def testbed() -> torch.nn.Module:
    return load_model("testbed-llada2")


def _prompt() -> torch.Tensor:
    """One held-out copy prompt in the test bed's format ``[1, P]``."""
    _, prompts = held_out_prompts(waiting_line_oracle(), "copy", 1)
    return torch.tensor(prompts)


def test_models_declare_it() -> None:
    assert load_model("testbed-llada2").supports_causal_in_block is False
    assert load_model("tiny-sdar").supports_causal_in_block is True
    assert tiny_model("sdar").supports_causal_in_block is None  # not stated


def test_export_keeps_the_declaration(tmp_path) -> None:
    save_model(load_model("testbed-llada2"), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["supports_causal_in_block"] is False
    assert load_model(tmp_path).supports_causal_in_block is False


def test_s2d2_declares_the_need() -> None:
    assert capabilities_of(s2d2()).causal_forwards  # the verifier, whatever the router
    assert capabilities_of(s2d2(router="mask_span_length")).causal_forwards
    caps = capabilities_of(s2d2(**BASE_RULE_ALONE))
    assert not (caps.causal_forwards or caps.draft_causal or caps.causal_prefix)


@pytest.mark.parametrize(("params", "uses"), [
    ({}, ["block-size-1", "draft_causal:", "causal_prefix:"]),
    ({"draft_causal": False}, ["block-size-1", "causal_prefix:"]),
    ({"router": "never"}, ["draft_causal:", "causal_prefix:"]),
    ({"router": "never", "draft_causal": False}, ["causal_prefix:"]),
])
def test_s2d2_refused_on_testbed_llada2(testbed, params: dict, uses: list[str]) -> None:
    sampler = DiffusionSampler(testbed, "s2d2", gen_length=16, **params)
    with pytest.raises(ValueError, match="not trained for") as err:
        sampler.generate(_prompt())
    message = str(err.value)
    assert "\n" not in message and "router='never'" in message and "draft_causal=False" in message
    for use in uses:
        assert use in message
    for use in {"block-size-1", "draft_causal:", "causal_prefix:"} - set(uses):
        assert use not in message


def test_causal_prefix_refused_for_any_policy(testbed) -> None:
    sampler = DiffusionSampler(testbed, "low_confidence", gen_length=16, causal_prefix=True)
    with pytest.raises(ValueError, match="causal_prefix: committed blocks"):
        sampler.generate(_prompt())
    # a per-call override is checked too; the default (off) runs
    plain = DiffusionSampler(testbed, "low_confidence", gen_length=16)
    with pytest.raises(ValueError, match="not trained for"):
        plain.generate(_prompt(), causal_prefix=True)
    assert plain.generate(_prompt()).answer.shape == (1, 16)


def test_s2d2_without_the_need_is_its_fallback_rule(testbed) -> None:
    """The suggested settings run, equal the fallback rule (S2D2's ``never`` faithfulness
    test) and answer held-out prompts."""
    prompt = _prompt()
    out = DiffusionSampler(testbed, "s2d2", gen_length=16, **BASE_RULE_ALONE).generate(prompt)
    base = DiffusionSampler(testbed, "low_confidence_dynamic", gen_length=16).generate(prompt)
    assert torch.equal(out.tokens, base.tokens) and torch.equal(out.nfe, base.nfe)
    rows = decode_tasks(testbed, waiting_line_oracle(), 4, tasks=("copy", "reverse"),
                        policy="s2d2", **BASE_RULE_ALONE)
    assert all(r["valid"] for task in rows.values() for r in task)


def test_s2d2_runs_where_the_model_supports_it() -> None:
    """``tiny-sdar`` (trained for block-size-1 mode) and a model that states nothing."""
    for model in (load_model("tiny-sdar"), tiny_model("sdar", seed=1)):
        prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
        out = DiffusionSampler(model, "s2d2", router="always", gen_length=8).generate(prompt)
        assert out.forwards > out.steps  # the verifier ran


def test_a_model_declaring_support_runs_and_one_declaring_none_is_refused() -> None:
    for flag in (True, False):
        model = tiny_model("sdar", seed=1, supports_causal_in_block=flag)
        sampler = DiffusionSampler(model, "s2d2", gen_length=8)
        prompt = torch.tensor([[5, 6, 7, 8, 9]])
        if flag:
            assert sampler.generate(prompt).answer.shape == (1, 8)
        else:
            with pytest.raises(ValueError, match="not trained for"):
                sampler.generate(prompt)


def test_config_value_must_be_a_bool(tmp_path) -> None:
    directory = tmp_path / "ckpt"
    shutil.copytree(resolve_path("tiny-sdar"), directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(
        json.dumps({**config, "supports_causal_in_block": "yes"}))
    with pytest.raises(CheckpointError, match="supports_causal_in_block must be true or false"):
        load_model(directory)
