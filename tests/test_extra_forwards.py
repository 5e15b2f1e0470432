"""Differential tests of every extra forward and own mask, on the bundled tiny checkpoints.

Each method's extra forward is captured where the library runs it (``StepModelView.forward``,
the ``types.StepModel`` a policy calls; ``DecoderLM.feature_forward`` for dLLM-Cache) during a
real decode of ``tiny-llada`` (LLaDA-style, bidirectional) or ``tiny-sdar`` (block diffusion,
block size 4), and recomputed from the canvases it stands for with plain forwards of the model
(issue 52, item 4). The prompts are left-padded, so every mask carries padding. Logits are
compared in fp32 with ``ATOL`` / ``RTOL``: the largest difference measured is 3.2e-5 on logits
up to ~20; each mask mutation tried (packed rows seeing each other, a shadow row seeing its own
position, a verifier row seeing later drafts, padding made visible) fails these tests.

* **LoPA branches** (``policies/lopa.py``): the packed branch forward equals, branch by branch,
  (block diffusion) the plain block-causal forward of that branch's canvas, exact; (LLaDA) the
  approximation LoPA makes by design on a bidirectional model: the branch's block and what
  follows it against the *anchor's* keys left of the block (the step's, as the authors' D2F
  prefix cache holds them; exact on D2F's block-causal models, hence the SDAR check), recomputed
  here through the model's K/V cache path, and never against another branch's tokens (it is up
  to 2.9 in logits from the plain forward of the branch canvas on tiny-llada).
* **WINO's shadow block** (``policies/wino.py``): equals the authors' one-call layout
  (``decoding_wino``: canvas + shadow block, each shadow row seeing every canvas key but its
  own position and the whole shadow block; block-causal: keys before the block's end), built
  here from that definition. It is by design not the leave-one-out forward (the canvas with the
  position masked): the shadow row sees the masked copies of its neighbours beside their tokens
  and canvas rows that saw its token (measured: up to 0.95 in probability on tiny-llada, 0.17 on
  tiny-sdar); the tests assert the gap exists and keep it out of the claim.
* **S2D2's verifier** (``policies/speculative.py``): the 2L forward's second half equals, per
  position, the plain block-size-1 (causal) forward of prefix + draft before it + a mask.
* **dLLM-Cache at a refresh** (``cache/dllm_cache.py``): a forward that refreshes prompt and
  response equals the plain forward of the canvas (between refreshes it reuses features: the
  paper's approximation, not checked here). Bidirectional models only (the plan refuses block
  diffusion).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from dllm_decode import DiffusionSampler, load_model, load_tokenizer
from dllm_decode.samplers.step import StepModelView
from dllm_decode.text import encode_prompts

#: fp32 tolerance on logits (measured max |diff| 3.2e-5, see the module docstring)
ATOL, RTOL = 1e-4, 1e-5
GEN = 16


@functools.cache
def model(name: str) -> Any:
    return load_model(name).eval()


#: two chat prompts (24 and 32 tokens): row 0 is left-padded, so every mask has padding, by
#: whole blocks of tiny-sdar (block-diffusion rows of another phase would decode apart)
TEXTS = ['Reverse the list: ["Lara Kramer", "Xavier Bowen", "Lucy Kaur", "Karim Pearson"]',
         'Insert "Ava Lee" anywhere in the list: ["Lara Kramer", "Lucy Kaur", "Karim Pearson"]']


@functools.cache
def prompts(name: str) -> tuple[Tensor, Tensor]:
    """``TEXTS`` in the checkpoint's chat template: ids and attention mask ``[2, P]``."""
    ids, valid = encode_prompts(load_tokenizer(name), TEXTS, chat=True)
    assert valid.sum(1).tolist() == [24, 32]
    return ids, valid


def generate(m: Any, name: str, policy: str, **kw: Any) -> Tensor:
    """Decode ``prompts(name)``; returns the canvas key validity ``[2, P + GEN]``."""
    ids, valid = prompts(name)
    DiffusionSampler(m, policy, gen_length=GEN, **kw).generate(ids, attention_mask=valid)
    return torch.cat([valid.bool(), torch.ones(2, GEN, dtype=torch.bool)], 1)


