"""Thread CPU time inside a model's core modules, by forward hooks.

Standard library only (the hooks are torch's, called on the modules handed in), so the
reference-loop runner (``benchmarks/reference_loops.py``), which runs in a Python without this
library, loads this file by path and times the reference models exactly as ``overhead`` times
ours.
"""

from __future__ import annotations

import time
from typing import Any


class CoreClock:
    """Thread CPU seconds inside ``modules`` (forward pre / post hooks; calls must not nest).

    Args:
        modules: e.g. ``core_modules(model)``.
    """

    def __init__(self, modules: list[Any]) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

        def pre(module: Any, args: Any) -> None:
            self._t0 = time.thread_time()

        def post(module: Any, args: Any, out: Any) -> None:
            self.seconds += time.thread_time() - self._t0

        self._handles = [h for m in modules for h in (m.register_forward_pre_hook(pre),
                                                      m.register_forward_hook(post))]

    def reset(self) -> None:
        """Zero the accumulated time."""
        self.seconds = 0.0

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
