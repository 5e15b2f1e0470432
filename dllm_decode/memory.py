"""Memory estimates checked before large allocations: a clear error instead of an OOM crash.

Two callers: ``models.loading.build_model`` (weights drawn for a config) and
``samplers.inputs.check_inputs`` (a ``gen_length`` whose canvas, logits and KV cache would not
fit). Estimates are lower bounds of what the allocation needs, compared with what the device
has free now: on CUDA ``torch.cuda.mem_get_info`` plus the caching allocator's reserved but
unused bytes; on the CPU available RAM plus free swap (``psutil`` when installed, else
``/proc/meminfo``). Where free memory cannot be read (other devices, other systems) nothing is
checked. Small requests (under ``CHECK_ABOVE`` bytes) are not checked at all, so the common
case costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import torch

#: requests below this many bytes are not checked (no query of the device)
CHECK_ABOVE: Final = 256 * 2**20


class MemoryBudgetError(ValueError):
    """An allocation that cannot fit in the device's free memory (message says what to lower)."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def _meminfo_bytes() -> int | None:
    """``MemAvailable + SwapFree`` from ``/proc/meminfo`` (Linux), in bytes."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    fields = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024
    if "MemAvailable" not in fields:
        return None
    return fields["MemAvailable"] + fields.get("SwapFree", 0)


def available_bytes(device: str | torch.device) -> int | None:
    """Bytes that can still be allocated on ``device`` now; ``None`` when unknown."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return int(free + max(0, cached))
    if dev.type != "cpu":
        return None
    try:
        import psutil
    except ImportError:
        return _meminfo_bytes()
    return int(psutil.virtual_memory().available + psutil.swap_memory().free)


def check_fits(nbytes: int, device: str | torch.device, what: str, fix: str) -> None:
    """``MemoryBudgetError`` when ``nbytes`` (a lower bound) exceeds the free memory of
    ``device``: ``"{what} needs at least X GiB on DEVICE, which has Y GiB free; {fix}"``."""
    if nbytes < CHECK_ABOVE:
        return
    free = available_bytes(device)
    if free is not None and nbytes > free:
        raise MemoryBudgetError(f"{what} needs at least {_gib(nbytes)} on {device}, which has "
                                f"{_gib(free)} free; {fix}")


def _first_parameter(model: Any) -> torch.Tensor | None:
    params = getattr(model, "parameters", None)
    return next(iter(params()), None) if callable(params) else None


def model_device(model: Any, default: torch.device) -> torch.device:
    """Where ``model``'s (first) weights live, where its logits and KV cache are allocated;
    ``default`` for a model without parameters."""
    first = _first_parameter(model)
    return first.device if first is not None else default


def decode_bytes(model: Any, batch: int, length: int, fed: int, cached: bool) -> int:
    """A lower bound of the memory one ``generate`` call allocates beyond the weights.

    Args:
        model: the model (``vocab_size``; ``spec`` for the KV cache and hidden size if any).
        batch: B rows; ``length``: L = P + G canvas positions.
        fed: N positions a forward computes logits for (L without a cache, else the block).
        cached: whether a KV cache ``[layers, 2, B, Hkv, L, D]`` is allocated.

    Counted: the canvas bookkeeping (token ids, commit steps and probabilities, masks: at
    least 32 bytes per position), one forward's logits in float32 ``[B, N, V]`` and hidden
    states ``[B, L, d]``, and the KV cache in the weights' dtype.
    """
    spec = getattr(model, "spec", None)  # None: no hidden / KV terms
    vocab = int(getattr(model, "vocab_size", 0) or 0)
    first = _first_parameter(model)
    elem = first.element_size() if first is not None else 4
    total = 32 * batch * length + 4 * batch * fed * vocab
    sizes = {k: int(getattr(spec, k, 0) or 0)
             for k in ("hidden_size", "num_layers", "num_kv_heads", "head_dim")}
    total += elem * batch * length * sizes["hidden_size"]
    if cached:  # families whose spec names these differently (DiffusionGemma) count 0 here
        total += (2 * elem * sizes["num_layers"] * batch * sizes["num_kv_heads"] * length
                  * sizes["head_dim"])
    return total
