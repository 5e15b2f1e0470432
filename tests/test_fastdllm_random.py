"""Fast-dLLM's threshold and factor rules over ``remasking="random"`` confidences.

The oracle below is an independent, deliberately plain re-implementation of Fast-dLLM's loops
(NVlabs/Fast-dLLM ``llada/generate.py`` at f6b35ec: ``generate``, ``generate_with_prefix_cache``,
``generate_with_dual_cache``, ``get_transfer_index`` / ``get_transfer_index_dynamic``; the K/V
reuse goes through the model's own cache API), written from their semantics: per forward, a float64
Gumbel draw over the forward's span when T > 0 (twice in the prefix loop's cached steps, one
discarded), then ``torch.rand`` of that span (float32) as confidences;
the block's best masked position always commits, every other one unless its confidence is below
the threshold (factor: the leading run of ranks with ``c_n >= 1 - f/(n+1)``, all of them when
only the last rank fails). One deliberate difference, the library's: the mask token's logit is
set to -inf before anything else (a committed MASK would stay masked forever); the tiny random
model used here would otherwise propose it.
"""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler
from tests.helpers import MASK, tiny_model


def _forward(model, x: torch.Tensor, start: int = 0, end: int | None = None,
             cache=None) -> torch.Tensor:
    """Logits of ``x[:, start:end]``; with ``cache`` the fed K/V are written at their slots and
    every cached key is attended (Fast-dLLM's prefix / dual cache reuse)."""
    end = x.shape[1] if end is None else end
    pos = torch.arange(start, end).expand(x.shape[0], -1)
    logits = model.forward(x[:, start:end], pos, cache=cache, store=cache is not None).float()
    logits[..., MASK] = -torch.inf
    return logits


