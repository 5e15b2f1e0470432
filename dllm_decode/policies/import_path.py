"""A user's class or factory by import path: ``package.module:Name`` or ``path/to/file.py:Name``
(``--policy`` / ``--stopper`` / ``--truncator``, grid and lm-eval ``policy=``, ``make_policy``).

Only a string with ``:`` that the user wrote is imported (a module) or run (a file); plain
names are the built-in presets (``policies.resolve``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any


def is_import_path(spec: Any) -> bool:
    """True for ``module:Name`` / ``file.py:Name`` strings."""
    return isinstance(spec, str) and ":" in spec


def load_object(spec: str) -> Any:
    """The object named by ``package.module:Name`` or ``path/to/file.py:Name``.

    The current directory is searched too (console scripts do not put it on ``sys.path``).

    Raises:
        ValueError: a malformed spec, a module that cannot be imported or a missing name.
    """
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"import path must be 'package.module:Name' or 'file.py:Name', "
                         f"got {spec!r}")
    if module_name.endswith(".py"):
        module = _load_file(Path(module_name), spec)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            cwd = os.getcwd()
            if cwd in sys.path or err.name != module_name.split(".")[0]:
                raise ValueError(f"cannot import {module_name!r} for {spec!r}: {err}") from None
            sys.path.insert(0, cwd)
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as again:
                raise ValueError(f"cannot import {module_name!r} for {spec!r}: {again}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} ({spec!r})") from None


def _load_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise ValueError(f"policy file not found: {path} ({spec!r})")
    name = f"_dllm_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses resolve their module while the file runs
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
