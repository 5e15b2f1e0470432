"""Where a decode step's time goes: the model forward vs the loop around it.

``TimedModel`` wraps a ``DiffusionLM`` (attribute access passes through) and adds the thread
CPU time of every forward, split into refresh forwards (the whole canvas fed against a cache)
and the rest, and inside the model into attention (SDPA + cache write, the part that grows
with the canvas) and everything else. ``measure_overhead`` decodes once without the profiler
(times) and once under ``torch.profiler`` (ops), and returns per-step numbers:

* ``model_ms`` / ``loop_ms``: thread CPU ms per step inside / outside the model forward;
* ``loop_ops``: top-level aten ops per step outside the model forward, from the profiler's
  op tree (the forward is marked with a ``record_function`` so its ops are excluded);
  ``loop_kernels``: the same without view / metadata ops (``slice``, ``unsqueeze``,
  ``expand``, ...), i.e. the ops that launch a kernel on a GPU.

``CoreClock`` times a narrower "model": only the network's core modules (token embedding,
each decoder layer, final norm, LM head), so that work a model does around them inside its
``forward`` (RoPE tables, masks, row selection) counts as loop work. The reference-loop
comparison (``benchmarks/overhead_reference.py``) times the reference models' same modules.

Thread CPU time (``time.thread_time``) is immune to pre-emption but not to memory-bandwidth
contention; op counts are hardware independent. Everything here is for benchmarks: it syncs
freely and patches ``torch.nn.functional.scaled_dot_product_attention`` while it times.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from dllm_decode.cache.kv import BlockKVCache
from dllm_decode.core_clock import CoreClock  # noqa: F401 (re-export)

MODEL_LABEL = "dllm_decode.model_forward"
#: aten ops that only make views or read metadata (no kernel launch on a GPU)
VIEW_OPS = frozenset(f"aten::{n}" for n in (
    "slice", "select", "unsqueeze", "squeeze", "expand", "expand_as", "view", "unbind", "alias",
    "as_strided", "t", "transpose", "permute", "narrow", "resolve_conj", "resolve_neg",
    "lift_fresh", "detach", "_unsafe_view", "split", "chunk", "unflatten", "view_as"))


@dataclass
class ForwardClock:
    """Accumulated thread CPU seconds of the model's forwards."""

    calls: int = 0
    refresh_calls: int = 0
    total: float = 0.0
    refresh: float = 0.0
    attention: float = 0.0  # SDPA + cache writes in non-refresh forwards
    shapes: list[int] = field(default_factory=list)


class TimedModel:
    """Proxy around ``model`` that times each forward (see the module docstring).

    Args:
        model: any ``DiffusionLM``.
        label: ``record_function`` name put around each forward (for op counting).
    """

    def __init__(self, model: Any, label: str | None = MODEL_LABEL) -> None:
        self.__dict__["_model"] = model
        self.__dict__["_label"] = label
        self.__dict__["clock"] = ForwardClock()
        self.__dict__["_in_attention"] = [0.0]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        clock = self.clock
        cache = kwargs.get("cache")
        refresh = cache is not None and tokens.shape[1] == cache.max_len
        attn0 = self._in_attention[0]
        t0 = time.thread_time()
        ctx = (torch.profiler.record_function(self._label) if self._label
               else contextlib.nullcontext())
        with ctx:
            out = self._model(tokens, *args, **kwargs)
        dt = time.thread_time() - t0
        clock.calls += 1
        clock.total += dt
        clock.shapes.append(int(tokens.shape[1]))
        if refresh:
            clock.refresh_calls += 1
            clock.refresh += dt
        else:
            clock.attention += self._in_attention[0] - attn0
        return out


def core_modules(model: Any) -> list[torch.nn.Module]:
    """A ``DecoderLM``'s (or a ``TimedModel``'s) core modules: token embedding, every decoder
    layer, final norm, LM head."""
    inner = model.__dict__.get("_model", model)
    return [inner.embed, *inner.layers, inner.norm, inner.head]


@contextlib.contextmanager
def timed_attention(model: TimedModel) -> Iterator[None]:
    """While active, SDPA calls and cache writes add their thread time to ``model``."""
    acc = model._in_attention
    sdpa, write = F.scaled_dot_product_attention, BlockKVCache.write

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed_fn(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[0] += time.thread_time() - t0
        return timed_fn

    F.scaled_dot_product_attention = wrap(sdpa)
    BlockKVCache.write = wrap(write)  # type: ignore[method-assign]
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
        BlockKVCache.write = write  # type: ignore[method-assign]


def count_loop_ops(run: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """Top-level aten ops outside ``MODEL_LABEL`` ranges while ``run()`` executes.

    Returns: (count, per-op-name counts). Ops nested in another op (``aten::linear`` ->
    ``aten::addmm``) count once, as their top-level op.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    names: dict[str, int] = {}
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        parent, inside = ev.cpu_parent, False
        top = True
        while parent is not None:
            if parent.name == MODEL_LABEL:
                inside = True
                break
            if parent.name.startswith("aten::"):
                top = False
            parent = parent.cpu_parent
        if top and not inside:
            names[ev.name] = names.get(ev.name, 0) + 1
    return sum(names.values()), dict(sorted(names.items(), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class Overhead:
    """Per-step numbers of one decode (see the module docstring)."""

    steps: int
    forwards: int
    model_ms: float
    loop_ms: float
    loop_ops: float
    loop_kernels: float
    refresh_ms: float
    attention_ms: float
    total_s: float
    top_ops: dict[str, int]


def measure_overhead(make_sampler: Callable[[Any], Any], model: Any, prompt: torch.Tensor,
                     *, repeats: int = 3, count_ops: bool = True,
                     **overrides: Any) -> Overhead:
    """Decode ``prompt`` with ``make_sampler(timed_model)`` and split its time.

    Args:
        make_sampler: builds a ``DiffusionSampler`` around the (wrapped) model (once; every
            run uses it).
        model: the ``DiffusionLM``.
        prompt: ``[B, P]`` prompt ids.
        repeats: timed runs after one warm-up; the run with the least total time is kept.
        count_ops: also count ops under the profiler (one more run).
        **overrides: ``generate`` overrides (``gen_length``, ...).
    """
    best: tuple[float, ForwardClock, int, int] | None = None
    timed = TimedModel(model, label=None)
    sampler = make_sampler(timed)  # one sampler: a compiled step compiles once, in the warm-up
    for r in range(repeats + 1):
        timed.__dict__["clock"] = ForwardClock()
        with timed_attention(timed):
            t0 = time.thread_time()
            out = sampler.generate(prompt, **overrides)
            total = time.thread_time() - t0
        if r and (best is None or total < best[0]):
            best = (total, timed.clock, out.steps, out.forwards)
    assert best is not None
    total, clock, steps, forwards = best
    ops, top = 0, {}
    if count_ops:
        timed.__dict__["_label"] = MODEL_LABEL
        timed.__dict__["clock"] = ForwardClock()  # keep the kept run's clock as it was
        ops, top = count_loop_ops(lambda: sampler.generate(prompt, **overrides))
    per = max(steps, 1)
    return Overhead(steps=steps, forwards=forwards, model_ms=1e3 * clock.total / per,
                    loop_ms=1e3 * (total - clock.total) / per, loop_ops=ops / per,
                    loop_kernels=sum(n for k, n in top.items() if k not in VIEW_OPS) / per,
                    refresh_ms=1e3 * clock.refresh / per,
                    attention_ms=1e3 * clock.attention / per, total_s=total, top_ops=top)
