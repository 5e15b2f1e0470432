"""Per-request state of the blocks SGLang serves, preallocated for its running requests.

SGLang runs at most ``max_running_requests`` dLLM requests at once (its ``DllmManager``); each
live block holds one slot of a ``RequestPool``: its truncation length (a truncator's) and the
policy's memory (``init_memory(N, K)``: every Tensor leaf has the request on dim 0).
A round's rows are decided in one call: ``gather(slots)`` builds a memory object of the
policy's own class whose Tensor leaves are the rows ``slots`` (``index_select``), the policy
mutates it, ``scatter(slots, memory)`` writes every leaf back (``index_copy_``). A leaf that
is ``None`` in the pool and a tensor after a call (allocated on first use, e.g. KLASS's
``log_prev [K, V]``) is allocated ``[N, ...]`` then. A slot is freed when its block ends or when
SGLang drops the block's state (an aborted request). No SGLang import.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from dllm_decode.policies.base import init_memory_of

logger = logging.getLogger("dllm_decode.integrations.sglang")

Path = tuple[str, ...]


def leaves(obj: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """``(path, value)`` of every leaf of a memory object: dataclass fields recursively; a
    bare value is its own leaf (path ``()``)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from leaves(getattr(obj, f.name), (*path, f.name))
    else:
        yield path, obj


def get_leaf(obj: Any, path: Path) -> Any:
    for name in path:
        obj = getattr(obj, name)
    return obj


def with_leaves(obj: Any, values: dict[Path, Any]) -> Any:
    """A shallow copy of ``obj`` (every dataclass on the way copied) with ``values`` at their
    paths; ``obj`` itself is left alone."""
    if () in values:
        return values[()]
    out = copy.copy(obj)
    heads: dict[str, dict[Path, Any]] = {}
    for path, value in values.items():
        heads.setdefault(path[0], {})[path[1:]] = value
    for name, sub in heads.items():
        object.__setattr__(out, name, with_leaves(getattr(obj, name), sub))
    return out


def set_leaf(obj: Any, path: Path, value: Any) -> Any:
    """Set the leaf at ``path`` in place (returns the new root for ``path == ()``)."""
    if not path:
        return value
    parent = get_leaf(obj, path[:-1])
    object.__setattr__(parent, path[-1], value)
    return obj


def gather_rows(memory: Any, slots: Tensor, rows: int | None = None) -> Any:
    """A copy of ``memory`` (its class, every dataclass on the way) whose per-row Tensor
    leaves (dim 0 of size ``rows``; any size when ``None``) are the rows ``slots [b]``; other
    leaves as they are."""
    def per_row(v: Any) -> bool:
        return isinstance(v, Tensor) and v.dim() > 0 and (rows is None or v.shape[0] == rows)

    return with_leaves(memory, {path: v.index_select(0, slots) if per_row(v) else v
                                for path, v in leaves(memory)})


def nbytes(obj: Any) -> int:
    """Bytes of every Tensor leaf of ``obj``."""
    return sum(v.numel() * v.element_size() for _, v in leaves(obj) if isinstance(v, Tensor))


