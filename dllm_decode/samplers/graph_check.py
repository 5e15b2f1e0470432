"""A CPU check that a static-buffer step could be replayed as a CUDA graph.

A CUDA graph replays the kernels its capture recorded, with the same arguments: the same
memory addresses and the same host scalars. A step may therefore be replayed in place of a
later run of the same ``StepKey`` exactly when that later run would launch the same ops, on
the same memory, with the same scalars. ``ReplayCheck`` records every aten op of a step (a
``TorchDispatchMode``) and compares each later run of the key with the first one:

* the same op sequence, with equal non-tensor arguments (a host value baked into a step,
  such as the step index passed as a Python int, differs between steps and is reported);
* tensors made inside the step: equal shapes and dtypes (a data-dependent shape is reported);
* tensors from outside the step: the static buffers and the model's weights must be the very
  same memory (storage, offset, shape, strides); any other outside tensor is a constant the
  graph keeps alive, so its content must equal what the first run read;
* writes go only to tensors made inside the step or to the static buffers;
* no host sync (``aten::_local_scalar_dense``: ``.item()``, ``bool(tensor)``, ...), and none
  of what syncs or cannot be captured on CUDA although it does not on a CPU (``cuda_problem``):
  ops whose output shape depends on the data (``nonzero``, indexing by a boolean mask,
  ``unique``, ...), random draws (a generator a graph would replay with the captured offsets),
  tensors made from host data (``torch.tensor``: a host-to-device copy; a CPU cannot tell it
  from a Python number written by index, so the step writes none) and copies between host
  and device.

No GPU is needed: the tests run every CPU static-buffer decode under this check, so a step
that the CPU proves token-identical is also one whose capture would replay correctly.
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: ops whose output shape depends on tensor values: CUDA syncs to size the output
#: (``repeat_interleave`` only without ``output_size``)
DATA_SHAPED: Final = frozenset({
    "nonzero", "argwhere", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "bincount", "histc", "repeat_interleave", "equal", "is_nonzero",
    "allclose", "item", "_local_scalar_dense"})
#: ops that draw random numbers
RANDOM: Final = frozenset({
    "uniform", "uniform_", "normal", "normal_", "bernoulli", "bernoulli_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "random_", "rand", "rand_like", "randn",
    "randn_like", "randint", "randint_like", "randperm", "multinomial", "poisson",
    "native_dropout"})


def cuda_problem(func: Any, args: Any, kwargs: dict[str, Any]) -> str | None:
    """Why the op ``func(*args, **kwargs)`` could not be in a captured CUDA step although it
    runs on a CPU (``None``: it can): a host sync, a random draw, or a host-to-device copy."""
    base = func.overloadpacket.__name__
    name = str(func)
    if base in DATA_SHAPED and not (base == "repeat_interleave"
                                    and kwargs.get("output_size") is not None):
        return f"{name} syncs with the host (its result's shape or value is read there)"
    if base in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in indices or ()):
            return f"{name} with a boolean mask index syncs with the host (a nonzero)"
    if base in RANDOM:
        return f"{name} draws random numbers inside the step"
    if base == "lift_fresh" and args and isinstance(args[0], Tensor) and \
            args[0].device.type == "cpu":
        return (f"{name}: a tensor made from host data inside the step (torch.tensor: a "
                f"host-to-device copy on CUDA; on a CPU a Python number written by index "
                f"shows the same way)")
    if base in ("copy_", "_to_copy"):
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, Tensor)]
        target = kwargs.get("device")
        devices = {t.device.type for t in tensors} | ({torch.device(target).type}
                                                      if target is not None else set())
        if "cpu" in devices and len(devices) > 1:
            return f"{name} copies between the host and the device inside the step"
    return None


class ReplayMismatch(AssertionError):
    """A step run differs from its key's first run in a way a CUDA graph replay would miss."""


def storage_of(t: Tensor) -> int:
    """The address of ``t``'s storage (views share it)."""
    return t.untyped_storage().data_ptr()


