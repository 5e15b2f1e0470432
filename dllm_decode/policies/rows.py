"""Per-row step values: the helpers a policy part uses to read a ``StepState`` whose rows are at
different steps of their blocks, and the rules its per-request memory follows.

A serving engine (SGLang's first-done-first-out batches, ``integrations/sglang``) decodes one
request's block per row, each at its own step. It decides all rows in **one** call when every
part of the policy declares ``Capabilities(row_steps=True)``: the ``StepState`` then holds the
step values per row (``types.StepState``, "Step values, in one of two forms"): ``step``,
``block_step``, ``steps_left``, ``block_start``, ``gen_start`` and ``extras["total_steps"]`` as
``[B]`` int64, ``progress`` as ``[B]`` float64, ``times`` as ``([B], [B])`` float32, on the
canvas's device; ``block_end`` stays a host int. A part that does not declare it gets host
values only (the engine splits the rows into calls that share them).

A part declaring ``row_steps`` must give each row exactly what a call on that row alone, with
the row's values as host scalars, gives (tested: ``tests/test_row_steps.py``), with no host
sync: Python control flow on a step value (``if state.block_step == 0``, ``min(step, n)``,
``[:, bs:be]``, ``table[block_step]``) becomes a tensor op in the per-row branch. The shared
form must keep running exactly the ops it ran before, so a part branches on ``per_row(value)``
(a Python check, no op) and leaves the shared branch as it was.

Random draws: with ``state.row_seeds`` (``[B]`` int64) set, every draw comes from
``uniform(state, shape)`` (``kernels.row_uniform``: a row's numbers depend on its seed alone),
never from ``state.generator``. The engine hands fresh seeds every step
(``kernels.mix_seeds(request_seed, step)``); a part drawing twice in one step passes
``stream=1, 2, ...`` to its later draws.

**Memory rules** (what ``init_memory`` returns, for a part declaring ``row_steps``). The engine
keeps one pool ``init_memory(N, K, device)`` (N = the most requests it runs, K = its block) and
for each call gathers the rows of the requests in it, calls the policy, and scatters them back
(SGLang's: ``integrations.sglang.pool.RequestPool``). So a memory must be a dataclass (or
``None``) whose fields are

* tensors with the request as the leading dim (``[B, ...]``), updated in place or by assigning
  a new tensor of the same shape to the field (both are written back);
* ``None`` until the part allocates them at a step (``[B, ...]``, e.g. KLASS's ``log_prev`` once
  V is known): the pool gets zeros ``[N, ...]`` and the rows are scattered;
* dataclasses obeying the same rules (recursively: ``PairedMemory``, ``CreditMemory.base``);
* host values (ints, tuples, ``None``) that the per-row branch **never reads nor relies on**
  (they cannot differ between rows: use the state's per-row values instead, e.g. KLASS's
  in-block warm-up reads ``state.block_step``, not its ``block_step`` counter).

The memory object itself is never replaced in ``select`` (only its fields). A request's memory
is per block inside the engine (its canvas is the block): the engine resets a request's rows to
``init_memory(1, K, device)``'s values when its block starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dllm_decode.kernels import mix_seeds, row_uniform
from dllm_decode.types import StepState

__all__ = ["as_rows", "column", "constant", "last_step", "lookup", "per_row", "positions",
           "span_mask", "table", "uniform"]


def per_row(x: Any) -> bool:
    """Whether a step value is given per row (a 1-d tensor) rather than shared (a host value
    or a 0-d tensor). A Python check: no tensor op."""
    return isinstance(x, Tensor) and x.dim() == 1


def as_rows(x: int | float | Tensor, b: int, device: torch.device,
            dtype: torch.dtype = torch.long) -> Tensor:
    """A step value as ``[B]`` of ``dtype`` on ``device`` (a shared value repeated; a tensor
    already of ``dtype`` on ``device`` is not copied: no op for a per-row value)."""
    if isinstance(x, Tensor):
        if x.dtype != dtype or x.device != device:
            x = x.to(device=device, dtype=dtype)
        return x.expand(b) if x.dim() == 0 else x
    return torch.full((b,), x, dtype=dtype, device=device)


def column(x: int | float | Tensor) -> int | float | Tensor:
    """``x`` ready to broadcast against ``[B, L]``: ``[B, 1]`` for a per-row value, else
    ``x`` itself."""
    return x[:, None] if per_row(x) else x


_CONSTANTS: dict[tuple[Any, ...], Tensor] = {}


def constant(key: tuple[Any, ...], make: Callable[[], Tensor]) -> Tensor:
    """A read-only tensor made by ``make()`` once per ``key`` in eager mode (no op per call),
    made afresh under ``torch.compile`` or while a CUDA graph is captured (never cached then).
    ``key`` names what it holds and its device. Never write into it."""
    out = _CONSTANTS.get(key)
    if out is not None and not torch.compiler.is_compiling():
        return out
    out = make()
    capturing = out.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not (torch.compiler.is_compiling() or capturing):
        if len(_CONSTANTS) > 128:
            _CONSTANTS.clear()
        _CONSTANTS[key] = out
    return out


def positions(length: int, device: torch.device) -> Tensor:
    """``[1, L]`` int64 canvas positions ``0 .. L - 1`` (a ``constant``)."""
    return constant(("positions", length, device),
                    lambda: torch.arange(length, device=device)[None])


def span_mask(state: StepState, length: int | None = None) -> Tensor:
    """``[B, L]`` bool: ``block_start <= position < block_end`` per row (shared or per row)."""
    b, width = state.eligible.shape
    pos = positions(width if length is None else length, state.eligible.device)
    inside = (pos >= column(state.block_start)) & (pos < state.block_end)
    return inside.expand(b, -1)


def last_step(state: StepState) -> Tensor:
    """``[B]`` bool: the row's block is at its last scheduled step (``steps_left == 1``;
    all False for adaptive steps, ``steps_left is None``)."""
    b, device = state.eligible.shape[0], state.eligible.device
    if state.steps_left is None:
        return torch.zeros(b, dtype=torch.bool, device=device)
    return as_rows(state.steps_left, b, device) == 1


def lookup(table: Tensor, index: Tensor, fill: int | float = 0) -> Tensor:
    """``table[index]`` per row (``table [n]``, ``index [B]`` int64), ``fill`` where the index
    is past the table's end (or negative). No host sync."""
    n = table.shape[0]
    if n == 0:
        return torch.full(index.shape, fill, dtype=table.dtype, device=index.device)
    inside = (index >= 0) & (index < n)
    return torch.where(inside, table[index.clamp(0, n - 1)], fill)


