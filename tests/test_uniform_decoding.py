"""Uniform-noise decoding (``policies.renoise``, ``samplers.uniform``) on DiffusionGemma.

Conformance with transformers' DiffusionGemma ``generate`` comes in two kinds of check:
*same-machine reference* tests run the reference in the test, on the same CPU, and require
the library to equal it token for token (NFE, the canvas of every decoder forward and the
encoder inputs included) — on the conformance checkpoint and on checkpoints built from a
config and a seed; *recorded* tests compare ``diffusiongemma-tiny/cases.json`` only where the
recording does not depend on the machine's fp32 rounding (self-conditioned sampling makes
multi-step trajectories machine-dependent, see ``tests/gemma_reference.py``). Besides: batch
invariance with per-row seeds, the other acceptance rules, and clear errors for policies and
settings that do not fit the noise kind."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, load_model
from dllm_decode.models import build_model
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.renoise import Renoise, gemma_renoise, step_temperature
from dllm_decode.samplers.contract import PolicyContractError
from tests.conformance import CONFORMANCE, require_shared
from tests.gemma_reference import (
    Trace,
    assert_same_run,
    canvas_length,
    case_params,
    load_reference,
    reference_args,
    reference_modules,
    run_library,
    run_reference,
)
from tests.helpers import tiny_config, tiny_gemma

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = CONFORMANCE / "diffusiongemma-tiny"
#: transformers' own DiffusionGemma uses torch.jit.script_method, which torch deprecates: the
#: warning is the reference's, not ours
REFERENCE_WARNING = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"


@pytest.fixture(scope="module")
def gemma():
    return load_model(require_shared(TINY), dtype=torch.float32)


@pytest.fixture(scope="module")
def reference():
    """transformers' ``DiffusionGemmaForBlockDiffusion`` on the conformance checkpoint."""
    return load_reference(require_shared(TINY))


@pytest.fixture(scope="module")
def small():
    """Built from a config and a seed: the tests below run without ``../shared``."""
    return tiny_gemma(seed=1, steps=12)


def cases() -> list[dict]:
    path = TINY / "cases.json"
    return json.loads(path.read_text()) if path.is_file() else []


def _library(gemma, case: dict) -> Trace:
    params, g = case_params(case, canvas_length(TINY))
    mask = case["attention_mask"]
    return run_library(gemma, torch.tensor(case["prompt_ids"]),
                       None if mask is None else torch.tensor(mask), case["seed"], g, **params)


@pytest.mark.filterwarnings(REFERENCE_WARNING)
@pytest.mark.parametrize("case", cases(), ids=lambda c: c["name"])
def test_reference_case_same_machine(gemma, reference, case) -> None:
    """Same-machine reference: transformers' ``generate`` run here on the conformance
    checkpoint with the case's arguments and seed; the library equals it token for token, with
    the same decoder forwards (each one's canvas), encoder inputs and tokens per forward."""
    mask = case["attention_mask"]
    want = run_reference(reference, torch.tensor(case["prompt_ids"]),
                         None if mask is None else torch.tensor(mask), case["seed"],
                         **reference_args(case["args"]))
    assert_same_run(_library(gemma, case), want, gemma.pad_token_id)


def _fixed_forwards(case: dict) -> bool:
    """Whether the case's forward count does not depend on the trajectory: adaptive stopping
    off, one canvas (every step runs, no EOS can end a later canvas)."""
    args = case["args"]
    off = args.get("stability_threshold", 0) is None or \
        args.get("confidence_threshold", 0) is None
    return off and case["encoder_calls"] == 1


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["name"])
def test_reference_case_recorded(gemma, case) -> None:
    """Recorded, only what fp32 rounding cannot change: the first decoder input (the seed's
    initial canvas) and the first encoder input (the prompt) of every case; the NFE of a case
    whose forwards are fixed (``_fixed_forwards``); and every output of a case that runs one
    forward per canvas (nothing self-conditions), the tokens per forward included."""
    got = _library(gemma, case)
    assert got.decoder_inputs[0] == case["decoder_input_ids_per_forward"][0]
    assert got.encoder_inputs[0] == case["encoder_input_ids"][0] == case["prompt_ids"]
    if _fixed_forwards(case):
        assert got.forwards == case["nfe"]
    if case["nfe"] == case["encoder_calls"]:
        want = Trace(case["output_ids"], case["decoder_input_ids_per_forward"],
                     case["encoder_input_ids"], case["nfe"],
                     case["tokens_per_forward_reported"])
        assert_same_run(got, want, gemma.pad_token_id)


