"""The conformance tests once more under another fp32 rounding, so that a test that only passes
with this machine's rounding (a recorded trajectory that rounding can flip) cannot land.

A subprocess re-runs the conformance modules with ``ATEN_CPU_CAPABILITY=default``: ATen's
scalar kernels instead of the AVX2 / AVX-512 ones, i.e. other summation orders in softmax,
norms and reductions and another matmul path — logits differ in their last bits (measured on
``llada-tiny``) as they do between two CPUs. Same-machine reference tests run both sides under
the setting; recorded tests must not notice it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance import CONFORMANCE, require_shared

ROOT = Path(__file__).resolve().parents[1]
#: the setting: ATen's default (scalar) CPU kernels
SETTING = {"ATEN_CPU_CAPABILITY": "default"}
#: every test that compares with a reference decoder's recorded or same-machine output
CONFORMANCE_TESTS = (
    "tests/test_conformance.py",
    "tests/test_conformance_2026.py",
    "tests/test_models_2026.py::test_llada_moe_case",
    "tests/test_uniform_decoding.py::test_reference_case_same_machine",
    "tests/test_uniform_decoding.py::test_reference_case_recorded",
    "tests/test_reference_ties.py",
    "tests/test_wino.py::test_wino_case",
    "tests/test_dllm_cache.py::test_dllm_cache_case",
    "tests/test_lopa.py::test_lopa_case",
)
#: the child prints the capability torch runs with, then runs pytest
CHILD = ("import sys, torch, pytest; "
         "print('capability', torch.backends.cpu.get_cpu_capability(), flush=True); "
         "sys.exit(pytest.main(sys.argv[1:]))")


def test_conformance_under_default_cpu_capability() -> None:
    """Every conformance test passes under ``ATEN_CPU_CAPABILITY=default`` (a subprocess, one
    thread); a failure reports the child's failure summary."""
    require_shared(CONFORMANCE)
    if os.environ.get("ATEN_CPU_CAPABILITY") == SETTING["ATEN_CPU_CAPABILITY"]:
        pytest.skip("this run already uses ATEN_CPU_CAPABILITY=default")
    env = {**os.environ, **SETTING, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "-q", "-p", "no:cacheprovider", "-x",
         *CONFORMANCE_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert out.startswith("capability DEFAULT"), out[:500]
    summary = out[out.rfind("short test summary info"):] if proc.returncode else ""
    assert proc.returncode == 0, f"conformance under {SETTING} failed:\n{summary or out[-3000:]}"
    assert " passed" in out and " failed" not in out
