"""``--dllm-algorithm-config`` resolved exactly as a server start resolves it, without SGLang.

One resolution, used by ``DllmDecodeAlgorithm.configure_server_args`` and by
``dllm-decode serve-check POLICY.yaml --model PATH``: the file is read (``read_yaml``), the
served model is built from the checkpoint's files (``served_from_path``: ``config.json``, the
stop set of ``checkpoint``; block size and mask id as SGLang gives them per architecture), the
mapping is resolved (``spec.serving_spec``: the library's resolution, then what cannot run
inside SGLang refused) and a policy part that needs an EOS is refused when the checkpoint has
no stop token (``refuse_without_eos``). Every error is one line, prefixed with
``--dllm-algorithm-config PATH:`` as the server prints it. ``plan_serving`` adds what the CLI
prints (``plan_lines``), and ``runtime_sampling`` resolves, once per process, the YAML a
running server decodes with (for ``DllmDecodeAlgorithm.validate_request``). Runs on a CPU,
offline; imports SGLang only inside ``runtime_sampling`` (its runtime context).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
import yaml

from dllm_decode.config import SamplerConfig
from dllm_decode.integrations.sglang.checkpoint import CheckpointFiles, read_checkpoint
from dllm_decode.integrations.sglang.requests import (
    ServedSampling,
    model_defaults,
    refused_features,
)
from dllm_decode.integrations.sglang.spec import (
    SERVED_FIELDS,
    CheckpointHead,
    ServedModel,
    ServingSpec,
    serving_spec,
)
from dllm_decode.policies.base import bind_of, init_memory_of

#: how the server names the YAML in its errors
FLAG: Final = "--dllm-algorithm-config"
logger = logging.getLogger("dllm_decode.integrations.sglang")


def read_yaml(path: str | Path | None) -> dict[str, Any]:
    """The YAML mapping at ``path`` (``{}`` for no file), as SGLang reads it (``safe_load``);
    a one-line error for a file that cannot be read or is not a YAML mapping."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ValueError(f"{FLAG} {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{FLAG} {path}: not a UTF-8 text file") from None
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ValueError(f"{FLAG} {path}: not valid YAML{at}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{FLAG} {path}: must be a YAML mapping (policy:, params:, ...), got "
                         f"{type(config).__name__}")
    return config


def served_from_path(model_path: str | Path, *, block_size: int | None = None,
                     mask_id: int | None = None, tokenizer_path: str | Path | None = None,
                     revision: str | None = None, skip_tokenizer: bool = False) -> ServedModel:
    """The served model from a checkpoint folder (or bundled name, or a Hub id already in the
    local Hugging Face cache: nothing is downloaded); ``eos_token_ids`` is SGLang's stop set.
    ``block_size`` / ``mask_id``: SGLang's per-architecture values unless given; the other
    keywords are SGLang's ``--tokenizer-path``, ``--revision``, ``--skip-tokenizer-init``."""
    return ServedModel.from_path(model_path, block_size=block_size, mask_id=mask_id,
                                 tokenizer_path=tokenizer_path, revision=revision,
                                 skip_tokenizer=skip_tokenizer)


def eos_users(spec: ServingSpec) -> list[str]:
    """The parts and settings of ``spec`` that act on EOS (they need a stop token): any
    truncator (the adapter fills a cut block with EOS), a part holding ``eos_token_ids``
    (EoTP, ...), ``logits_eos_inf`` / ``confidence_eos_eot_inf``."""
    policy, cfg = spec.policy, spec.cfg
    out = []
    for role, part in (("selector", policy.selector), ("stopper", policy.stopper),
                       ("truncator", policy.truncator)):
        if part is not None and (role == "truncator" or hasattr(part, "eos_token_ids")):
            out.append(f"{role} {type(part).__name__}")
    out += [name for name in ("logits_eos_inf", "confidence_eos_eot_inf") if getattr(cfg, name)]
    return out


def refuse_without_eos(spec: ServingSpec, served: ServedModel) -> None:
    """``ValueError`` when ``spec`` acts on EOS and the served model has no stop token."""
    users = eos_users(spec)
    if users and not served.eos_token_ids:
        raise ValueError(
            f"policy {spec.policy.name!r} acts on EOS ({', '.join(users)}) and the checkpoint "
            f"has no stop token (no eos_token_id in config.json or generation_config.json, no "
            f"tokenizer eos_token), so SGLang would never end a request there: add the EOS id "
            f"to config.json (eos_token_id) or serve a policy without them")


def resolve_config(config: Mapping[str, Any], served: ServedModel,
                   path: str | Path | None = None) -> ServingSpec:
    """Resolve the YAML mapping ``config`` for ``served`` and refuse, in one line prefixed with
    ``--dllm-algorithm-config PATH:``, what cannot be served (``serving_spec``,
    ``refuse_without_eos``)."""
    try:
        spec = serving_spec(config, served)
        refuse_without_eos(spec, served)
    except ValueError as err:
        raise ValueError(f"{FLAG} {path}: {err}") from None
    return spec


def resolve_yaml(path: str | Path | None, served: ServedModel) -> ServingSpec:
    """The server start's resolution of ``--dllm-algorithm-config path`` for ``served``."""
    return resolve_config(read_yaml(path), served, path)


@dataclass(frozen=True)
class ServePlan:
    """What a server started with this YAML and checkpoint will run.

    Attributes:
        path: the YAML; model: the ``--model`` argument.
        config: the YAML mapping.
        served: the served model (stop set, block size, mask id).
        spec: the resolved policy, settings and capabilities.
        block_source: where the block size comes from.
        files: the checkpoint's files (where each stop token comes from).
    """

    path: str | None
    model: str
    config: dict[str, Any]
    served: ServedModel
    spec: ServingSpec
    block_source: str
    files: CheckpointFiles


def plan_serving(path: str | Path | None, model: str | Path, *, block_size: int | None = None,
                 tokenizer_path: str | Path | None = None, revision: str | None = None,
                 skip_tokenizer: bool = False) -> ServePlan:
    """Resolve ``path`` against the checkpoint ``model`` as a server start does.

    The block size is ``block_size`` if given, else the YAML's ``block_size`` (as SGLang reads
    it), else SGLang's for the architecture. Raises ``ValueError`` / ``FileNotFoundError`` with
    the server's one-line message.
    """
    config = read_yaml(path)
    source = "--block-size"
    if block_size is None and "block_size" in config:
        block_size, source = config["block_size"], "the YAML's block_size"
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"{FLAG} {path}: block_size must be an int >= 1 (SGLang's dLLM "
                             f"block), got {block_size!r}")
    files = read_checkpoint(model, tokenizer_path=tokenizer_path, revision=revision,
                            skip_tokenizer=skip_tokenizer)
    served = ServedModel.from_files(files, block_size=block_size)
    # as the launcher: fingerprints (a Learn2PD filter's) hash the checkpoint's output head,
    # read from its safetensors only if a part fingerprints the model
    served.head = CheckpointHead.of(files.directory, served.family, served.config)
    if block_size is None:
        source = f"SGLang's for {type_name(served)}"
    capacity = getattr(served.config, "expert_capacity", None)
    trained = getattr(served.config, "block_size", None)
    if capacity is not None and served.block_size != trained:
        raise ValueError(f"{FLAG} {path}: block_size {served.block_size} ({source}) differs "
                         f"from the checkpoint's block_size {trained}, which its block routing "
                         f"(expert_capacity) requires: SGLang refuses it; drop block_size")
    spec = resolve_config(config, served, path)
    return ServePlan(None if path is None else str(path), str(model), config, served, spec,
                     source, files)


