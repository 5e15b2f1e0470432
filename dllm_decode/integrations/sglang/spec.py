"""What ``--dllm-algorithm-config policy.yaml`` asks for, resolved and checked for serving.

The YAML names the policy exactly as ``DiffusionSampler`` and ``dllm-decode generate`` do::

    policy: eb                 # a preset, "module:Class" or "file.py:Class" ("default": the
    params: {gamma: 0.01}      #   model family's); params as --param (stopper.NAME, ...)
    stopper: sched             # optional, as --stopper / --truncator
    truncator: eotp
    block_size: 32             # SGLang's own key (read by SGLang, left alone here)

``serving_spec`` resolves it with the code ``DiffusionSampler`` and the CLI resolve with
(``policies.defaults.apply_family_default`` for ``default``, then
``samplers.params.build_policy``: the split into ``SamplerConfig`` fields and
``policies.resolve.resolve_policy``), so unknown names and parameters get the same errors as
there, made one line, and then refuses, with the reason and what to use instead, what cannot
run inside SGLang's block loop: policies of uniform-noise models, policies that need extra
forwards (S2D2's verifier, WINO's verification, LoPA's branches), re-masking, per-row pruned
canvases (``window``), cross-block commits, and the ``SamplerConfig`` settings that belong to
the library's own loop (``gen_length``, cache plans, CFG, ...). Nothing here imports SGLang.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import torch
from torch import nn

from dllm_decode.config import SamplerConfig
from dllm_decode.integrations.sglang.checkpoint import (
    SGLANG_DLLM_PARAMS,
    CheckpointFiles,
    read_checkpoint,
    stop_token_set,
)
from dllm_decode.integrations.sglang.compat import ALGORITHM_NAME, ARCHITECTURES
from dllm_decode.models.base import to_checkpoint_name
from dllm_decode.models.families import FAMILIES
from dllm_decode.models.weights import SINGLE, open_safetensors, weight_map
from dllm_decode.policies.base import bind_of
from dllm_decode.policies.capabilities import PolicyCapabilities, policy_capabilities
from dllm_decode.policies.defaults import apply_family_default
from dllm_decode.policies.policy import Policy
from dllm_decode.samplers.params import build_policy

#: keys of the YAML read here, and SGLang's own keys (read by SGLang)
SPEC_KEYS: Final = ("policy", "params", "stopper", "truncator", "pool_budget_mb")
#: the default bound on the per-request policy memory preallocated at server start (MiB;
#: SGLang does not count it in --mem-fraction-static)
POOL_BUDGET_MB: Final = 4096
SGLANG_KEYS: Final = ("block_size",)
#: SGLang keys a ``DllmDecode`` YAML may not hold, and why
REFUSED_KEYS: Final[dict[str, str]] = {
    "capture_input_preparation": "SGLang reads it only for algorithms that prepare their "
                                 "inputs inside its CUDA graphs (Gemma4Renoise); DllmDecode "
                                 "prepares none, so it would change nothing: remove the key"}
#: ``SamplerConfig`` fields that mean the same inside SGLang's block loop (``steps``: per block
#: of ``block_size``; a block cut by the prompt gets its share, rounded up)
SERVED_FIELDS: Final = frozenset({
    "steps", "temperature", "sampling", "top_p", "top_k", "schedule", "eps", "seed",
    "max_steps_per_block", "impl", "logits_eos_inf", "confidence_eos_eot_inf",
    "eos_eot_reference_asymmetry"})
#: fields whose only accepted value is what SGLang does anyway
NATIVE: Final[dict[str, Any]] = {
    "cache": "block_causal",         # the radix cache holds exact block-causal K/V
    "block_eos_stop": True,          # a request ends after the block holding its stop token
    "decode_block_padding": True,    # whole blocks are decoded, the tail cut at max_new_tokens
    "rng": "compact",                # every request draws from its own generator
}
#: why the other fields cannot apply inside SGLang
NOT_SERVED: Final[dict[str, str]] = {
    "gen_length": "the answer length is each request's max_new_tokens",
    "block_length": "block-diffusion models decode in their own block size (SGLang's "
                    "block_size key)",
    "cache": "SGLang keeps the prefix K/V in its radix cache and feeds one block per forward, "
             "which is cache='block_causal' (the only value accepted)",
    "refresh_every": "cache refreshes belong to the library's prefix / dual / window plans",
    "window_tokens": "window pruning of a bidirectional canvas (cache='window' / 'streaming')",
    "active_tokens": "Window-Diffusion prunes a bidirectional canvas (cache='window')",
    "window_truncate": "Window-Diffusion prunes a bidirectional canvas (cache='window')",
    "causal_prefix": "SGLang computes committed blocks' K/V block-causally",
    "cfg_scale": "classifier-free guidance needs a second, unconditional forward per step",
    "stop_at_eos": "SGLang ends a request at its stop tokens after the block",
    "eos_stop_on_commit": "SGLang ends a request at its stop tokens after the block",
    "block_eos_stop": "SGLang always ends a request after the block holding its stop token "
                      "(unless the request sets ignore_eos)",
    "eos_skip_block_start": "SGLang ends a request at any stop token it emits",
    "separate_prefill": "SGLang runs its own prefill",
    "decode_block_padding": "SGLang always decodes whole blocks",
    "rng": "inside SGLang every request draws from its own generator (rng='compact')",
    "allow_prompt_masks": "SGLang marks literal mask tokens of the prompt as prompt "
                          "(dllm_prompt_mask); they are never decoded",
    "exact_steps": "SGLang emits a block as soon as a forward has seen it complete",
}


#: what serves in one forward per step instead of a preset that runs extra forwards
ONE_FORWARD: Final[dict[str, str]] = {
    "s2d2": "its drafting rule alone (policy: low_confidence_dynamic)",
    "wino": "its drafting rule alone (policy: wide_in, or params: {verify: false})",
    "lopa": "its anchor alone (params: {branches: 0})"}


class ServedModel(nn.Module):
    """The served model as the policies' hooks see it (``bind(model, cfg)``, the proposal maker).

    A module only so that parts which move their weights to "the model's device" (a Learn2PD
    filter) find the serving device: it holds an empty buffer there, and ``head`` (the output
    projection: at server start the checkpoint's, ``CheckpointHead``) for model fingerprints.

    Args:
        family: the library's family name (``ARCHITECTURES``).
        mask_token_id, block_size: SGLang's (``DllmConfig``).
        eos_token_ids: the checkpoint's stop tokens (SGLang's stop set; the first is the
            config's EOS when it has one).
        config: the checkpoint's config (vocabulary and layer sizes for fingerprints).
        head: anything with the output projection as ``weight`` (``None``: no fingerprint).
        device: where the served model runs.
    """

    attention: Final = "block_causal"
    noise_kind: Final = "mask"

    def __init__(self, family: str, mask_token_id: int, block_size: int,
                 eos_token_ids: tuple[int, ...], config: Any = None, head: Any = None,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.family, self.mask_token_id, self.block_size = family, mask_token_id, block_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.config = config
        self.head = head
        self.register_buffer("anchor", torch.empty(0, device=device), persistent=False)

    @classmethod
    def from_config(cls, config: Any, mask_token_id: int, block_size: int, head: Any = None,
                    device: torch.device | str = "cpu", *, generation_config: Any = None,
                    tokenizer_stop_ids: Iterable[int] = ()) -> ServedModel:
        """From a checkpoint config (``architectures``, ``eos_token_id``).

        ``eos_token_ids`` is SGLang's stop set (``checkpoint.stop_token_set``): the config's
        ``eos_token_id``, ``generation_config``'s (SGLang's ``ModelConfig.hf_generation_config``
        or the ``generation_config.json`` mapping) and ``tokenizer_stop_ids``
        (``checkpoint.tokenizer_stops(...).ids``: the tokenizer's EOS and extra stop tokens).
        """
        arch = (getattr(config, "architectures", None) or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise ValueError(f"{ALGORITHM_NAME} serves mask-token block-diffusion models "
                             f"{sorted(ARCHITECTURES)}; this checkpoint is {arch!r}")
        gen_eos = (generation_config.get("eos_token_id")
                   if isinstance(generation_config, Mapping)
                   else getattr(generation_config, "eos_token_id", None))
        eos_ids = stop_token_set(getattr(config, "eos_token_id", None), gen_eos,
                                 tokenizer_stop_ids)
        return cls(ARCHITECTURES[arch], mask_token_id, block_size, eos_ids, config, head,
                   device)

    @classmethod
    def from_path(cls, model: str | Path, *, block_size: int | None = None,
                  mask_id: int | None = None, tokenizer_path: str | Path | None = None,
                  revision: str | None = None, skip_tokenizer: bool = False) -> ServedModel:
        """From a checkpoint folder (or a bundled name, or a Hub id already in the local cache:
        nothing is downloaded), its files read as a dLLM server reads them
        (``checkpoint.read_checkpoint``). ``block_size`` / ``mask_id``: SGLang's for the
        architecture (``checkpoint.SGLANG_DLLM_PARAMS``) unless given."""
        files = read_checkpoint(model, tokenizer_path=tokenizer_path, revision=revision,
                                skip_tokenizer=skip_tokenizer)
        return cls.from_files(files, block_size=block_size, mask_id=mask_id)

    @classmethod
    def from_files(cls, files: CheckpointFiles, *, block_size: int | None = None,
                   mask_id: int | None = None) -> ServedModel:
        """From a checkpoint's files (``checkpoint.read_checkpoint``); see ``from_path``. Its
        ``head`` is the checkpoint's (``CheckpointHead``: read only if a part fingerprints the
        model), so a server start and ``serve-check`` fingerprint alike."""
        k, mask = SGLANG_DLLM_PARAMS.get(files.architecture, (None, None))
        config = SimpleNamespace(**files.config)
        stops = () if files.tokenizer is None else files.tokenizer.ids
        served = cls.from_config(config, mask if mask_id is None else mask_id,
                                 k if block_size is None else block_size,
                                 generation_config=files.generation, tokenizer_stop_ids=stops)
        served.head = CheckpointHead.of(files.directory, served.family, config)
        return served

    @property
    def vocab_size(self) -> int:
        return int(getattr(self.config, "vocab_size", -1))


class CheckpointHead:
    """The served model's output projection as its checkpoint stores it, for fingerprints (a
    Learn2PD filter's ``ModelFingerprint``): the whole head, whatever the tensor-parallel split,
    vocabulary padding or quantization of the head SGLang loaded.

    ``weight`` is read on first use, memory-mapped from the safetensors file (no copy of the
    head is made: a fingerprint reads 256 of its rows), with the library's reader
    (``models.weights``); it is
    ``None`` when the checkpoint has no readable safetensors or no such tensor, and ``why``
    says so.

    Args:
        directory: the local checkpoint folder.
        name: the head's tensor name there (the embedding's for a tied head).
    """

    def __init__(self, directory: str | Path, name: str) -> None:
        self.directory, self.name = Path(directory), name
        self.why: str | None = None
        self._weight: torch.Tensor | None = None
        self._read = False

    @classmethod
    def of(cls, directory: str | Path, family: str, config: Any) -> CheckpointHead:
        """The head of a ``family`` checkpoint (the library's tensor names; a config with
        ``tie_word_embeddings`` stores it as the input embedding)."""
        tied = bool(getattr(config, "tie_word_embeddings", False))
        names = FAMILIES[family][0].names
        return cls(directory, to_checkpoint_name(names, "embed.weight" if tied else
                                                 "head.weight"))

    @property
    def weight(self) -> torch.Tensor | None:
        if not self._read:
            self._read = True
            try:
                self._weight = self._load()
            except (OSError, ValueError) as err:  # CheckpointError is a ValueError
                self.why = _one_line(err)
        return self._weight

    def _load(self) -> torch.Tensor | None:
        shards = weight_map(self.directory)
        file = self.directory / (SINGLE if shards is None else shards.get(self.name, ""))
        if shards is not None and self.name not in shards:
            self.why = f"{self.directory} stores no tensor {self.name!r}"
            return None
        with open_safetensors(file) as f:
            if self.name not in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                self.why = f"{file} holds no tensor {self.name!r}"
                return None
            return f.get_tensor(self.name)


@dataclass(frozen=True)
class ServingSpec:
    """A resolved ``--dllm-algorithm-config``: the composed policy (unbound), its settings and
    its declared capabilities (checked servable)."""

    policy: Policy
    cfg: SamplerConfig
    caps: PolicyCapabilities
    #: bytes the per-request pool may take (``pool_budget_mb``)
    pool_budget: int = POOL_BUDGET_MB << 20


def serving_spec(config: Mapping[str, Any], served: ServedModel) -> ServingSpec:
    """Resolve and check the YAML mapping for ``served``.

    Raises:
        ValueError: one line: unknown keys, names or parameters, or what cannot be served.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"the {ALGORITHM_NAME} config must be a YAML mapping with keys "
                         f"{list(SPEC_KEYS)}, got {type(config).__name__}")
    for key, why in REFUSED_KEYS.items():
        if key in config:
            raise ValueError(f"{key} is not a {ALGORITHM_NAME} key: {why}")
    unknown = sorted(set(map(str, config)) - set(SPEC_KEYS) - set(SGLANG_KEYS))
    if unknown:
        raise ValueError(f"unknown {ALGORITHM_NAME} config key(s) {unknown}; keys: "
                         f"{list(SPEC_KEYS)} (and SGLang's {list(SGLANG_KEYS)})")
    params = config.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a mapping (as --param KEY=VALUE), got {params!r}")
    try:  # as DiffusionSampler / build_sampler: the family default, then the one resolution
        policy, params, _ = apply_family_default(served, config.get("policy"), params)
        cfg_params, built = build_policy(policy, params, stopper=config.get("stopper"),
                                         truncator=config.get("truncator"))
    except (TypeError, ValueError) as err:
        raise ValueError(_one_line(err)) from None
    cfg = serving_config(cfg_params, served.block_size)
    try:
        caps = policy_capabilities(*_bound_parts(built, served, cfg))
    except (TypeError, ValueError) as err:
        raise ValueError(_one_line(err)) from None
    refuse_unservable(caps, built.name)
    budget = config.get("pool_budget_mb", POOL_BUDGET_MB)
    if isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0:
        raise ValueError(f"pool_budget_mb must be a positive number of MiB (the per-request "
                         f"policy memory preallocated at server start), got {budget!r}")
    return ServingSpec(built, cfg, caps, int(budget * 2**20))


