"""How ``impl="auto" | "reference" | "triton"`` resolves, for every kernel op.

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
* ``auto`` on CUDA goes per op (``AUTO_ON_CUDA``, measured at batch 1 on an H200): Triton
  where one launch replaces many torch kernels (the vocabulary pass, the fused layer ops),
  torch where a well-kept torch kernel exists (SDPA, the cache scatter).
* ``DLLM_DECODE_KERNELS=auto|reference|triton`` overrides what ``auto`` resolves to.

Triton is imported lazily (never at module top), so ``import dllm_decode`` works without it.
The op modules (``vocab``, ``attention``, ``layer``) import this one; ``dllm_decode.kernels``
re-exports the public names.
"""


from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import torch
from torch import Tensor

from dllm_decode.types import Impl

logger = logging.getLogger("dllm_decode.kernels")  # the name users filter on
_T = TypeVar("_T")

_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: environment variable overriding what ``impl="auto"`` resolves to (see ``kernels_env``)
ENV_VAR = "DLLM_DECODE_KERNELS"
#: the ``selfcheck`` module (its ``passed(op, device, dtype)``), set by ``dllm_decode.kernels``
#: on import: the self-check runs the public ops, which resolve their impl here, so this module
#: reaches it through the package instead of importing it
_CHECKER: list[Any] = []


#: what ``impl="auto"`` picks per op on CUDA when Triton can launch (ops not listed: Triton).
#: Measured on an H200 (batch 1, LLaDA-8B shape, eager, at 2da4814): the Triton ``kv_write_`` +
#: ``block_attention`` path cost 25.3 ms per forward against 20.1 for the torch reference
#: (Triton's launcher costs more per launch than torch's), so attention stays on SDPA and the
#: cache write on torch's scatter. By launch count (not yet timed on a GPU): the vocabulary
#: pass (one launch for ~10 torch kernels over ``[N, V]``) and the fused layer ops (one
#: launch for 5-8 / 2 torch kernels) go to Triton. Categorical proposals (top-p / top-k need
#: a sort) are torch only (``propose_impl``).
AUTO_ON_CUDA: dict[str, Impl] = {
    "confidence_stats": Impl.TRITON, "gumbel_sample": Impl.TRITON, "propose": Impl.TRITON,
    "qkv_rope": Impl.TRITON, "silu_mul": Impl.TRITON,
    "kv_write_": Impl.REFERENCE, "block_attention": Impl.REFERENCE,
}


def _once_per_process(fn: Callable[..., _T]) -> Callable[..., _T]:
    """``functools.cache`` as a plain dict that ``torch.compile`` traces like any code.

    A model may resolve its impls inside a compiled region (its first forward under
    ``torch.compile(fullgraph=True)``); Dynamo bypasses an ``lru_cache`` wrapper there, with a
    warning. Here a call while compiling reads the memo but never fills it (Dynamo never
    filled the ``lru_cache`` either), so the first eager call still decides (and logs) once;
    the answer is the same function of the arguments. Keeps ``cache_clear``.
    """
    memo: dict[tuple, _T] = {}

    @functools.wraps(fn)
    def once(*args: object) -> _T:
        if args in memo:
            return memo[args]
        got = fn(*args)
        if not torch.compiler.is_compiling():
            memo[args] = got
        return got

    once.cache_clear = memo.clear  # type: ignore[attr-defined]
    return once


def _backend() -> ModuleType:
    """The Triton backend package, imported on first use."""
    try:
        from dllm_decode.kernels import triton as backend
    except ImportError as err:
        raise RuntimeError("impl='triton' needs the triton package "
                           "(pip install 'dllm-decode[triton]')") from err
    return backend


@_once_per_process
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
    if not torch.compiler.is_compiling():  # a first forward inside torch.compile(fullgraph)
        logger.info("dllm_decode.kernels: impl=auto on %s -> %s (%s)", device_type,
                    choice.value, why)
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
    if not _driver_ready():
        raise RuntimeError("impl='triton' cannot launch: Triton found no active GPU driver")


@_once_per_process
def _driver_ready() -> bool:
    """``driver_ready`` once per process: every explicit Triton op checks it (per layer, per
    forward), and the driver query costs microseconds of host time each."""
    return _backend().driver_ready()


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
    resolves to the reference from then on. On CUDA, ``auto`` also follows ``AUTO_ON_CUDA``
    for each op in ``ops`` (any op listed as the reference makes the answer the reference).
    Explicit ``"triton"`` is checked and raises ``RuntimeError`` if it cannot launch.
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
        if choice is Impl.TRITON and device.type == "cuda" and any(
                AUTO_ON_CUDA.get(op, Impl.TRITON) is Impl.REFERENCE for op in ops):
            return Impl.REFERENCE
        if choice is Impl.TRITON and ops and _CHECKER:
            checker = _CHECKER[0]
            if not all(checker.passed(op, device, dtype or torch.float32) for op in ops):
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
