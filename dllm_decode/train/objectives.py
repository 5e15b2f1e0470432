"""Masked-diffusion training objectives.

**Masked diffusion (LLaDA, Dream).** Nie et al., arXiv 2502.09992, eq. 3 / the SFT variant:
draw ``t ~ U(0, 1)`` per sequence, mask every answer token independently with probability
``p = (1 - eps) t + eps``, and minimise ``sum over masked tokens of CE / p``, normalised by the
answer length ``G`` (answer + EOS padding; the prompt is never masked). Dream uses the same
loss; its AR-shifted head is handled inside ``DreamModel.forward`` (``logits[:, i]`` comes from
the hidden state at ``i - 1``), so training through ``forward`` trains Dream semantics.

**Block diffusion (SDAR-style).** Arriola et al. (BD3-LM), arXiv 2503.09573: the model sees a
clean stream ``x_0`` and a noisy stream ``x_t`` of the same positions in one forward. Clean
queries attend block-causally to clean keys; a noisy query in block ``b`` attends to the noisy
keys of its own block and to the clean keys of blocks ``< b`` -- exactly what it sees when
decoding block ``b`` after blocks ``< b`` are committed (or cached). With probability
``ar_fraction`` a step uses block size 1 with every answer token masked, which is the causal-LM
objective the same weights need in block-size-1 (S2D2 verifier) mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.models.base import DecoderLM
from dllm_decode.models.functional import block_causal_mask
from dllm_decode.train.data import Batch


@dataclass(frozen=True)
class LossOutput:
    """Scalar loss plus per-token accuracy counts on masked answer positions.

    correct / masked: all masked positions (EOS padding included);
    correct_content / masked_content: masked positions of the answer text (before EOS).
    """

    loss: Tensor
    correct: Tensor
    masked: Tensor
    correct_content: Tensor
    masked_content: Tensor


def mask_rate(batch_size: int, eps: float, generator: torch.Generator,
              device: torch.device | str = "cpu") -> Tensor:
    """``p = (1 - eps) t + eps`` with ``t ~ U(0, 1)``: ``[B]`` float32."""
    t = torch.rand(batch_size, generator=generator).to(device)
    return (1 - eps) * t + eps


def mask_answer(answer: Tensor, p: Tensor, mask_id: int,
                generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Mask answer tokens i.i.d. with per-row probability ``p``.

    Args:
        answer: ``[B, G]`` clean answer ids.
        p: ``[B]`` mask probabilities.
        mask_id: the model's mask token id.
        generator: CPU generator (draws are made on CPU, then moved: device-independent).

    Returns: noisy ``[B, G]`` and the bool mask ``[B, G]`` of masked positions.
    """
    u = torch.rand(answer.shape, generator=generator).to(answer.device)
    masked = u < p[:, None]
    return answer.masked_fill(masked, mask_id), masked


def weighted_ce(logits: Tensor, targets: Tensor, masked: Tensor, p: Tensor,
                content: Tensor, norm: Tensor | None = None) -> LossOutput:
    """``mean_b sum_i masked * CE / p_b / G`` and accuracy counts.

    Args:
        logits: ``[B, G, V]`` at the answer positions.
        targets: ``[B, G]`` clean answer ids.
        masked: ``[B, G]`` bool, positions that were masked.
        p: ``[B]`` mask probabilities (the 1/p importance weights).
        content: ``[B, G]`` bool, answer text positions (for the content accuracy).
        norm: optional ``[B]`` per-row normaliser instead of ``G``.
    """
    b, g, v = logits.shape
    ce = F.cross_entropy(logits.float().reshape(b * g, v), targets.reshape(-1),
                         reduction="none").view(b, g)
    loss = ((ce * masked) / p[:, None]).sum(1).div(g if norm is None else norm).mean()
    with torch.no_grad():
        hit = (logits.argmax(-1) == targets) & masked
        return LossOutput(loss, hit.sum(), masked.sum(), (hit & content).sum(),
                          (masked & content).sum())


def answer_logits(model: DecoderLM, tokens: Tensor, valid: Tensor, prompt_length: int
                  ) -> Tensor:
    """Logits ``[B, G, V]`` of the answer rows of a full canvas (bidirectional models).

    Positions come from ``model.rope_positions(valid)`` and pads are hidden by a key mask,
    exactly as the sampler feeds the model at inference.
    """
    positions = model.rope_positions(valid)
    rows = torch.arange(prompt_length, tokens.shape[1], device=tokens.device)
    return model(tokens, positions, mask=valid, hidden_rows=rows)


def _rates(batch: Batch, eps: float, generator: torch.Generator, rate: float | None) -> Tensor:
    b, device = batch.tokens.shape[0], batch.tokens.device
    if rate is not None:
        return torch.full((b,), float(rate), device=device)
    return mask_rate(b, eps, generator, device)