def type_name(served: ServedModel) -> str:
    """The checkpoint's architecture name."""
    return str((getattr(served.config, "architectures", None) or ["?"])[0])


def steps_per_block(spec: ServingSpec, k: int) -> str:
    """The forwards a full block of ``k`` positions takes, in words."""
    cfg, sel = spec.cfg, spec.caps.selector
    if sel.budgeted:
        text = (f"{cfg.steps} scheduled (steps={cfg.steps} per block of {k})" if cfg.steps
                else f"{k} scheduled (one per position)")
    else:
        most = cfg.max_steps_per_block or k
        text = (f"adaptive: at most {most} (the rule commits as many positions per step as it "
                f"accepts; the last scheduled step commits what is left)")
    if sel.edits and sel.max_post_steps:
        text += f", then up to {sel.max_post_steps} editing steps"
    return text


def bind_parts(spec: ServingSpec, served: ServedModel) -> tuple[list[Any], list[str]]:
    """The policy's parts bound to ``served`` as the server binds them (a part that cannot bind
    without the weights stays unbound), and the warnings binding gave, one line each (e.g.
    Learn2PD's "no trained filter")."""
    parts = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for part in (spec.policy.selector, spec.policy.stopper, spec.policy.truncator):
            try:
                parts.append(bind_of(part, served, spec.cfg))
            except (TypeError, ValueError):
                parts.append(part)
    said = dict.fromkeys(" ".join(str(w.message).split()) for w in caught)
    return parts, list(said)


