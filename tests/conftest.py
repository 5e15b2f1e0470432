"""Shared fixtures."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings

# Property tests are deterministic by default: every run (CI included) draws the same examples,
# so a failure reproduces and a pass means the same thing twice. Hunting for new failures:
# ``pytest -m slow --hypothesis-profile=explore --hypothesis-seed=N`` (``derandomize`` would
# override the seed). No example database: nothing outside the repository changes a run.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile("deterministic")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny CPU workloads run fastest (and steadiest on a shared machine) on one intra-op
    thread; modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
