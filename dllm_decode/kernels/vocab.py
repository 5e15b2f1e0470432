"""Public vocabulary-pass ops (``impl="auto" | "reference" | "triton"``, as every kernel op;
see ``dllm_decode.kernels`` for how ``impl`` resolves): per-row confidence statistics, the
Gumbel-max sample and the fused proposal. References: ``kernels/reference.py``; Triton:
``kernels/triton/vocab.py`` (one pass over V per row)."""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from dllm_decode.kernels import dispatch as _k
from dllm_decode.kernels import reference
from dllm_decode.kernels.common import (
    STAT_NAMES,
    GumbelSample,
    check_active,
    check_logits,
    mask_inactive_stats,
)
from dllm_decode.kernels.rng import row_seeds_for
from dllm_decode.types import Impl, Proposal


def confidence_stats(logits: Tensor, active: Tensor | None = None, *,
                     impl: Impl | str = Impl.AUTO) -> dict[str, Tensor]:
    """One pass over V per row: argmax token, its probability, top-2 margins, entropy, LSE.

    Args:
        logits: ``[N, V]`` or ``[B, L, V]``, fp32/fp16/bf16 (Triton) or any float (reference);
            any strides (the Triton path never copies ``[N, V]``/``[B, L, V]``).
        active: optional bool ``logits.shape[:-1]``; inactive rows are skipped (token -1,
            float statistics ``-inf``).
        impl: see ``dllm_decode.kernels``.

    Returns: dict of ``logits.shape[:-1]`` tensors: ``token`` int64 (ties -> lowest index),
    float32 ``p_max``, ``margin`` (p1 - p2), ``logit_margin`` (z1 - z2; ``inf`` if V == 1),
    ``neg_entropy`` (sum p log p), ``lse``. Triton math is fp32 (online rescaling), the
    reference fp32 torch ops (softmax/topk). No host sync.
    """
    check_logits(logits)
    check_active(active, logits)
    if _k._choose(impl, logits.device, _k._dtype_issue(logits), "confidence_stats",
                  logits.dtype) is Impl.REFERENCE:
        return mask_inactive_stats(reference.confidence_stats(logits), active)
    token, _, out = _k._backend().vocab_pass(logits, stats=True, active=active)
    shape = logits.shape[:-1]
    stats = {name: out[i].view(shape) for i, name in enumerate(STAT_NAMES)}
    return {"token": token.view(shape), **stats}


def _seed_tensor(seed: int | Tensor, device: torch.device) -> Tensor:
    if isinstance(seed, Tensor):
        return seed.reshape(1).to(device=device, dtype=torch.int64)
    return torch.tensor([seed], dtype=torch.int64, device=device)


def gumbel_sample(logits: Tensor, temperature: float, seed: int | Tensor = 0, offset: int = 0,
                  active: Tensor | None = None, noise: Tensor | None = None, *,
                  row_seeds: Tensor | None = None,
                  impl: Impl | str = Impl.AUTO) -> GumbelSample:
    """Sample ``argmax(logits / T + Gumbel)`` per row, with the token's un-noised probability.

    Args:
        logits: ``[N, V]`` or ``[B, L, V]`` (any strides).
        temperature: ``T >= 0``; 0 is the argmax (ties -> lowest index).
        seed: int or int64 device tensor (no sync). Triton noise for element ``(r, c)`` of the
            flattened ``[N, V]`` rows is Philox(seed, counter ``offset + r * V + c``), 64 bits
            turned into Exp(1) in fp64 (tails to ~44, not float32's ~16); advance ``offset`` by
            ``N * V`` (or change ``seed``) between calls for fresh noise. The reference uses a
            ``torch.Generator`` stream instead: same law, different draws.
        offset: Philox counter offset (see ``seed``).
        active: optional bool ``logits.shape[:-1]``; inactive rows give -1 / ``-inf``.
        noise: optional uniform float64 logits-shaped tensor; both impls then return the token
            of ``reference.gumbel_argmax`` (exact on inputs without near-ties).
        row_seeds: optional ``[B]`` int64 for ``logits [B, ..., V]`` (``[N]`` for ``[N, V]``):
            the noise is ``row_uniform(row_seeds, logits.shape)`` (per-row streams,
            batch-invariant), hashed in-kernel by Triton (no noise tensor); the tokens equal
            the reference's (tie-free inputs). Excludes ``noise``; ``seed``/``offset`` unused.
        impl: see ``dllm_decode.kernels``.

    Returns: ``GumbelSample(token int64, p_token float32, lse float32)``.
    """
    check_logits(logits)
    check_active(active, logits)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    row_seeds_for(row_seeds, logits, noise)
    if _k._choose(impl, logits.device, _k._dtype_issue(logits), "gumbel_sample",
                  logits.dtype) is Impl.REFERENCE:
        return reference.gumbel_sample(logits, temperature, seed, offset, active, noise,
                                       row_seeds)
    if noise is not None and noise.shape != logits.shape:
        raise ValueError(f"noise must have the logits shape {tuple(logits.shape)}, got "
                         f"{tuple(noise.shape)}")
    shape = logits.shape[:-1]
    backend = _k._backend()
    if temperature == 0:
        token, _, out = backend.vocab_pass(logits, stats=True, active=active)
        return GumbelSample(token.view(shape), out[1].view(shape), out[0].view(shape))
    seed_t = None if noise is not None or row_seeds is not None else _seed_tensor(
        seed, logits.device)
    _, sample, out = backend.vocab_pass(logits, stats=False, temperature=temperature,
                                        seed=seed_t, offset=offset, noise=noise, active=active,
                                        row_seeds=row_seeds)
    return GumbelSample(sample.view(shape), out[5].view(shape), out[0].view(shape))


