"""No host-to-device copy inside the step loop: a ``torch.tensor(...)`` made on the device per
step is a blocking copy on CUDA (a host sync the one "is anything still masked" check does not
account for). On the CPU it shows as ``aten::lift_fresh``; the step loop's own code (the
samplers, policies and cache plans; the models are checked with their own suites) makes none.
"""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dllm_decode import DiffusionSampler
from dllm_decode.policies.renoise import gemma_renoise
from dllm_decode.samplers import loop
from tests.helpers import tiny_gemma, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


class _Fresh(TorchDispatchMode):
    """Records where (file:line of the innermost library frame) a constant is made."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "lift_fresh" in str(func):
            lib = [f for f in traceback.extract_stack() if "/dllm_decode/" in f.filename]
            site = lib[-1] if lib else None
            if site is not None and "/dllm_decode/models/" not in site.filename:
                self.sites.append(f"{site.filename.split('/dllm_decode/')[-1]}:{site.lineno}")
        return func(*args, **(kwargs or {}))


def _fresh_in_steps(monkeypatch, sampler: DiffusionSampler, **kw) -> list[str]:
    mode = _Fresh()
    step = loop.decode_step

    def spy(run, i):
        with mode:
            step(run, i)

    monkeypatch.setattr(loop, "decode_step", spy)
    sampler.generate(torch.tensor([[5, 6, 7]]), gen_length=8, **kw)
    return mode.sites


@pytest.mark.parametrize("family,policy,cache,kw", [
    ("sdar", "low_confidence", None, dict(stop_at_eos=True, block_eos_stop=True)),
    ("llada", "low_confidence", None, dict(stop_at_eos=True, block_length=4)),
    ("dream", "window_dream", "window", dict(early_stop=True)),
])
def test_eos_stops_copy_nothing_per_step(monkeypatch, family, policy, cache, kw) -> None:
    """``fill_after_eos`` used to build its EOS id tensor every step, and so did the
    Window-Diffusion EOS cut (``EosCut``)."""
    sampler = DiffusionSampler(tiny_model(family), policy, cache, **kw)
    assert _fresh_in_steps(monkeypatch, sampler) == []


def test_uniform_steps_copy_nothing(monkeypatch) -> None:
    """The re-noise temperature used to be a ``torch.tensor`` per step; it is now the step's
    entry of a schedule made once (``Renoise.temperatures``)."""
    sampler = DiffusionSampler(tiny_gemma(seed=1, steps=4), "gemma_renoise")
    assert _fresh_in_steps(monkeypatch, sampler) == []


def test_temperature_schedule_equals_the_per_step_temperature() -> None:
    sel = gemma_renoise(t_min=0.3, t_max=0.9).selector
    for steps in (1, 7, 48):
        sched = sel.temperatures(steps)
        assert sched.dtype == torch.float32 and sched.shape == (steps,)
        for i in range(steps):
            assert torch.equal(sched[i], sel.temperature(steps - i, steps))
