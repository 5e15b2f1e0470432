"""The ``Generation`` a mask-model decode returns, assembled after the loop from the per-step
records ``samplers.mask_run.MaskRun`` kept (NFE, bits, refresh flags, edits)."""

from __future__ import annotations

from typing import Any

import torch

from dllm_decode.samplers.step import bits_per_step
from dllm_decode.types import Generation


def mask_generation(run: Any) -> Generation:
    """The contract's end check (one sync) and the ``Generation`` of ``run`` (a finished
    ``MaskRun``): tokens ``[B, P + G]``, NFE ``[B]`` (rows that took part in each forward),
    bits and commit steps ``[B, G]``, refresh flags ``[B, steps]``, edits ``[B, steps, G]``
    (editing policies only), cut back to the requested G under ``decode_block_padding``."""
    b, p, g, g_out, device = run.b, run.p, run.g, run.g_out, run.device
    canvas, lengths, commit_at = run.canvas, run.lengths, run.commit_at
    run.guard.finish(canvas[:, p:], run.mask_id, check_masks=run.lo == p)
    if run.graphed is not None:  # the buffers are the next generation's
        canvas, lengths = canvas.clone(), lengths.clone()
    took_part = run.took_part
    nfe = (torch.stack(took_part, 1).sum(1) if took_part
           else torch.zeros(b, dtype=torch.long, device=device))
    bits_t = bits_per_step(commit_at, run.commit_prob, run.step)
    refreshed_t = (torch.stack(run.refreshed, 1) if run.refreshed
                   else torch.zeros(b, 0, dtype=torch.bool, device=device))
    edits = None
    if run.tracker is not None:
        edits = (torch.stack(run.edit_log, 1) if run.edit_log
                 else torch.zeros(b, 0, g, dtype=torch.bool, device=device))
    if g != g_out:  # decode_block_padding: the padding positions are cut
        canvas, commit_at = canvas[:, :p + g_out], commit_at[:, :p + g_out]
        lengths, edits = lengths.clamp(max=g_out), None if edits is None else edits[..., :g_out]
    return Generation(tokens=canvas, nfe=nfe, forwards=run.forwards, steps=run.step,
                      prompt_length=p, commit_step=commit_at[:, p:].clone(), bits=bits_t,
                      lengths=lengths, refreshed=refreshed_t,
                      step_forwards=run.step_forwards, edits=edits,
                      step_positions=run.step_positions,
                      positions=run.prefill_positions + sum(run.step_positions))