def memory_per_request(selector: Any, block_size: int) -> str:
    """The bound ``selector``'s per-request memory at a block's start, in words
    (``init_memory``)."""
    memory = init_memory_of(selector, 1, block_size, torch.device("cpu"))
    if memory is None:
        return "none (the policy keeps no state between steps)"
    total = sum(v.numel() * v.element_size() for v in _leaves(memory)
                if isinstance(v, torch.Tensor))
    return (f"{total:,} bytes per running request at a block's start (init_memory; state the "
            f"policy allocates on first use is not counted)")


def _leaves(obj: Any) -> list[Any]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [leaf for f in dataclasses.fields(obj) for leaf in _leaves(getattr(obj, f.name))]
    if isinstance(obj, (list, tuple)):
        return [leaf for item in obj for leaf in _leaves(item)]
    return [obj]


def settings(spec: ServingSpec) -> dict[str, Any]:
    """The ``SamplerConfig`` fields served (``SERVED_FIELDS``) that differ from the defaults."""
    base = SamplerConfig(gen_length=spec.cfg.gen_length, cache="block_causal")
    return {f: getattr(spec.cfg, f) for f in sorted(SERVED_FIELDS)
            if getattr(spec.cfg, f) != getattr(base, f)}


def stop_sources(files: CheckpointFiles) -> str:
    """Where each part of the stop set comes from, in words."""
    gen = None if files.generation is None else files.generation.get("eos_token_id")
    tok = files.tokenizer
    if tok is None:
        tokenizer = "no tokenizer files"
    elif tok.eos_text is None:
        tokenizer = "the tokenizer names no eos_token"
    elif tok.eos_id is None:
        tokenizer = f"tokenizer eos_token {tok.eos_text!r} is in no vocabulary file read"
    else:
        tokenizer = f"tokenizer eos_token {tok.eos_text!r} = {tok.eos_id}"
    if tok is not None and tok.extra_ids:
        tokenizer += f", turn-final added tokens {list(tok.extra_ids)}"
    return (f"config.json eos_token_id {files.config.get('eos_token_id')}; "
            f"generation_config.json " + ("absent" if files.generation is None else
                                          f"eos_token_id {gen}") + f"; {tokenizer}")


