"""Helpers mapping the reference decoders' recorded cases onto ``DiffusionSampler`` settings.

Every field of a case is either mapped onto a sampler setting, checked against the model or the
case itself, or listed as description / expected output below. Anything else raises
``UnmappedCaseField``: a case from a newer recording with a setting this harness does not know
fails loudly instead of being reproduced with that setting silently dropped.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CONFORMANCE = SHARED / "conformance"

#: case fields that describe the recording and set nothing
INFO: Final = frozenset({
    "name", "description", "notes", "reference", "reference_repo", "reference_path",
    "reference_function", "reference_commit", "model_forward", "rng", "checks", "call",
    "cross_checked_with", "differs_from",
})
#: recorded outputs: compared by the tests (``output_ids``, ``nfe``) or consistency-checked
#: here (``answer_ids``); the per-forward traces are diagnostics for a failing case
EXPECTED: Final = frozenset({
    "output_ids", "answer_ids", "nfe", "nfe_reported_by_reference", "forward_input_ids",
    "forward_kinds", "commits_per_step",
})
#: inputs, mapped by ``tensors``
INPUTS: Final = frozenset({"prompt_ids", "attention_mask", "seed"})
LLADA_TOP: Final = INFO | EXPECTED | INPUTS | {"settings", "args"}
DREAM_TOP: Final = INFO | EXPECTED | INPUTS | {"effective_generation_config", "args"}
#: LLaDA / Fast-dLLM settings this harness maps (``settings`` and the call's ``args``)
LLADA_SETTINGS: Final = frozenset({
    "steps", "gen_length", "block_length", "temperature", "remasking", "cfg_scale",
    "threshold", "factor", "mask_id", "seed", "batch_size", "cache", "logits_eos_inf",
    "confidence_eos_eot_inf",
})
DREAM_SETTINGS: Final = frozenset({
    "alg", "alg_temp", "eps", "steps", "max_new_tokens", "max_length", "temperature", "top_k",
    "top_p", "mask_token_id", "eos_token_id", "pad_token_id",
})
#: ``remasking`` -> the score ranking candidates (``threshold``/``factor``: what is compared)
REMASKING: Final = {"low_confidence": "prob", "random": "random"}
CACHES: Final = frozenset({"none", "prefix", "dual"})
DREAM_ALGS: Final = frozenset({"origin", "maskgit_plus", "topk_margin", "entropy"})


class UnmappedCaseField(ValueError):
    """A case carries a field or a value this harness does not reproduce."""


def require_shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent (the ../shared fixtures are not in a user's clone)")
    return path


def assert_reference_logits(model: Any, directory: Path,
                            forward: Callable[[dict[str, Any], torch.Tensor, torch.Tensor],
                                              torch.Tensor] | None = None) -> None:
    """Every input of ``directory/logits.json``: the model's fp32 logits within 1e-4 of the
    reference's, with the same argmax. ``forward(input, ids [1, N], positions [1, N]) ->
    logits [1, N, V]`` (default: ``model(ids, positions)``) runs under ``no_grad``."""
    data = json.loads((directory / "logits.json").read_text())
    for inp in data["inputs"]:
        ids = torch.tensor([inp["input_ids"]])
        pos = torch.tensor([inp["positions"]])
        with torch.no_grad():
            out = (model(ids, pos) if forward is None else forward(inp, ids, pos))[0]
        ref = torch.tensor(inp["logits"])
        if model.logit_shift:  # logits.json holds raw rows: raw[i] predicts token i + 1
            out, ref = out[1:], ref[:-1]
        assert (out - ref).abs().max().item() < 1e-4, inp["name"]
        assert torch.equal(out.argmax(-1), ref.argmax(-1)), inp["name"]


def load_cases(family_dir: str) -> list[dict[str, Any]]:
    path = CONFORMANCE / family_dir / "cases.json"
    if not path.exists():
        return []
    return json.loads(path.read_text())


def _only(fields: Any, known: frozenset[str], where: str, case: dict[str, Any]) -> None:
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UnmappedCaseField(f"{case.get('name')}: {where} field(s) {unknown} are not mapped "
                                "by tests/conformance.py")


def _consistent(case: dict[str, Any], merged: dict[str, Any], args: dict[str, Any],
                where: str) -> None:
    """``args`` (what the reference call passed) must agree with the effective settings."""
    for key, value in args.items():
        if key in merged and merged[key] != value:
            raise UnmappedCaseField(f"{case.get('name')}: {where} {key}={merged[key]!r} but the "
                                    f"call passed {value!r}")


def _check_answer(case: dict[str, Any]) -> None:
    if "answer_ids" in case:
        p = len(case["prompt_ids"][0])
        if [row[p:] for row in case["output_ids"]] != case["answer_ids"]:
            raise UnmappedCaseField(f"{case.get('name')}: answer_ids is not output_ids[:, P:]")


def _check_ids(case: dict[str, Any], model: Any, ids: dict[str, int | None]) -> None:
    """Token ids the reference was called with must be the model's."""
    if model is None:
        return
    eos = tuple(getattr(model, "eos_token_ids", ()) or ())
    for key, value in ids.items():
        if value is None:
            continue
        ok = (value == model.mask_token_id if key.startswith("mask") else value in eos)
        if not ok:
            raise UnmappedCaseField(f"{case.get('name')}: {key}={value} does not match the model "
                                    f"(mask {model.mask_token_id}, eos {eos})")


