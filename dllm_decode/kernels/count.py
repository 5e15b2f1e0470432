"""Counting kernel launches with the torch profiler on the CPU.

A GPU decode step at batch 1 is launch bound (H200, eager: ~1,640 kernels per LLaDA-8B forward,
the GPU idle most of the time), so the number of kernels a forward launches is the number to
keep down, and it can be counted on a CPU: every top-level aten op that does tensor work
launches (at least) one kernel on a GPU, and every Triton launch of ``kernels/triton`` is
marked with a ``triton::<kernel>`` profiler range (``launch_range``).

An aten op *launches* when it is not view / metadata / allocation work: it is outside
``NO_KERNEL_OPS``, or one of the ops it calls launches (``aten::reshape`` that only views
does not launch, one that copies does; ``aten::to`` launches only when it converts). A
top-level op counts once however many ops it calls (``aten::linear`` -> ``aten::addmm`` is
one launch), as a GPU trace counts them; a GEMM's split-K reduction on a GPU is not visible here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

#: prefix of the profiler ranges around Triton launches (one range = one launch)
TRITON_PREFIX = "triton::"

#: aten ops that make views, read metadata or allocate without writing: no kernel
NO_KERNEL_OPS = frozenset(f"aten::{n}" for n in (
    "slice", "select", "unsqueeze", "squeeze", "expand", "expand_as", "view", "unbind", "alias",
    "as_strided", "t", "transpose", "permute", "narrow", "resolve_conj", "resolve_neg",
    "lift_fresh", "detach", "detach_", "_unsafe_view", "split", "split_with_sizes", "chunk",
    "unflatten", "view_as", "reshape", "_reshape_alias", "flatten", "contiguous", "to",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_",
    "view_as_real", "view_as_complex", "_view_as_real", "_view_as_complex", "numpy_T",
    "movedim", "swapaxes", "diagonal", "result_type", "size", "stride", "is_nonzero",
    "set_", "_has_compatible_shallow_copy_type", "lift", "_nested_tensor_from_mask",
))


def launch_range(name: str) -> contextlib.AbstractContextManager[Any]:
    """A ``triton::<name>`` profiler range while the profiler runs, else a no-op (the check
    is one C call, so Triton's launch path pays nothing outside profiling)."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(TRITON_PREFIX + name)
    return contextlib.nullcontext()


@dataclass
class LaunchCount:
    """Kernel launches of one profiled run.

    ``total``: launches inside the counted ranges; ``by_op``: per top-level op name;
    ``per_range``: launches of each counted range instance, in order (one entry per decoder
    layer call when counting layers).
    """

    total: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    per_range: list[int] = field(default_factory=list)

    @property
    def mean(self) -> float:
        """Mean launches per counted range (``nan`` when none ran)."""
        return self.total / len(self.per_range) if self.per_range else float("nan")

    @property
    def max(self) -> int:
        return max(self.per_range, default=0)


def _launches(ev: Any) -> bool:
    """Whether profiler event ``ev`` (an aten op) launches a kernel itself or via a callee."""
    if ev.name.startswith(TRITON_PREFIX) or ev.name not in NO_KERNEL_OPS:
        return True
    return any(_launches(c) for c in ev.cpu_children
               if c.name.startswith(("aten::", TRITON_PREFIX)))


def count_launches(run: Callable[[], Any], label: str | None = None) -> LaunchCount:
    """Kernel launches while ``run()`` executes, under the CPU profiler.

    Args:
        run: the work to count (called once).
        label: count only inside ``record_function(label)`` ranges (each range instance
            gets its own ``per_range`` entry); ``None``: everything ``run`` does, as one range.

    Top-level ops (no aten op or Triton range above them inside the counted range) count
    once if they launch (module docstring); each Triton range counts once.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    count = LaunchCount()
    ranges: dict[int, int] = {}
    for ev in prof.events():
        if not ev.name.startswith(("aten::", TRITON_PREFIX)):
            continue
        parent, owner, top = ev.cpu_parent, None, True
        while parent is not None:
            if parent.name.startswith(("aten::", TRITON_PREFIX)):
                top = False
            if label is not None and parent.name == label:
                owner = parent
                break
            parent = parent.cpu_parent
        if not top or (label is not None and owner is None):
            continue
        if not (ev.name.startswith(TRITON_PREFIX) or _launches(ev)):
            continue
        key = id(owner)
        ranges[key] = ranges.get(key, 0) + 1
        count.by_op[ev.name] = count.by_op.get(ev.name, 0) + 1
    if label is not None:  # ranges that launched nothing count as zeros, in order
        starts = sorted((ev.time_range.start, id(ev)) for ev in prof.events()
                        if ev.name == label)
        count.per_range = [ranges.get(key, 0) for _, key in starts]
    else:
        count.per_range = [sum(ranges.values())]
    count.total = sum(count.per_range)
    count.by_op = dict(sorted(count.by_op.items(), key=lambda kv: (-kv[1], kv[0])))
    return count


@contextlib.contextmanager
def labelled_modules(modules: list[torch.nn.Module], label: str) -> Iterator[None]:
    """Put a ``record_function(label)`` range around every call of each module in ``modules``
    (forward pre/post hooks), for ``count_launches(..., label=label)``."""
    handles = []

    def enter(module: torch.nn.Module, args: Any) -> None:
        ctx = torch.profiler.record_function(label)
        ctx.__enter__()
        module.__dict__.setdefault("_launch_ranges", []).append(ctx)

    def leave(module: torch.nn.Module, args: Any, out: Any) -> None:
        module.__dict__["_launch_ranges"].pop().__exit__(None, None, None)

    try:
        for m in modules:
            handles.append(m.register_forward_pre_hook(enter))
            handles.append(m.register_forward_hook(leave))
        yield
    finally:
        for h in handles:
            h.remove()
