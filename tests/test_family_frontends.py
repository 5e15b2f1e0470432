"""The 2026 families through every front end: ``generate_text``, the sweep runner (a grid with
``policy: default`` and ``block_length: model``), the lm-eval adapter's generate path and the
CLI, with each family's default preset (``policies.defaults``), its stop tokens and any
``gen_length``. Models are built from a config and a seed with the bundled tokenizer's
vocabulary (mask 2, EOS 1; the conformance checkpoints have no tokenizer)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, generate_text, load_tokenizer
from dllm_decode.eval.decoding import sampler_decode_fn
from dllm_decode.eval.parallelbench.codec import TokenizerCodec
from dllm_decode.eval.parallelbench.grid import parse_grid
from dllm_decode.eval.parallelbench.rows import read_rows
from dllm_decode.eval.runner import load_records, run_grid
from dllm_decode.policies.defaults import (
    FAMILY_DEFAULTS,
    apply_family_default,
    family_defaults,
)
from dllm_decode.policies.resolve import PRESETS
from dllm_decode.text import stop_token_ids
from tests.docs_text import doc_section
from tests.helpers import tiny_gemma_config, tiny_model
from tests.moe_helpers import tiny_moe_model

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
#: the bundled tokenizer's ids
MASK_ID, EOS_ID, PAD_ID = 2, 1, 0
#: test name -> (model.family, its default preset)
FAMILIES = {
    "llada2": ("llada2_moe", "llada2"),
    "fastdllm2": ("fast_dllm_qwen", "fastdllm_v2"),
    "lladamoe": ("lladamoe", "low_confidence"),
    "sdarmoe": ("sdar_moe", "low_confidence_dynamic"),
    "gemma": ("diffusion_gemma", "gemma_renoise"),
}


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer("tiny-llada")


def family_model(name: str, vocab: int) -> Any:
    """A tiny random model of family ``name`` sized to the bundled tokenizer."""
    ids = dict(vocab_size=vocab, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    if name == "gemma":
        from dllm_decode.models.gemma_loading import build_diffusion_gemma

        return build_diffusion_gemma(tiny_gemma_config(**ids, bos_token_id=3), seed=0,
                                     init_std=0.5, generation={"max_denoising_steps": 4})
    return tiny_moe_model(name, mask_token_id=MASK_ID, **ids)


def test_every_family_default_is_a_preset() -> None:
    assert all(d.policy in PRESETS for d in FAMILY_DEFAULTS.values())
    table = doc_section("## Supported model families")
    for d in FAMILY_DEFAULTS.values():  # the docs' families table names each default
        assert f"`{d.policy}`" in table, d.policy


def test_resolve_policy_keeps_the_users_choices() -> None:
    model = tiny_moe_model("fastdllm2")
    assert apply_family_default(model, None) == ("fastdllm_v2", {"stop_at_eos": True},
                                                 "block_causal")
    assert apply_family_default(model, "default", {"stop_at_eos": False, "threshold": 0.5},
                                "none") \
        == ("fastdllm_v2", {"stop_at_eos": False, "threshold": 0.5}, "none")
    assert apply_family_default(model, "threshold", {"tau": 0.7}) == ("threshold", {"tau": 0.7},
                                                                      None)
    assert family_defaults(tiny_model("llada")).policy == "low_confidence"


@pytest.mark.parametrize("name", [*sorted(FAMILIES), "llada"])
def test_sampler_without_a_policy_takes_the_family_default(name: str) -> None:
    """``DiffusionSampler(model)`` / ``build_sampler(model)`` with no policy: the family's
    preset, its parameters and cache (``low_confidence`` on LLaDA, ``gemma_renoise`` on
    DiffusionGemma, where ``low_confidence`` is refused); the user's own settings win; the
    same tokens as naming the default."""
    from dllm_decode.samplers.build import build_sampler

    model = tiny_model("llada") if name == "llada" else family_model(name, 40)
    want = family_defaults(model)
    sampler = DiffusionSampler(model)
    assert sampler.policy.name == want.policy
    assert build_sampler(model).policy.name == want.policy
    cache = want.cache or sampler.capabilities.selector.preferred_cache or "none"
    assert sampler.config.cache.value == cache
    for key, value in want.params.items():
        assert getattr(sampler.config, key) == value
    assert DiffusionSampler(model, "default").policy.name == want.policy
    if want.params:  # the user's parameters win over the family's
        key = next(iter(want.params))
        flipped = not want.params[key]
        assert getattr(DiffusionSampler(model, **{key: flipped}).config, key) == flipped
    prompt = torch.tensor([[5, 6, 7]])
    named = DiffusionSampler(model, want.policy, want.cache, **want.params)
    kw = dict(gen_length=8, seed=2)
    a, b = sampler.generate(prompt, **kw), named.generate(prompt, **kw)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.nfe, b.nfe)
    if name == "gemma":  # the old hard-coded default is a mask policy: refused here
        with pytest.raises(ValueError, match="uniform-noise"):
            DiffusionSampler(model, "low_confidence")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_generate_text_with_the_family_default(tok, name: str) -> None:
    """Chat template applied, the family's preset, a gen_length that is not a multiple of the
    block (4) / canvas (8): exactly 10 tokens, no mask left, answers cut at EOS."""
    model = family_model(name, len(tok))
    assert model.family == FAMILIES[name][0]
    policy, params, cache = apply_family_default(model, None, {"gen_length": 10, "seed": 1})
    assert policy == FAMILIES[name][1]
    sampler = DiffusionSampler(model, policy, cache, **params)
    out = generate_text(sampler, tok, ["Maya Doyle", "the cat"])  # chat template: the tok's
    gen = out.generation
    assert gen.answer.shape == (2, 10) and len(out.texts) == 2
    assert EOS_ID in out.stop_token_ids
    if getattr(model, "noise_kind", "mask") == "mask":
        assert (gen.answer != MASK_ID).all()
    rendered = tok.apply_chat_template([{"role": "user", "content": "the cat"}],
                                       add_generation_prompt=True, tokenize=False)
    assert out.prompt_ids[1, -len(tok(rendered)["input_ids"]):].tolist() == \
        tok(rendered, add_special_tokens=False)["input_ids"]
    for row, text in zip(gen.answer.tolist(), out.texts, strict=True):
        cut = next((i for i, t in enumerate(row) if t in out.stop_token_ids), len(row))
        assert text == tok.decode(row[:cut], skip_special_tokens=True)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_runner_grid_with_policy_default(tok, tmp_path: Path, name: str) -> None:
    """A grid sweep ``policy: default`` with ``block_length: model`` runs each family's preset
    (resolved once the model is known) with answers ending at the tokenizer's stop tokens."""
    model = family_model(name, len(tok))
    grid = parse_grid({
        "tasks": ["waiting_line/copy"], "source": "generated", "num_samples": 2,
        "icl_examples": 0, "batch_size": 2,
        "sweeps": [{"policy": "default", "block_length": "model", "gen_length": 10}],
    })
    records = load_records(grid)
    codec = TokenizerCodec(tok, eos_token_ids=stop_token_ids(tok, model))
    summary = run_grid(grid, records, tmp_path, decode=sampler_decode_fn(model), codec=codec,
                       model=name, progress=False)
    rows = read_rows(summary.rows_path)
    assert len(rows) == 2
    for row in rows:
        assert row["config"]["policy"] == "default" and row["config"]["block_length"] is None
        assert row["gen_tokens_budget"] == 10 and len(row["commit_steps"]) == 10
        assert row["nfe"] >= 1 and isinstance(row["prediction"], str)