def _bound_parts(policy: Policy, served: ServedModel, cfg: SamplerConfig) -> list[Any]:
    """The parts bound to ``served`` for the capability checks (capabilities such as ETE's
    lookahead resolve at bind on block-diffusion models). A binding error (a Learn2PD filter
    trained for another model) is raised when ``served`` has its output head
    (``CheckpointHead``); without it (the launcher of a Hub id whose weights are not
    downloaded yet) the part is checked unbound here and bound at server start
    (``algorithm.DllmDecodeAlgorithm.__init__``), where a failure stops the server."""
    out = []
    for part in (policy.selector, policy.stopper, policy.truncator):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. "no trained filter" without the weights
                out.append(bind_of(part, served, cfg))
        except (TypeError, ValueError):
            if getattr(served.head, "weight", None) is not None:
                raise
            out.append(part)
    return out


def serving_config(cfg_params: Mapping[str, Any], block_size: int) -> SamplerConfig:
    """The ``SamplerConfig`` of the served loop: the fields in ``SERVED_FIELDS``; a field with
    a ``NATIVE`` value is accepted (SGLang does that anyway), any other is refused with its
    reason. ``gen_length`` is the block: the engine shows one block at a time."""
    for key, value in cfg_params.items():
        if key in SERVED_FIELDS or NATIVE.get(key, object()) == value:
            continue
        why = NOT_SERVED.get(key, "it is not a setting of SGLang's block loop")
        raise ValueError(f"{key}={value!r} cannot apply inside SGLang: {why}")
    seed = cfg_params.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise ValueError(f"seed must be one int inside SGLang (each request's generator is "
                         f"seeded from it and the request id), got {seed!r}")
    served = {k: v for k, v in cfg_params.items() if k in SERVED_FIELDS}
    try:
        return SamplerConfig(gen_length=block_size, cache="block_causal", **served)
    except ValueError as err:
        raise ValueError(_one_line(err)) from None


