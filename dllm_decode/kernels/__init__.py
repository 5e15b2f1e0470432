"""Public kernel ops. Each takes ``impl="auto" | "reference" | "triton"``.

* ``reference``: the torch functions in ``kernels/reference.py`` (test oracle, CPU path).
* ``triton``: the kernels in ``kernels/triton`` on CUDA tensors, or on CPU tensors when
  ``TRITON_INTERPRET=1`` was set before the first Triton op (the interpreter; tests only).
  An explicit ``"triton"`` never falls back: it raises if the kernel cannot launch.
* ``auto``: Triton only when a compiled kernel can really launch for the tensor's device
  (CUDA tensor, ``triton`` importable, active driver, interpreter off), else the reference.
  Resolved once per device type and logged once. CPU tensors never import Triton. The first
  time ``auto`` sends an op to Triton on a device (per dtype), the op is compared once with
  the reference on a small input (``kernels.selfcheck``); on a mismatch or an error it warns,
  naming the op and the error, and that op uses the reference from then on.
* ``DLLM_DECODE_KERNELS=auto|reference|triton`` overrides what ``auto`` resolves to.

Triton is imported lazily (never at module top), so ``import dllm_decode`` works without it.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Collection
from types import ModuleType

import torch
from torch import Tensor

from dllm_decode.kernels import reference
from dllm_decode.kernels.common import (
    STAT_NAMES,
    AttentionOutput,
    GumbelSample,
    check_active,
    check_attention,
    check_kv_write,
    check_logits,
    mask_inactive_stats,
)
from dllm_decode.types import Impl, Proposal

logger = logging.getLogger(__name__)

_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: environment variable overriding what ``impl="auto"`` resolves to (see ``kernels_env``)
ENV_VAR = "DLLM_DECODE_KERNELS"


def _backend() -> ModuleType:
    """The Triton backend package, imported on first use."""
    try:
        from dllm_decode.kernels import triton as backend
    except ImportError as err:
        raise RuntimeError("impl='triton' needs the triton package "
                           "(pip install 'dllm-decode[triton]')") from err
    return backend


@functools.cache
def _auto(device_type: str) -> Impl:
    if device_type != "cuda":
        choice, why = Impl.REFERENCE, f"{device_type} tensors"
    else:
        try:
            backend = _backend()
        except RuntimeError:
            choice, why = Impl.REFERENCE, "triton is not installed"
        else:
            if backend.INTERPRETED:
                choice, why = Impl.REFERENCE, "TRITON_INTERPRET=1 (interpreter is opt-in only)"
            elif backend.driver_ready():
                choice, why = Impl.TRITON, "CUDA device with an active Triton driver"
            else:
                choice, why = Impl.REFERENCE, "no active Triton GPU driver"
    logger.info("dllm_decode.kernels: impl=auto on %s -> %s (%s)", device_type, choice.value, why)
    return choice


def _require_triton(device: torch.device) -> None:
    backend = _backend()
    if backend.INTERPRETED:
        if device.type != "cpu":
            raise RuntimeError(f"Triton kernels were defined under TRITON_INTERPRET=1 and run "
                               f"on CPU tensors only, got a {device} tensor")
        return
    if device.type != "cuda":
        raise RuntimeError(f"impl='triton' cannot launch on {device} tensors: it needs CUDA "
                           f"tensors and a GPU driver (or TRITON_INTERPRET=1 set before the "
                           f"first Triton op, to run the interpreter on CPU)")
    if not backend.driver_ready():
        raise RuntimeError("impl='triton' cannot launch: Triton found no active GPU driver")


def triton_status(device: torch.device) -> str | None:
    """How Triton kernels run on ``device``: ``"compiled"``, ``"interpreter"`` or ``None``."""
    try:
        backend = _backend()
    except RuntimeError:
        return None
    if backend.INTERPRETED:
        return "interpreter" if torch.device(device).type == "cpu" else None
    return "compiled" if torch.device(device).type == "cuda" and backend.driver_ready() else None


def kernels_env() -> Impl | None:
    """``DLLM_DECODE_KERNELS`` (read on every call): what ``impl="auto"`` resolves to.

    ``auto`` or unset: the device decides (with the first-use self-check); ``reference``: the
    torch reference everywhere; ``triton``: Triton wherever the op supports the input, as if
    asked explicitly (raises if it cannot launch, never falls back, no self-check).
    """
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw not in ("reference", "triton"):
        raise ValueError(f"{ENV_VAR}={raw!r} is not valid; use auto, reference or triton")
    return Impl(raw)


def resolve_impl(impl: Impl | str, device: torch.device, *, ops: tuple[str, ...] = (),
                 dtype: torch.dtype | None = None) -> Impl:
    """``auto`` -> Triton when a kernel can launch on ``device``, else the torch reference.

    ``DLLM_DECODE_KERNELS`` overrides what ``auto`` resolves to (see ``kernels_env``). When
    ``auto`` picks Triton by itself, each op in ``ops`` is first compared once with the
    reference on a small ``dtype`` input on this device (``selfcheck``); any failure warns and
    resolves to the reference from then on. Explicit ``"triton"`` is checked and raises
    ``RuntimeError`` if it cannot launch.
    """
    impl = Impl(impl)
    device = torch.device(device)
    if impl is Impl.AUTO:
        forced = kernels_env()
        if forced is Impl.REFERENCE:
            return Impl.REFERENCE
        if forced is Impl.TRITON:
            _require_triton(device)
            return Impl.TRITON
        choice = _auto(device.type)
        if choice is Impl.TRITON and ops:
            from dllm_decode.kernels import selfcheck

            if not all(selfcheck.passed(op, device, dtype or torch.float32) for op in ops):
                return Impl.REFERENCE
        return choice
    if impl is Impl.TRITON:
        _require_triton(device)
    return impl


def _choose(impl: Impl | str, device: torch.device, unsupported: str | None, op: str,
            dtype: torch.dtype) -> Impl:
    """Resolve ``impl`` for ``op``; ``unsupported`` (a reason) sends ``auto`` to the reference
    and makes an explicit ``"triton"`` raise."""
    if unsupported is not None:
        if Impl(impl) is Impl.TRITON:
            raise NotImplementedError(f"impl='triton' does not support {unsupported}")
        if Impl(impl) is Impl.AUTO:
            return Impl.REFERENCE
    return resolve_impl(impl, device, ops=(op,), dtype=dtype)


def _dtype_issue(*tensors: Tensor | None) -> str | None:
    for t in tensors:
        if t is not None and t.dtype not in _TRITON_DTYPES:
            return f"{t.dtype} inputs (fp32/fp16/bf16 only)"
    return None


def confidence_stats(logits: Tensor, active: Tensor | None = None, *,
                     impl: Impl | str = Impl.AUTO) -> dict[str, Tensor]:
    """One pass over V per row: argmax token, its probability, top-2 margins, entropy, LSE.

    Args:
        logits: ``[N, V]`` or ``[B, L, V]``, fp32/fp16/bf16 (Triton) or any float (reference);
            any strides (the Triton path never copies ``[N, V]``/``[B, L, V]``).
        active: optional bool ``logits.shape[:-1]``; inactive rows are skipped (token -1,
            float statistics ``-inf``).
        impl: see the module docstring.

    Returns: dict of ``logits.shape[:-1]`` tensors: ``token`` int64 (ties -> lowest index),
    float32 ``p_max``, ``margin`` (p1 - p2), ``logit_margin`` (z1 - z2; ``inf`` if V == 1),
    ``neg_entropy`` (sum p log p), ``lse``. Triton math is fp32 (online rescaling), the
    reference fp32 torch ops (softmax/topk). No host sync.
    """
    check_logits(logits)
    check_active(active, logits)
    if _choose(impl, logits.device, _dtype_issue(logits), "confidence_stats",
               logits.dtype) is Impl.REFERENCE:
        return mask_inactive_stats(reference.confidence_stats(logits), active)
    token, _, out = _backend().vocab_pass(logits, stats=True, active=active)
    shape = logits.shape[:-1]
    stats = {name: out[i].view(shape) for i, name in enumerate(STAT_NAMES)}
    return {"token": token.view(shape), **stats}


def _seed_tensor(seed: int | Tensor, device: torch.device) -> Tensor:
    if isinstance(seed, Tensor):
        return seed.reshape(1).to(device=device, dtype=torch.int64)
    return torch.tensor([seed], dtype=torch.int64, device=device)


def gumbel_sample(logits: Tensor, temperature: float, seed: int | Tensor = 0, offset: int = 0,
                  active: Tensor | None = None, noise: Tensor | None = None, *,
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
        impl: see the module docstring.

    Returns: ``GumbelSample(token int64, p_token float32, lse float32)``.
    """
    check_logits(logits)
    check_active(active, logits)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if _choose(impl, logits.device, _dtype_issue(logits), "gumbel_sample",
               logits.dtype) is Impl.REFERENCE:
        return reference.gumbel_sample(logits, temperature, seed, offset, active, noise)
    if noise is not None and noise.shape != logits.shape:
        raise ValueError(f"noise must have the logits shape {tuple(logits.shape)}, got "
                         f"{tuple(noise.shape)}")
    shape = logits.shape[:-1]
    backend = _backend()
    if temperature == 0:
        token, _, out = backend.vocab_pass(logits, stats=True, active=active)
        return GumbelSample(token.view(shape), out[1].view(shape), out[0].view(shape))
    seed_t = None if noise is not None else _seed_tensor(seed, logits.device)
    _, sample, out = backend.vocab_pass(logits, stats=False, temperature=temperature,
                                        seed=seed_t, offset=offset, noise=noise, active=active)
    return GumbelSample(sample.view(shape), out[5].view(shape), out[0].view(shape))


