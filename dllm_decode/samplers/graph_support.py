"""Which generations may run the static-buffer step (``samplers.graph``), and why not.

The step is captured once per shape and replayed, so everything it reads must be a tensor
of fixed shape and every host value it bakes in must be fixed for the shape. The policy parts
allowed are listed (``GRAPH_SAFE``): they read the step only through tensors and keep their
memory in tensors. Settings that read the step on the host, draw from a generator, or feed
per-row shapes fall back to the eager loop with the reason (``unsupported``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

import torch

from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.policies.adaptive import EntropyBounded, EntropyThreshold, Factor, Threshold
from dllm_decode.policies.confidence import TopK
from dllm_decode.policies.frechet import Frechet
from dllm_decode.policies.sched import SchED
from dllm_decode.policies.supervised import Supervised
from dllm_decode.types import CacheMode, ScoreKind

#: selector / stopper classes whose step is a static tensor program: they read the step only
#: through tensors (``proposal``, ``eligible``, ``budget``, ``progress``, ...) and keep their
#: memory in tensors of fixed shape (a plugin may add its own)
GRAPH_SAFE: set[type] = {TopK, Threshold, Factor, EntropyBounded, EntropyThreshold, SchED,
                         Frechet}

def graph_safe(part: Any) -> bool:
    """Whether a selector or stopper may run inside a captured step (``GRAPH_SAFE``; a
    ``TopK`` only without position sampling; a ``Supervised`` of safe parts)."""
    if part is None:
        return True
    if isinstance(part, Supervised):
        return graph_safe(part.selector) and graph_safe(part.stopper)
    if type(part) is TopK:
        return not part.alg_temp and part.score is not ScoreKind.RANDOM
    return type(part) in GRAPH_SAFE


logger = logging.getLogger("dllm_decode.graph")

#: why a uniform-noise generation (DiffusionGemma) always runs the eager step
UNIFORM_EAGER: Final = ("uniform-noise decoding (its encoder-decoder forward, per-step "
                        "sampling and re-noising) is not wired into the static step")

#: environment variable: ``0`` turns the CUDA default off (``graphs=None``)
ENV_VAR = "DLLM_DECODE_GRAPHS"


def wanted(graphs: bool | None, device: torch.device) -> bool:
    """Whether a sampler's ``graphs`` setting asks for the static step on ``device``:
    ``True`` anywhere, ``False`` never, ``None`` on CUDA unless ``DLLM_DECODE_GRAPHS=0``."""
    if graphs is not None:
        return bool(graphs)
    return device.type == "cuda" and os.environ.get(ENV_VAR, "1") != "0"


def unsupported(*, plan: ForwardPlan, cfg: Any, caps: Any, parts: tuple[Any, Any, Any],
                on_step: Any, debug: bool, compile: bool | str) -> str | None:
    """Why this generation cannot run the static-buffer step (``None``: it can)."""
    selector, stopper, truncator = parts
    sel = caps.selector
    reasons = [
        (compile, "compile=True captures the step with torch.compile instead"),
        (on_step is not None, "an on_step callback reads every step on the host"),
        (len(model_devices(plan.model)) > 1,
         "the model is spread over several devices (device_map): a CUDA graph captures the "
         "work of one device's stream"),
        (debug, "debug=True checks every commit on the host"),
        (cfg.cfg_scale > 0, "classifier-free guidance is not wired into the static step"),
        (plan.mode is CacheMode.SUB_BLOCK,
         "cache='sub_block' decides each row's forward (refresh or sub-block) on the host"),
        (plan.mode is CacheMode.WINDOW or type(plan) is not ForwardPlan,
         "cache='window' feeds per-row position sets whose width is read on the host"),
        (cfg.temperature > 0, "temperature > 0 draws from a torch.Generator each step"),
        (cfg.rng == "reference" and sel.budgeted,
         "rng='reference' selects the budgeted top-k with torch.topk on the host budget (the "
         "reference decoders' tie order)"),
        (truncator is not None, "a truncator shortens rows on the host"),
        (sel.extra_forwards, "the policy runs extra forwards"),
        (sel.proposes_after_select, "the policy draws tokens after selection"),
        (sel.lookahead > 0, "cross-block lookahead"),
        (sel.draft_causal and plan.model.attention == "block_causal",
         "draft-causal forwards (S2D2) read the canvas on the host"),
        (cfg.confidence_eos_eot_inf, "confidence_eos_eot_inf is not wired in"),
        (sel.edits, "token editing runs post steps whose count is read on the host"),
        (cfg.eos_stop_on_commit or cfg.decode_block_padding,
         "eos_stop_on_commit / decode_block_padding (reference options) are not wired in"),
    ]
    for bad, why in reasons:
        if bad:
            return why
    for part in (selector, stopper):
        if not graph_safe(part):
            return (f"{type(part).__name__} is not declared graph-safe "
                    "(samplers.graph_support.GRAPH_SAFE)")
    return None


def model_devices(model: Any) -> set[torch.device]:
    """The devices of ``model``'s parameters (several under ``load_model(device_map=...)``;
    none for a ``DiffusionLM`` that is no ``nn.Module``)."""
    parameters = getattr(model, "parameters", None)
    return set() if parameters is None else {p.device for p in parameters()}


def runs_eagerly(sampler: Any, cfg: Any, why: str) -> None:
    """Record and log why ``sampler``'s generation runs the eager step (``graph_reason``; a
    warning when ``graphs=True`` asked for the static step, else info)."""
    sampler.graph_reason = why
    log = logger.warning if sampler.graphs else logger.info
    log("policy %r, cache %r: steps run eagerly (no CUDA graphs): %s",
        sampler.policy.name, cfg.cache.value, why)


def eager_noise_kind(sampler: Any, cfg: Any, device: torch.device) -> None:
    """A uniform-noise generation: the eager step, with the reason where the static step
    was wanted (``wanted``); ``graph_reason`` ``None`` otherwise."""
    sampler.graph_reason = None
    if wanted(sampler.graphs, device):
        runs_eagerly(sampler, cfg, UNIFORM_EAGER)
