"""First-use self-check and DLLM_DECODE_KERNELS, exercised on CPU through the interpreter.

``auto`` only picks Triton on CUDA; here ``kernels.dispatch._auto`` is patched to pick it for CPU
tensors (the interpreter), which is exactly the path a GPU takes the first time an op runs.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator

import pytest
import torch
from kernel_utils import from_interpreter

from dllm_decode import kernels
from dllm_decode.kernels import dispatch, reference, selfcheck
from dllm_decode.types import Impl

pytestmark = pytest.mark.triton


def _self_check_warnings(seen: list) -> list[str]:
    # the interpreter itself emits numpy RuntimeWarnings (inf * 0); only ours count
    return [str(w.message) for w in seen if "self-check" in str(w.message)]


@contextlib.contextmanager
def warns_self_check(match: str) -> Iterator[None]:
    """``pytest.warns(RuntimeWarning, match=...)`` that drops the interpreter's expected numpy
    warnings (``kernel_utils.from_interpreter``) instead of re-emitting them as pytest.warns
    does; any other warning is re-emitted."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    ours = [w for w in seen if issubclass(w.category, RuntimeWarning)
            and re.search(match, str(w.message))]
    assert ours, f"no RuntimeWarning matching {match!r}: {[str(w.message) for w in seen]}"
    for w in seen:
        if w not in ours and not from_interpreter(w):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@pytest.fixture
def auto_is_triton(device, monkeypatch):
    monkeypatch.setattr(dispatch, "_auto", lambda device_type: Impl.TRITON)
    monkeypatch.setattr(dispatch, "AUTO_ON_CUDA", {})  # every op Triton (also on a GPU)
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    selfcheck.reset()
    yield
    selfcheck.reset()


@pytest.mark.parametrize("op", sorted(selfcheck.CHECKS))
def test_every_kernel_passes_its_check(op, device) -> None:
    assert selfcheck.check(op, device) is None


def test_check_reports_a_wrong_kernel(device, monkeypatch) -> None:
    from dllm_decode.kernels import triton as backend

    real = backend.vocab_pass

    def off_by_one(*args, **kwargs):
        token, sample, out = real(*args, **kwargs)
        return token, sample, out + 0.1

    monkeypatch.setattr(backend, "vocab_pass", off_by_one)
    error = selfcheck.check("confidence_stats", device)
    assert error is not None and "reference" in error


def test_auto_self_checks_once_and_falls_back(device, auto_is_triton, monkeypatch) -> None:
    from dllm_decode.kernels import triton as backend

    logits = torch.randn(2, 3, 257, generator=torch.Generator().manual_seed(0))
    noise = torch.rand(logits.shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(1))
    calls = {"n": 0}
    real = backend.vocab_pass

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(backend, "vocab_pass", counted)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = kernels.propose(logits, temperature=0.7, noise=noise)
    assert not _self_check_warnings(seen)  # a passing check warns nothing
    checked = calls["n"]
    assert checked >= 2  # the self-check ran the kernel, then the call itself did
    kernels.propose(logits, temperature=0.7, noise=noise)
    assert calls["n"] == checked + 1  # checked once per (op, device, dtype)
    assert torch.equal(got.greedy, logits.argmax(-1))

    def broken(*args, **kwargs):
        token, sample, out = real(*args, **kwargs)
        return (token + 1) % logits.shape[-1], sample, out

    monkeypatch.setattr(backend, "vocab_pass", broken)
    with warns_self_check(r"'confidence_stats' failed its self-check.*token"):
        stats = kernels.confidence_stats(logits)
    assert torch.equal(stats["token"], logits.argmax(-1))  # the reference answered
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        kernels.confidence_stats(logits)
    assert not _self_check_warnings(seen)  # warned once; the reference from then on
    # an explicit request is never second-guessed
    assert not torch.equal(kernels.confidence_stats(logits, impl="triton")["token"],
                           logits.argmax(-1))


