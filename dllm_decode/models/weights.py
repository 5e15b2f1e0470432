"""Reading checkpoint files: JSON, the safetensors file list, and tensors one at a time.

Every problem with the files is a ``CheckpointError`` naming the file and the fix (unreadable
/ truncated safetensors, invalid JSON with line and column, an index that disagrees with its
shards). Tensors are read lazily from memory-mapped files (``safe_open``), one shard open at a
time, so host memory beyond the model stays near one tensor; ``load_model`` checks names
against the architecture from the headers alone before any tensor data is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint directory that does not match the architecture it declares."""


class MaskTokenIdError(CheckpointError):
    """The mask id (config, generation config or the family's released id) is not in the
    checkpoint's vocabulary: pass ``load_model(..., mask_token_id=...)``."""


#: largest JSON file read (config, index, generation config: kilobytes in real releases)
MAX_JSON_BYTES = 64 * 2**20
#: largest ``num_hidden_layers`` accepted: parsers build per-layer tables from it before the
#: weights' size check can run (released models have at most 94 layers)
MAX_LAYERS = 100_000


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ``CheckpointError`` with the line and column if invalid,
    if the file is larger than ``MAX_JSON_BYTES`` (checked before it is read), or nested past
    the recursion limit."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise CheckpointError(f"{path}: {size:,} bytes is not a config or index file (at most "
                              f"{MAX_JSON_BYTES:,} are read); is it the right file?")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno} "
                              f"({err.msg}); fix that line or re-save the checkpoint with "
                              "save_model") from None
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: not a UTF-8 text file ({err.reason}); is it the right "
                              "file?") from None
    except RecursionError:
        raise CheckpointError(f"{path}: JSON nested deeper than Python's recursion limit; a "
                              "config or index file is a few levels deep") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def weight_map(directory: Path) -> dict[str, str] | None:
    """``{tensor name: shard file}`` from the index of a sharded checkpoint; ``None`` if single."""
    if (directory / SINGLE).is_file():
        return None
    index = directory / INDEX
    if not index.is_file():
        raise FileNotFoundError(f"{directory} has neither {SINGLE} nor {INDEX}")
    mapping = read_json(index).get("weight_map", {})
    if not isinstance(mapping, dict):
        raise CheckpointError(f"{index}: weight_map must be an object {{tensor: shard file}}")
    return mapping


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint (the shards listed by the index when sharded)."""
    mapping = weight_map(directory)
    if mapping is None:
        return [directory / SINGLE]
    files = []
    for shard in sorted(set(mapping.values())):
        if not (directory / shard).is_file():
            raise FileNotFoundError(f"shard {shard} listed in {INDEX} is missing from "
                                    f"{directory}")
        files.append(directory / shard)
    return files


def _unreadable(path: Path, err: Exception) -> CheckpointError:
    return CheckpointError(f"{path}: cannot read safetensors ({type(err).__name__}: {err}); "
                           "the file is truncated or corrupt: download or save it again")


@contextmanager
def open_safetensors(path: Path, device: str = "cpu") -> Iterator[Any]:
    """``safe_open`` (header parsed, data memory-mapped), with the file named if unreadable."""
    try:
        handle = safe_open(str(path), framework="pt", device=device)
    except Exception as err:  # noqa: BLE001 - SafetensorError / OSError: name the file
        raise _unreadable(path, err) from None
    with handle as f:
        yield f


def tensor_index(directory: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """``{checkpoint tensor name: (file, shape)}`` from the safetensors headers (no tensor
    data read; safetensors itself rejects a header whose shapes disagree with its data
    offsets or the file size).

    A sharded checkpoint must agree with its index: a tensor in a shard the index does not
    list there, or one the index lists that no shard holds, is a ``CheckpointError``.
    """
    mapping = weight_map(directory)
    index: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in weight_files(directory):
        with open_safetensors(file) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if mapping is not None and mapping.get(name) != file.name:
                    raise CheckpointError(f"tensor {name!r} in {file.name} is not listed there "
                                          f"by {INDEX}")
                index[name] = (file, tuple(f.get_slice(name).get_shape()))
    if mapping is not None and set(mapping) - set(index):
        raise CheckpointError(f"tensors listed in {INDEX} but absent: "
                              f"{sorted(set(mapping) - set(index))[:5]}")
    return index


def iter_tensors(files: list[Path], device: torch.device
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` one at a time, one shard open at a time.

    Each tensor comes in its stored dtype, straight onto ``device`` for CUDA (CPU otherwise,
    possibly a view of the mapped file); a shard is unmapped before the next one opens.
    """
    read_on = str(device) if device.type == "cuda" else "cpu"
    for file in files:
        with open_safetensors(file, read_on) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                try:
                    t = f.get_tensor(name)
                except Exception as err:  # noqa: BLE001 - name the file and the tensor
                    raise CheckpointError(f"{file}: cannot read tensor {name!r} "
                                          f"({type(err).__name__}: {err}); the file is "
                                          "truncated or corrupt: download or save it "
                                          "again") from None
                yield name, t


def is_finite(t: torch.Tensor) -> bool:
    """No NaN / inf in ``t``: one ``aminmax`` reduction (NaN and +-inf reach the min or max),
    no tensor-sized temporary, in the stored dtype on the device the tensor was read to."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def check_finite(t: torch.Tensor, name: str, directory: Path) -> None:
    """``CheckpointError`` naming ``name`` when the tensor holds NaN / inf."""
    if not is_finite(t):
        raise CheckpointError(f"{directory}: tensor {name!r} holds NaN or inf values; the "
                              "checkpoint is corrupt (re-save it from a finite model), or "
                              "pass check_finite=False to inspect it")