@pytest.mark.parametrize("name", ["llada2", "gemma"])
def test_runner_refuses_full_blocks_with_the_fix(tok, tmp_path: Path, name: str) -> None:
    model = family_model(name, len(tok))
    grid = parse_grid({"tasks": ["waiting_line/copy"], "source": "generated", "num_samples": 1,
                       "icl_examples": 0, "sweeps": [{"policy": "default", "gen_length": 16}]})
    with pytest.raises(ValueError, match="block_length: model"):
        run_grid(grid, load_records(grid), tmp_path, decode=sampler_decode_fn(model),
                 codec=TokenizerCodec(tok), model=name, progress=False)


def test_example_grid_for_llada2_parses_and_runs(tok, tmp_path: Path) -> None:
    """``benchmarks/grids/llada2_mini.yaml`` (written for LLaDA2.0-mini on a GPU) on a tiny
    LLaDA2 built from a seed, its first two docs of one task."""
    from dllm_decode.eval.parallelbench.grid import load_grid

    grid = load_grid(ROOT / "benchmarks/grids/llada2_mini.yaml")
    grid = parse_grid({"tasks": ["waiting_line/copy"], "source": "generated", "num_samples": 1,
                       "icl_examples": 0, "batch_size": 1,
                       "sweeps": [dict(s) for s in _raw_sweeps(grid)]})
    model = family_model("llada2", len(tok))
    summary = run_grid(grid, load_records(grid), tmp_path, decode=sampler_decode_fn(model),
                       codec=TokenizerCodec(tok, eos_token_ids=stop_token_ids(tok, model)),
                       model="llada2", progress=False)
    rows = read_rows(summary.rows_path)
    assert {r["config"]["policy"] for r in rows} >= {"llada2", "llada21"}
    assert all(r["nfe"] >= 1 for r in rows)


