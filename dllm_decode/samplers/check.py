"""``check_policy``: run a policy through the decode loop and check the library's contracts.

For people writing a policy: one call runs it on a model with the commit contract checked at
every step (``check_commit``: a subset of the eligible positions, at least one per row that
has one, unless the selector declares ``may_commit_nothing``) and the end-to-end invariants
every bundled preset satisfies. Use it in unit tests and in property tests (hypothesis over
prompts, lengths and seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.samplers.sampler import DiffusionSampler
from dllm_decode.speed import generation_tpf, model_stop_ids


@dataclass(frozen=True)
class PolicyReport:
    """What ``check_policy`` measured (one decode of the batch); ``tokens_per_forward`` is
    ``dllm_decode.speed``'s: answer tokens up to EOS per forward, over the batch."""

    steps: int
    forwards: int
    nfe: list[int]
    tokens_per_forward: float


def check_policy(policy: Any, model: Any, prompt_ids: Tensor | list[list[int]], *,
                 cache: str | None = None, check_batch: bool = True,
                 stop_token_ids: Sequence[int] | None = None, **config: Any) -> PolicyReport:
    """Decode ``prompt_ids`` with ``policy`` and assert the library's contracts.

    Checked: the commit contract at every step (``DiffusionSampler(debug=True)``); the prompt
    is never changed; every generated position inside each row's final length is committed
    (no mask left); without extra forwards, forwards <= gen_length and NFE <= gen_length per
    row; a second run with the same seed is identical; and (``check_batch``, at temperature 0,
    for policies that are not ``stochastic``) each row decoded alone equals its row of the
    batch.

    Args:
        policy: a preset name, an import path ``module:Class``, a ``Policy`` or a selector.
        model: any ``DiffusionLM`` (e.g. ``load_model("tiny-llada")``).
        prompt_ids: ``[B, P]`` int64 prompts (no padding).
        cache: cache mode (``None``: the policy's preferred one).
        check_batch: also compare each row decoded alone with the batch.
        stop_token_ids: the ids that end an answer, for the report's tokens per forward
            (``None``: the model's EOS ids).
        **config: ``SamplerConfig`` fields (``gen_length``, ``block_length``, ``steps``, ...)
            and policy parameters, as for ``DiffusionSampler``.

    Returns: a ``PolicyReport``. Raises ``AssertionError`` naming the broken contract.
    Syncs freely (it is a test helper, not a decode path).
    """
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long)
    if prompt.dim() != 2:
        raise ValueError(f"prompt_ids must be [B, P], got shape {tuple(prompt.shape)}")
    sampler = DiffusionSampler(model, policy, cache=cache, debug=True, **config)
    out = sampler.generate(prompt)
    p, g = prompt.shape[1], sampler.config.gen_length
    caps = sampler.capabilities.selector
    if not torch.equal(out.tokens[:, :p].cpu(), prompt):
        raise AssertionError("the prompt was changed")
    inside = torch.arange(g, device=out.answer.device)[None] < out.lengths[:, None]
    left = (out.answer == model.mask_token_id) & inside
    if left.any():
        raise AssertionError(f"{int(left.sum())} generated positions are still masked")
    if not caps.extra_forwards and (out.forwards > g or bool((out.nfe > g).any())):
        raise AssertionError(f"{out.forwards} forwards / NFE {out.nfe.tolist()} exceed "
                             f"gen_length {g} (declare Capabilities(extra_forwards=True) if "
                             "the policy runs extra forwards)")
    again = sampler.generate(prompt)
    if not torch.equal(again.tokens, out.tokens) or again.forwards != out.forwards:
        raise AssertionError("a second run with the same seed differs")
    greedy = sampler.config.temperature == 0 and not caps.stochastic
    if check_batch and greedy and prompt.shape[0] > 1:
        for r in range(prompt.shape[0]):
            alone = sampler.generate(prompt[r:r + 1])
            if not torch.equal(alone.tokens[0], out.tokens[r]):
                raise AssertionError(f"row {r} decoded alone differs from its row in the batch")
    stops = model_stop_ids(model) if stop_token_ids is None else stop_token_ids
    tpf, _ = generation_tpf(out, stops)
    return PolicyReport(steps=out.steps, forwards=out.forwards, nfe=out.nfe.tolist(),
                        tokens_per_forward=tpf)
