"""Block iteration and per-step budgets.

LLaDA (ML-GSAI/LLaDA ``get_num_transfer_tokens``): a block's masked count n is split over its S
steps as ``n // S`` each, the first ``n % S`` steps one more. Dream (``_sample``): time grid
``t = linspace(1, eps, S + 1)`` in float32; step i commits ``int(n_mean * (1 - t[i+1] / t[i]))``
where ``n_mean`` is the masked count averaged over the batch; the last step commits the rest.
Both budgets are computed as tensors (no host sync).

Dream's grid is not one token per step at ``steps = n``: with ``eps = 1e-3`` its first step
commits ``int(n * (1 - eps) / S) = 0`` and the rounding deficit lands on the last step (16
positions in 16 steps: 0, 1, 1, ..., 1, 2). Pass ``schedule="llada"`` for exactly ``n / S`` per
step on any family.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from dllm_decode.config import SamplerConfig
    from dllm_decode.policies.capabilities import Capabilities


def blocks(gen_start: int, gen_length: int, block_length: int) -> list[tuple[int, int]]:
    """Prompt-relative blocks ``[(start, end), ...]`` in canvas coordinates (LLaDA/Dream)."""
    return [(gen_start + i, gen_start + i + block_length)
            for i in range(0, gen_length, block_length)]


def aligned_blocks(gen_start: int, total: int, block_size: int) -> list[tuple[int, int]]:
    """Blocks aligned to absolute positions (block-diffusion models): the first block may
    start inside the prompt's last partial block; decoding covers ``[gen_start, total)``."""
    out = []
    start = (gen_start // block_size) * block_size
    while start < total:
        out.append((max(start, gen_start), min(start + block_size, total)))
        start += block_size
    return out


def padded_gen_length(model: Any, cfg: SamplerConfig, p: int) -> int:
    """The generated span the loop decodes: ``cfg.gen_length``, or with
    ``cfg.decode_block_padding`` on a block-diffusion model, up to the end of the block that
    holds position ``P + G`` (LLaDA2's ``generate``: ``ceil((P + G) / K) * K - P``)."""
    g = cfg.gen_length
    if not cfg.decode_block_padding or model.attention != "block_causal":
        return g
    k = model.block_size
    return -(-(p + g) // k) * k - p


def llada_budget(n_block: Tensor, step: int, steps: int) -> Tensor:
    """``[B]`` commits at ``step`` (0-based) of ``steps`` for a block that had ``n_block``."""
    return n_block // steps + (step < n_block % steps).long()


def llada_budgets(n_block: Tensor, steps: int) -> Tensor:
    """``[B, steps]``: ``llada_budget`` of every step of a block, computed once per block."""
    at = torch.arange(steps, device=n_block.device)
    return n_block[:, None] // steps + (at[None] < (n_block % steps)[:, None]).long()


def dream_times(steps: int, eps: float, device: torch.device | str = "cpu") -> Tensor:
    """Dream's float32 time grid ``linspace(1, eps, steps + 1)``."""
    return torch.linspace(1, eps, steps + 1, device=device)


def dream_fractions(times: Tensor) -> Tensor:
    """``[S]`` float32 ``1 - t[i+1] / t[i]`` of a time grid ``[S + 1]``: the fraction of the
    masked positions each step commits (computed once per block; the same values step by
    step)."""
    return 1 - times[1:] / times[:-1]


def dream_budget(masked: Tensor, times: Tensor, step: int, steps: int,
                 fractions: Tensor | None = None) -> Tensor:
    """``[B]`` commits at ``step``: ``int(n_masked * (1 - s/t))``, everything at the end.

    ``masked`` is the ``[B, L]`` mask of masked positions; ``fractions`` the block's
    ``dream_fractions(times)`` if the caller keeps them (else computed for this step). The
    reference uses the batch-mean count for every row; here each row uses its own count, which
    is identical whenever rows have equal counts (always, in the reference's use) and keeps
    rows independent once they diverge (per-row stops, truncation), so no row ends its last
    step with masks left.
    """
    n_masked = masked.sum(1, dtype=torch.float32)  # exact counts (< 2**24)
    if step < steps - 1:
        n_masked = n_masked * (dream_fractions(times) if fractions is None else fractions)[step]
    return n_masked.long()  # floor: the count is >= 0


def decode_layout(model: Any, cfg: SamplerConfig, p: int,
                  length: int) -> list[tuple[int, int, int]]:
    """``[(start, end, aligned_start)]`` blocks of a decode in canvas coordinates (prompt
    length ``p``, canvas ``length``): prompt-relative blocks of ``block_length``, or the
    absolute-aligned blocks of a block-diffusion model's own size."""
    if model.attention == "block_causal":
        if cfg.block_length is not None and cfg.block_length != model.block_size:
            view = (f", or decode a view in blocks of {cfg.block_length}: "
                    f"model.with_block_size({cfg.block_length})"
                    if hasattr(model, "with_block_size") else "")
            raise ValueError(f"block-diffusion models decode in their own block size "
                             f"({model.block_size}); got block_length={cfg.block_length}: pass "
                             f"block_length=None (any gen_length){view}")
        bsz = model.block_size
        return [(s, e, (s // bsz) * bsz) for s, e in aligned_blocks(p, length, bsz)]
    from dllm_decode.config import check_block_division  # noqa: PLC0415 (import cycle)

    check_block_division(cfg)
    quirks = [n for n in ("decode_block_padding", "eos_skip_block_start") if getattr(cfg, n)]
    if quirks:
        raise ValueError(f"{quirks} apply to block-diffusion models (attention 'block_causal', "
                         "blocks of the model's own size); this model decodes prompt-relative "
                         f"blocks (attention {model.attention!r}): leave them False")
    k = cfg.block_length or cfg.gen_length
    return [(s, e, s) for s, e in blocks(p, cfg.gen_length, k)]


def steps_per_block(model: Any, cfg: SamplerConfig, layout: list[tuple[int, int, int]],
                    caps: Capabilities) -> list[int] | None:
    """Steps per block for budgeted policies (``None``: adaptive, open-ended blocks).

    Prompt-relative blocks split ``steps`` evenly (LLaDA's rule, divisibility required).
    Absolute-aligned blocks of block-diffusion models can be partial at either end; each
    gets ``ceil(len * steps / G)`` steps, i.e. the same tokens per step.
    """
    timed = caps.proposes_after_select  # origin: Dream time grid
    if not caps.budgeted and not timed:
        return None
    total = cfg.steps or cfg.gen_length
    n_blocks = len(layout)
    if model.attention == "block_causal":
        return [max(1, -(-(e - s) * total // cfg.gen_length)) for s, e, _ in layout]
    if total % n_blocks:
        valid = [s for s in range(n_blocks, cfg.gen_length + 1, n_blocks)]
        raise ValueError(f"steps ({total}) must be divisible by the number of blocks "
                         f"({n_blocks}); e.g. one of {valid[:8]}")
    return [total // n_blocks] * n_blocks
