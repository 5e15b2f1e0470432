"""DiffusionGemma's training recipe for the test-bed student: uniform noise, self-conditioning
and the encoder's causal-LM loss.

No DiffusionGemma training report is public. The recipe followed is the one NVIDIA NeMo
AutoModel implements for fine-tuning ``google/diffusiongemma-26B-A4B-it``, whose comments state
each choice as "matching Google's" (``docs/guides/dllm/diffusiongemma.md``;
``nemo_automodel/recipes/dllm``: ``DiffusionGemmaSFTRecipe``, ``BlockDiffusionStrategy``;
``components/datasets/dllm/corruption.py``: ``corrupt_uniform_random``;
``components/models/diffusion_gemma/model.py``: the training forward):

* **uniform corruption**: per example ``t ~ U(eps, 1)`` (``eps = 1e-3``); every canvas position
  is replaced with probability ``t`` by a token drawn uniformly from the whole vocabulary
  (there is no mask token);
* the **encoder** reads the clean prompt and answer with causal attention; the **decoder**
  denoises the canvas bidirectionally against the clean prompt's encoder K/V (one canvas here:
  the test bed's 16 answer positions);
* **flat loss**: the mean cross-entropy over every canvas position, corrupted or clean, without
  ``1 / t`` weighting;
* the **encoder's causal-LM loss** on the clean sequence, added with weight 1
  (``--encoder-loss-weight``);
* **self-conditioning** (Analog Bits, Chen et al., arXiv 2208.04202): a first decoder pass
  without gradients and without self-conditioning; per example, with probability 0.5
  (``--self-cond``), the second pass is conditioned on the first pass's logits, else on zeros;
  only the second pass is trained.

A test-bed addition, off by default (``--name-noise-frac``): a share of the rows corrupts only
the name positions, at the same per-row rate, and their targets are the exact posterior of that
process (the clean list symbols and EOS carry no evidence about the rate). I.i.d. corruption
almost never leaves every list symbol clean while names are noisy, yet that is the state the
re-noising sampler is in once its entropy-bound acceptance has taken the list symbols; a student
trained on i.i.d. rows alone put 0.83 of its mass on a name already in the canvas there (a
shuffle prompt, one name accepted) where the posterior puts none, and its shuffle answers
repeated names. It is the uniform counterpart of the mask objective's ``structure`` rows.

Where this student differs: its router is trained (the fine-tuning recipe freezes a pretrained
one; this student starts from random weights), and the targets are the exact posterior of the
clean answer given the canvas (``models.uniform_oracle.noisy_posterior``, with the corruption
level unknown on the grid ``UniformOracle`` uses) instead of the clean token: the minimiser, in
expectation, of the same cross-entropy. The forwards here are the differentiable counterparts of
``DiffusionGemmaModel.encode`` / ``decode`` (tested equal on a test-bed canvas).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from dllm_decode.models.diffusion_gemma import DiffusionGemmaModel
from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.models.uniform_oracle import ALPHAS, noisy_posterior
from dllm_decode.train.distill_batch import (
    batch_prompts,
    draw_answers,
    left_padded,
    scramble_batch,
)
from dllm_decode.train.testbed import TESTBED_GEN_LENGTH

#: the corruption level's lower bound (``dllm.eps`` of the reference recipe)
EPS = 1e-3
#: added to the step seed so the noise draws are independent of the scrambled-copy batch's
NOISE_SALT = 0x7E57


def _softcap(model: DiffusionGemmaModel, h: Tensor) -> Tensor:
    logits = F.linear(model.norm(h), model.embed.weight).float()
    return torch.tanh(logits / model.spec.softcap) * model.spec.softcap


def encode_clean(model: DiffusionGemmaModel, clean: Tensor, valid: Tensor
                 ) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """The causal encoder over ``clean [B, N]`` (``valid [B, N]``: False = left padding, never
    attended to; positions ``0 .. N - 1``) -> per layer ``(k, v)`` ``[B, Hkv, N, D]`` and the
    encoder's logits ``[B, N, V]`` (fp32, soft-capped)."""
    b, n = clean.shape
    positions = torch.arange(n, device=clean.device).expand(b, n)
    q_pos, k_pos = positions[0][:, None], positions[0][None]
    seen = (k_pos <= q_pos)[None] & valid[:, None, :] | (k_pos == q_pos)[None]  # [B, N, N]
    local = seen & (q_pos - k_pos < model.spec.sliding_window)[None]
    h = model._embed(clean)
    rope = model._layer_rope(positions, h.dtype)
    kv = []
    for i, layer in enumerate(model.layers):
        q, k, v = layer.self_attn.project(layer.input_layernorm(h), *rope[layer.spec])
        kv.append((k, v))
        a = layer.self_attn.attend(q, k, v, local if layer.spec.sliding else seen)
        h = h + layer.post_attention_layernorm(a)
        h = layer.feed_forward(h, model.encoder_scalars[i], model.moe_impl == "grouped")
    return kv, _softcap(model, h)


