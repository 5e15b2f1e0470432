"""Function-preserving growth of a trained model: more layers, a wider residual stream, more heads.

Used to add capacity after the test-bed plateau is passed (``shared/research/testbed-
feasibility.md``: a deeper model trained from scratch stays on the plateau). The grown model
starts from the small one's function (up to the RMSNorm epsilon) and every new weight can learn:

* depth: the ``n`` old layers are spread over the ``m >= n`` new ones (old layer ``i`` goes to
  ``i * m // n``); every other layer keeps its initialisation but its residual outputs
  (attention ``o_proj``, MLP ``down_proj``) are zeroed, so it starts as the identity;
* width (hidden ``d -> D``, heads ``h -> H`` at the same head size, MLP ``I -> I'``): old weights
  fill the leading block of each new matrix (old heads are the first heads, so GQA groups keep
  their K/V heads); the new residual dimensions start at zero because everything that writes
  them (the embedding's new columns, ``o_proj`` / ``down_proj`` new rows) is zeroed, and the new
  heads / MLP units write nothing yet (their ``o_proj`` / ``down_proj`` columns are zeroed);
  hidden-size RMSNorm weights are scaled by ``sqrt(d / D)`` because the mean square now runs
  over ``D`` dimensions of which only ``d`` are non-zero. New readers keep their random
  initialisation, so gradients reach the zeroed writers from the first step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dllm_decode.models.base import DecoderLM

#: parameters that write into the residual stream (zeroed where new)
_WRITERS = ("o_proj.weight", "o_proj.bias", "down_proj.weight", "down_proj.bias")
#: RMSNorm weights over the hidden size (rescaled when the hidden size grows)
_HIDDEN_NORMS = ("attn_norm.weight", "mlp_norm.weight")


def grow_into(model: DecoderLM, small: dict[str, Tensor]) -> None:
    """Load ``small`` (a state dict of a shallower and/or narrower model of the same family)
    into ``model``, keeping its function; see the module docstring for the rules."""
    own = model.state_dict()
    d_old, d_new = small["embed.weight"].shape[1], own["embed.weight"].shape[1]
    old_layers = {int(k.split(".")[1]) for k in small if k.startswith("layers.")}
    n, m = len(old_layers), len(model.layers)
    if not 0 < n <= m:
        raise ValueError(f"cannot grow a {n}-layer model into {m} layers")
    if d_old > d_new:
        raise ValueError(f"cannot grow hidden size {d_old} into {d_new}")
    place = {i * m // n: i for i in range(n)}
    source: dict[str, Tensor] = {k: v for k, v in small.items() if not k.startswith("layers.")}
    for j, i in place.items():
        prefix = f"layers.{i}."
        source |= {f"layers.{j}.{k[len(prefix):]}": v for k, v in small.items()
                   if k.startswith(prefix)}
    state: dict[str, Tensor] = {}
    for name, init in own.items():
        old = source.get(name)
        if old is None:  # a new layer: an identity residual block
            state[name] = torch.zeros_like(init) if name.endswith(_WRITERS) else init.clone()
            continue
        if old.shape == init.shape:  # nothing grows here (any tensor, stacked experts too)
            state[name] = old.to(init.dtype).clone()
            continue
        if any(a > b for a, b in zip(old.shape, init.shape, strict=True)):
            raise ValueError(f"{name}: cannot grow {tuple(old.shape)} into {tuple(init.shape)}")
        state[name] = _widen(name, old.to(init.dtype), init, d_old, d_new)
    model.load_state_dict(state)


def _widen(name: str, old: Tensor, init: Tensor, d_old: int, d_new: int) -> Tensor:
    """``old`` placed in the leading block of a copy of ``init`` (with the zeroing / norm
    scaling of the module docstring)."""
    out = init.detach().clone()
    if out.dim() == 1:
        scale = math.sqrt(d_old / d_new) if name == "norm.weight" or name.endswith(
            _HIDDEN_NORMS) else 1.0
        out[: old.shape[0]] = old * scale
        return out
    rows, cols = old.shape
    out[:rows, :cols] = old
    if name in ("embed.weight", "head.weight"):  # [V, d]: no new residual dims written / read
        out[:, cols:] = 0
    elif name.endswith(_WRITERS):  # [d, in]: new rows write new dims, new columns new units
        out[rows:, :] = 0
        out[:, cols:] = 0
    return out
