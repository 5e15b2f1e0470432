"""dtype and device choices for ``load_model``: ``"auto"`` dtype, device checks, device maps.

* ``dtype="auto"`` is the checkpoint's ``torch_dtype`` (``config.json``; transformers 5 writes
  ``dtype``), on every device. The released LLaDA / Dream / SDAR checkpoints say ``bfloat16``;
  bf16 runs on CPU too (torch has bf16 CPU kernels) but is several times slower than fp32 on
  CPUs without native bf16 instructions, so pass ``dtype=torch.float32`` for CPU work. A
  config without ``torch_dtype`` (the bundled tiny checkpoints) loads in float32.
* Before any weight is read, a 4 x 4 matmul in the chosen dtype runs on the target device, so
  a dtype the device cannot compute in fails with a ``ValueError`` that says what to pass.
* ``device_map`` (a dict ``module prefix -> device`` or ``"auto" | "balanced" |
  "balanced_low_0" | "sequential"``) is resolved and applied by accelerate's big-model
  dispatch (``infer_auto_device_map`` / ``dispatch_model``); one ``Layer`` is never split.
  Module names are the model's own: ``embed``, ``layers.{i}``, ``norm``, ``head``.
"""

from __future__ import annotations

import warnings
from typing import Any, Final

import torch
from torch import nn

#: spellings accepted for ``dtype`` (strings from configs, the CLI and users)
DTYPE_NAMES: Final[dict[str, torch.dtype]] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
#: ``device_map`` strings that accelerate resolves
DEVICE_MAP_STRATEGIES: Final = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_dtype(value: str | torch.dtype, source: str = "dtype") -> torch.dtype:
    """A floating ``torch.dtype`` from a dtype or one of ``DTYPE_NAMES`` (``"torch.x"`` too)."""
    if isinstance(value, torch.dtype):
        dtype = value
    else:
        key = str(value).strip().lower().removeprefix("torch.")
        if key not in DTYPE_NAMES:
            raise ValueError(f"{source} {value!r} is not a supported dtype; use 'auto' or one "
                             f"of {sorted(DTYPE_NAMES)}")
        dtype = DTYPE_NAMES[key]
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{source} {dtype} is not supported; use float32, bfloat16 or float16")
    return dtype


def resolve_dtype(dtype: str | torch.dtype | None, config: dict[str, Any]) -> torch.dtype:
    """``"auto"``/``None`` -> the config's ``torch_dtype`` (float32 if absent); else parsed."""
    if dtype is None or (isinstance(dtype, str) and dtype == "auto"):
        name = config.get("torch_dtype") or config.get("dtype")
        if name is None:
            return torch.float32
        return parse_dtype(name, source="config.json torch_dtype")
    return parse_dtype(dtype)


def resolve_device(device: str | torch.device | int | None) -> torch.device:
    """``None`` -> CPU; otherwise a device that exists here (``ValueError`` if not)."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device string (e.g. 'cpu', 'cuda', "
                         f"'cuda:1'): {err}") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: this torch {torch.__version__} sees no CUDA "
                             f"device (CPU-only build or no driver); pass device='cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA "
                             f"device(s) visible")
    return dev


def probe_matmul(dtype: torch.dtype, device: torch.device) -> None:
    """Run a tiny matmul in ``dtype`` on ``device`` (raises what torch raises)."""
    a = torch.ones(4, 4, dtype=dtype, device=device)
    (a @ a).sum().item()


def check_dtype_runs(dtype: torch.dtype, device: torch.device) -> None:
    """``ValueError`` with the fix when ``device`` cannot compute in ``dtype``."""
    try:
        probe_matmul(dtype, device)
    except (RuntimeError, TypeError, NotImplementedError) as err:
        name = str(dtype).removeprefix("torch.")
        raise ValueError(f"dtype {name} cannot run a matmul on {device} ({err}); pass "
                         f"dtype=torch.float32 (CLI: --dtype float32)"
                         + (" or dtype=torch.float16" if device.type == "cuda" else "")) from err
    if (device.type == "cuda" and dtype is torch.bfloat16
            and not torch.cuda.is_bf16_supported(including_emulation=False)):
        warnings.warn(f"{torch.cuda.get_device_name(device)} has no native bfloat16: it runs "
                      f"emulated and slowly; dtype=torch.float16 is faster there", stacklevel=3)


def _no_split(model: nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in getattr(model, "layers", [])})


def infer_device_map(model: nn.Module, device_map: str | dict[str, Any],
                     dtype: torch.dtype) -> dict[str, Any]:
    """A ``{module prefix: device}`` map (strategies resolved by accelerate), validated."""
    try:
        from accelerate import infer_auto_device_map
        from accelerate.utils import get_balanced_memory
    except ImportError as err:
        raise ImportError("device_map needs accelerate: pip install accelerate "
                          "(or pip install 'dllm-decode[eval]')") from err
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise ValueError(f"device_map {device_map!r}: use a dict {{module: device}} or one "
                             f"of {list(DEVICE_MAP_STRATEGIES)}")
        max_memory = None
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, dtype=dtype,
                                             no_split_module_classes=_no_split(model),
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=max_memory, dtype=dtype,
                                           no_split_module_classes=_no_split(model))
    if not isinstance(device_map, dict) or not device_map:
        raise ValueError(f"device_map must be a non-empty dict or a strategy string, got "
                         f"{device_map!r}")
    resolved = {}
    for prefix, dev in device_map.items():
        if dev == "disk":
            raise ValueError("device_map: disk offload is not supported; give the module a "
                             "device or 'cpu'")
        resolved[prefix] = resolve_device(dev)
    for name, _ in model.named_parameters():
        device_for(name, resolved)
    return resolved


def device_for(name: str, device_map: dict[str, torch.device]) -> torch.device:
    """The device of parameter ``name`` under ``device_map`` (longest matching prefix)."""
    best = None
    for prefix in device_map:
        covers = prefix == "" or name == prefix or name.startswith(prefix + ".")
        if covers and (best is None or len(prefix) > len(best)):
            best = prefix
    if best is None:
        raise ValueError(f"device_map does not place parameter {name!r}; its keys "
                         f"{sorted(device_map)} must cover embed, layers.N, norm and head")
    return device_map[best]


def dispatch(model: nn.Module, device_map: dict[str, torch.device]) -> nn.Module:
    """Hand the placed model to accelerate's ``dispatch_model`` (hooks move activations)."""
    from accelerate import dispatch_model

    return dispatch_model(model, device_map={k: str(v) for k, v in device_map.items()})