def decode_canvas(model: DiffusionGemmaModel, kv: list[tuple[Tensor, Tensor]],
                  prefix_valid: Tensor, canvas: Tensor, soft: Tensor | None) -> Tensor:
    """The decoder over ``canvas [B, C]`` at positions ``W .. W + C - 1`` against the first
    ``W`` encoder positions (``prefix_valid [B, W]``) -> logits ``[B, C, V]`` (fp32,
    soft-capped). ``soft [B, C, hidden]``: the self-conditioning signal (``None``: zeros)."""
    b, c = canvas.shape
    w = prefix_valid.shape[1]
    x = model._embed(canvas)
    h = model.self_conditioning.condition(x, torch.zeros_like(x) if soft is None else soft)
    positions = torch.arange(w, w + c, device=canvas.device).expand(b, c)
    rope = model._layer_rope(positions, h.dtype)
    keys_valid = torch.cat([prefix_valid, torch.ones(b, c, dtype=torch.bool,
                                                     device=canvas.device)], 1)
    for i, layer in enumerate(model.layers):
        lo = max(w - (model.spec.sliding_window - 1), 0) if layer.spec.sliding else 0
        q, k, v = layer.self_attn.project(layer.input_layernorm(h), *rope[layer.spec])
        keys = torch.cat([kv[i][0][:, :, lo:w], k], 2)
        values = torch.cat([kv[i][1][:, :, lo:w], v], 2)
        mask = keys_valid[:, None, lo:].expand(b, c, w - lo + c)
        a = layer.self_attn.attend(q, keys, values, mask)
        h = h + layer.post_attention_layernorm(a)
        h = layer.feed_forward(h, layer.layer_scalar, model.moe_impl == "grouped")
    return _softcap(model, h)


def self_conditioning(model: DiffusionGemmaModel, logits: Tensor, rows: Tensor) -> Tensor:
    """``softmax(logits) @ embed * sqrt(hidden)`` (what ``decode`` feeds back), zero in the rows
    where ``rows [B]`` is False. logits ``[B, C, V]`` -> ``[B, C, hidden]``."""
    w = model.embed.weight
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32).to(w.dtype)
    soft = (probs @ w) * torch.tensor(model.spec.hidden_size ** 0.5, dtype=w.dtype)
    return soft * rows[:, None, None].to(soft.dtype)


