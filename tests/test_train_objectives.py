"""Masked-diffusion objectives: masking, 1/p weighting, Dream shift, block-diffusion masks."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from dllm_decode.models import DreamModel, load_model, save_model
from dllm_decode.models.base import block_causal_mask
from dllm_decode.train.config import TrainConfig, build_tiny_model
from dllm_decode.train.data import Batch
from dllm_decode.train.objectives import (
    answer_logits,
    block_diffusion_loss,
    mask_answer,
    masked_diffusion_loss,
    two_stream_mask,
    weighted_ce,
)

V, MASK, EOS, PAD = 64, 2, 1, 0
P, G = 6, 8


def tiny(family: str, **kw) -> torch.nn.Module:
    cfg = TrainConfig(family=family, hidden=32, layers=2, heads=2, intermediate=64,
                      block_size=4, **kw)
    return build_tiny_model(cfg, V, MASK, EOS, PAD)


pytestmark = pytest.mark.usefixtures("one_thread")


def make_batch(b: int = 4, seed: int = 0, pad_rows: int = 1) -> Batch:
    """Random prompts; the answer copies the prompt, then two EOS."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, V, (b, P + G), generator=gen)
    tokens[:, P:P + G - 2] = tokens[:, :P]
    tokens[:, -2:] = EOS
    valid = torch.ones(b, P + G, dtype=torch.bool)
    tokens[:pad_rows, :2] = PAD
    valid[:pad_rows, :2] = False
    content = torch.ones(b, G, dtype=torch.bool)
    content[:, -2:] = False
    return Batch(tokens, valid, P, content, ("t",) * b)


class Recorder(torch.nn.Module):
    """A stand-in model that records what it is fed and returns constant logits."""

    mask_token_id, eos_token_ids, vocab_size = MASK, (EOS,), V

    def __init__(self, attention: str = "bidirectional", block_size: int | None = None):
        super().__init__()
        self.attention, self.block_size, self.fed = attention, block_size, []
        self.bias = torch.nn.Parameter(torch.zeros(V))

    def rope_positions(self, valid):
        return torch.arange(valid.shape[1]).expand_as(valid)

    def forward(self, tokens, positions, *, mask=None, hidden_rows=None, **_):
        self.fed.append((tokens.clone(), positions.clone(), mask, hidden_rows))
        rows = tokens.shape[1] if hidden_rows is None else len(hidden_rows)
        return self.bias.expand(tokens.shape[0], rows, V)


def test_masks_touch_only_answer_tokens() -> None:
    batch = make_batch()
    model = Recorder()
    masked_diffusion_loss(model, batch, torch.Generator().manual_seed(0))
    tokens, _, mask, rows = model.fed[0]
    assert torch.equal(tokens[:, :P], batch.tokens[:, :P])  # prompt (and pads) untouched
    changed = tokens != batch.tokens
    assert (tokens[changed] == MASK).all() and changed[:, P:].any()
    assert torch.equal(mask, batch.valid) and torch.equal(rows, torch.arange(P, P + G))