def written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[Tensor]:
    """The tensor arguments the op ``func(*args, **kwargs)`` writes (its schema's write
    aliases: ``out=``, the target of an in-place op)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        if isinstance(value, Tensor):
            out.append(value)
    return out


def made_by(args: Any, kwargs: dict[str, Any], out: Any) -> list[Tensor]:
    """The tensors of an op's result ``out`` that it made (not views of its arguments)."""
    inputs = {storage_of(a) for a in tree_leaves((args, kwargs)) if isinstance(a, Tensor)}
    return [o for o in tree_leaves(out) if isinstance(o, Tensor) and storage_of(o) not in inputs]


class Recorder(TorchDispatchMode):
    """Records one step's ops (``ReplayCheck``; ``samplers.graph`` runs each capture under
    it to keep the outside tensors it reads alive and to refuse host syncs).

    Args:
        static: storage addresses of the static buffers and the weights.
        keep_made: keep the tensors made inside the step alive while recording, so that no
            address is reused within the step (exact classification; the CPU check). A
            capture does not (its intermediates share memory).
    """

    def __init__(self, static: set[int], keep_made: bool = False) -> None:
        super().__init__()
        self.static = static
        self.keep_made = keep_made
        self._alive: list[Tensor] = []
        self.made: set[int] = set()
        self.ops: list[tuple[Any, ...]] = []
        self.consts: list[Tensor] = []  # outside non-static tensors, in order of reading
        self.problems: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        if "_local_scalar_dense" in name:
            self.problems.append(f"host sync ({name}) inside the step")
        else:
            problem = cuda_problem(func, args, kwargs)
            if problem is not None:
                self.problems.append(problem)
        sig: list[Any] = []
        fresh = "lift_fresh" in name  # a constant made in the step (``torch.tensor(x)``)
        for a in tree_leaves((args, kwargs)):
            if fresh and isinstance(a, Tensor):
                sig.append(("fresh", tuple(a.shape), a.dtype))
                continue
            if not isinstance(a, Tensor):
                sig.append(repr(a))
                continue
            ptr = storage_of(a)
            if ptr in self.made:
                sig.append(("made", tuple(a.shape), a.dtype))
            elif ptr in self.static:
                sig.append(("static", ptr, a.storage_offset(), tuple(a.shape), a.stride()))
            else:
                sig.append(("const", len(self.consts), tuple(a.shape), a.dtype))
                self.consts.append(a)
        for value in written(func, args, kwargs):
            if storage_of(value) not in self.made | self.static:
                self.problems.append(f"{name} writes a tensor outside the static buffers")
        out = func(*args, **kwargs)
        for o in made_by(args, kwargs, out):
            self.made.add(storage_of(o))
            if self.keep_made:
                self._alive.append(o)
            sig.append(("out", tuple(o.shape), o.dtype))
        self.ops.append((name, tuple(sig)))
        return out


class ReplayCheck:
    """Per ``StepKey``, the first run's op record; later runs are compared with it."""

    def __init__(self) -> None:
        self._first: dict[Any, tuple[list[tuple[Any, ...]], list[Tensor]]] = {}
        self.checked = 0

    def run(self, key: Any, static: set[int], body: Any) -> None:
        """Run ``body()`` recording its ops; raise ``ReplayMismatch`` if a graph captured on
        the key's first run would not replay this run."""
        rec = Recorder(static, keep_made=True)
        with rec:
            body()
        if rec.problems:
            raise ReplayMismatch(f"step {key}: {rec.problems[0]}")
        first = self._first.get(key)
        if first is None:
            self._first[key] = (rec.ops, [c.clone() for c in rec.consts])
            return
        ops, consts = first
        if len(ops) != len(rec.ops):
            raise ReplayMismatch(f"step {key}: {len(rec.ops)} ops, the capture had {len(ops)}")
        for i, (want, got) in enumerate(zip(ops, rec.ops, strict=True)):
            if want != got:
                raise ReplayMismatch(f"step {key}: op {i} differs from the capture:\n"
                                     f"  capture: {want}\n  now:     {got}")
        for i, (want, got) in enumerate(zip(consts, rec.consts, strict=True)):
            if not torch.equal(want, got):
                raise ReplayMismatch(f"step {key}: outside tensor #{i} {tuple(got.shape)} "
                                     "changed since the capture (it must be a static buffer)")
        self.checked += 1