def test_recorded_cases_cover_the_stable_kinds() -> None:
    """The recorded checks above are not vacuous: the fixture holds a one-forward-per-canvas
    case and a fixed-forwards case."""
    found = cases()
    if not found:
        require_shared(TINY)
    assert any(c["nfe"] == c["encoder_calls"] for c in found)
    assert any(_fixed_forwards(c) for c in found)


def test_temperature_schedule_in_float32() -> None:
    """t = t_min + (t_max - t_min) * n / N in the reference's float32 order: N down to 1."""
    ts = [step_temperature(n, 12, 0.4, 0.8).item() for n in range(12, 0, -1)]
    assert ts[0] == pytest.approx(0.8) and ts[-1] == pytest.approx(0.4 + 0.4 / 12)
    assert step_temperature(12, 12, 0.4, 0.8).dtype == torch.float32


def test_per_row_seeds_equal_rows_alone(small) -> None:
    """With one seed per row, every row decodes (tokens, NFE) exactly as alone."""
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(3, 60, (3, 7), generator=gen)
    sampler = DiffusionSampler(small, "gemma_renoise", entropy_bound=0.5)
    batch = sampler.generate(prompts, gen_length=32, seed=[5, 6, 7])
    for r, seed in enumerate([5, 6, 7]):
        alone = sampler.generate(prompts[r:r + 1], gen_length=32, seed=seed)
        assert batch.tokens[r].tolist() == alone.tokens[0].tolist()
        assert batch.nfe[r].item() == alone.nfe[0].item()


def test_seeded_runs_repeat_and_budget_bounds_nfe(small) -> None:
    prompts = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(1))
    sampler = DiffusionSampler(small, "gemma_renoise", max_denoising_steps=5)
    a = sampler.generate(prompts, gen_length=24, seed=11)
    b = sampler.generate(prompts, gen_length=24, seed=11)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.nfe, b.nfe)
    assert (a.nfe <= 3 * 5).all() and a.forwards <= 3 * 5
    assert torch.equal(a.tokens[:, :9], prompts)  # the prompt is never touched


@pytest.mark.parametrize("policy,params", [
    ("eb", {"gamma": 0.5}), ("threshold", {"tau": 0.5}), ("entropy_threshold", {"theta": 0.5}),
])
def test_confidence_selectors_accept_on_a_uniform_canvas(small, policy, params) -> None:
    """Adaptive mask-model selectors that declare noise_kinds 'uniform' are the acceptance
    rule of ``Renoise`` (the model's budget and temperature schedule); they terminate."""
    sampler = DiffusionSampler(small, policy, **params)
    assert isinstance(sampler.policy.selector, Renoise)
    out = sampler.generate(torch.tensor([[5, 6, 7, 8]]), gen_length=16, seed=0)
    assert out.tokens.shape == (1, 20) and out.nfe.item() <= 2 * 12


def test_sticky_acceptance_keeps_accepted_tokens(small) -> None:
    """sticky=True: an accepted position is final (never re-noised), eligible shrinks, and a
    canvas ends once every position is accepted."""
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def record(state, accepted) -> None:
        s = slice(state.block_start, state.block_end)
        seen.append((state.eligible[:, s].clone(), accepted[:, s].clone(),
                     state.proposal.tokens[:, s].clone()))

    sampler = DiffusionSampler(small, "gemma_renoise", sticky=True, entropy_bound=1.0,
                               early_stop=False, max_denoising_steps=30)
    out = sampler.generate(torch.tensor([[9, 10, 11]]), gen_length=8, seed=2, on_step=record)
    kept = torch.zeros(1, 8, dtype=torch.bool)
    token = torch.zeros(1, 8, dtype=torch.long)
    for eligible, accepted, proposal in seen:
        assert torch.equal(eligible, ~kept)
        assert not (accepted & kept).any()
        token = torch.where(accepted, proposal, token)
        kept |= accepted
    assert kept.all() and out.nfe.item() == len(seen) < 30
    assert torch.equal(out.tokens[:, 3:], token)