def kv_write_(k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor, pos: int | Tensor,
              cos: Tensor | None = None, sin: Tensor | None = None, *,
              impl: Impl | str = Impl.AUTO) -> None:
    """In place: write ``k_new, v_new [B, H_kv, Lq, D]`` into ``k_cache, v_cache
    [B, H_kv, L_max, D]`` (one layer's views of ``BlockKVCache``), rotating K if asked.

    Args:
        pos: int (shared first row), int ``[B]`` first rows, or int ``[B, Lq]`` explicit rows;
            destinations outside ``[0, L_max)`` (``-1`` by convention) are skipped. Rows must
            be distinct within a sequence (duplicates race on GPU).
        cos, sin: optional fp32 rotate-half RoPE tables: ``[P, D]`` indexed by cache row
            (P >= L_max) or ``[B, Lq, D]`` / ``[B, 1, Lq, D]`` aligned with ``k_new`` (use this
            form when RoPE positions differ from cache rows, e.g. left padding).
        impl: see the module docstring.

    Values are cast to the cache dtype. Triton: bitwise equal to the reference (RoPE in fp32
    without FMA contraction); no host sync. Reference: a tensor ``pos`` syncs on CUDA.
    """
    check_kv_write(k_cache, v_cache, k_new, v_new, cos, sin)
    issue = _dtype_issue(k_cache, v_cache, k_new, v_new)
    if _choose(impl, k_cache.device, issue, "kv_write_", k_cache.dtype) is Impl.REFERENCE:
        reference.kv_write_(k_cache, v_cache, k_new, v_new, pos, cos, sin)
    else:
        _backend().kv_write_(k_cache, v_cache, k_new, v_new, pos, cos, sin)