def llada_settings(case: dict[str, Any], model: Any = None) -> tuple[str, dict[str, Any]]:
    """(policy, sampler kwargs) reproducing a LLaDA / Fast-dLLM case; raises
    ``UnmappedCaseField`` on any field or value it does not reproduce."""
    _only(case, LLADA_TOP, "case", case)
    # LLaDA-MoE's cases (plain ``generate`` on another model) record only the call's args
    args = case.get("args") or {}
    s = case.get("settings", args)
    _only(s, LLADA_SETTINGS, "settings", case)
    _only(args, LLADA_SETTINGS, "args", case)
    _consistent(case, s, args, "settings")
    merged = {**args, **s}
    _check_answer(case)
    _check_ids(case, model, {"mask_id": merged.get("mask_id")})
    if merged.get("seed", case["seed"]) != case["seed"]:
        raise UnmappedCaseField(f"{case['name']}: settings seed != case seed")
    if merged.get("batch_size", len(case["prompt_ids"])) != len(case["prompt_ids"]):
        raise UnmappedCaseField(f"{case['name']}: batch_size != number of prompts")
    remasking = merged.get("remasking", "low_confidence")
    cache = merged.get("cache") or "none"
    if remasking not in REMASKING or cache not in CACHES:
        raise UnmappedCaseField(f"{case['name']}: remasking={remasking!r} / cache={cache!r}")
    params: dict[str, Any] = dict(
        gen_length=merged["gen_length"], block_length=merged["block_length"],
        steps=merged["steps"], temperature=merged["temperature"],
        cfg_scale=merged.get("cfg_scale") or 0.0, seed=case["seed"], rng="reference",
        allow_prompt_masks=True, sampling="gumbel", schedule="llada", exact_steps=True,
        logits_eos_inf=bool(merged.get("logits_eos_inf")),
        confidence_eos_eot_inf=bool(merged.get("confidence_eos_eot_inf")),
    )
    if cache != "none":
        params["cache"] = cache
    threshold, factor = merged.get("threshold"), merged.get("factor")
    if threshold is not None and factor is not None:
        raise UnmappedCaseField(f"{case['name']}: both threshold and factor are set")
    score = REMASKING[remasking]
    if threshold is not None:
        return "threshold", params | {"tau": threshold, "score": score}
    if factor is not None:
        return "factor", params | {"factor": factor, "last_rank_quirk": True, "score": score}
    return ("random" if remasking == "random" else "low_confidence"), params