def propose_impl(impl: Impl | str, device: torch.device, sampling: str) -> Impl:
    """The impl ``propose`` runs with for ``sampling``, resolved once by a decode loop:
    ``auto`` sends ``"categorical"`` (torch only) to the reference instead of resolving to
    Triton and then raising; an explicit ``"triton"`` still raises there."""
    if Impl(impl) is Impl.AUTO and sampling == "categorical":
        return Impl.REFERENCE
    return _k.resolve_impl(impl, device, ops=("propose",))


def propose(logits: Tensor, *, temperature: float = 0.0, sampling: str = "gumbel",
            top_p: float | None = None, top_k: int | None = None, noise: Tensor | None = None,
            generator: torch.Generator | None = None, impl: Impl | str = Impl.AUTO,
            fields: Collection[str] | None = None,
            row_seeds: Tensor | None = None) -> Proposal:
    """Fused proposal over the vocabulary; see ``reference.propose`` for the semantics.

    ``fields``: the optional ``Proposal`` fields wanted (``types.OPTIONAL_FIELDS``; ``None``:
    all). The reference computes only those; the Triton kernel computes every statistic in its
    one pass and the others are dropped, so both impls return the same fields.

    Triton covers ``sampling="gumbel"`` in one pass over V (scores from the fp32 statistics,
    token = argmax or a Gumbel-max sample, ``prob`` = its un-noised probability). With
    ``noise`` the tokens equal the reference exactly (tie-free inputs); without it the noise
    is in-kernel Philox seeded by one int64 drawn from ``generator`` on the logits' device
    (no sync; same law as the reference, different draws). ``sampling="categorical"`` (sort
    based top-p/top-k) is torch only: ``auto`` routes it to the reference, an explicit
    ``impl="triton"`` raises ``NotImplementedError``.

    ``row_seeds`` (``[B]`` int64 for ``logits [B, L, V]``, on the logits' device; excludes
    ``noise``, ignores ``generator``): every row samples from its own counter-based stream
    (``kernels.row_uniform``), so row b's tokens depend only on ``row_seeds[b]`` and its
    logits, never on the batch. Triton hashes it in-kernel (no ``[B, L, V]`` tensor), tokens
    equal to the reference's on tie-free inputs. Derive a fresh key per step with
    ``kernels.mix_seeds(seeds, step)``.
    """
    unsupported = None
    if sampling in ("categorical", "llada2"):
        unsupported = f"sampling={sampling!r} (top-p/top-k need a sort; use the reference)"
    else:
        unsupported = _k._dtype_issue(logits)
    row_seeds_for(row_seeds, logits, noise)
    chosen = _k._choose(impl, logits.device, unsupported, "propose", logits.dtype)
    if chosen is Impl.REFERENCE or sampling != "gumbel":
        return reference.propose(logits, temperature=temperature, sampling=sampling, top_p=top_p,
                                 top_k=top_k, noise=noise, generator=generator, fields=fields,
                                 row_seeds=row_seeds)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    check_logits(logits)
    backend = _k._backend()
    argmax = None
    if temperature == 0:
        token, _, out = backend.vocab_pass(logits, stats=True)
        tokens, prob = token, out[1]
    else:
        seed = None
        if noise is None and row_seeds is None:
            seed = torch.randint(0, 2**62, (1,), generator=generator, device=logits.device)
        elif noise is not None and noise.shape != logits.shape:
            raise ValueError(f"noise must have the logits shape {tuple(logits.shape)}, got "
                             f"{tuple(noise.shape)}")
        # the same pass keeps the un-noised argmax: ``Proposal.greedy`` must be the argmax
        # (stoppers and history policies commit it) even when ``tokens`` are sampled
        argmax, tokens, out = backend.vocab_pass(logits, stats=True, temperature=temperature,
                                                 seed=seed, noise=noise, row_seeds=row_seeds)
        prob = out[5]
    shape = logits.shape[:-1]
    want = reference.STAT_FIELDS if fields is None else frozenset(fields)

    def opt(name: str) -> Tensor | None:
        return out[STAT_NAMES.index(name)].view(shape) if name in want else None

    return Proposal(tokens=tokens.view(shape), prob=prob.view(shape), margin=opt("margin"),
                    logit_margin=opt("logit_margin"), neg_entropy=opt("neg_entropy"),
                    argmax=None if argmax is None else argmax.view(shape),
                    lse=out[0].view(shape))


__all__ = ["confidence_stats", "gumbel_sample", "propose", "propose_impl"]
