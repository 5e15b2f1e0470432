"""An exponential moving average of a model's weights (Polyak averaging).

``p_ema <- decay * p_ema + (1 - decay) * p`` after every optimiser step; evaluation and export
use the averaged weights (``WeightAverage.applied``). Averaging the iterates of a noisy
optimiser reduces the variance of the final weights (Polyak & Juditsky 1992); the test-bed
distillation uses it against per-prompt errors of the conditionals that a single iterate keeps
(``dllm-decode train testbed --ema 0.999``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn


class WeightAverage:
    """The running average of ``model``'s floating-point parameters and buffers.

    Args:
        model: the trained module (its current weights start the average).
        decay: in ``(0, 1)``; the average spans about ``1 / (1 - decay)`` steps.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must lie in (0, 1), got {decay}")
        self.decay = decay
        self.names = [k for k, v in model.state_dict().items() if v.is_floating_point()]
        state = model.state_dict()
        self.values = [state[k].detach().clone() for k in self.names]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One averaging step towards ``model``'s current weights."""
        state = model.state_dict()
        torch._foreach_lerp_(self.values, [state[k] for k in self.names], 1.0 - self.decay)

    def state_dict(self) -> dict[str, Tensor]:
        """The averaged tensors by parameter name (for checkpoints)."""
        return dict(zip(self.names, self.values, strict=True))

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore from ``state_dict()`` (same names)."""
        if sorted(state) != sorted(self.names):
            raise ValueError("the checkpoint's weight average has other tensors than the model")
        self.values = [state[k].clone() for k in self.names]

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """Inside the block ``model`` holds the averaged weights; its own come back after."""
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.state_dict(), strict=False)
        try:
            yield model
        finally:
            model.load_state_dict(own)