class RequestPool:
    """Slots for ``capacity`` requests' blocks (grows, with a warning, if SGLang ever runs more).

    Args:
        selector: the bound selector (its ``init_memory``, if any).
        k: the block size.
        capacity: SGLang's ``max_running_requests``.
        device: where the served model runs.
    """

    def __init__(self, selector: Any, k: int, capacity: int, device: torch.device, *,
                 lengths: bool = False) -> None:
        self.selector, self.k, self.device = selector, k, device
        self.capacity = max(1, int(capacity))
        #: one fresh row of the policy's memory: what a new block's slot is reset to
        self.template = init_memory_of(selector, 1, k, device)
        self.has_memory = self.template is not None
        self.memory = init_memory_of(selector, self.capacity, k, device)
        #: leaf path -> the one value its fresh row holds everywhere (reset with one
        #: ``index_fill_``), for template rows that are constant (read once, here)
        self._fills = {path: v.reshape(-1)[0].item() for path, v in leaves(self.template)
                       if isinstance(v, Tensor) and v.numel() > 0 and
                       bool((v == v.reshape(-1)[0]).all())}
        #: ``[N]`` truncation lengths (a truncator's), else ``None``
        self.lengths = torch.full((self.capacity,), k, dtype=torch.long, device=device) \
            if lengths else None
        #: whether a new block's slot must be reset (memory or a length)
        self.needs_reset = self.has_memory or lengths
        self._free = list(range(self.capacity - 1, -1, -1))

    # ---- slots -------------------------------------------------------------------------
    def acquire(self, owner: Any) -> int:
        """A free slot for ``owner`` (freed when ``owner`` is garbage-collected, unless
        ``release`` frees it first)."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        owner._finalizer = weakref.finalize(owner, self._put, slot)
        return slot

    def _put(self, slot: int) -> None:
        self._free.append(slot)

    def release(self, owner: Any) -> None:
        """Free ``owner``'s slot now (its block ended)."""
        fin = getattr(owner, "_finalizer", None)
        if fin is not None:
            fin()

    @property
    def in_use(self) -> int:
        return self.capacity - len(self._free)

    def _per_row(self, value: Any) -> bool:
        return isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == self.capacity

    def bytes_per_request(self) -> int:
        """Bytes one slot holds (memory leaves allocated so far, prompt, length)."""
        total = nbytes(self.memory) + nbytes(self.lengths)
        return total // self.capacity

    def _grow(self) -> None:
        logger.warning("DllmDecode: more live blocks than max_running_requests=%d; the "
                       "per-request pool grows to %d", self.capacity, 2 * self.capacity)
        self.reserve(2 * self.capacity)

    def reserve(self, capacity: int) -> None:
        """Widen the pool to ``capacity`` slots (every allocated leaf; new slots free)."""
        old, new = self.capacity, int(capacity)
        if new <= old:
            return

        def widen(t: Tensor, fill: Any) -> Tensor:
            extra = torch.full((new - old, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
            return torch.cat([t, extra])

        for path, value in list(leaves(self.memory)):
            if self._per_row(value):
                self.memory = set_leaf(self.memory, path, widen(value, 0))
        if self.lengths is not None:
            self.lengths = widen(self.lengths, self.k)
        self._free = list(range(new - 1, old - 1, -1)) + self._free
        self.capacity = new

    # ---- per block and per round --------------------------------------------------------
    def reset(self, slots: Tensor) -> None:
        """New blocks in ``slots [b]``: full lengths and fresh memory (the template row;
        zeros for leaves the template has not allocated)."""
        if self.lengths is not None:
            self.lengths.index_fill_(0, slots, self.k)
        if not self.has_memory:
            return
        fresh = dict(leaves(self.template))
        for path, value in leaves(self.memory):
            if not self._per_row(value):
                continue
            row = fresh.get(path)
            if path in self._fills:
                value.index_fill_(0, slots, self._fills[path])
            elif isinstance(row, Tensor):
                value.index_copy_(0, slots, row.expand(slots.shape[0], *row.shape[1:]))
            else:
                value.index_fill_(0, slots, 0)

    def gather(self, slots: Tensor) -> Any:
        """The policy's memory for the rows ``slots [b]`` (a new object; the pool's is kept)."""
        if not self.has_memory:
            return None
        return gather_rows(self.memory, slots, self.capacity)

    def scatter(self, slots: Tensor, memory: Any) -> None:
        """Write the rows' memory back after a call: every per-row Tensor leaf into the pool
        (a leaf allocated during the call is first allocated ``[N, ...]``), other values (host
        counters, objects made during the call) as they are."""
        if self.has_memory:
            self.memory = self._merge(self.memory, memory, slots)

    def _merge(self, pooled: Any, value: Any, slots: Tensor) -> Any:
        if dataclasses.is_dataclass(value) and type(pooled) is type(value):
            for f in dataclasses.fields(value):
                merged = self._merge(getattr(pooled, f.name), getattr(value, f.name), slots)
                object.__setattr__(pooled, f.name, merged)
            return pooled
        rowwise = isinstance(value, Tensor) and value.dim() > 0 and \
            value.shape[0] == slots.shape[0]
        if not rowwise or not (pooled is None or self._per_row(pooled)):
            return value  # a value shared by every request
        if pooled is None or pooled.shape[1:] != value.shape[1:] or pooled.dtype != value.dtype:
            pooled = torch.zeros(self.capacity, *value.shape[1:], dtype=value.dtype,
                                 device=value.device)
        pooled.index_copy_(0, slots, value)
        return pooled