def semi_ar_masks(shape: tuple[int, int], p: Tensor, rows: Tensor, block: int,
                  generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Masks of the semi-autoregressive rows: a random cut ``c`` per row; answer positions
    before ``c`` stay clean, ``[c, c + block)`` are masked with probability ``p`` and
    everything after is masked. Returns ``(masked, scored)``: ``[B, G]`` bool each; only the
    block's masked positions are scored (the BD3-LM / SDAR noisy-block term, seen by a
    bidirectional model with the unknown suffix present as masks).

    rows: ``[B]`` bool, which rows use this scheme (the others get an all-False pair).
    """
    b, g = shape
    pos = torch.arange(g)[None]
    cut = (torch.rand(b, generator=generator) * g).long()[:, None]
    u = torch.rand(b, g, generator=generator)
    block_pos = (pos >= cut) & (pos < cut + block)
    masked = ((block_pos & (u < p.cpu()[:, None])) | (pos >= cut + block)) & rows.cpu()[:, None]
    return masked, masked & block_pos


def masked_diffusion_loss(model: DecoderLM, batch: Batch, generator: torch.Generator,
                          eps: float = 1e-3, rate: float | None = None,
                          semi_ar: float = 0.0, semi_ar_block: int = 4) -> LossOutput:
    """The LLaDA / Dream objective on one batch (see the module docstring).

    ``rate`` fixes the mask probability of every row (evaluation; 1.0 masks the whole answer).
    ``semi_ar``: the fraction of rows trained with :func:`semi_ar_masks` instead (a clean
    answer prefix, a partly masked block of ``semi_ar_block`` tokens, a masked suffix): the
    visible left context is what lets a small model learn to copy quickly; LLaDA's semi-AR
    block decoding sees exactly such canvases.
    """
    p = _rates(batch, eps, generator, rate)
    noisy, masked = mask_answer(batch.answer, p, model.mask_token_id, generator)
    scored, norm = masked, None
    if semi_ar > 0 and rate is None:
        rows = torch.rand(p.shape[0], generator=generator) < semi_ar
        ar_masked, ar_scored = semi_ar_masks(tuple(batch.answer.shape), p, rows,
                                             semi_ar_block, generator)
        rows, ar_masked, ar_scored = (x.to(p.device) for x in (rows, ar_masked, ar_scored))
        masked = torch.where(rows[:, None], ar_masked, masked)
        scored = torch.where(rows[:, None], ar_scored, masked)
        noisy = batch.answer.masked_fill(masked, model.mask_token_id)
        g = batch.answer.shape[1]  # a block row is normalised by the block, not by G
        norm = torch.where(rows, float(min(semi_ar_block, g)), float(g))
    tokens = torch.cat([batch.tokens[:, :batch.prompt_length], noisy], dim=1)
    logits = answer_logits(model, tokens, batch.valid, batch.prompt_length)
    return weighted_ce(logits, batch.answer, scored, p, batch.content, norm)


def two_stream_mask(positions: Tensor, valid: Tensor, start: int, block_size: int) -> Tensor:
    """Attention mask ``[B, L + M, L + M]`` of the clean + noisy training sequence.

    The sequence is ``[clean canvas (L) ; noisy canvas[start:] (M = L - start)]`` with the
    same positions in both streams; blocks are ``position // block_size``. Clean queries see
    clean keys of blocks ``<=`` theirs; noisy queries see noisy keys of their own block and
    clean keys of earlier blocks. Padding keys are hidden; every query sees itself (so a pad
    row never has an empty softmax).
    """
    pos = torch.cat([positions, positions[:, start:]], dim=1)
    key_valid = torch.cat([valid, valid[:, start:]], dim=1)
    n_clean, total = positions.shape[1], pos.shape[1]
    noisy = torch.arange(total, device=pos.device) >= n_clean
    blk = pos // block_size
    q_blk, k_blk = blk[:, :, None], blk[:, None, :]
    q_noisy, k_noisy = noisy[None, :, None], noisy[None, None, :]
    clean_q = ~q_noisy & ~k_noisy & (k_blk <= q_blk)
    noisy_q = q_noisy & ((k_noisy & (k_blk == q_blk)) | (~k_noisy & (k_blk < q_blk)))
    eye = torch.eye(total, dtype=torch.bool, device=pos.device)[None]
    return ((clean_q | noisy_q) & key_valid[:, None, :]) | eye


def block_diffusion_loss(model: DecoderLM, batch: Batch, generator: torch.Generator,
                         eps: float = 1e-3, ar_fraction: float = 0.0,
                         rate: float | None = None,
                         block_size: int | None = None) -> LossOutput:
    """The block-diffusion objective (two streams; see the module docstring).

    With probability ``ar_fraction`` the step runs in block-size-1 mode with every answer
    token masked (``p = 1``): the causal-LM objective. ``rate`` fixes the mask probability
    (evaluation; 1.0 masks whole blocks, each predicted from the clean blocks before it).
    ``block_size`` overrides the model's: a bidirectional model trained this way for a while
    (the attention pattern is just a mask) learns to copy far faster than under uniform
    masking; its weights then warm-start the masked-diffusion objective.
    """
    block_size = block_size or model.block_size
    if block_size is None:
        raise ValueError("block_diffusion_loss needs a block-causal model (block_size set) "
                         "or an explicit block_size")
    b, length = batch.tokens.shape
    device = batch.tokens.device
    ar = bool(torch.rand((), generator=generator) < ar_fraction)
    block = 1 if ar else block_size
    if ar:
        p = torch.ones(b, device=device)
        masked = torch.ones_like(batch.answer, dtype=torch.bool)
        noisy_answer = batch.answer.masked_fill(masked, model.mask_token_id)
    else:
        p = _rates(batch, eps, generator, rate)
        noisy_answer, masked = mask_answer(batch.answer, p, model.mask_token_id, generator)
    prompt = batch.prompt_length
    start = (prompt // block) * block
    positions = model.rope_positions(batch.valid)
    noisy = torch.cat([batch.tokens[:, start:prompt], noisy_answer], dim=1)
    tokens = torch.cat([batch.tokens, noisy], dim=1)
    pos = torch.cat([positions, positions[:, start:]], dim=1)
    mask = two_stream_mask(positions, batch.valid, start, block)
    rows = torch.arange(length + prompt - start, tokens.shape[1], device=device)
    logits = model(tokens, pos, mask=mask, hidden_rows=rows)
    return weighted_ce(logits, batch.answer, masked, p, batch.content)


def causal_lm_loss(model: DecoderLM, batch: Batch) -> LossOutput:
    """Next-token prediction on the answer with a causal mask (AR-shifted models only).

    For a Dream-style model ``logits[:, j]`` comes from the hidden state at ``j - 1``; under a
    causal mask that state has seen exactly the tokens before ``j``, so this is the plain
    causal-LM loss — the AR initialisation Dream itself starts from (Ye et al., arXiv
    2508.15487) — and the warm-up that forms the copying circuit before masked diffusion.
    """
    if not model.logit_shift:
        raise ValueError("causal_lm_loss needs an AR-shifted model (Dream); position-aligned "
                         "models use block_diffusion_loss(..., block_size=1)")
    positions = model.rope_positions(batch.valid)
    n = batch.tokens.shape[1]
    causal = block_causal_mask(positions, positions, 1)  # block size 1 = causal
    mask = (causal & batch.valid[:, None, :]) | torch.eye(
        n, dtype=torch.bool, device=batch.tokens.device)[None]
    rows = torch.arange(batch.prompt_length, n, device=batch.tokens.device)
    logits = model(batch.tokens, positions, mask=mask, hidden_rows=rows)
    every = torch.ones_like(batch.answer, dtype=torch.bool)
    p = torch.ones(batch.tokens.shape[0], device=batch.tokens.device)
    return weighted_ce(logits, batch.answer, every, p, batch.content)


def warmup_loss(model: DecoderLM, batch: Batch, generator: torch.Generator,
                eps: float = 1e-3, ar_fraction: float = 0.0, block_size: int = 4) -> LossOutput:
    """The autoregressive warm-up objective of the family (``--bd-warmup-steps``): a causal
    LM for AR-shifted models (Dream), the two-stream block-diffusion objective with blocks of
    ``block_size`` for other bidirectional models (LLaDA), and the family's own objective for
    block-causal models (which already train this way)."""
    if model.logit_shift:
        return causal_lm_loss(model, batch)
    if model.attention != "block_causal":
        return block_diffusion_loss(model, batch, generator, eps, ar_fraction,
                                    block_size=block_size)
    return diffusion_loss(model, batch, generator, eps, ar_fraction)


def diffusion_loss(model: DecoderLM, batch: Batch, generator: torch.Generator,
                   eps: float = 1e-3, ar_fraction: float = 0.0,
                   rate: float | None = None, semi_ar: float = 0.0,
                   semi_ar_block: int = 4) -> LossOutput:
    """The family's objective: block diffusion for block-causal models, else masked diffusion
    (``semi_ar`` / ``semi_ar_block``: see :func:`masked_diffusion_loss`)."""
    if model.attention == "block_causal":
        return block_diffusion_loss(model, batch, generator, eps, ar_fraction, rate)
    return masked_diffusion_loss(model, batch, generator, eps, rate, semi_ar, semi_ar_block)
