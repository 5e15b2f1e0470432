"""Self-checking graphs: the first replay of every captured step is compared with the eager step.

A captured step (``samplers.graph_replay``) is trusted only after its first replay agreed with
the eager ``static_step`` on the same inputs. Right after the capture (a capture runs nothing,
so the buffers still hold the step's inputs), ``first_replay``:

1. keeps a copy of what the step writes: the canvas ``[B, L]``, the commit records
   (``commit_at`` ``[B, L]``, ``commit_prob`` ``[B, L]``), the active rows ``[B]``, every
   carried tensor (the policy memory, the contract's record) and the K/V cache;
2. replays the graph (the step's result is now in the buffers) and keeps the replay's result,
   its logits (the tensor the capture made) and the contract's flags;
3. puts the inputs back and runs the step eagerly (the K/V cache: on the copy of step 1, so
   the replay's cache is kept without a second copy);
4. compares, with one host sync: tokens, ``commit_at``, the active rows, integer and boolean
   carried tensors and the contract's flags exactly; the logits, ``commit_prob``, floating
   carried tensors and the K/V cache within ``TOLERANCE`` of the model's dtype
   (``|replay - eager| <= atol + rtol * |eager|``);
5. leaves the eager step's result in every buffer, whatever the verdict.

A replay launches the kernels its capture recorded, so it is expected to agree bit for bit;
the tolerance only absorbs kernels whose reduction order may differ between two launches
(atomics, split-K GEMMs). On a mismatch the shape (its ``StepKey``) runs the eager step on the
buffers from then on: the reason names the first differing result, is logged as a warning on
the ``dllm_decode.graph`` logger and is kept in the sampler's ``graph_reason``.

Only the first replay of a shape is checked, at its capture (which syncs anyway): later
replays run no comparison and no sync. So a graph that bakes in a value changing between its
steps (a host scalar the step reads) passes this check; that is what the CPU replay check
(``samplers.graph_check``) catches in the tests.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.samplers.static_step import StepKey, static_step

#: a ``samplers.graph_replay.GraphRun`` (not imported: that module calls this one)
GraphRun = Any

logger = logging.getLogger("dllm_decode.graph")

#: ``(rtol, atol)`` for floating results, by the model's compute dtype (its parameters')
TOLERANCE: Final[dict[torch.dtype, tuple[float, float]]] = {
    torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3),
    torch.float32: (1e-4, 1e-5), torch.float64: (1e-9, 1e-12)}


def describe(key: StepKey) -> str:
    """A short name of a step shape for messages (``StepKey`` without its setting)."""
    f = key.feed
    span = f"[{f.start}, {f.end})" + (" past the block origin" if key.relative else "")
    what = "refresh" if f.refresh else ("cached" if f.use_cache else "full")
    return (f"batch {key.batch}, canvas {key.length}, {what} forward of {span}, scored rows "
            f"[{f.lo}, {f.hi}){', last step of a block' if key.last else ''}")


def _written(run: GraphRun) -> dict[str, Tensor]:
    """What a step writes, by name, besides the K/V cache (the buffers themselves)."""
    buf = run.buf
    out = {"tokens": buf.canvas, "commit_at": buf.commit_at, "commit_prob": buf.commit_prob,
           "active rows": buf.active}
    out |= {f"carried {path}": t for path, t in buf.statics.items()}
    return out


#: elements compared at once (a K/V cache is compared a slice of its leading dim at a time,
#: so the widened copies stay small)
CHUNK: Final = 1 << 24


def _chunks(got: Tensor, want: Tensor) -> list[tuple[Tensor, Tensor]]:
    """``got`` and ``want`` as pairs of slices along dim 0 of at most about ``CHUNK``
    elements each (views; the whole tensors when small or 0-d)."""
    if want.dim() == 0 or want.numel() <= CHUNK:
        return [(got, want)]
    rows = max(1, CHUNK // max(1, want[0].numel()))
    return list(zip(got.split(rows), want.split(rows), strict=True))


def _agree(got: Tensor, want: Tensor, tol: tuple[float, float]) -> Tensor:
    """0-d bool on the device: ``got`` equals ``want`` (floats: within ``tol``; no sync)."""
    if not want.is_floating_point():
        return (got == want).all()
    wide = torch.float64 if want.dtype == torch.float64 else torch.float32
    return torch.stack([torch.isclose(g.to(wide), w.to(wide), rtol=tol[0], atol=tol[1],
                                      equal_nan=True).all()
                        for g, w in _chunks(got, want)]).all()


def _detail(got: Tensor, want: Tensor) -> str:
    """How two results differ (after a mismatch; syncs)."""
    if not want.is_floating_point():
        bad = sum(int((g != w).sum()) for g, w in _chunks(got, want))
        return f"{bad} of {want.numel()} entries differ"
    worst = 0.0
    for g, w in _chunks(got, want):
        g, w = g.double(), w.double()
        same = (g == w) | (g.isnan() & w.isnan())  # equal infinities too
        diff = torch.where(same, 0.0, (g - w).abs().nan_to_num(nan=float("inf")))
        if diff.numel():
            worst = max(worst, float(diff.max()))
    return f"max |replay - eager| = {worst:.4g}"


def first_replay(run: GraphRun, graph: Any, key: StepKey, host: dict[str, Any],
                 step: int) -> str | None:
    """The first replay of ``graph`` (just captured for ``key``) against the eager step on
    the same inputs (the module docstring); ``None`` when they agree, else the reason. The
    buffers hold the eager step's result afterwards; syncs once."""
    buf, guard = run.buf, run.parts.guard
    before = {name: t.clone() for name, t in _written(run).items()}
    cache = buf.cache
    kv_copy = None
    if cache is not None:
        try:
            kv_copy = (cache.k.clone(), cache.v.clone())
        except torch.OutOfMemoryError:  # compared without it (the eager step rewrites it)
            logger.info("graph self-check: no memory for a copy of the K/V cache "
                        "(%.2f GB); the cache is not compared", cache.nbytes / 1e9)
    graph.graph.replay()
    run._restore(graph, step)
    replay = {name: t.clone() for name, t in _written(run).items()}
    replay["logits"] = run.watch[0]
    replay_flags = list(guard._flags)
    # the eager step on the same inputs
    for name, t in _written(run).items():
        t.copy_(before[name])
    kv_buffers = None
    if kv_copy is not None:
        kv_buffers = (cache.k, cache.v)
        cache.k, cache.v = kv_copy  # the eager step writes the copy
    run.plan._memo = {}
    run.bind_state()
    run.watch = []
    try:
        static_step(run, key, host)
    finally:
        if kv_buffers is not None:
            cache.k, cache.v = kv_buffers
    eager = dict(_written(run))
    eager["logits"] = run.watch[0]
    run.watch = None
    pairs = [(name, replay[name], eager[name]) for name in eager]
    pairs += [(f"contract flag {i}", a, b) for i, (a, b) in enumerate(zip(replay_flags,
                                                                          guard._flags,
                                                                          strict=False))]
    if kv_copy is not None:
        pairs += [("K cache", cache.k, kv_copy[0]), ("V cache", cache.v, kv_copy[1])]
    why = compare_results(pairs, _compute_dtype(run.model, eager["logits"].dtype))
    if why is None and len(replay_flags) != len(guard._flags):
        why = (f"the replay recorded {len(replay_flags)} contract flags, the eager step "
               f"{len(guard._flags)}")
    if kv_copy is not None:  # the eager step's cache into the buffers
        cache.k.copy_(kv_copy[0])
        cache.v.copy_(kv_copy[1])
    return None if why is None else _failed(key, run, why)