def dream_settings(case: dict[str, Any], model: Any = None) -> tuple[str, dict[str, Any]]:
    """(policy, sampler kwargs) reproducing a Dream ``diffusion_generate`` case (run with the
    case's *effective* generation config); raises ``UnmappedCaseField`` on anything else."""
    _only(case, DREAM_TOP, "case", case)
    e, args = case["effective_generation_config"], case.get("args") or {}
    _only(e, DREAM_SETTINGS, "effective_generation_config", case)
    _only(args, DREAM_SETTINGS, "args", case)
    _consistent(case, e, args, "effective_generation_config")
    _check_answer(case)
    _check_ids(case, model, {"mask_token_id": e.get("mask_token_id"),
                             "eos_token_id": e.get("eos_token_id"),
                             "pad_token_id": e.get("pad_token_id")})
    if e["alg"] not in DREAM_ALGS:
        raise UnmappedCaseField(f"{case['name']}: alg={e['alg']!r}")
    p = len(case["prompt_ids"][0])
    if e.get("max_length") is not None and e["max_length"] != p + e["max_new_tokens"]:
        raise UnmappedCaseField(f"{case['name']}: max_length != prompt + max_new_tokens")
    params: dict[str, Any] = dict(
        gen_length=e["max_new_tokens"], steps=e["steps"], temperature=e["temperature"] or 0.0,
        top_p=e["top_p"], top_k=e["top_k"], eps=e["eps"], seed=case["seed"], rng="reference",
        sampling="categorical", schedule="dream", exact_steps=True,
    )
    # ``origin`` ignores alg_temp in the reference (it reveals at random, ranks nothing)
    if e["alg"] != "origin" and e.get("alg_temp"):
        params["alg_temp"] = e["alg_temp"]
    return e["alg"], params