@dataclass(frozen=True)
class _Rogue:
    """Accepts every canvas position, eligible or not (a broken acceptance rule)."""

    capabilities = Capabilities(budgeted=False, noise_kinds=("uniform",))

    def select(self, state):
        s = torch.zeros_like(state.eligible)
        s[:, state.block_start - 1:state.block_end] = True
        return s


def test_acceptance_outside_eligible_is_an_error(small) -> None:
    with pytest.raises(PolicyContractError, match="not eligible"):
        DiffusionSampler(small, Renoise(accept=_Rogue())).generate(
            torch.tensor([[5, 6]]), gen_length=16, seed=0)


def test_mask_policy_on_uniform_model_is_a_clear_error(small) -> None:
    for name in ("low_confidence", "random", "sched"):
        with pytest.raises(ValueError, match="uniform-noise model"):
            DiffusionSampler(small, name)


def test_uniform_preset_on_mask_model_is_a_clear_error() -> None:
    llada = build_model(tiny_config("llada"), seed=0)
    with pytest.raises(ValueError, match="noise_kind 'mask'"):
        DiffusionSampler(llada, "gemma_renoise")
    with pytest.raises(ValueError, match="noise_kind 'mask'"):
        DiffusionSampler(llada, gemma_renoise(early_stop=False))


@pytest.mark.parametrize("overrides,match", [
    ({"temperature": 0.7}, "temperature"), ({"block_length": 4}, "canvas_length"),
    ({"steps": 5, "gen_length": 16}, "multiple of 2"), ({"cache": "prefix"}, "do not apply"),
])
def test_settings_without_meaning_are_errors(small, overrides, match) -> None:
    kw = {"gen_length": 16} | overrides
    with pytest.raises(ValueError, match=match):
        DiffusionSampler(small, "gemma_renoise").generate(torch.tensor([[5, 6]]), **kw)


def test_compile_on_uniform_model_is_a_clear_error(small) -> None:
    """``compile=True`` compiles the mask-model step: on a uniform model it is refused when
    the sampler is built, never silently ignored."""
    with pytest.raises(ValueError, match="runs its step eagerly"):
        DiffusionSampler(small, "gemma_renoise", compile=True)


def test_renoising_is_recorded_as_edits(small) -> None:
    """Re-noising rewrites accepted positions: the editing capability is declared and
    ``Generation.edits`` marks, per step, accepted positions whose token changed; sticky
    acceptance declares no edits and records none."""
    accepted = torch.zeros(1, 8, dtype=torch.bool)
    before: list[torch.Tensor] = []

    def record(state, chosen) -> None:
        s = slice(state.block_start, state.block_end)
        assert torch.equal(state.editable[:, s], accepted)  # accepted at earlier steps
        before.append(accepted.clone())
        accepted.logical_or_(chosen[:, s])

    sampler = DiffusionSampler(small, "gemma_renoise", entropy_bound=1.0, early_stop=False)
    assert sampler.capabilities.selector.edits
    out = sampler.generate(torch.tensor([[4, 5, 6]]), gen_length=8, seed=1, on_step=record)
    assert out.edits.shape == (1, out.steps, 8) and out.edits.any()
    for step, was in enumerate(before):
        assert not (out.edits[:, step] & ~was).any()  # only accepted positions are edited
    sticky = DiffusionSampler(small, "gemma_renoise", sticky=True)
    assert not sticky.capabilities.selector.edits
    assert sticky.generate(torch.tensor([[4, 5, 6]]), gen_length=8, seed=1).edits is None