def _compute_dtype(model: Any, default: torch.dtype) -> torch.dtype:
    """The model's compute dtype (its first floating parameter's; ``default`` without one)."""
    for p in getattr(model, "parameters", tuple)():
        if p.is_floating_point():
            return p.dtype
    return default


def _failed(key: StepKey, run: GraphRun, why: str) -> str:
    return (f"{run.owner.backend.name} graph self-check failed for the step ({describe(key)}): "
            f"{why}; this step shape runs eagerly from now on")


def compare_results(pairs: list[tuple[str, Tensor, Tensor]], dtype: torch.dtype) -> str | None:
    """The first pair ``(name, replay, eager)`` that disagrees, described (``None``: all
    agree). One host sync (two after a mismatch)."""
    tol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    for name, got, want in pairs:
        if got.shape != want.shape or got.dtype != want.dtype:
            return (f"{name}: the replay gave {tuple(got.shape)} {got.dtype}, the eager step "
                    f"{tuple(want.shape)} {want.dtype}")
    ok = torch.stack([_agree(got, want, tol) for _, got, want in pairs]).tolist()  # the sync
    for (name, got, want), good in zip(pairs, ok, strict=True):
        if not good:
            exact = "" if want.is_floating_point() else " (compared exactly)"
            tolerance = (f" (tolerance rtol={tol[0]:g}, atol={tol[1]:g})"
                         if want.is_floating_point() else exact)
            return f"{name} differ from the eager step: {_detail(got, want)}{tolerance}"
    return None


def reject(run: GraphRun, key: StepKey, why: str) -> None:
    """``key`` runs the eager step on ``run``'s buffers from now on: recorded on the buffer set,
    logged, and reported to the sampler (``GraphRun.on_reject``)."""
    run.buf.rejected[key] = why
    run.owner.stats.rejected += 1
    logger.warning("%s", why)
    if run.on_reject is not None:
        run.on_reject(why)