def _transfer(logits: torch.Tensor, x: torch.Tensor, mask_index: torch.Tensor, gen, *,
              temperature: float, remasking: str, threshold: float | None,
              factor: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast-dLLM's selection helper over one forward's span ``[B, W]``."""
    if temperature > 0:
        z = logits.double()
        u = torch.rand(z.shape, dtype=torch.float64, generator=gen)
        x0 = torch.argmax(z.exp() / (-torch.log(u)) ** temperature, dim=-1)
    else:
        x0 = torch.argmax(logits, dim=-1)
    if remasking == "random":
        conf = torch.rand(x0.shape, generator=gen)
    else:
        probs = torch.softmax(logits.double(), dim=-1)
        conf = probs.gather(-1, x0[..., None])[..., 0]
    conf = torch.where(mask_index, conf, -torch.inf)
    x0 = torch.where(mask_index, x0, x)
    transfer = torch.zeros_like(mask_index)
    for j in range(x.shape[0]):
        n = int(mask_index[j].sum())
        if n == 0:
            continue
        order = torch.sort(conf[j], descending=True, stable=True).indices[:n]
        if factor is None:
            keep = [0] + [k for k in range(1, n) if not conf[j, order[k]] < threshold]
        else:
            count = n
            for k in range(1, n):
                if conf[j, order[k]] < 1 - factor / (k + 2):
                    count = n if k == n - 1 else k
                    break
            keep = list(range(count))
        transfer[j, order[keep]] = True
    return x0, transfer


def fastdllm_generate(model, prompt: torch.Tensor, *, gen_length: int, block_length: int,
                      temperature: float, remasking: str, seed: int, cache: str = "none",
                      threshold: float | None = None,
                      factor: float | None = None) -> tuple[torch.Tensor, int]:
    """Plain transcription of the semantics of Fast-dLLM's ``generate`` /
    ``generate_with_prefix_cache`` / ``generate_with_dual_cache`` (f6b35ec)."""
    gen = torch.Generator().manual_seed(seed)
    rule = dict(temperature=temperature, remasking=remasking, threshold=threshold,
                factor=factor)
    b, p = prompt.shape
    length = p + gen_length
    x = torch.cat([prompt, torch.full((b, gen_length), MASK)], dim=1)
    nfe = 0
    for blk in range(gen_length // block_length):
        start, end = p + blk * block_length, p + (blk + 1) * block_length
        kv = None if cache == "none" else model.new_cache(b, length)
        if kv is not None:  # the refresh forward over the whole canvas also decodes
            nfe += 1
            mask_index = x == MASK
            mask_index[:, end:] = False
            x0, tr = _transfer(_forward(model, x, cache=kv), x, mask_index, gen, **rule)
            x[tr] = x0[tr]
        while (x[:, start:end] == MASK).any():
            nfe += 1
            if kv is None:
                lo, hi = 0, length
            else:
                lo, hi = start, (length if cache == "prefix" else end)
            logits = _forward(model, x, lo, hi, cache=kv)
            if cache == "prefix" and temperature > 0:  # drawn and discarded by the reference
                torch.rand(logits.shape, dtype=torch.float64, generator=gen)
            part = x[:, lo:hi]
            mask_index = part == MASK
            mask_index[:, end - lo:] = False
            x0, tr = _transfer(logits, part, mask_index, gen, **rule)
            x[:, lo:hi] = torch.where(tr, x0, part)
    return x, nfe


CASES = [
    # (rule, value, temperature, batch, seed, cache)
    ("threshold", 0.5, 0.0, 1, 3, "none"),
    ("threshold", 0.9, 0.0, 2, 4, "none"),
    ("threshold", 0.7, 0.8, 1, 5, "none"),
    ("threshold", 0.3, 1.0, 2, 6, "none"),
    ("factor", 1.0, 0.0, 1, 7, "none"),
    ("factor", 2.0, 0.7, 1, 8, "none"),
    ("threshold", 0.6, 0.0, 2, 9, "prefix"),
    ("threshold", 0.5, 0.9, 1, 10, "prefix"),
    ("threshold", 0.6, 0.0, 1, 11, "dual"),
    ("threshold", 0.4, 0.8, 1, 12, "dual"),
    ("factor", 1.0, 0.6, 1, 13, "prefix"),
    ("factor", 1.0, 0.0, 1, 14, "dual"),
]


@pytest.mark.parametrize("rule, value, temperature, batch, seed, cache", CASES)
def test_random_confidences_match_fastdllm(rule: str, value: float, temperature: float,
                                           batch: int, seed: int, cache: str) -> None:
    model = tiny_model("llada", seed=seed)
    prompt = torch.randint(0, MASK - 2, (batch, 6), generator=torch.Generator().manual_seed(seed))
    kw = {"threshold": value} if rule == "threshold" else {"factor": value}
    want, nfe = fastdllm_generate(model, prompt, gen_length=16, block_length=4, cache=cache,
                                  temperature=temperature, remasking="random", seed=seed, **kw)
    params = {"tau": value} if rule == "threshold" else {"factor": value,
                                                        "last_rank_quirk": True}
    if cache != "none":
        params["cache"] = cache
    sampler = DiffusionSampler(model, rule, score="random", debug=True, **params)
    out = sampler.generate(prompt, gen_length=16, block_length=4, steps=4,
                           temperature=temperature, seed=seed, rng="reference",
                           sampling="gumbel", exact_steps=True)
    assert torch.equal(out.tokens, want), f"{(out.tokens != want).sum()} positions differ"
    assert out.forwards == nfe


def test_random_threshold_differs_from_confidence_threshold() -> None:
    """The oracle comparison above can fail: random confidences are not probabilities."""
    model = tiny_model("llada", seed=3)
    prompt = torch.randint(0, MASK - 2, (2, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(gen_length=16, block_length=4, steps=4, seed=3, rng="reference")
    a = DiffusionSampler(model, "threshold", tau=0.5, score="random").generate(prompt, **kw)
    b = DiffusionSampler(model, "threshold", tau=0.5).generate(prompt, **kw)
    assert not torch.equal(a.tokens, b.tokens) or a.forwards != b.forwards


def test_proposal_refuses_random_score() -> None:
    from dllm_decode.types import Proposal, ScoreKind

    z = torch.zeros(1, 2)
    prop = Proposal(z.long(), z, z, z, z)
    with pytest.raises(ValueError, match="step_score"):
        prop.score(ScoreKind.RANDOM)