def _short(part: Any, width: int = 160) -> str:
    text = " ".join(repr(part).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def plan_lines(plan: ServePlan) -> list[str]:
    """What ``serve-check`` prints: the policy, its parts and settings, steps per block, the
    stop set, memory, and what SGLang refuses per request (``requests.refused_features``)."""
    spec, served = plan.spec, plan.served
    refused = refused_features(sampling_of(plan.spec, plan.path))
    defaults = model_defaults(plan.files.generation)
    parts, said = bind_parts(spec, served)
    policy = spec.policy
    k = served.block_size
    vocab = served.vocab_size
    own = getattr(served.config, "mask_token_id", None)
    mask_note = ("" if vocab < 0 or 0 <= served.mask_token_id < vocab else
                 f" (outside the vocabulary [0, {vocab}): SGLang 0.5.23 uses this id for every "
                 f"{type_name(served)} checkpoint, and this config's "
                 + ("names no mask_token_id)" if own is None else f"mask_token_id is {own})"))
    stops = ", ".join(map(str, served.eos_token_ids)) or "none"
    lines = [
        f"{FLAG} {plan.path} with --model {plan.model}: OK (DllmDecode's server-start "
        "checks pass)",
        f"model: {type_name(served)} (family {served.family}), block size {k} "
        f"({plan.block_source}), mask id {served.mask_token_id}{mask_note}",
        f"policy: {policy.name}",
        f"  selector: {_short(policy.selector)}",
    ]
    for role in ("stopper", "truncator"):
        part = getattr(policy, role)
        if part is not None:
            lines.append(f"  {role}: {_short(part)}")
    lines += [
        f"  parameters (YAML): {dict(plan.config.get('params') or {})}",
        f"  settings: {settings(spec) or 'the defaults (greedy: temperature 0)'}",
        f"steps per block: {steps_per_block(spec, k)}",
        f"stop tokens (SGLang's stop set; a request also stops on its own stop_token_ids): "
        f"{stops}",
        f"  from: {stop_sources(plan.files)}",
        f"per-request policy memory: {memory_per_request(parts[0], k)}",
    ]
    lines += [f"warning (binding the policy to the model): {text}" for text in said]
    if defaults:
        lines.append(f"request defaults from generation_config.json {defaults}: SGLang fills "
                     f"them into OpenAI-API requests that leave them unset (--sampling-defaults "
                     f"model, its default); such requests pass, and decode with the YAML's")
    lines += [
        "refused per request (SGLang answers 400 with the reason):",
    ]
    lines += [f"  {features}: {why}" for features, why in refused]
    return lines


def sampling_of(spec: ServingSpec, path: str | Path | None,
                defaults: Mapping[str, Any] | None = None) -> ServedSampling:
    """What every request decodes with under ``spec`` (for ``requests.request_error``);
    ``defaults``: what the server fills into requests (``requests.model_defaults``)."""
    return ServedSampling.from_spec(spec, tuple(eos_users(spec)), f"{FLAG} {path}", defaults)


def runtime_sampling() -> ServedSampling | None:
    """The sampling of the YAML this SGLang process serves (its runtime context's
    ``--dllm-algorithm-config``, model, tokenizer, revision and request defaults), resolved
    once per process; ``None`` outside a server (nothing published) or if it cannot be
    resolved (logged)."""
    try:
        from sglang.srt.runtime_context import get_exec, get_model, get_serving

        model, serving = get_model(), get_serving()
        preferred = serving.preferred_sampling_params
        key = (get_exec().dllm.dllm_algorithm_config, model.model_path, serving.tokenizer_path,
               model.revision, bool(serving.skip_tokenizer_init),
               serving.sampling_defaults == "model",
               preferred if preferred is None or isinstance(preferred, str)
               else json.dumps(preferred, sort_keys=True))
    except (ImportError, ValueError, AttributeError, RuntimeError, TypeError):
        return None
    return _resolved(*key)


@functools.lru_cache(maxsize=8)
def _resolved(path: str | None, model_path: str, tokenizer_path: str | None,
              revision: str | None, skip_tokenizer: bool, model_defaults_on: bool,
              preferred: str | None) -> ServedSampling | None:
    try:
        plan = plan_serving(path, model_path, tokenizer_path=tokenizer_path, revision=revision,
                            skip_tokenizer=skip_tokenizer)
        server = json.loads(preferred) if preferred else None
    except (ValueError, OSError) as err:
        logger.error("DllmDecode: cannot resolve %s %s for the request checks (%s); requests "
                     "are accepted only at SGLang's default temperature / top_p / top_k",
                     FLAG, path, err)
        return None
    generation = plan.files.generation if model_defaults_on else None
    return sampling_of(plan.spec, path, model_defaults(generation, server))
