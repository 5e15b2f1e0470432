"""What captures and replays a static-buffer step (``samplers.graph``): CUDA graphs, or a CPU
stand-in with a graph's semantics.

``CudaGraphs`` is ``torch.cuda.CUDAGraph`` with its private memory pool and the
``torch.cuda.graph`` capture context. ``StandInGraphs`` runs the same capture / replay logic on
a CPU: its capture records the aten ops of the step with their very tensors and then puts back
every tensor the step wrote that existed before it (a CUDA capture launches nothing, so the
buffers are as they were), and ``replay`` runs the recorded ops again on the same tensors,
with no Python in between (a baked host value stays baked, a tensor read from outside the
buffers is read at its recorded address). The tests and ``dllm-decode doctor`` on a CPU use it
to exercise the CUDA path's warm-up, capture, replay and self-check
(``samplers.graph_selfcheck``) without a GPU; it is no speed-up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dllm_decode.samplers.graph_check import made_by, storage_of, written


class CudaGraphs:
    """CUDA graphs: one ``torch.cuda.CUDAGraph`` per captured step, one memory pool per
    buffer set."""

    name = "cuda"

    def new_graph(self) -> Any:
        return torch.cuda.CUDAGraph()

    def pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, graph: Any, pool: Any, stream: Any) -> Any:
        """The capture context (``torch.cuda.graph``) on ``stream`` with the pool ``pool``."""
        return torch.cuda.graph(graph, pool=pool, stream=stream)


class StandInGraph:
    """A recorded step: ``(op, args, kwargs, outputs)`` in order, replayed on the same tensors."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, Any, Any, Any]] = []

    def replay(self) -> None:
        """Run the recorded ops again: in-place ops write their recorded targets, the other
        ops' results are copied into the tensors the capture made (their graph addresses)."""
        for func, args, kwargs, out in self.ops:
            new = func(*args, **kwargs)
            inputs = {storage_of(t) for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
            for old, now in zip(tree_leaves(out), tree_leaves(new), strict=True):
                if isinstance(old, Tensor) and storage_of(old) not in inputs:  # not a view
                    old.copy_(now)


class _Record(TorchDispatchMode):
    """Records ops into a ``StandInGraph``; keeps the pre-capture value of every outside
    tensor an op writes (the first time), so the capture can leave no trace."""

    def __init__(self, graph: StandInGraph) -> None:
        super().__init__()
        self.graph = graph
        self.made: set[int] = set()
        self.saved: list[tuple[Tensor, Tensor]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for value in written(func, args, kwargs):
            if storage_of(value) not in self.made:
                self.saved.append((value, value.clone()))
        out = func(*args, **kwargs)
        self.made |= {storage_of(o) for o in made_by(args, kwargs, out)}
        self.graph.ops.append((func, args, kwargs, out))
        return out


class StandInGraphs:
    """The CPU stand-in for ``CudaGraphs`` (see the module docstring)."""

    name = "stand-in"

    def new_graph(self) -> StandInGraph:
        return StandInGraph()

    def pool(self) -> None:
        return None

    @contextlib.contextmanager
    def capture(self, graph: StandInGraph, pool: Any, stream: Any) -> Iterator[None]:
        """Record the step into ``graph``, then restore what it wrote outside itself (in
        reverse order, so overlapping views end at their first value)."""
        rec = _Record(graph)
        try:
            with rec:
                yield
        finally:
            for target, before in reversed(rec.saved):
                target.copy_(before)