def tensors(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    prompt = torch.tensor(case["prompt_ids"], dtype=torch.long)
    mask = case.get("attention_mask")
    return prompt, (torch.tensor(mask, dtype=torch.long) if mask is not None else None)


#: LLaDA2.x ``generate`` keyword arguments this harness maps (both modeling files)
LLADA2_ARGS: Final = frozenset({
    "temperature", "block_length", "steps", "gen_length", "threshold", "eos_id", "mask_id",
    "minimal_topk", "top_k", "top_p", "eos_early_stop", "editing_threshold", "max_post_steps",
    "num_to_transfer",
})
LLADA2_TOP: Final = INFO | EXPECTED | INPUTS | {"args", "family", "returned_ids"}
#: ``generate`` defaults of the two remote-code files (LLaDA2.0 / LLaDA2.1)
LLADA2_DEFAULTS: Final = {
    "LLaDA2.0": {"threshold": 0.95, "steps": 32, "minimal_topk": 1},
    "LLaDA2.1": {"threshold": 0.95, "editing_threshold": 0.9, "max_post_steps": 16,
                 "num_to_transfer": 1},
}


def llada2_settings(case: dict[str, Any], model: Any = None) -> tuple[str, dict[str, Any]]:
    """(policy, sampler kwargs) reproducing a LLaDA2.0 / LLaDA2.1 ``generate`` case: the
    ``llada2`` / ``llada21`` presets with the reference's quirks the recording needs (padding
    blocks decoded: ``decode_block_padding``; the EOS rules: ``block_eos_stop`` after every
    block for 2.0 and with ``eos_early_stop`` for 2.1, ``stop_at_eos`` for 2.0's in-block
    early stop). Raises ``UnmappedCaseField`` on any field it does not map."""
    _only(case, LLADA2_TOP, "case", case)
    args = case["args"]
    _only(args, LLADA2_ARGS, "args", case)
    _check_answer(case)
    _check_ids(case, model, {"mask_id": args.get("mask_id"), "eos_id": args.get("eos_id")})
    family = case.get("family")
    if family not in LLADA2_DEFAULTS:
        raise UnmappedCaseField(f"{case['name']}: family={family!r}")
    a = {**LLADA2_DEFAULTS[family], **args}
    v20 = family == "LLaDA2.0"
    if v20 and {"editing_threshold", "max_post_steps", "num_to_transfer"} & set(args):
        raise UnmappedCaseField(f"{case['name']}: LLaDA2.0 has no editing arguments")
    early = bool(a.get("eos_early_stop"))
    params: dict[str, Any] = dict(
        # the block is the model's (``with_block_size(block_length)``): gen_length need not be
        # a multiple of it, as in the reference
        gen_length=a["gen_length"], block_length=None,
        temperature=a.get("temperature") or 0.0, top_k=a.get("top_k"), top_p=a.get("top_p"),
        seed=case["seed"], rng="reference", sampling="llada2", decode_block_padding=True,
        block_eos_stop=v20 or early, stop_at_eos=v20 and early, eos_stop_on_commit=v20 and early,
        threshold=a["threshold"])
    if v20:
        return "llada2", params | {"steps": a["steps"], "minimal_topk": a["minimal_topk"]}
    return "llada21", params | {"editing_threshold": a["editing_threshold"],
                                "max_post_steps": a["max_post_steps"],
                                "num_to_transfer": a["num_to_transfer"]}


def cut_at_eos(tokens: torch.Tensor, p: int, g: int, eos: int) -> list[int]:
    """Row 0 of ``tokens`` as LLaDA2's ``generate`` returns it with the prompt: the answer
    ``[p, p + g)`` cut after its first EOS (inclusive)."""
    answer = tokens[0, p:p + g].tolist()
    if eos in answer:
        answer = answer[:answer.index(eos) + 1]
    return tokens[0, :p].tolist() + answer


#: Fast-dLLM v2 ``batch_sample`` / ``generate`` keyword arguments this harness maps
FDV2_ARGS: Final = frozenset({
    "block_size", "small_block_size", "max_new_tokens", "threshold", "mask_id", "stop_token",
    "min_len", "seq_len", "tokenizer.pad_token_id", "temperature", "top_p", "use_block_cache",
})
FDV2_TOP: Final = INFO | EXPECTED | INPUTS | {"args", "input_ids_passed", "input_note"}


def fastdllm2_settings(case: dict[str, Any], row: int | None = None
                       ) -> tuple[str, dict[str, Any], int]:
    """(policy, sampler kwargs, stop token) reproducing a Fast-dLLM v2 case with the
    ``fastdllm_v2`` preset: the canvas the reference builds (the prompt's blocks plus
    ``max_new_tokens // block_size`` blocks, plus the next block's AR token when the last
    block completes), its cache (``use_block_cache``: ``cache="sub_block"``, else the exact
    ``block_causal``), its prompt prefill as a forward of its own (``separate_prefill``: the
    reference's forward count) and its stop rule (``batch_sample``: a row stops after the
    block in which it committed the stop token, ``block_eos_stop``; ``generate``: as soon as
    the stop token has nothing masked before it, ``stop_at_eos``). The model's EOS must be the
    case's stop token; seeded cases sample as the reference (``mask_in_softmax``). Raises
    ``UnmappedCaseField`` on anything else (a batch without ``row``; sampled or
    ``use_block_cache`` batches; reference bugs: see the checks).
    ``row``: the settings of that row of a batched case decoded alone (its own prompt, the
    batch's number of blocks, ``max_new_tokens // block_size + max(seq_len) // block_size``)."""
    _only(case, FDV2_TOP, "case", case)
    a = case["args"]
    _only(a, FDV2_ARGS, "args", case)
    k = a["block_size"]
    lengths = [len(r) for r in case["prompt_ids"]]
    if row is None and len(lengths) != 1:
        raise UnmappedCaseField(f"{case['name']}: a batched case is decoded row by row")
    if a.get("seq_len", lengths) != lengths or a.get("min_len", min(lengths)) != min(lengths):
        raise UnmappedCaseField(f"{case['name']}: seq_len / min_len != the prompt lengths")
    if a.get("temperature") and len(lengths) > 1:
        raise UnmappedCaseField(f"{case['name']}: the reference samples for row 0 only")
    if a.get("use_block_cache") and len(lengths) > 1:
        raise UnmappedCaseField(f"{case['name']}: batched use_block_cache refreshes every "
                                "row's block cache when one row needs it (rows depend on their "
                                "neighbours); cache='sub_block' rows decide alone")
    if min(lengths) == k:
        raise UnmappedCaseField(f"{case['name']}: min_len == block_size (the reference "
                                "prefills nothing and decodes without the prompt's K/V)")
    if len({n // k for n in lengths}) > 1:
        raise UnmappedCaseField(f"{case['name']}: prompts ending in different blocks (the "
                                "reference then decodes a longer row's blocks from a window "
                                "not aligned to the block grid, a bug)")
    p = lengths[row or 0]
    gen = (max(lengths) // k + a["max_new_tokens"] // k) * k + 1 - p
    if gen < 1:
        raise UnmappedCaseField(f"{case['name']}: max_new_tokens < block_size leaves no block "
                                "after the prompt's to decode")
    sample = case["reference_function"] == "batch_sample"
    params: dict[str, Any] = dict(
        gen_length=gen, threshold=a["threshold"], small_block_size=a["small_block_size"],
        temperature=a.get("temperature") or 0.0, top_p=a.get("top_p"), seed=case["seed"],
        rng="reference", block_eos_stop=sample, stop_at_eos=not sample,
        eos_skip_block_start=sample, separate_prefill=True,
        cache="sub_block" if a.get("use_block_cache") else "block_causal",
        mask_in_softmax=bool(a.get("temperature")))
    return "fastdllm_v2", params, a["stop_token"]


def fastdllm2_batch_forwards(case: dict[str, Any], rows: list[Any]) -> int:
    """The forwards of ``batch_sample`` on a batch whose rows, decoded alone, gave the
    ``Generation`` s ``rows``: the reference moves the batch through each block's sub-blocks in
    lockstep, one forward for all its rows per step, so a sub-block takes as many forwards as
    its slowest row does alone (a row with no mask there commits nothing); each block ends with
    one cache-commit forward (which predicts the next block's AR token) unless every row has
    finished; rows that committed the stop token in a sub-block leave after that block (the
    AR token is never checked, ``eos_skip_block_start``); the prompt's complete blocks up to
    the shortest prompt are one prefill forward when that prompt is longer than a block. A
    row's steps in a sub-block are read from its ``commit_step`` (a row alone commits in one
    sub-block per step, or the block's AR token alone)."""
    a = case["args"]
    k, sub, stop = a["block_size"], a["small_block_size"], a["stop_token"]
    lengths = [len(r) for r in case["prompt_ids"]]
    n_blocks = a["max_new_tokens"] // k + max(lengths) // k
    steps, tokens, last = [], [], []
    for p, out in zip(lengths, rows, strict=True):
        at, ids = out.commit_step[0].tolist(), out.tokens[0, p:].tolist()
        steps.append({p + i: s for i, s in enumerate(at) if s >= 0 and (p + i) % k})
        tokens.append(ids)
        ends = [p + i for i, t in enumerate(ids) if t == stop and (p + i) % k]
        last.append(ends[0] // k if ends else n_blocks)  # the block the row finishes in
    total = int(min(lengths) > k)
    running = list(range(len(rows)))
    for blk in range(min(lengths) // k, n_blocks):
        if not running:
            break
        for lo in range(blk * k, (blk + 1) * k, sub):
            total += max(len({s for q, s in steps[r].items() if lo <= q < lo + sub})
                         for r in running)
        running = [r for r in running if last[r] > blk]
        total += int(bool(running))
    return total


class GaussianNoise:
    """A model with ``N(0, std)`` noise on every logit (a fixed generator per instance): a
    recorded case must not depend on fp32 rounding."""

    def __init__(self, model: Any, std: float, seed: int) -> None:
        self._model, self._std = model, std
        self._gen = torch.Generator().manual_seed(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self._model(*args, **kwargs)
        return out + self._noise(out)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.forward(*args, **kwargs)

    def _noise(self, out: torch.Tensor) -> torch.Tensor:
        return self._std * torch.randn(out.shape, generator=self._gen).to(out.dtype)


class RelativeNoise(GaussianNoise):
    """A model with relative noise ``std (1 + |z|) U(-1, 1)`` on every logit ``z``."""

    def _noise(self, out: torch.Tensor) -> torch.Tensor:
        u = torch.rand(out.shape, generator=self._gen, dtype=torch.float64) * 2 - 1
        return (self._std * (1 + out.double().abs()) * u).to(out.dtype)


@functools.cache
def conformance_model(name: str) -> Any:
    """A checkpoint of ``../shared/conformance`` loaded once per test session (skipped when
    ``../shared`` is absent); ``llada-tiny`` with its mask id 500 given explicitly (the
    tiny vocabulary has no LLaDA mask id to find)."""
    from dllm_decode import load_model

    extra = {"mask_token_id": 500} if name == "llada-tiny" else {}
    return load_model(require_shared(CONFORMANCE / name), **extra)
