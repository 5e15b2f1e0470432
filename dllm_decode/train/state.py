"""Training state on disk as data: one safetensors file whose header carries the rest as JSON.

A run directory's ``checkpoint.safetensors`` holds everything ``--resume`` needs (weights,
optimizer moments, weight average, RNG states, step, wall time, config). Tensors are stored by
their path in the state (``model/embed.weight``, ``optimizer/state/0/exp_avg``, ``rng/torch``)
with their exact bytes; everything else is JSON in the safetensors metadata under
``dllm_decode.state``, so reading a checkpoint never runs code: safetensors parses a bounded
header and maps the data, and the JSON decoder below rebuilds only dicts, lists, tuples,
strings, numbers, booleans, ``None`` and tensors. Floats go through JSON's shortest repr and
back exactly, so a resumed run continues bit for bit.

Older runs wrote ``checkpoint.pt`` with ``torch.save``, a pickle: loading one can execute any
code placed in it, so it is refused (``LegacyCheckpointError``) with the command that converts a
trusted one: ``dllm-decode train convert PATH`` (``convert_legacy``), which reads it with
torch's restricted unpickler (``weights_only=True``: tensors and plain containers only).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Final

import torch
from safetensors import safe_open
from safetensors.torch import save_file

#: the file a run directory keeps its resumable state in
STATE_FILE: Final = "checkpoint.safetensors"
#: the pickle file of older versions (refused; see ``convert_legacy``)
LEGACY_FILE: Final = "checkpoint.pt"
#: ``format`` entry of the safetensors metadata
FORMAT: Final = "dllm-decode/training-state/1"
_META_KEY: Final = "dllm_decode.state"
#: typed JSON nodes (any other object is a plain ``str``-keyed dict)
_TENSOR, _TUPLE, _DICT = "$tensor", "$tuple", "$dict"
#: torch.save writes a zip archive (newer) or a bare pickle (protocol 2+ starts with 0x80)
_PICKLE_MAGIC: Final = (b"PK\x03\x04", b"\x80")


class LegacyCheckpointError(ValueError):
    """A pickle checkpoint (``torch.save``), refused because loading it can run code."""


class StateFormatError(ValueError):
    """A file that is not a readable dllm-decode training state."""


def legacy_error(path: Path, what: str = "checkpoint") -> LegacyCheckpointError:
    """The refusal for a pickle file, naming it and the conversion command."""
    target = path.with_name(STATE_FILE) if path.name == LEGACY_FILE else path.with_suffix(
        ".safetensors")
    return LegacyCheckpointError(
        f"{path} is a pickle {what} (torch.save, written by dllm-decode before training states "
        f"became safetensors); loading a pickle can run any code placed in it, so it is not "
        f"read. If you trust whoever made it, convert it once with `dllm-decode train convert "
        f"{path}` (reads tensors and plain values only, writes {target}) and use that file")


def is_pickle(path: Path) -> bool:
    """True when ``path`` has a ``torch.save`` / pickle file suffix."""
    return path.suffix in (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


def _pickle_magic(path: Path) -> bool:
    """True when the file starts like a ``torch.save`` file (asked only of files safetensors
    could not read: a safetensors header length may start with the same bytes)."""
    with path.open("rb") as f:
        return f.read(4).startswith(_PICKLE_MAGIC)


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor], seen: set[int]) -> Any:
    """``value`` as JSON with its tensors moved into ``tensors`` (named by their path)."""
    if isinstance(value, torch.Tensor):
        name = path or "tensor"
        while name in tensors:
            name += "'"
        t = value.detach().cpu().contiguous()
        storage = t.untyped_storage().data_ptr()
        if t.numel() and storage in seen:  # tied weights: safetensors refuses shared memory
            t = t.clone()
        seen.add(storage)
        tensors[name] = t
        return {_TENSOR: name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, _join(path, i), tensors, seen) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, _join(path, i), tensors, seen) for i, v in enumerate(value)]
    if isinstance(value, dict):
        for k in value:
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"training state key {k!r} at {path or '/'}: only str / int / "
                                "float / bool / None keys are stored")
        items = [(k, _encode(v, _join(path, k), tensors, seen)) for k, v in value.items()]
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return dict(items)
        return {_DICT: [[k, v] for k, v in items]}
    raise TypeError(f"training state value at {path or '/'} is a {type(value).__name__}; only "
                    "tensors, dicts, lists, tuples, str, int, float, bool and None are stored")


def _decode(node: Any, tensors: dict[str, torch.Tensor], where: Path) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors, where) for v in node]
    if not isinstance(node, dict):
        return node
    typed = [k for k in node if k.startswith("$")]
    if typed:
        if len(node) != 1 or typed[0] not in (_TENSOR, _TUPLE, _DICT):
            raise StateFormatError(f"{where}: unknown entry {sorted(node)[:3]} in the state")
        kind, body = typed[0], node[typed[0]]
        if kind == _TENSOR:
            if body not in tensors:
                raise StateFormatError(f"{where}: the state names tensor {body!r}, which the "
                                       "file does not hold")
            return tensors[body]
        if kind == _TUPLE:
            return tuple(_decode(v, tensors, where) for v in body)
        return {k: _decode(v, tensors, where) for k, v in body}
    return {k: _decode(v, tensors, where) for k, v in node.items()}


def save_state(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (nested dicts / lists / tuples of tensors and plain values) to ``path``
    atomically (a temporary file, then ``os.replace``)."""
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, "", tensors, set())
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": FORMAT, _META_KEY: json.dumps(tree)})
    os.replace(tmp, path)
    return path