_TABLES: dict[tuple[Any, ...], Tensor] = {}


def table(values: tuple[int | float, ...] | tuple[tuple[int, ...], ...], dtype: torch.dtype,
          device: torch.device) -> Tensor:
    """A read-only schedule table (host values, e.g. a per-step budget) as a tensor on
    ``device``: made once per values / dtype / device (one copy to the device), then cached."""
    key = (values, dtype, device)
    out = _TABLES.get(key)
    if out is None:
        if len(_TABLES) > 256:
            _TABLES.clear()
        out = _TABLES[key] = torch.tensor(values, dtype=dtype, device=device)
    return out


def uniform(state: StepState, shape: tuple[int, ...], stream: int = 0) -> Tensor:
    """``[B, ...]`` float64 uniforms in (0, 1) of ``shape`` from ``state.row_seeds``
    (``kernels.row_uniform``; draw ``stream`` > 0 of a step takes ``mix_seeds(seeds,
    stream)``). Raises ``ValueError`` when the state carries no row seeds."""
    seeds = state.row_seeds
    if seeds is None:
        raise ValueError("StepState.row_seeds is None: per-row draws need row seeds (use "
                         "state.generator otherwise)")
    return row_uniform(seeds if stream == 0 else mix_seeds(seeds, stream), shape)
