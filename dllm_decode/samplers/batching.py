"""Batch invariance: when a batch must be decoded as several sub-batches, and the merge.

Two cases split a batch (``split_rows``):

* **block-causal models with ragged prompts.** Blocks are aligned to absolute positions, so a
  row's block boundaries relative to its own tokens depend on its left padding. Rows whose
  prompt lengths agree modulo the block size share that phase: re-padded to their own longest
  prompt, their padding is a multiple of the block size and they decode exactly as they would
  alone. The batch is decoded as one sub-batch per phase (at most ``block_size`` of them), so a
  row's tokens and NFE never depend on its batch neighbours.
* **per-row seeds** (``seed=[s0, s1, ...]``): each row is decoded alone with its own generator,
  so sampled decoding (T > 0) gives every row the tokens it gets alone with that seed. With an
  int seed (the default) one generator is shared by the batch: sampled tokens then depend on a
  row's batch position and neighbours (greedy decoding does not).

A split batch runs its sub-batches one after another (throughput of the smaller batches; at most
``block_size`` of them for greedy block-diffusion decoding); an ``on_step`` callback then sees
each sub-batch's states, with row indices local to that sub-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from dllm_decode.types import Generation

#: (row indices, seed) per sub-batch
Groups = list[tuple[list[int], int | None]]


def split_rows(model: Any, valid: Tensor, seed: int | Sequence[int] | None) -> Groups | None:
    """Sub-batches needed for batch invariance, or ``None`` when the batch decodes as one.

    Args:
        model: the ``DiffusionLM``.
        valid: ``[B, P]`` bool prompt validity (False = left padding).
        seed: the config's seed (an int, ``None`` or one int per row).

    Syncs once (reads the prompt lengths) when the model is block-causal or seeds are per row.
    """
    b = valid.shape[0]
    if isinstance(seed, (list, tuple)):
        if len(seed) != b:
            raise ValueError(f"seed has {len(seed)} entries for a batch of {b} rows; pass one "
                             "int per row (or a single int shared by the batch)")
        return [([r], int(s)) for r, s in enumerate(seed)]
    if getattr(model, "attention", None) != "block_causal" or b == 1:
        return None
    size = int(model.block_size)
    phases = (valid.sum(1) % size).tolist()
    if len(set(phases)) == 1:
        return None
    return [([r for r in range(b) if phases[r] == ph], seed) for ph in sorted(set(phases))]


def decode_groups(decode: Callable[..., Generation], prompt: Tensor, valid: Tensor,
                  groups: Groups, **kwargs: Any) -> Generation:
    """Decode each group as its own batch (re-padded to its longest prompt) and merge.

    Args:
        decode: ``generate``-like callable ``(prompt [b, p], attention_mask, seed=..., **kw)``.
        prompt: ``[B, P]`` int64 left-padded prompts.
        valid: ``[B, P]`` bool.
        groups: from ``split_rows``.
        **kwargs: passed on to ``decode``.

    Returns: one ``Generation`` for the whole batch (``prompt_length`` P, ``bits`` and
    ``refreshed`` zero-padded to the longest group's steps, ``forwards`` summed, ``step_forwards``
    summed step by step, ``steps`` the maximum).
    """
    b, p = prompt.shape
    lens = valid.sum(1).tolist()
    parts = []
    for rows, seed in groups:
        width = max(lens[r] for r in rows)
        idx = torch.tensor(rows, device=prompt.device)
        sub_p, sub_v = prompt[idx, p - width:], valid[idx, p - width:]
        parts.append((rows, width, decode(sub_p, sub_v.long(), seed=seed, **kwargs)))
    first = parts[0][2]
    g = first.tokens.shape[1] - parts[0][1]
    tokens = torch.cat([prompt, prompt.new_zeros(b, g)], dim=1)
    nfe = torch.zeros(b, dtype=first.nfe.dtype, device=prompt.device)
    commit_step = torch.full((b, g), -1, dtype=first.commit_step.dtype, device=prompt.device)
    lengths = torch.zeros(b, dtype=first.lengths.dtype, device=prompt.device)
    steps = max(out.steps for _, _, out in parts)
    bits = torch.zeros(b, steps, dtype=first.bits.dtype, device=prompt.device)
    refreshed = torch.zeros(b, steps, dtype=torch.bool, device=prompt.device)
    step_forwards = [0] * steps
    for rows, width, out in parts:
        idx = torch.tensor(rows, device=prompt.device)
        tokens[idx, p - width:] = out.tokens
        nfe[idx] = out.nfe
        commit_step[idx] = out.commit_step
        lengths[idx] = out.lengths
        bits[idx, :out.bits.shape[1]] = out.bits
        if out.refreshed is not None:
            refreshed[idx, :out.refreshed.shape[1]] = out.refreshed.to(prompt.device)
        for s, calls in enumerate(out.step_forwards or []):
            step_forwards[s] += calls
    return Generation(tokens=tokens, nfe=nfe, forwards=sum(out.forwards for _, _, out in parts),
                      steps=steps, prompt_length=p, commit_step=commit_step, bits=bits,
                      lengths=lengths, refreshed=refreshed, step_forwards=step_forwards)