def test_uniform_oracle_is_the_exact_posterior() -> None:
    """The test bed's uniform-noise oracle: a canvas holding a valid answer points every
    position at it; a copy task (one valid answer) decodes exactly under ``gemma_renoise``."""
    from dllm_decode.eval.runner import left_pad
    from dllm_decode.models.uniform_oracle import UniformOracle
    from dllm_decode.train.testbed import grade, waiting_line_oracle
    from dllm_decode.train.testbed_eval import held_out_prompts

    oracle = waiting_line_oracle()
    uniform = UniformOracle(oracle, canvas_length=16)
    records, prompts = held_out_prompts(oracle, "copy", 4)
    ids, attn = left_pad(prompts, oracle.pad_token_id)
    answers = torch.stack([oracle.answer_table(p, 16)[0] for p in prompts])
    cache = uniform.new_cache(4, ids.shape[1] + 16)
    uniform.encode(ids, cache, attn.bool())
    assert torch.equal(uniform.decode(answers, cache).argmax(-1), answers)
    out = DiffusionSampler(uniform, "gemma_renoise", max_denoising_steps=8).generate(
        ids, attn, gen_length=16)
    assert all(grade("copy", rec, oracle.decode(ans))
               for rec, ans in zip(records, out.answer.tolist(), strict=True))


def _reference_model(tmp: Any, seed: int, canvas: int, window: int, experts: int, top_k: int):
    """A seeded tiny checkpoint written by transformers' own DiffusionGemma class (weights
    drawn as the fixtures draw them), its generation config, and the reference model."""
    tf, gen_mod = reference_modules()
    text = {"vocab_size": 200, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "global_head_dim": 16, "num_global_key_value_heads": 1,
            "layer_types": ["sliding_attention"] * 2 + ["full_attention"],
            "sliding_window": window, "num_experts": experts, "top_k_experts": top_k,
            "moe_intermediate_size": 8, "max_position_embeddings": 256, "pad_token_id": 0,
            "eos_token_id": 1, "bos_token_id": 2, "model_type": "diffusion_gemma_text"}
    vision = {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 37,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1,
              "head_dim": 64, "patch_size": 5, "image_size": 20, "pooling_kernel_size": 3,
              "position_embedding_size": 10240}
    cfg = tf.DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas,
                                  boi_token_id=190, image_token_id=191, eoi_token_id=192,
                                  eos_token_id=[1, 106])
    ref = tf.DiffusionGemmaForBlockDiffusion(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(ref.named_parameters()):
            draw = torch.randn if p.dim() >= 2 else torch.rand
            p.copy_((draw(p.shape, generator=g, dtype=torch.float64) * 0.5
                     + (0 if p.dim() >= 2 else 0.5)).float())
    ref.generation_config = gen_mod.DiffusionGemmaGenerationConfig(
        max_new_tokens=2 * canvas, max_denoising_steps=6,
        sampler_config=gen_mod.EntropyBoundSamplerConfig(entropy_bound=0.5), t_min=0.4,
        t_max=0.8, stability_threshold=1, confidence_threshold=0.05, eos_token_id=[1, 106],
        pad_token_id=0, bos_token_id=2)
    ref.save_pretrained(tmp)
    return tf.DiffusionGemmaForBlockDiffusion.from_pretrained(tmp, dtype=torch.float32).eval()


@pytest.mark.filterwarnings(REFERENCE_WARNING)
@pytest.mark.parametrize("seed,canvas,window,experts,top_k", [(11, 8, 4, 4, 2), (12, 6, 7, 6, 3)])
def test_other_sizes_and_padding_match_transformers(tmp_path, seed, canvas, window, experts,
                                                    top_k) -> None:
    """Same-machine reference beyond the conformance checkpoint (runs without ``../shared``):
    checkpoints built from a config and a seed (other sizes, canvas lengths and windows), a
    left-padded batch and an unpadded one, against transformers' own ``generate`` run here
    (skipped without a transformers that has DiffusionGemma): tokens, every decoder forward's
    canvas, the encoder inputs, NFE and tokens per forward identical."""
    ref = _reference_model(tmp_path, seed, canvas, window, experts, top_k)
    mine = load_model(tmp_path, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (2, 9), generator=g)
    for mask in (torch.ones(2, 9, dtype=torch.long),
                 torch.tensor([[0] * 5 + [1] * 4, [1] * 9])):
        ids = ids.masked_fill(mask == 0, 0)
        want = run_reference(ref, ids, mask, seed)
        got = run_library(mine, ids, mask, seed, 2 * canvas)
        assert_same_run(got, want, mine.pad_token_id)