def load_state(path: str | Path) -> dict[str, Any]:
    """The state ``save_state`` wrote, on the CPU.

    Raises:
        FileNotFoundError: no such file.
        LegacyCheckpointError: a pickle checkpoint (not read; the message says how to convert).
        StateFormatError: anything else that is not a readable training state.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no training state at {path}")
    if is_pickle(path):
        raise legacy_error(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except Exception as err:  # noqa: BLE001 - SafetensorError / OSError: name the file
        if _pickle_magic(path):
            raise legacy_error(path) from None
        raise StateFormatError(f"{path}: not a readable safetensors training state "
                               f"({type(err).__name__}: {err})") from None
    if meta.get("format") != FORMAT or _META_KEY not in meta:
        raise StateFormatError(f"{path}: not a dllm-decode training state (its metadata has "
                               f"format {meta.get('format')!r}, expected {FORMAT!r}); a model "
                               "checkpoint directory is loaded with load_model instead")
    nested = StateFormatError(f"{path}: the state's JSON is nested deeper than Python's "
                              f"recursion limit {sys.getrecursionlimit()}; a saved training "
                              "state is a few levels deep")
    try:
        tree = json.loads(meta[_META_KEY])
    except json.JSONDecodeError as err:
        raise StateFormatError(f"{path}: the state's JSON is invalid ({err})") from None
    except RecursionError:
        raise nested from None
    try:
        state = _decode(tree, tensors, path)
    except StateFormatError:
        raise
    except RecursionError:
        raise nested from None
    except (TypeError, ValueError) as err:  # e.g. an unhashable key in a "$dict" entry
        raise StateFormatError(f"{path}: the state's JSON is malformed ({err})") from None
    if not isinstance(state, dict):
        raise StateFormatError(f"{path}: the state must be a mapping")
    return state


def state_path(run_dir: Path) -> Path:
    """``run_dir / STATE_FILE``; ``LegacyCheckpointError`` when only an old pickle is there."""
    path = run_dir / STATE_FILE
    if not path.exists() and (run_dir / LEGACY_FILE).exists():
        raise legacy_error(run_dir / LEGACY_FILE)
    return path


def convert_legacy(src: str | Path, dst: str | Path | None = None) -> Path:
    """Rewrite a trusted ``torch.save`` checkpoint as a training state; returns the new path.

    Reads with ``torch.load(weights_only=True)``: torch's restricted unpickler, which builds
    tensors and plain containers only and refuses anything else, so even this knowingly run
    conversion executes no code from the file (torch >= 2.6 is required: older versions had a
    bypass of that restriction, CVE-2025-32434).
    """
    src = Path(src)
    dst = Path(dst) if dst is not None else (src.with_name(STATE_FILE) if src.name == LEGACY_FILE
                                             else src.with_suffix(".safetensors"))
    if not src.is_file():
        raise FileNotFoundError(f"no checkpoint at {src}")
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 6):
        raise RuntimeError(f"converting needs torch >= 2.6 (its restricted unpickler is not "
                           f"safe before that); this is torch {torch.__version__}")
    if dst.exists():
        raise FileExistsError(f"{dst} exists; remove it or pass another output path")
    try:
        state = torch.load(src, map_location="cpu", weights_only=True)  # safe: restricted
    except Exception as err:  # noqa: BLE001 - UnpicklingError and friends: say what happened
        raise StateFormatError(
            f"{src}: torch's restricted loader refused it ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); a checkpoint dllm-decode wrote "
            "holds only tensors and plain values, so this file was made by something else or "
            "altered: do not load it") from None
    if not isinstance(state, dict):
        raise StateFormatError(f"{src}: expected a dict checkpoint, got {type(state).__name__}")
    return save_state(dst, state)