def _raw_sweeps(grid: Any) -> list[dict[str, Any]]:
    """The sweeps of a parsed grid back as YAML-style mappings (gen_length shortened to 8)."""
    out = []
    for s in grid.sweeps:
        raw: dict[str, Any] = {"policy": list(s.policy), "cache": list(s.cache),
                               "block_length": list(s.block_length), "gen_length": 8,
                               "params": {k: list(v) for k, v in s.params}}
        out.append(raw)
    return out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_lm_eval_generate_until_with_the_family_default(tok, tmp_path: Path, name: str) -> None:
    pytest.importorskip("lm_eval", reason="lm-eval is not installed")
    from dllm_decode.eval.lm_eval import DllmDecodeLM

    model = family_model(name, len(tok))
    speed = tmp_path / "speed.jsonl"
    lm = DllmDecodeLM(model=model, tokenizer=tok, device="cpu", speed_log=str(speed))
    assert set(stop_token_ids(tok, model)) <= set(lm.eos_ids)
    sampler_kw, generate_kw = lm.decode_settings({"max_gen_toks": 10})
    assert generate_kw["gen_length"] == 10  # exactly: whole blocks / canvases inside
    assert lm._sampler(sampler_kw).policy.name == FAMILIES[name][1]
    requests = [SimpleNamespace(args=(prompt, {"max_gen_toks": 10, "until": ["\n\n"]}))
                for prompt in ("Maya Doyle", "the cat")]
    texts = lm.generate_until(requests)
    assert len(texts) == 2 and all(isinstance(t, str) and "\n\n" not in t for t in texts)
    logged = [json.loads(line) for line in speed.read_text().splitlines()]
    assert [r["config"]["policy"] for r in logged] == [FAMILIES[name][1]] * 2
    if getattr(model, "noise_kind", "mask") == "uniform":
        with pytest.raises(NotImplementedError, match="no mask token"):
            lm.loglikelihood([SimpleNamespace(args=("a", " b"))])