def block_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_start: Tensor,
    kv_end: Tensor,
    *,
    k_new: Tensor | None = None,
    v_new: Tensor | None = None,
    q_start: Tensor | None = None,
    new_mask: Tensor | None = None,
    kv_mask: Tensor | None = None,
    sm_scale: float | None = None,
    return_lse: bool = False,
    impl: Impl | str = Impl.AUTO,
) -> AttentionOutput:
    """Bidirectional attention of a query block over cached keys plus optional fresh keys.

    Args:
        q: ``[B, H, Lq, D]`` post-RoPE queries (fp32/fp16/bf16); ``H % H_kv == 0`` (GQA:
            query head h reads KV head ``h // (H / H_kv)``).
        k_cache, v_cache: ``[B, H_kv, L_max, D]`` one layer of ``BlockKVCache`` (post-RoPE K).
        kv_start, kv_end: int ``[B]``; every query sees cache rows ``[kv_start, kv_end)``
            (clamped to ``[0, L_max)``) ...
        kv_mask: ... that are also True in this optional bool ``[B, L_max]`` (non-contiguous
            windows, e.g. Window-Diffusion's decoded tokens + external window) ...
        q_start: ... except, when given, rows ``[q_start, q_start + Lq_new)``, which are
            replaced by the fresh source (their cache contents are ignored).
        k_new, v_new: optional fresh source ``[B, H_kv, Lq_new, D]``, attended *in addition*
            to the cache under ``new_mask``; not stored (call ``kv_write_`` for that).
        new_mask: bool ``[Lq, Lq_new]`` or ``[B, Lq, Lq_new]``, True = query sees fresh key;
            ``None`` = all visible.
        sm_scale: softmax scale, default ``1 / sqrt(D)``.
        return_lse: also return the fp32 ``[B, H, Lq]`` log-sum-exp.
        impl: see the module docstring.

    Returns: ``AttentionOutput(out [B, H, Lq, D] in q's dtype, lse or None)``. Rows with no
    visible key give 0 and ``lse = -inf``. Hidden cache rows never contribute, whatever they
    hold (NaN included). fp32 accumulation; no host sync.

    Patterns:
        * dual / prefix cache, refreshed block written first: ``kv_write_`` then attend with
          ``[kv_start, kv_end)`` = the whole canvas.
        * dual cache without storing: ``k_new`` = block K/V, ``q_start`` = block start.
        * block-causal (block diffusion): cache range = committed prefix ``[kv_start,
          block_start)``, ``k_new`` = current block, ``new_mask=None`` (bidirectional inside
          the block), no ``q_start``.
        * S2D2 "2L" verifier (store=False): queries = ``[draft block | mask copy]`` (Lq = 2K),
          ``k_new`` = their K/V, cache range = prefix, ``new_mask [2K, 2K]``: first half
          lower-triangular; second-half row j sees first-half keys ``< j`` and itself.
    """
    check_attention(q, k_cache, v_cache, kv_start, kv_end, k_new, v_new, q_start, new_mask,
                    kv_mask)
    issue = _dtype_issue(q, k_cache, v_cache, k_new, v_new)
    if issue is None and (k_cache.dtype != q.dtype or (k_new is not None and
                                                       k_new.dtype != q.dtype)):
        issue = "mixed query/key dtypes"
    kwargs = dict(k_new=k_new, v_new=v_new, q_start=q_start, new_mask=new_mask,
                  kv_mask=kv_mask, sm_scale=sm_scale, return_lse=return_lse)
    if _choose(impl, q.device, issue, "block_attention", q.dtype) is Impl.REFERENCE:
        return reference.block_attention(q, k_cache, v_cache, kv_start, kv_end, **kwargs)
    out, lse = _backend().block_attention(q, k_cache, v_cache, kv_start, kv_end, **kwargs)
    return AttentionOutput(out, lse)


