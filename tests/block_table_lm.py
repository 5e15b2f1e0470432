"""A scripted model whose logits depend only on token ids, block-causally: the LoPA conformance
model (``benchmarks/conformance/record_lopa.py`` runs the authors' decoder on it,
``tests/test_lopa.py`` the library; this file imports torch only, so both environments load it).

``BlockTable.raw(tokens, positions, mask)``: for each fed row ``r`` at position ``i``,
``h = E[t_r] + sum_c A[(i - j_c) mod R] * F[t_c] / sqrt(#c)`` over the visible keys ``c`` (the
mask, if any) at positions ``j_c < end(i)`` other than ``i`` itself, where ``end(i)`` is the end
of ``i``'s block (the prompt ``[0, P)`` is one block, then blocks of ``B``); logits
``scale * tanh(h) @ H`` in float64, cast to float32, the mask token (and ``banned`` ids) at
-1e4. Because the keys
past a position's block never count and the token ids are final once a block is decoded, a
K/V cache of token ids is exact: the reference's prefix caching, shifted last logit included,
gives the same logits as recomputing the canvas. ``raw`` row ``i`` predicts position ``i + 1``
(a Dream-style AR shift); ``TableLM`` undoes it as the library's models do.
"""

from __future__ import annotations

import torch
from torch import Tensor


class BlockTable:
    """The logit table (see the module docstring); ``seed`` draws every weight."""

    def __init__(self, vocab: int, mask_id: int, prompt_length: int, block: int, *,
                 seed: int = 0, dim: int = 12, reach: int = 5, scale: float = 4.0,
                 banned: tuple[int, ...] = ()) -> None:
        gen = torch.Generator().manual_seed(seed)
        f64 = torch.float64
        self.vocab, self.mask_id, self.p, self.block = vocab, mask_id, prompt_length, block
        self.E = torch.randn(vocab, dim, generator=gen, dtype=f64)
        self.F = torch.randn(vocab, dim, generator=gen, dtype=f64)
        self.A = torch.randn(reach, dim, generator=gen, dtype=f64)
        self.H = torch.randn(dim, vocab, generator=gen, dtype=f64)
        self.reach, self.scale = reach, scale
        self.banned = (mask_id, *banned)  # logit -1e4: never predicted

    def end(self, pos: Tensor) -> Tensor:
        """Block end of each position."""
        p, k = self.p, self.block
        return torch.where(pos < p, p, p + ((pos - p) // k + 1) * k)

    def raw(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None) -> Tensor:
        """``tokens, positions [B, N]`` (``mask [B, N, N]`` bool, ``None``: all visible) ->
        float32 ``[B, N, V]``."""
        pos_q, pos_k = positions[:, :, None], positions[:, None, :]
        vis = (pos_k < self.end(pos_q)) & (pos_k != pos_q)
        if mask is not None:
            vis = vis & mask
        off = (pos_q - pos_k) % self.reach  # [B, N, N]
        terms = self.A[off] * self.F[tokens][:, None, :, :]  # [B, N, N, d]
        s = (terms * vis[..., None]).sum(2)
        count = vis.sum(2).clamp(min=1).to(torch.float64)
        h = self.E[tokens] + s / count.sqrt()[..., None]
        logits = self.scale * torch.tanh(h) @ self.H
        logits[..., list(self.banned)] = -1e4
        return logits.float()


class TableLM:
    """The library-side ``DiffusionLM`` of a ``BlockTable``: bidirectional interface, no K/V
    cache, logits shifted back (``logit_shift = 1``: row ``i``'s logits come from ``raw`` row
    ``i - 1``, as Dream's)."""

    attention = "bidirectional"
    block_size = None
    family = "mock"
    logit_shift = 1

    def __init__(self, table: BlockTable, eos: int) -> None:
        self.table = table
        self.vocab_size = table.vocab
        self.mask_token_id = table.mask_id
        self.eos_token_ids = (eos,)
        self.max_length = 512

    def rope_positions(self, valid: Tensor) -> Tensor:
        b, length = valid.shape
        return torch.arange(length, device=valid.device).expand(b, length)

    def new_cache(self, batch_size: int, max_len: int) -> None:
        raise ValueError("TableLM has no K/V cache; use cache='none'")

    def forward(self, tokens: Tensor, positions: Tensor, *, cache: object = None,
                slots: Tensor | None = None, mask: Tensor | None = None, store: bool = True,
                hidden_rows: Tensor | None = None) -> Tensor:
        if cache is not None:
            raise ValueError("TableLM has no K/V cache; use cache='none'")
        if mask is not None and mask.dim() == 2:
            mask = mask[:, None, :].expand(-1, tokens.shape[1], -1)
        raw = self.table.raw(tokens, positions, mask)
        logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)
        return logits if hidden_rows is None else logits[:, hidden_rows]

    __call__ = forward