def test_block_loss_masks_touch_only_the_noisy_answer() -> None:
    batch = make_batch()
    model = Recorder("block_causal", 4)
    block_diffusion_loss(model, batch, torch.Generator().manual_seed(1))
    tokens, positions, _, rows = model.fed[0]
    start = (P // 4) * 4
    assert torch.equal(tokens[:, :P + G], batch.tokens)  # the clean stream is clean
    noisy = tokens[:, P + G:]
    assert torch.equal(noisy[:, :P - start], batch.tokens[:, start:P])
    assert torch.equal(positions[:, P + G:], positions[:, start:P + G])
    assert torch.equal(rows, torch.arange(P + G + P - start, tokens.shape[1]))
    changed = noisy[:, P - start:] != batch.answer
    assert (noisy[:, P - start:][changed] == MASK).all()


def test_weighted_ce_hand_computed() -> None:
    logits = torch.zeros(2, 3, 4)  # CE = log 4 everywhere
    targets = torch.zeros(2, 3, dtype=torch.long)
    masked = torch.tensor([[True, False, True], [False, False, True]])
    p = torch.tensor([0.5, 0.25])
    out = weighted_ce(logits, targets, masked, p, torch.ones(2, 3, dtype=torch.bool))
    expected = math.log(4) * ((2 / 0.5) / 3 + (1 / 0.25) / 3) / 2
    assert float(out.loss) == pytest.approx(expected)
    assert int(out.masked) == 3


def test_inverse_p_weighting_is_unbiased() -> None:
    """With a constant per-token CE c, E[sum masked CE / p / G] = c for any mask rate law."""
    b = 4000
    batch = make_batch(b, pad_rows=0)
    model = Recorder()
    out = masked_diffusion_loss(model, batch, torch.Generator().manual_seed(0), eps=0.05)
    assert float(out.loss.detach()) == pytest.approx(math.log(V), rel=0.05)
    # and the weights are exactly 1/p per masked token
    gen = torch.Generator().manual_seed(0)
    p = (1 - 0.05) * torch.rand(b, generator=gen) + 0.05
    _, masked = mask_answer(batch.answer, p, MASK, gen)
    expected = (masked.sum(1) / p * math.log(V) / G).mean()
    assert float(out.loss.detach()) == pytest.approx(float(expected), rel=1e-5)


def test_loss_decreases_on_a_fixed_batch() -> None:
    torch.manual_seed(0)
    model = tiny("llada")
    assert sum(p.numel() for p in model.parameters()) < 60_000
    batch = make_batch(8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss_at(seed: int) -> float:
        with torch.no_grad():
            return float(masked_diffusion_loss(model, batch, torch.Generator().manual_seed(seed),
                                               rate=0.5).loss)

    before = sum(loss_at(s) for s in range(4))
    for step in range(60):
        out = masked_diffusion_loss(model, batch, torch.Generator().manual_seed(100 + step))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert sum(loss_at(s) for s in range(4)) < 0.6 * before


def test_dream_trains_through_the_shifted_head(tmp_path) -> None:
    """Dream's logits at answer position i come from the hidden state at i - 1."""
    model = tiny("dream").eval()
    assert isinstance(model, DreamModel) and model.logit_shift == 1
    batch = make_batch()
    raw = copy.copy(model)
    raw.spec = replace(model.spec, logit_shift=0)
    with torch.no_grad():
        ours = answer_logits(model, batch.tokens, batch.valid, P)
        unshifted = raw(batch.tokens, model.rope_positions(batch.valid), mask=batch.valid)
    assert torch.allclose(ours, unshifted[:, P - 1:P + G - 1], atol=1e-6)
    loaded = load_model(save_model(model, tmp_path / "dream"))
    assert isinstance(loaded, DreamModel) and loaded.logit_shift == 1
    assert '"model_type": "Dream"' in (tmp_path / "dream" / "config.json").read_text()


def test_two_stream_mask_structure() -> None:
    length, start, block = 8, 4, 2
    positions = torch.arange(length)[None]
    valid = torch.ones(1, length, dtype=torch.bool)
    mask = two_stream_mask(positions, valid, start, block)[0]
    pos = torch.cat([positions[0], positions[0, start:]]).tolist()
    for q in range(len(pos)):
        for k in range(len(pos)):
            qn, kn = q >= length, k >= length
            bq, bk = pos[q] // block, pos[k] // block
            if not qn:
                want = not kn and bk <= bq
            else:
                want = (kn and bk == bq) or (not kn and bk < bq)
            assert bool(mask[q, k]) == (want or q == k), (q, k)
    # padding keys are hidden from everyone but themselves
    valid[0, 0] = False
    padded = two_stream_mask(positions, valid, start, block)[0]
    assert not padded[1:, 0].any() and padded[0, 0] and padded.any(-1).all()


@pytest.mark.parametrize("block", [4, 1])
def test_two_stream_logits_equal_blockwise_inference(block: int) -> None:
    """A noisy block's training logits equal the logits of decoding that block at inference
    (earlier blocks clean, the block itself noisy, later blocks invisible)."""
    model = tiny("sdar").eval()
    model = model.with_block_size(block)
    batch = make_batch(2, pad_rows=0)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        noisy_answer, _ = mask_answer(batch.answer, torch.full((2,), 0.6), MASK, gen)
        start = (P // block) * block
        noisy = torch.cat([batch.tokens[:, start:P], noisy_answer], 1)
        tokens = torch.cat([batch.tokens, noisy], 1)
        positions = model.rope_positions(batch.valid)
        pos = torch.cat([positions, positions[:, start:]], 1)
        mask = two_stream_mask(positions, batch.valid, start, block)
        rows = torch.arange(P + G + P - start, tokens.shape[1])
        train_logits = model(tokens, pos, mask=mask, hidden_rows=rows)
        for b0 in range(start, P + G, block):
            b1 = min(b0 + block, P + G)
            canvas = torch.cat([batch.tokens[:, :b0], noisy[:, b0 - start:b1 - start]], 1)
            cpos = positions[:, :b1]
            inf = model(canvas, cpos, mask=block_causal_mask(cpos, cpos, block))
            lo = max(b0, P)
            assert torch.allclose(train_logits[:, lo - P:b1 - P], inf[:, lo:b1], atol=1e-5)


def test_semi_ar_masks_clean_prefix_block_and_masked_suffix() -> None:
    from dllm_decode.train.objectives import semi_ar_masks

    gen = torch.Generator().manual_seed(3)
    rows = torch.tensor([True, True, True, False])
    p = torch.full((4,), 0.5)
    masked, scored = semi_ar_masks((4, 16), p, rows, 4, gen)
    assert not masked[3].any() and not scored[3].any()
    for r in range(3):
        m = masked[r].tolist()
        cut = next((i for i, x in enumerate(m) if x), 16)
        assert not any(m[:cut])  # clean answer prefix
        assert all(m[min(cut + 4, 16):])  # masked suffix after the block
        assert scored[r, cut + 4:].sum() == 0 and (scored[r] <= masked[r]).all()


def test_semi_ar_rows_score_only_their_block() -> None:
    model = Recorder()
    batch = make_batch(b=8)
    out = masked_diffusion_loss(model, batch, torch.Generator().manual_seed(0), semi_ar=1.0)
    tokens = model.fed[0][0][:, P:]
    masked = tokens == MASK
    assert int(out.masked) <= 4 * 8  # one block of <= 4 scored tokens per row
    for row in masked.tolist():
        first = row.index(True) if True in row else len(row)  # late cut, block drew no mask
        assert all(row[first + 4:])  # after the block: the masked suffix
    plain = masked_diffusion_loss(Recorder(), batch, torch.Generator().manual_seed(0))
    again = masked_diffusion_loss(Recorder(), batch, torch.Generator().manual_seed(0),
                                  semi_ar=0.0)
    assert torch.equal(plain.loss, again.loss)


def test_block_objective_warm_starts_a_bidirectional_model() -> None:
    model = tiny("llada")
    batch = make_batch()
    with pytest.raises(ValueError, match="block_size"):
        block_diffusion_loss(model, batch, torch.Generator().manual_seed(0))
    out = block_diffusion_loss(model, batch, torch.Generator().manual_seed(0), block_size=4)
    out.loss.backward()
    assert math.isfinite(float(out.loss.detach())) and int(out.masked) > 0
    assert model.layers[0].attn.qkv.weight.grad.abs().sum() > 0  # the fused q/k/v weight


def test_causal_lm_loss_predicts_each_answer_token_from_its_left_context() -> None:
    from dllm_decode.train.objectives import causal_lm_loss

    model = tiny("dream").eval()
    batch = make_batch()
    captured = []
    real = model.forward

    def spy(tokens, positions, **kw):
        out = real(tokens, positions, **kw)
        captured.append(out)
        return out

    model.forward = spy
    out = causal_lm_loss(model, batch)
    assert int(out.masked) == batch.answer.numel()
    changed = batch.tokens.clone()
    changed[:, P + 3] = (changed[:, P + 3] + 1 - 3) % (V - 3) + 3
    causal_lm_loss(model, replace(batch, tokens=changed))
    a, b = captured
    assert torch.allclose(a[:, :4], b[:, :4])  # rows <= 3 never see answer token 3
    assert not torch.allclose(a[:, 4:], b[:, 4:])
    with pytest.raises(ValueError, match="AR-shifted"):
        causal_lm_loss(tiny("llada"), batch)
