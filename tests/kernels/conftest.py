"""Kernel tests: Triton kernels run in the interpreter when no GPU is present.

Triton decides between interpreted and compiled kernels when ``@triton.jit`` runs, i.e. when
``dllm_decode.kernels.triton`` is first imported. pytest imports every conftest during
collection, before any test runs, and ``dllm_decode.kernels`` imports its Triton backend
only on the first Triton op, so setting ``TRITON_INTERPRET`` here is early enough even when
other test packages imported ``dllm_decode`` first.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from kernel_utils import INTERPRETER_NUMPY_WARNINGS

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _expected_interpreter_warnings():
    """Ignore the interpreter's expected numpy warnings in the kernel tests (this directory
    only; ``kernel_utils.INTERPRETER_NUMPY_WARNINGS`` says which and why)."""
    with warnings.catch_warnings():
        for message in INTERPRETER_NUMPY_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=RuntimeWarning,
                                    module=r"triton\.runtime\.interpreter")
        yield


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
        pytest.skip("needs a CUDA device")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where Triton kernels run in this session: CUDA, else CPU under the interpreter."""
    pytest.importorskip("triton")
    from dllm_decode.kernels import triton as backend

    if HAS_CUDA and backend.INTERPRETED:
        pytest.skip("Triton backend was loaded under TRITON_INTERPRET with CUDA present")
    if not HAS_CUDA and not backend.INTERPRETED:
        pytest.skip("Triton backend was imported before TRITON_INTERPRET=1 was set")
    return torch.device("cuda" if HAS_CUDA else "cpu")