def test_cli_generate_uses_the_family_default(tok, tmp_path: Path, capsys) -> None:
    """``dllm-decode generate`` without ``--policy`` on a LLaDA2 checkpoint runs ``llada2``,
    for a gen_length that is not a multiple of its block."""
    import shutil

    from dllm_decode.cli import main
    from dllm_decode.models import save_model
    from dllm_decode.models.loading import resolve_path

    save_model(family_model("llada2", len(tok)), tmp_path / "m")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(resolve_path("tiny-llada") / f, tmp_path / "m" / f)
    assert main(["generate", "Maya Doyle", "--model", str(tmp_path / "m"), "--gen-length", "10",
                 "--block-length", "4"]) == 0
    err = capsys.readouterr().err
    assert "policy=llada2 cache=none" in err and re.search(r"NFE=\d+", err)


def test_gen_length_not_a_multiple_of_the_block() -> None:
    """Block-diffusion models decode any gen_length in their own blocks (an explicit
    block_length equal to it too) and return exactly G tokens; with ``decode_block_padding``
    (LLaDA2's reference quirk) the last block is decoded whole and cut back. LLaDA's
    prompt-relative blocks still need G % K == 0, with an error naming the fix."""
    model = tiny_moe_model("llada2")  # blocks of 4
    prompt = torch.randint(0, 60, (2, 5))
    kw = dict(gen_length=10, steps=4)
    implicit = DiffusionSampler(model, "llada2", **kw).generate(prompt)
    explicit = DiffusionSampler(model, "llada2", block_length=4, **kw).generate(prompt)
    assert implicit.tokens.shape == (2, 15) and torch.equal(implicit.tokens, explicit.tokens)
    assert torch.equal(implicit.nfe, explicit.nfe)
    padded = DiffusionSampler(model, "llada2", block_length=4, decode_block_padding=True,
                              **kw).generate(prompt)
    assert padded.tokens.shape == (2, 15) and padded.commit_step.shape == (2, 10)
    # the padded canvas (P + G = 15 -> 16) decodes one more position in the last block
    assert not (padded.answer == model.mask_token_id).any()
    with pytest.raises(ValueError, match="own block size .*block_length=None"):
        DiffusionSampler(model, "llada2", block_length=8, **kw).generate(prompt)
    with pytest.raises(ValueError, match="divisible by block_length.*LLaDA"):
        DiffusionSampler(tiny_model("llada"), "low_confidence", gen_length=10,
                         block_length=4).generate(prompt)


def test_uniform_gen_length_not_a_multiple_of_the_canvas() -> None:
    from dllm_decode.models.gemma_loading import build_diffusion_gemma

    model = build_diffusion_gemma(tiny_gemma_config(), seed=0, init_std=0.5,
                                  generation={"max_denoising_steps": 3})
    prompt = torch.randint(3, 60, (1, 4))
    a = DiffusionSampler(model, "gemma_renoise", gen_length=12, seed=0).generate(prompt)
    b = DiffusionSampler(model, "gemma_renoise", gen_length=12, block_length=8,
                         seed=0).generate(prompt)
    assert a.answer.shape == (1, 12) and torch.equal(a.tokens, b.tokens)


def test_generation_config_eos_needs_a_directory(tmp_path: Path, monkeypatch) -> None:
    """A tokenizer without a directory does not read ``./generation_config.json``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    tok = SimpleNamespace(name_or_path="", eos_token_id=5)
    assert stop_token_ids(tok) == (5,)


@pytest.mark.parametrize("policy,params", [("llada2", {}), ("llada21", {"mode": "speed"})])
def test_readme_llada2_settings_cache_is_exact(policy: str, params: dict) -> None:
    """The quick start's LLaDA2 settings: ``block_causal`` gives the tokens and NFE of no
    cache (the reference's), editing included, at a gen_length off the block grid."""
    model = tiny_moe_model("llada2")
    prompt = torch.randint(0, 60, (3, 7))
    kw = dict(gen_length=13, block_eos_stop=True, **params)
    a = DiffusionSampler(model, policy, cache="none", **kw).generate(prompt)
    b = DiffusionSampler(model, policy, cache="block_causal", **kw).generate(prompt)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.nfe, b.nfe)
