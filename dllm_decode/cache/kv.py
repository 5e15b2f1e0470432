"""``BlockKVCache``: preallocated per-layer K/V storage, written and read by position.

Policy-free storage (kernels.md §2.1): samplers decide which rows are written each step and
which keys each query may see; the cache only holds ``k, v [n_layers, B, H_kv, L_max, D]``
(keys post-RoPE, model dtype) plus per-row valid key ranges ``[kv_start, kv_end)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


class BlockKVCache:
    """Per-layer K/V buffers ``[B, H_kv, L_max, D]`` in one tensor per K and V."""

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.kv_start = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self.kv_end = torch.full((batch_size,), max_len, dtype=torch.int32, device=device)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Views ``(k, v)`` of layer ``i``, each ``[B, H_kv, L_max, D]``."""
        return self.k[i], self.v[i]

    def write(self, i: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """In place: rows ``slots [B, N]`` of layer ``i`` <- ``k, v [B, H_kv, N, D]``.

        Slots must be distinct within a row (duplicates would race).
        """
        idx = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        self.k[i].scatter_(2, idx, k.to(self.k.dtype))
        self.v[i].scatter_(2, idx, v.to(self.v.dtype))

    def valid_keys(self) -> Tensor:
        """``[B, L_max]`` bool: key rows inside each row's ``[kv_start, kv_end)``."""
        pos = torch.arange(self.max_len, device=self.k.device)
        return (pos[None] >= self.kv_start[:, None]) & (pos[None] < self.kv_end[:, None])

    def set_range(self, kv_start: Tensor | None = None, kv_end: Tensor | None = None) -> None:
        """Set the per-row valid key range (left padding, truncation)."""
        if kv_start is not None:
            self.kv_start.copy_(kv_start.to(torch.int32))
        if kv_end is not None:
            self.kv_end.copy_(kv_end.to(torch.int32))

    def crop(self, lengths: Tensor) -> None:
        """Truncate each row's valid keys to ``lengths [B]`` (EoTP); no data moves."""
        self.kv_end.copy_(torch.minimum(self.kv_end, lengths.to(torch.int32)))

    def select(self, rows: Tensor) -> BlockKVCache:
        """A new cache holding only batch rows ``rows`` (drop finished sequences)."""
        out = object.__new__(BlockKVCache)
        out.k, out.v = self.k[:, rows].clone(), self.v[:, rows].clone()
        out.kv_start, out.kv_end = self.kv_start[rows].clone(), self.kv_end[rows].clone()
        return out

    def reset(self) -> None:
        self.k.zero_()
        self.v.zero_()