def uniform_batch(cfg: Any, oracle: WaitingLineOracle, step: int,
                  onpolicy: tuple[list[list[int]], list[Tensor], Tensor] | None = None
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, int]:
    """One step's rows: ``(clean [B, W + G], valid [B, W + G], canvas [B, G], targets [B, G,
    V] float32, self-conditioned rows [B] bool, W)``. A function of ``(seed, step)``. The first
    ``scramble_steps`` copy random name lists (the test bed's scrambled-copy warm-up,
    ``train/README.md``), the same corruption on top. ``onpolicy``: ``(prompts, answer
    tables, canvases [n, G])`` that replace the first ``n`` rows (``train/uniform_onpolicy``:
    the student's own sampler's canvases; the clean sequence the encoder reads takes one valid
    answer of each)."""
    g, v = TESTBED_GEN_LENGTH, oracle.vocab_size
    rng = random.Random(f"{cfg.seed}:{step}:answer")
    gen = torch.Generator().manual_seed((cfg.seed << 32) + step + NOISE_SALT)
    if step < cfg.scramble_steps:  # copies of random name lists: the only way down is to copy
        tokens, valid, _, onehot, width = scramble_batch(cfg, oracle, step)
        prompts = batch_prompts(tokens, valid, width)
        answers = onehot.argmax(-1)
        tables = [a[None] for a in answers]  # one valid answer each
    else:
        prompts, tables, answers = draw_answers(cfg, oracle, step, rng)
    b = len(prompts)
    t = EPS + (1 - EPS) * torch.rand(b, 1, generator=gen)
    hit = torch.rand(b, g, generator=gen) < t
    canvas = torch.where(hit, torch.randint(0, v, (b, g), generator=gen), answers)
    sc_rows = torch.rand(b, generator=gen) < cfg.self_cond
    known = torch.ones(b, g, dtype=torch.bool)
    if cfg.name_noise_frac:  # drawn last: runs without name-noise rows keep their draws
        name_rows = torch.rand(b, generator=gen) < cfg.name_noise_frac
        known = ~name_rows[:, None] | (answers >= oracle._first_name)
        canvas = torch.where(known, canvas, answers)  # list symbols and EOS left clean
    if onpolicy is not None:
        on_prompts, on_tables, on_canvas = onpolicy
        n = len(on_prompts)
        prompts[:n], tables[:n] = on_prompts, on_tables
        answers[:n] = torch.stack([t[rng.randrange(len(t))] for t in on_tables])
        canvas[:n], known[:n] = on_canvas, True
    keep = torch.tensor(ALPHAS, dtype=torch.float64)
    targets = torch.cat([noisy_posterior(table, row[None], keep, v, known=k[None])
                         for table, row, k in zip(tables, canvas, known, strict=True)]).float()
    width = max(len(p) for p in prompts) + rng.randint(0, cfg.max_pad)
    clean, valid = left_padded(prompts, answers, width, oracle.pad_token_id)
    return clean, valid, canvas, targets, sc_rows, width


def uniform_loss(model: DiffusionGemmaModel, clean: Tensor, valid: Tensor, canvas: Tensor,
                 targets: Tensor, sc_rows: Tensor, width: int,
                 encoder_loss_weight: float) -> tuple[Tensor, Tensor]:
    """``(loss, KL to the targets)``: the flat soft cross-entropy over the canvas (second,
    self-conditioned pass) plus ``encoder_loss_weight`` times the encoder's causal-LM
    cross-entropy on the clean sequence (every valid next token)."""
    kv, enc_logits = encode_clean(model, clean, valid)
    prefix_valid = valid[:, :width]
    with torch.no_grad():
        first = decode_canvas(model, [(k.detach(), v.detach()) for k, v in kv], prefix_valid,
                              canvas, None)
    logits = decode_canvas(model, kv, prefix_valid, canvas,
                           self_conditioning(model, first, sc_rows))
    logp = logits.log_softmax(-1)
    ce = -(targets * logp).sum(-1)  # [B, G]
    entropy = -(targets * targets.clamp_min(1e-30).log()).sum(-1)
    pairs = valid[:, :-1] & valid[:, 1:]  # logits at j predict token j + 1
    ar = F.cross_entropy(enc_logits[:, :-1][pairs], clean[:, 1:][pairs])
    return ce.mean() + encoder_loss_weight * ar, (ce - entropy).mean()
