"""impl selection: auto never imports Triton for CPU tensors, explicit triton never falls back."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dllm_decode import kernels
from dllm_decode.types import Impl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_cpu_auto_is_reference_and_lazy():
    """Fresh process, interpreter off: auto on CPU never imports triton; explicit raises."""
    script = textwrap.dedent("""
        import sys, torch
        import dllm_decode, dllm_decode.kernels as K
        x = torch.randn(3, 11)
        assert K.resolve_impl("auto", x.device) is K.Impl.REFERENCE
        K.confidence_stats(x); K.propose(x[None]); K.gumbel_sample(x, 1.0, seed=1)
        assert "triton" not in sys.modules, "triton imported for CPU tensors"
        try:
            K.confidence_stats(x, impl="triton")
        except RuntimeError as err:
            print("ERR", err)
        else:
            raise SystemExit("explicit triton on CPU did not raise")
    """)
    res = subprocess.run([sys.executable, "-c", script], env=_clean_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "cannot launch on cpu" in res.stdout


def test_reference_explicit_and_auto_log_once(caplog):
    x = torch.randn(2, 5)
    assert kernels.resolve_impl("reference", x.device) is Impl.REFERENCE
    kernels.dispatch._auto.cache_clear()
    with caplog.at_level(logging.INFO, logger="dllm_decode.kernels"):
        for _ in range(3):
            assert kernels.resolve_impl(Impl.AUTO, torch.device("cpu")) is Impl.REFERENCE
    assert len([r for r in caplog.records if "impl=auto" in r.getMessage()]) == 1


@pytest.mark.triton
def test_unsupported_dtype(device):
    x = torch.randn(2, 9, dtype=torch.float64, device=device)
    with pytest.raises(NotImplementedError, match="float64"):
        kernels.confidence_stats(x, impl="triton")
    stats = kernels.confidence_stats(x, impl="auto")
    assert stats["token"].equal(x.argmax(-1))


@pytest.mark.triton
def test_explicit_triton_resolves(device):
    assert kernels.resolve_impl("triton", device) is Impl.TRITON
