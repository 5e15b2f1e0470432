"""Kernel launches per decoder layer of a decoding run (the per-layer launch budget).

``layer_launches`` decodes a short batch-1 prompt under the CPU profiler and counts, with
``kernels.count``, the kernels each decoder-layer call launches: top-level aten ops that do
tensor work plus Triton launches. Every forward of the run counts (the cache refreshes and
the cached steps alike), so ``max`` is the worst layer call and ``mean`` the average.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_decode.kernels.count import LaunchCount, count_launches, labelled_modules

LAYER_LABEL = "dllm_decode.decoder_layer"


def layer_launches(model: Any, cache: str = "dual", *, batch: int = 1, prompt_length: int = 8,
                   gen_length: int = 8, block_length: int = 4, policy: str = "low_confidence",
                   **config: Any) -> LaunchCount:
    """Launches per decoder-layer call while ``model`` decodes once with ``cache``.

    Args:
        model: a ``DecoderLM`` (its ``layers`` are labelled for the profiler).
        cache: cache mode (``none``, ``prefix``, ``dual``, ``block_causal``, ``window``).
        batch, prompt_length, gen_length, block_length, policy: the decode (steps = one token
            per step); ``config``: more ``SamplerConfig`` fields.

    Returns: ``LaunchCount`` with one ``per_range`` entry per layer call.
    """
    from dllm_decode.samplers.sampler import DiffusionSampler

    gen = torch.Generator().manual_seed(0)
    vocab = min(model.vocab_size, model.mask_token_id)
    prompt = torch.randint(0, max(vocab, 1), (batch, prompt_length), generator=gen)
    prompt = prompt.to(model.device)
    sampler = DiffusionSampler(model, policy, cache=cache, **config)
    kw = dict(gen_length=gen_length, block_length=block_length, steps=gen_length)
    sampler.generate(prompt, **kw)  # warm-up: lazy resolutions happen outside the count
    with labelled_modules(list(model.layers), LAYER_LABEL), torch.no_grad():
        return count_launches(lambda: sampler.generate(prompt, **kw), label=LAYER_LABEL)
