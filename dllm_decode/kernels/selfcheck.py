"""First-use self-check: every Triton op against its torch reference on the current device.

``passed(op, device, dtype)`` runs the op once through ``impl="triton"`` and once through
``impl="reference"`` on a small seeded input (tie-free, so discrete outputs must match
exactly; floats within a per-dtype tolerance), caches the verdict per ``(op, device, dtype)``
and, on a mismatch or an exception, warns with the op and the error. ``kernels.resolve_impl``
calls it the first time ``impl="auto"`` sends an op to Triton; ``dllm-decode doctor`` calls
``check(op, ...)`` for every op. The inputs are built on the host from a fixed seed and moved
to the device (a one-off transfer, never in the decode loop).

On a CPU the ops run in the Triton interpreter, which computes every lane of a block in numpy,
masked-out lanes included (``log2(0)`` of an empty row, ``0 * inf`` on a padded lane), and
numpy warns about them. A compiled kernel computes the same lanes silently and the results are
compared with the references, so ``check`` ignores exactly those warnings
(``INTERPRETER_NUMPY_WARNINGS``, ``RuntimeWarning`` raised in ``triton.runtime.interpreter``)
for the duration of the check; the library's own warnings and numpy warnings from anywhere else
pass through.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Final

import torch
from torch import Tensor

from dllm_decode.kernels import attention, layer, rng, vocab
from dllm_decode.kernels.layer_reference import rope_cos_sin

#: float tolerance (max absolute error) per input dtype
TOLERANCE: Final = {torch.float32: 2e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
#: numpy's floating-point warnings (message patterns) that the Triton interpreter raises on
#: masked-out lanes (see the module docstring); ignored only from ``INTERPRETER_MODULE``
INTERPRETER_NUMPY_WARNINGS: Final = (r"divide by zero encountered", r"invalid value encountered",
                                     r"overflow encountered")
INTERPRETER_MODULE: Final = r"triton\.runtime\.interpreter"

_RESULTS: dict[tuple[str, str, torch.dtype], str | None] = {}


def _rand(*shape: int, seed: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _max_err(got: Tensor, want: Tensor) -> float:
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    finite = torch.isfinite(w)
    if not torch.equal(finite, torch.isfinite(g)):
        return float("inf")
    return float((g[finite] - w[finite]).abs().max()) if finite.any() else 0.0


def _compare(pairs: dict[str, tuple[Tensor, Tensor]], exact: tuple[str, ...],
             tol: float) -> str | None:
    for name, (got, want) in pairs.items():
        if name in exact:
            if not torch.equal(got.cpu(), want.cpu()):
                bad = int((got.cpu() != want.cpu()).sum())
                return f"{name} differs from the reference at {bad} of {want.numel()} positions"
            continue
        err = _max_err(got, want)
        if err > tol:
            return f"max |{name} - reference| = {err:.3g} > {tol:g}"
    return None


def _confidence(device: torch.device, dtype: torch.dtype) -> str | None:
    x = _rand(6, 1003, seed=1, scale=3.0).to(device, dtype)
    got = vocab.confidence_stats(x, impl="triton")
    want = vocab.confidence_stats(x, impl="reference")
    return _compare({k: (got[k], want[k]) for k in want}, ("token",), TOLERANCE[dtype])


def _gumbel(device: torch.device, dtype: torch.dtype) -> str | None:
    x = _rand(6, 1003, seed=2, scale=3.0).to(device, dtype)
    noise = torch.rand(x.shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(3)).to(device)
    seeds = torch.tensor([3, -1, 2**62, 0, 7, 11], device=device)
    for kw in ({"noise": noise}, {"row_seeds": seeds}):
        got = vocab.gumbel_sample(x, 0.8, impl="triton", **kw)
        want = vocab.gumbel_sample(x, 0.8, impl="reference", **kw)
        error = _compare({"token": (got.token, want.token),
                          "p_token": (got.p_token, want.p_token)}, ("token",), TOLERANCE[dtype])
        if error is not None:
            return f"{next(iter(kw))}: {error}"
    return None


def _propose(device: torch.device, dtype: torch.dtype) -> str | None:
    x = _rand(2, 3, 1003, seed=4, scale=3.0).to(device, dtype)
    noise = torch.rand(x.shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(5)).to(device)
    seeds = torch.tensor([5, -9], device=device)
    for temperature, kw in ((0.0, {"noise": noise}), (0.8, {"noise": noise}),
                            (0.8, {"row_seeds": seeds})):
        got = vocab.propose(x, temperature=temperature, impl="triton", **kw)
        want = vocab.propose(x, temperature=temperature, impl="reference", **kw)
        error = _compare({"tokens": (got.tokens, want.tokens), "greedy": (got.greedy, want.greedy),
                          "prob": (got.prob, want.prob), "margin": (got.margin, want.margin),
                          "neg_entropy": (got.neg_entropy, want.neg_entropy)},
                         ("tokens", "greedy"), TOLERANCE[dtype])
        if error is not None:
            return f"T={temperature}, {next(iter(kw))}: {error}"
    return None


def _row_uniform(device: torch.device, dtype: torch.dtype) -> str | None:
    seeds = torch.tensor([0, 1, -1, 2**63 - 1, -2**63, 12345], device=device)
    shape = (6, 3, 700)
    return _compare({"uniform": (rng.row_uniform(seeds, shape, impl="triton"),
                                 rng.row_uniform(seeds, shape, impl="reference"))},
                    ("uniform",), 0.0)


def _kv_write(device: torch.device, dtype: torch.dtype) -> str | None:
    caches = [_rand(2, 2, 12, 16, seed=s).to(device, dtype) for s in (6, 7)]
    k_new, v_new = (_rand(2, 2, 4, 16, seed=s).to(device, dtype) for s in (8, 9))
    pos = torch.tensor([1, 6], device=device)
    out = {}
    for impl in ("triton", "reference"):
        k, v = caches[0].clone(), caches[1].clone()
        attention.kv_write_(k, v, k_new, v_new, pos, impl=impl)
        out[impl] = (k, v)
    return _compare({"k_cache": (out["triton"][0], out["reference"][0]),
                     "v_cache": (out["triton"][1], out["reference"][1])}, (), 0.0)


def _attention(device: torch.device, dtype: torch.dtype) -> str | None:
    q = _rand(2, 4, 5, 16, seed=10).to(device, dtype)
    k, v = (_rand(2, 2, 12, 16, seed=s).to(device, dtype) for s in (11, 12))
    k_new, v_new = (_rand(2, 2, 5, 16, seed=s).to(device, dtype) for s in (13, 14))
    start = torch.tensor([0, 2], dtype=torch.int32, device=device)
    end = torch.tensor([7, 12], dtype=torch.int32, device=device)
    res = {impl: attention.block_attention(q, k, v, start, end, k_new=k_new, v_new=v_new,
                                         return_lse=True, impl=impl)
           for impl in ("triton", "reference")}
    return _compare({"out": (res["triton"].out, res["reference"].out),
                     "lse": (res["triton"].lse, res["reference"].lse)}, (), TOLERANCE[dtype])


def _qkv_rope(device: torch.device, dtype: torch.dtype) -> str | None:
    heads, kv_heads, dim = 4, 2, 16
    qkv = _rand(2, 5, (heads + 2 * kv_heads) * dim, seed=15).to(device, dtype)
    rope = layer.rope_rows(*rope_cos_sin(torch.arange(3, 13, device=device).view(2, 5), dim,
                                           10000.0))
    w = [(1 + _rand(dim, seed=s, scale=0.1)).to(device, dtype) for s in (16, 17)]
    slots = torch.tensor([[0, 1, 2, 3, 4], [7, 6, 5, 4, 3]], device=device)
    out = {}
    for impl in ("triton", "reference"):
        k, v = (torch.zeros(2, kv_heads, 9, dim, dtype=dtype, device=device) for _ in "kv")
        qk = layer.qkv_rope(qkv.clone(), rope, heads, kv_heads, dim, q_norm=w[0], k_norm=w[1],
                              eps=1e-6, k_cache=k, v_cache=v, slots=slots, impl=impl)
        out[impl] = (qk, k, v)
    return _compare({name: (out["triton"][i], out["reference"][i])
                     for i, name in enumerate(("qk", "k_cache", "v_cache"))}, (),
                    TOLERANCE[dtype])


def _silu_mul(device: torch.device, dtype: torch.dtype) -> str | None:
    x = _rand(3, 5, 2 * 40, seed=18, scale=3.0).to(device, dtype)
    return _compare({"out": (layer.silu_mul(x, impl="triton"),
                             layer.silu_mul(x, impl="reference"))}, (), TOLERANCE[dtype])


#: op name (as ``kernels`` exports it) -> check returning an error description or None
CHECKS: Final[dict[str, Callable[[torch.device, torch.dtype], str | None]]] = {
    "confidence_stats": _confidence,
    "gumbel_sample": _gumbel,
    "propose": _propose,
    "row_uniform": _row_uniform,
    "kv_write_": _kv_write,
    "block_attention": _attention,
    "qkv_rope": _qkv_rope,
    "silu_mul": _silu_mul,
}


def check(op: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str | None:
    """Run ``op``'s check now (no cache, no warning): ``None`` if it matches, else the error."""
    if op not in CHECKS:
        raise ValueError(f"unknown kernel op {op!r}; ops: {sorted(CHECKS)}")
    if dtype not in TOLERANCE:
        dtype = torch.float32
    try:
        with warnings.catch_warnings():  # the interpreter's expected numpy warnings only
            for message in INTERPRETER_NUMPY_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=RuntimeWarning,
                                        module=INTERPRETER_MODULE)
            return CHECKS[op](torch.device(device), dtype)
    except Exception as err:  # a kernel that cannot compile or launch fails its check
        return f"{type(err).__name__}: {err}"


def passed(op: str, device: torch.device, dtype: torch.dtype = torch.float32) -> bool:
    """Cached ``check``; warns once (``RuntimeWarning``) when ``op`` fails on this device."""
    key = (op, str(torch.device(device)), dtype)
    if key not in _RESULTS:
        error = check(op, device, dtype)
        _RESULTS[key] = error
        if error is not None:
            warnings.warn(f"dllm_decode.kernels: Triton op {op!r} failed its self-check on "
                          f"{key[1]} ({str(dtype).removeprefix('torch.')}): {error}; using the "
                          f"torch reference for {op!r} from now on (DLLM_DECODE_KERNELS="
                          f"reference silences this)", RuntimeWarning, stacklevel=3)
    return _RESULTS[key] is None


def reset() -> None:
    """Forget every verdict (tests; after a driver change)."""
    _RESULTS.clear()
