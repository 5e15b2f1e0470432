"""Bad values of the decoding options added with issues 33-35 (reference quirks, block-cache
and EOS options, ``graphs``, ``gemma_renoise``'s EOS ids): each is a ``ValueError`` naming
what is allowed, never silently ignored."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler, SamplerConfig, make_policy
from tests.helpers import tiny_gemma, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llada():
    return tiny_model("llada")


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma(seed=1, steps=4)


@pytest.mark.parametrize("option,base", [("eos_stop_on_commit", "stop_at_eos"),
                                         ("eos_skip_block_start", "block_eos_stop")])
def test_a_refining_eos_option_needs_the_option_it_refines(option, base) -> None:
    with pytest.raises(ValueError, match=f"{option}=True refines {base}.*pass {base}=True"):
        SamplerConfig(gen_length=8, **{option: True})
    SamplerConfig(gen_length=8, **{option: True, base: True})  # together: fine


@pytest.mark.parametrize("option", ["decode_block_padding", "eos_skip_block_start"])
def test_block_diffusion_quirks_are_refused_on_prompt_relative_blocks(llada, option) -> None:
    """Both read the model's own block grid; LLaDA has none (they were silently ignored)."""
    sampler = DiffusionSampler(llada, "low_confidence", block_eos_stop=True)
    with pytest.raises(ValueError, match=rf"\['{option}'\] apply to block-diffusion models"):
        sampler.generate(torch.tensor([[5, 6, 7]]), gen_length=8, **{option: True})


@pytest.mark.parametrize("option", ["separate_prefill", "decode_block_padding",
                                    "block_eos_stop"])
def test_mask_model_options_are_refused_on_a_uniform_model(gemma, option) -> None:
    with pytest.raises(ValueError, match=rf"\['{option}'\] do not apply to a uniform-noise"):
        DiffusionSampler(gemma, "gemma_renoise").generate(torch.tensor([[5, 6]]), gen_length=8,
                                                          **{option: True})


def test_eos_stop_on_commit_is_refused_on_a_uniform_model(gemma) -> None:
    with pytest.raises(ValueError, match=r"\['eos_stop_on_commit'\] do not apply"):
        DiffusionSampler(gemma, "gemma_renoise").generate(
            torch.tensor([[5, 6]]), gen_length=8, stop_at_eos=True, eos_stop_on_commit=True)


@pytest.mark.parametrize("graphs", ["yes", 1, 0.0])
def test_graphs_must_be_none_or_a_bool(llada, graphs) -> None:
    with pytest.raises(ValueError, match=r"graphs must be None .*, True or False"):
        DiffusionSampler(llada, "low_confidence", graphs=graphs)


@pytest.mark.parametrize("ids", ["a", [-5], [1.5], True, [2, None]])
def test_gemma_renoise_eos_ids_must_be_token_ids(ids) -> None:
    with pytest.raises(ValueError, match="eos_token_ids must be None .*a token id >= 0"):
        make_policy("gemma_renoise", eos_token_ids=ids)
    assert make_policy("gemma_renoise", eos_token_ids=[3, 4]).selector.eos_token_ids == (3, 4)
    assert make_policy("gemma_renoise", eos_token_ids=7).selector.eos_token_ids == (7,)


@pytest.mark.parametrize("name", ["t_min", "t_max"])
def test_gemma_renoise_temperatures_must_be_finite(name) -> None:
    """``t_max=inf`` divided every logit by inf (a uniform or NaN sampling distribution)."""
    with pytest.raises(ValueError, match=f"Renoise: {name} must be a finite number > 0"):
        make_policy("gemma_renoise", **{name: float("inf")})