def structure(m: Any, q: Tensor, k: Tensor) -> Tensor:
    """``[Nq, Nk]`` keys each query may see by position: all (bidirectional) or those of its
    block and before (block diffusion)."""
    if not m.block_size:
        return torch.ones(len(q), len(k), dtype=torch.bool)
    return (k[None] // m.block_size) <= (q[:, None] // m.block_size)


@dataclass
class Call:
    """One extra forward as the policy asked for it and as the library answered it."""

    canvas: Tensor  # [B, L] the step's canvas
    tokens: Tensor  # [B, N]
    positions: Tensor  # [B, N]
    mask: Tensor  # [B, N, L + N]
    logits: Tensor  # [B, N, V]
    separate: list[tuple[Tensor, Tensor]]  # per packed group: (rows [n], logits [B, n, V])


def branch_groups(mask: Tensor, length: int) -> list[Tensor]:
    """Fed rows grouped by the first fed column they see (LoPA: one group per branch)."""
    first = mask[0, :, length:].int().argmax(1)
    return [(first == g).nonzero().flatten() for g in first.unique()]


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every ``StepModel.forward`` of the decodes run in the test; each packed group is also
    re-run alone against the same step's keys (``plan.extra_forward``), inside the step."""
    calls: list[Call] = []
    original = StepModelView.forward

    def forward(self: StepModelView, tokens: Tensor, positions: Tensor, mask: Tensor,
                active: Tensor | None = None) -> Tensor:
        logits = original(self, tokens, positions, mask, active)
        canvas, length = self._canvas, self._canvas.shape[1]
        separate = []
        for rows in branch_groups(mask, length):
            sub = torch.cat([mask[:, rows, :length], mask[:, rows][:, :, length + rows]], 2)
            separate.append((rows, self._plan.extra_forward(canvas, tokens[:, rows],
                                                            positions[:, rows], sub)))
        calls.append(Call(canvas.clone(), tokens.clone(), positions.clone(), mask.clone(),
                          logits.clone(), separate))
        return logits

    monkeypatch.setattr(StepModelView, "forward", forward)
    return calls


def close(actual: Tensor, expected: Tensor) -> float:
    """Assert fp32 closeness; return the largest absolute difference."""
    torch.testing.assert_close(actual.float(), expected.float(), atol=ATOL, rtol=RTOL)
    return float((actual.float() - expected.float()).abs().max())


def plain(m: Any, canvas: Tensor, valid: Tensor) -> Tensor:
    """The plain forward of whole canvases ``[B, L]`` with key validity ``valid [B, L]``
    (absolute positions, pads included, as LLaDA and SDAR place them)."""
    keys = torch.arange(canvas.shape[1])
    mask = valid[:, None, :] & structure(m, keys, keys)[None]
    with torch.no_grad():
        return m(canvas, keys.expand_as(canvas), mask=mask)


def anchor_context(m: Any, anchor: Tensor, valid: Tensor, tokens: Tensor, positions: Tensor,
                   keys: Tensor) -> Tensor:
    """Fed ``tokens [B, n]`` at ``positions`` against the K/V of ``anchor [B, L]``'s own
    plain forward at ``keys [L]`` (bool; valid ones), the fed rows all seeing each other (the
    model's cache path: a store of the anchor, then a forward that stores nothing)."""
    b, length = anchor.shape
    n = tokens.shape[1]
    pos = torch.arange(length).expand(b, length)
    cache = m.new_cache(b, length)
    mask = torch.cat([(valid & keys[None])[:, None].expand(b, n, -1),
                      torch.ones(b, n, n, dtype=torch.bool)], 2)
    with torch.no_grad():
        m(anchor, pos, cache=cache, slots=pos, mask=valid, store=True)
        return m(tokens, positions, cache=cache, mask=mask, store=False)


def place(canvas: Tensor, tokens: Tensor, positions: Tensor) -> Tensor:
    """``canvas`` with ``tokens [B, n]`` written at ``positions [B, n]``."""
    return canvas.scatter(1, positions, tokens)


# ---- LoPA ------------------------------------------------------------------------------------

LOPA = dict(threshold=0.9, branches=3, score="prob", block_length=8)


def lopa_branch_calls(captured: list[Call], name: str, cache: str, **kw: Any
                      ) -> tuple[list[Call], Tensor]:
    """The branch forwards of a ``lopa`` decode (and the canvas key validity), each packed
    branch checked against the same branch run alone against the same step's keys."""
    valid = generate(model(name), name, "lopa", cache=cache, **(LOPA | kw))
    assert len(captured) >= 3, "too few branch forwards ran"
    for call in captured:  # packing isolates the branches: each alone gives the same logits
        for rows, alone in call.separate:
            close(call.logits[:, rows], alone)
    return captured, valid


@pytest.mark.parametrize("cache", ["none", "block_causal"])
def test_lopa_branches_are_plain_forwards_of_their_canvases_on_block_diffusion(
        captured: list[Call], cache: str) -> None:
    """tiny-sdar: each branch's logits are the plain forward of its canvas (the anchor with
    the branch's span), exact: keys left of the block cannot see the block."""
    m = model("tiny-sdar")
    checked = 0
    calls, valid = lopa_branch_calls(captured, "tiny-sdar", cache, block_length=4)
    for call in calls:
        length = call.canvas.shape[1]
        for rows in branch_groups(call.mask, length):
            canvas = place(call.canvas, call.tokens[:, rows], call.positions[:, rows])
            ref = plain(m, canvas, valid).gather(1, call.positions[:, rows, None].expand(
                -1, -1, call.logits.shape[-1]))
            close(call.logits[:, rows], ref)
            checked += 1
    assert checked >= 6


@pytest.mark.parametrize("cache,extra", [("none", {}), ("prefix", {"refresh_every": 1}),
                                         ("dual", {"refresh_every": 1})])
def test_lopa_branches_on_llada_see_the_anchors_keys(captured: list[Call], cache: str,
                                                     extra: dict) -> None:
    """tiny-llada: each branch equals its span fed against the anchor's K/V left of the span
    (and right of it with ``dual``): the approximation LoPA makes by design on a bidirectional
    model (D2F's prefix cache). With a cache refreshed every step that is the plan's cache
    exactly; it differs from the plain forward of the branch canvas wherever the branch
    differs from the anchor, and equals it where the branch is the anchor."""
    m = model("tiny-llada")
    gaps = []
    calls, valid = lopa_branch_calls(captured, "tiny-llada", cache, **extra)
    for call in calls:
        length = call.canvas.shape[1]
        for rows in branch_groups(call.mask, length):
            pos = call.positions[:, rows]
            s0, s1 = int(pos[0, 0]), int(pos[0, -1]) + 1
            keys = torch.arange(length)
            keys = (keys < s0) | ((keys >= s1) if cache == "dual" else False)
            ref = anchor_context(m, call.canvas, valid, call.tokens[:, rows], pos, keys)
            close(call.logits[:, rows], ref)
            canvas = place(call.canvas, call.tokens[:, rows], pos)
            full = plain(m, canvas, valid).gather(1, pos[..., None].expand(-1, -1, ref.shape[-1]))
            same = (canvas == call.canvas).all(1)  # rows whose branch is the anchor itself
            if same.any():
                close(call.logits[same][:, rows], full[same])
            gaps.append(float((full - ref).abs().max()))
    assert max(gaps) > 1e-3  # the approximation is real on this model: a branch is not plain


# ---- WINO ------------------------------------------------------------------------------------

def wino_reference(m: Any, canvas: Tensor, valid: Tensor, bs: int, be: int) -> Tensor:
    """The authors' layout: one forward over canvas + ``be - bs`` mask tokens at the block's
    positions; canvas rows see the canvas (block-causally on block-diffusion models), shadow
    row ``i`` every canvas key but ``bs + i`` (and none past ``be`` on block-diffusion models)
    and the whole shadow block. Logits of the shadow rows ``[B, K, V]``."""
    b, length = canvas.shape
    k = be - bs
    keys = torch.arange(length)
    top = structure(m, keys, keys)[None] & valid[:, None, :]  # [B, L, L]
    reach = keys < be if m.block_size else torch.ones(length, dtype=torch.bool)
    shadow = (keys[None] != torch.arange(bs, be)[:, None]) & reach[None]
    shadow = shadow[None] & valid[:, None, :]  # [B, K, L]
    full = torch.cat([torch.cat([top, torch.zeros(b, length, k, dtype=torch.bool)], 2),
                      torch.cat([shadow, torch.ones(b, k, k, dtype=torch.bool)], 2)], 1)
    tokens = torch.cat([canvas, torch.full((b, k), m.mask_token_id)], 1)
    pos = torch.cat([keys, torch.arange(bs, be)]).expand(b, -1)
    with torch.no_grad():
        return m(tokens, pos, mask=full, hidden_rows=torch.arange(length, length + k))


@pytest.mark.parametrize("name,cache,extra", [
    ("tiny-llada", "none", {}), ("tiny-llada", "dual", {"refresh_every": 1}),
    ("tiny-llada", "prefix", {"refresh_every": 1}), ("tiny-llada", "dllm_cache", {}),
    ("tiny-sdar", "none", {}), ("tiny-sdar", "block_causal", {})])
def test_wino_shadow_block_is_the_authors_layout(captured: list[Call], name: str, cache: str,
                                                 extra: dict) -> None:
    """Every shadow forward equals the authors' one-call layout recomputed from the canvas
    (with a cache refreshed every step, or dLLM-Cache whose extra forwards recompute the
    canvas); its gap to leave-one-out plain forwards is the design's, measured not claimed."""
    m = model(name)
    block = 4 if m.block_size else 8
    valid = generate(m, name, "wino", threshold=0.9, cache=cache, block_length=block, **extra)
    assert len(captured) >= 3, "too few shadow forwards ran"
    gap = 0.0
    for call in captured:
        bs, be = int(call.positions[0, 0]), int(call.positions[0, -1]) + 1
        assert (call.tokens == m.mask_token_id).all()
        close(call.logits, wino_reference(m, call.canvas, valid, bs, be))
        for i, p in enumerate(range(bs, be)):  # leave-one-out: the canvas with p masked
            masked = call.canvas.index_fill(1, torch.tensor([p]), m.mask_token_id)
            loo = plain(m, masked, valid)[:, p]
            gap = max(gap, float((loo.softmax(-1) - call.logits[:, i].softmax(-1)).abs().max()))
    assert gap > 1e-4  # the shadow row is not the leave-one-out conditional (by design)


# ---- S2D2 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("cache", ["none", "block_causal"])
def test_s2d2_verifier_is_the_block_size_one_forward(captured: list[Call], cache: str) -> None:
    """tiny-sdar, ``router="always"``: the verifier's second half, row ``j``, equals the plain
    causal (block size 1) forward of prefix + draft before ``j`` + a mask, at ``start + j``
    (exact under the preset's ``causal_prefix``)."""
    m = model("tiny-sdar")
    valid = generate(m, "tiny-sdar", "s2d2", router="always", cache=cache)
    assert len(captured) >= 4, "the verifier did not run"
    causal = m.with_block_size(1)
    checked = 0
    for call in captured:
        s = call.tokens.shape[1] // 2
        start = int(call.positions[0, 0])
        for j in range(s):
            seq = torch.cat([call.canvas[:, :start], call.tokens[:, :j],
                             torch.full((call.canvas.shape[0], 1), m.mask_token_id)], 1)
            close(call.logits[:, s + j], plain(causal, seq, valid[:, :start + j + 1])[:, -1])
            checked += 1
    assert checked >= 8


# ---- dLLM-Cache --------------------------------------------------------------------------------

def test_dllm_cache_refresh_is_the_plain_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """tiny-llada, a left-padded batch over two blocks, K_p = K_r = 3: every forward that
    refreshes prompt and response equals the plain forward of its canvas under the padding
    mask (each query sees every valid key); the forwards in between differ (reused features)."""
    m = model("tiny-llada")
    runs: list[tuple[Tensor, dict, Tensor]] = []
    original = m.feature_forward

    def feature_forward(tokens: Tensor, positions: Tensor, store: Any, **plan: Any) -> Tensor:
        out = original(tokens, positions, store, **plan)
        runs.append((tokens.clone(), plan, out.clone()))
        return out

    monkeypatch.setattr(m, "feature_forward", feature_forward)
    keys = generate(m, "tiny-llada", "low_confidence", cache="dllm_cache",
                    prompt_refresh_every=3, refresh_every=3, refresh_ratio=0.25,
                    block_length=8, steps=GEN)
    refreshed = stale = 0
    for tokens, plan, out in runs:
        mask = keys[:, None, :].expand(-1, tokens.shape[1], -1)
        pos = torch.arange(tokens.shape[1]).expand_as(tokens)
        with torch.no_grad():
            ref = m(tokens, pos, mask=mask, hidden_rows=plan.get("hidden_rows"))
        if plan["refresh_prompt"] and plan["refresh_gen"]:
            close(out, ref)
            refreshed += 1
        else:
            stale += int(not torch.allclose(out, ref, atol=ATOL, rtol=RTOL))
    assert refreshed == 6 and stale >= 1  # forwards 0, 3, ..., 15 of 16