def test_model_attention_ops_are_checked(device, auto_is_triton, monkeypatch) -> None:
    from dllm_decode.kernels import triton as backend

    def crash(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(backend, "block_attention", crash)
    with warns_self_check(r"'block_attention'.*illegal memory access"):
        impl = kernels.resolve_impl("auto", device, ops=("kv_write_", "block_attention"))
    assert impl is Impl.REFERENCE


def test_env_override(device, auto_is_triton, monkeypatch) -> None:
    x = torch.randn(3, 50)
    monkeypatch.setenv(kernels.ENV_VAR, "reference")
    assert kernels.resolve_impl("auto", device) is Impl.REFERENCE
    monkeypatch.setenv(kernels.ENV_VAR, "triton")
    assert kernels.resolve_impl("auto", device) is Impl.TRITON
    monkeypatch.setenv(kernels.ENV_VAR, "AUTO")
    assert kernels.resolve_impl("auto", device) is Impl.TRITON
    assert kernels.resolve_impl("reference", device) is Impl.REFERENCE  # explicit wins
    monkeypatch.setenv(kernels.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match=r"DLLM_DECODE_KERNELS='cuda'.*auto, reference or triton"):
        kernels.confidence_stats(x)


def test_env_reference_on_cpu_never_imports_triton(monkeypatch) -> None:
    monkeypatch.setenv(kernels.ENV_VAR, "reference")
    x = torch.randn(2, 4, 30)
    got = kernels.propose(x, temperature=0.5, generator=torch.Generator().manual_seed(0))
    want = reference.propose(x, temperature=0.5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(got.tokens, want.tokens)


def test_only_the_interpreters_numpy_warnings_are_ignored() -> None:
    """The kernel tests' filter is scoped to ``triton.runtime.interpreter``: the same numpy
    warning raised anywhere else (here) is still reported, and so is the library's own."""
    import numpy as np

    with warnings.catch_warnings(record=True) as seen:  # the filters of the autouse fixture
        np.log2(np.zeros(1))
        warnings.warn("dllm_decode.kernels: Triton op 'x' failed its self-check", RuntimeWarning,
                      stacklevel=1)
    messages = [str(w.message) for w in seen]
    assert any(m.startswith("divide by zero encountered in log2") for m in messages)
    assert any("self-check" in m for m in messages)
    assert not any(from_interpreter(w) for w in seen)


def test_auto_on_cuda_goes_per_op(monkeypatch) -> None:
    """``AUTO_ON_CUDA``: attention and the cache scatter stay on torch, the layer ops and the
    vocabulary pass go to Triton; categorical proposals never resolve to Triton under auto.
    (Resolution only: nothing launches, so no GPU is needed.)"""
    monkeypatch.setattr(dispatch, "_auto", lambda device_type: Impl.TRITON)
    monkeypatch.setattr(selfcheck, "passed", lambda *args, **kwargs: True)
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    cuda = torch.device("cuda")
    assert kernels.resolve_impl("auto", cuda, ops=("kv_write_", "block_attention")) is \
        Impl.REFERENCE
    assert kernels.resolve_impl("auto", cuda, ops=("qkv_rope", "silu_mul")) is Impl.TRITON
    assert kernels.propose_impl("auto", cuda, "gumbel") is Impl.TRITON
    assert kernels.propose_impl("auto", cuda, "categorical") is Impl.REFERENCE
    monkeypatch.setattr(dispatch, "_require_triton", lambda device: None)
    assert kernels.propose_impl("triton", cuda, "categorical") is Impl.TRITON  # then raises


def test_check_ignores_only_the_interpreters_expected_warnings(device, monkeypatch) -> None:
    """``selfcheck.check`` (doctor, first use) silences the interpreter's numpy warnings on
    masked-out lanes, and nothing else: the same warning text raised outside
    ``triton.runtime.interpreter`` and the library's own warnings pass through."""
    import numpy as np

    if device.type != "cpu":
        pytest.skip("the interpreter runs on a CPU-only machine")
    with warnings.catch_warnings(record=True) as raw:  # the bare check does warn (log2(0))
        warnings.simplefilter("always")
        assert selfcheck.CHECKS["block_attention"](device, torch.float32) is None
    assert any(from_interpreter(w) for w in raw)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for op in selfcheck.CHECKS:
            assert selfcheck.check(op, device) is None, op
    assert seen == []

    def noisy(device: torch.device, dtype: torch.dtype) -> None:
        np.log2(np.zeros(1))  # the same numpy warning, raised here
        warnings.warn("dllm_decode.kernels: something else", RuntimeWarning, stacklevel=1)

    monkeypatch.setitem(selfcheck.CHECKS, "noisy", noisy)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert selfcheck.check("noisy", device) is None
    messages = [str(w.message) for w in seen]
    assert any("divide by zero" in m for m in messages) and any("something" in m for m in messages)