def propose(logits: Tensor, *, temperature: float = 0.0, sampling: str = "gumbel",
            top_p: float | None = None, top_k: int | None = None, noise: Tensor | None = None,
            generator: torch.Generator | None = None, impl: Impl | str = Impl.AUTO,
            fields: Collection[str] | None = None) -> Proposal:
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
    """
    unsupported = None
    if sampling in ("categorical", "llada2"):
        unsupported = f"sampling={sampling!r} (top-p/top-k need a sort; use the reference)"
    else:
        unsupported = _dtype_issue(logits)
    chosen = _choose(impl, logits.device, unsupported, "propose", logits.dtype)
    if chosen is Impl.REFERENCE or sampling != "gumbel":
        return reference.propose(logits, temperature=temperature, sampling=sampling, top_p=top_p,
                                 top_k=top_k, noise=noise, generator=generator, fields=fields)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    check_logits(logits)
    backend = _backend()
    argmax = None
    if temperature == 0:
        token, _, out = backend.vocab_pass(logits, stats=True)
        tokens, prob = token, out[1]
    else:
        seed = None
        if noise is None:
            seed = torch.randint(0, 2**62, (1,), generator=generator, device=logits.device)
        elif noise.shape != logits.shape:
            raise ValueError(f"noise must have the logits shape {tuple(logits.shape)}, got "
                             f"{tuple(noise.shape)}")
        # the same pass keeps the un-noised argmax: ``Proposal.greedy`` must be the argmax
        # (stoppers and history policies commit it) even when ``tokens`` are sampled
        argmax, tokens, out = backend.vocab_pass(logits, stats=True, temperature=temperature,
                                                 seed=seed, noise=noise)
        prob = out[5]
    shape = logits.shape[:-1]
    want = reference.STAT_FIELDS if fields is None else frozenset(fields)

    def opt(name: str) -> Tensor | None:
        return out[STAT_NAMES.index(name)].view(shape) if name in want else None

    return Proposal(tokens=tokens.view(shape), prob=prob.view(shape), margin=opt("margin"),
                    logit_margin=opt("logit_margin"), neg_entropy=opt("neg_entropy"),
                    argmax=None if argmax is None else argmax.view(shape),
                    lse=out[0].view(shape))


__all__ = ["ENV_VAR", "AttentionOutput", "GumbelSample", "block_attention", "confidence_stats",
           "gumbel_sample", "kernels_env", "kv_write_", "propose", "resolve_impl",
           "triton_status"]