def refuse_unservable(caps: PolicyCapabilities, name: str) -> None:
    """``ValueError`` (why, and what to use instead) for what SGLang's block loop cannot run:
    one model forward per step over one block of a mask-token block-diffusion model."""
    sel = caps.selector
    checks = (
        ("mask" not in caps.noise_kinds,
         "it decodes uniform-noise models (DiffusionGemma), which SGLang serves only with its "
         "own algorithm: use --dllm-algorithm Gemma4Renoise"),
        (sel.extra_forwards,
         "it runs extra model forwards inside a step (S2D2's verifier, WINO's verification, "
         "LoPA's branches) and SGLang makes exactly one forward per step: serve "
         f"{ONE_FORWARD.get(name, 'its drafting rule alone')} or decode with DiffusionSampler"),
        (sel.remasks,
         "it re-masks committed tokens (WINO's narrow-out), which are not written back into "
         "SGLang's block: serve its drafting rule alone or decode with DiffusionSampler"),
        (sel.draft_causal or sel.causal_prefix,
         "it changes the attention of the forward (S2D2's causal drafting / AR-like prefix), "
         "which SGLang's model runner does not: serve low_confidence_dynamic instead"),
        (caps.requires_attention == "bidirectional" or sel.preferred_cache == "window",
         "it needs a bidirectional model (Window-Diffusion's per-row pruning with "
         "cache='window', SAID's answer-wide schedule) and SGLang serves block-diffusion "
         "models one block per forward: serve threshold or low_confidence instead"),
        (sel.preferred_cache not in (None, "none", "block_causal"),
         f"it needs the library's cache plan {sel.preferred_cache!r}; SGLang feeds one block "
         "per forward against its radix cache (cache='block_causal')"),
        (sel.attention_maps > 0,
         "it reads the model's attention maps (DAWN's dependency graph) over the whole "
         "canvas without a cache, which SGLang's attention kernels never materialise: decode "
         "with DiffusionSampler(cache='none')"),
        (sel.slides_blocks,
         "its decode window slides across block boundaries (DSB) and SGLang shows one fixed "
         "block at a time: serve its base rule (threshold) instead"),
        (sel.soft_inputs,
         "it feeds soft input embeddings (ReMix's mask / token mixing) to an uncached forward "
         "over the whole canvas, and SGLang's model runner takes token ids against its radix "
         "cache: serve wide_in (its commit rule) or decode with DiffusionSampler"),
        (sel.lookahead > 0,
         "it commits past the current block (cross_block lookahead) and SGLang shows one "
         "block at a time: drop cross_block (ete stays in the block on these models)"),
        (sel.proposes_after_select,
         "it draws tokens after the reveal on Dream's time grid (origin), over the whole "
         "canvas: serve low_confidence or entropy instead"),
    )
    for bad, why in checks:
        if bad:
            raise ValueError(f"policy {name!r} cannot run inside SGLang: {why}")


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
