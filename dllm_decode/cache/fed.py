"""What a cache plan's forward returns (``Fed``) and the host-side description of what it will
feed (``Feed``): shared by every plan (``cache.plans``, ``cache.window``, ``cache.sub_block``)
and the static-buffer step (``samplers.static_step``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Fed:
    """What one forward computed.

    logits: ``[B', R, V]`` for canvas positions ``rows``: ``[R]`` long shared by the batch (the
    contiguous fast path), or ``[B', R]`` per row (pruned forwards; a row's list may repeat an
    entry as padding). ``live`` (``[B', R]`` bool, ``None``: all) marks the entries whose logits
    are meaningful for that row. fed_start / fed_width: the canvas span the *reference*
    decoder's forward covers (random draws in ``rng="reference"`` mode use this shape).
    ``refresh``: every row had a full refresh; ``refreshed`` (``[B']`` bool, ``None``: all rows
    equal ``refresh``) says it per row. ``double_draw``: a cached step of the prefix loop, at
    which Fast-dLLM's ``generate_with_prefix_cache`` draws (and discards) one extra Gumbel
    tensor; the proposal maker draws it only for a selector that reproduces that loop
    (``samplers.proposals.PREFIX_DOUBLE_DRAW``), never for others (Fast-dLLM++'s prefix loop,
    dInfer's, a plugin's).
    """

    logits: Tensor
    rows: Tensor
    fed_start: int
    fed_width: int
    refresh: bool
    double_draw: bool = False
    live: Tensor | None = None
    #: model calls this forward made (``sub_block`` runs two in a step whose rows disagree)
    calls: int = 1
    refreshed: Tensor | None = None
    #: ``(lo, hi)`` when ``rows`` is the contiguous ``arange(lo, hi)`` (the sampler then works
    #: on the span with cached masks instead of scattering)
    span: tuple[int, int] | None = None
    #: token positions per row the forward ran through the model's layers (a plan that
    #: recomputes only some positions at some layers counts their mean over the layers)
    positions: float = 0.0

    def fresh_mask(self, batch: int, length: int) -> Tensor:
        """``[batch, length]`` bool: canvas positions with fresh logits in each row (the first
        ``batch`` rows of the fed batch, i.e. the conditional half under CFG)."""
        device = self.logits.device
        if self.rows.dim() == 1 and self.live is None:
            fresh = torch.zeros(length, dtype=torch.bool, device=device)
            fresh[self.rows] = True
            return fresh[None].expand(batch, -1)
        rows = self.rows[:batch] if self.rows.dim() == 2 else self.rows.expand(batch, -1)
        live = torch.ones_like(rows, dtype=torch.bool) if self.live is None else self.live[:batch]
        hits = torch.zeros(batch, length, dtype=torch.long, device=device)
        hits.scatter_add_(1, rows, live.long())  # padding repeats an entry: add, never race
        return hits > 0

    def refreshed_rows(self, batch: int) -> Tensor:
        """``[batch]`` bool: rows whose forward was a full refresh."""
        if self.refreshed is not None:
            return self.refreshed[:batch]
        return torch.full((batch,), self.refresh, dtype=torch.bool, device=self.logits.device)


@dataclass(frozen=True)
class Feed:
    """The host integers of one step's forward (``ForwardPlan.feed``): the model is fed canvas
    positions ``[start, end)`` (against the cache when ``use_cache``) and scores the rows
    ``[lo, hi)``; ``fed_start`` / ``fed_width`` / ``refresh`` / ``double_draw`` are ``Fed``'s.
    Two steps with equal ``Feed`` run the same tensor program (a captured step's key)."""

    start: int
    end: int
    lo: int
    hi: int
    use_cache: bool
    fed_start: int
    fed_width: int
    refresh: bool
    double_draw: bool = False
