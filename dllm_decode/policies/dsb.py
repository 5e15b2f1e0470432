"""DSB: Dynamic Sliding Block, an eligibility window that slides over the whole generation.

Paper: "DSB: Dynamic Sliding Block Scheduling for Diffusion LLMs", arXiv 2602.05992; code
``lizhuo-luo/DSB`` @ 114c121 (``llada/generate.py``: ``generate_dsb``, and
``generate_dsb_cache``, whose cache is ``cache="dsb"``, ``dllm_decode.cache.dsb``).

Instead of pre-cut blocks, an active window ``[s, e)`` starts at the first masked position
``s`` and slides right as tokens are committed. With ``n`` the generated positions committed
so far, ``P`` the generation's start and ``B`` the block length::

    greedy (max_block_length = -1, the code's default):  e = min(P + B + n, L)
    const  (max_block_length = B):                      e = min(P + B + n, s + B)

Greedy keeps exactly ``B`` masked positions in the window (the committed ones all lie before
``e``); const keeps a span of ``B``. Inside the window a base selector commits: Fast-dLLM's
threshold rule (``prob >= 0.9``, and always the best position) in every script.

How it runs in the one loop: as **one loop block** over the whole generation (the sampler's
default ``block_length=None``): the window is the only block there is, and ``B`` is the
selector's ``block`` (the code's ``block_length``; 32 in every script), not the sampler's
``block_length``. With loop blocks of ``K < G`` it still runs (``bind`` sets
``lookahead = G - K``, so the window reaches past the loop block), but it is then DSB only while
each loop block completes within its step cap (``max_steps_per_block``, ``K`` by default): the
loop commits a block's leftovers at its last allowed step. Under ``cache="dsb"`` the plan slides
the same window over the K/V cache (``cache.dsb``: the plan takes ``B`` from ``refresh_every``
(``None``: 32; it is also the refresh period) and the span cap from ``window_tokens``, both
checked against this selector at bind) and marks the positions the authors' cached loop may
commit; the selector then trusts the fed positions (``plan_window``).

Deviations from the released code (see also the plan's): rows of a batch are independent (the
code is batch 1: ``.item()``); the window start is the first masked position (the code searches
``[0, e)`` and falls back to ``e``: the same position, since nothing at or past ``e`` was
eligible); the base selector sees the mask token removed and float32 probabilities (the code's
float64 softmax keeps it); the quota mode (``threshold=None``) is not provided: the base must be
adaptive (``generate_dsb`` indexes a whole-generation quota by its step counter and
``generate_dsb_cache`` always reads its first entry, spec quirks 2.7); no EOS handling, as the
code (stoppers and ``stop_at_eos`` compose). No host sync.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.base import bind_of, init_memory_of
from dllm_decode.policies.capabilities import Capabilities, capabilities_of
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.resolve import make_policy
from dllm_decode.policies.rows import column, positions
from dllm_decode.policies.supervised import Supervised
from dllm_decode.policies.validate import check_fields
from dllm_decode.types import CacheMode, StepState

#: ``B`` when ``block`` is None (every script: 32)
DSB_BLOCK: Final = 32


def dsb_bounds(masked: Tensor, gen_start: int | Tensor, block: int,
               max_block: int | None) -> tuple[Tensor, Tensor]:
    """The window ``(s, e)`` of each row, ``[B, 1]`` int64 each.

    Args:
        masked: ``[B, L]`` bool, still masked (before this step's commits).
        gen_start: ``P``, the generation's first canvas position (host int or ``[B]`` int64).
        block: ``B``; max_block: the window's span cap (``None``: greedy, unbounded).

    ``s`` is the first masked position (``L`` when none); ``n`` the generated positions not
    masked. No host sync.
    """
    length = masked.shape[-1]
    pos = positions(length, masked.device)  # [1, L]
    start = column(gen_start)
    n = (~masked & (pos >= start)).sum(-1, keepdim=True)
    s = torch.where(masked, pos, length).amin(-1, keepdim=True)
    e = (n + start + block).clamp(max=length)
    if max_block is not None:
        e = torch.minimum(e, s + max_block)
    return s, e


@dataclass(frozen=True)
class DynamicSlidingBlock:
    """DSB's window (arXiv 2602.05992) around a base selector: the base sees as eligible only
    the positions left of the window's end ``e`` (``dsb_bounds``).

    Args:
        selector: the adaptive selector committing inside the window (the scripts':
            ``Threshold(0.9)``).
        block: ``B`` (``None``: 32, the scripts').
        max_block_length: the code's argument: ``-1`` greedy (default), ``None`` const
            (``= B``), an int ``M >= 1`` caps the span at ``M``.
        lookahead / plan_window: set by ``bind`` (positions past the loop block the window may
            reach; ``cache="dsb"`` feeds and marks the window itself).

    Capabilities: the base's, with ``lookahead``. Memory: the base's.
    """

    selector: Any
    block: int | None = None
    max_block_length: int | None = -1
    lookahead: int = 0
    plan_window: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "DynamicSlidingBlock")
        if self.block is not None and (isinstance(self.block, bool) or self.block < 1):
            raise ValueError(f"DynamicSlidingBlock: block must be an int >= 1 or None, got "
                             f"{self.block!r}")
        m = self.max_block_length
        if m is not None and m != -1 and (isinstance(m, bool) or m < 1):
            raise ValueError(f"DynamicSlidingBlock: max_block_length must be -1 (greedy), None "
                             f"(const: = block) or an int >= 1, got {m!r}")
        if not callable(getattr(self.selector, "select", None)):
            raise TypeError(f"DynamicSlidingBlock wraps a selector (with select(state)), got "
                            f"{type(self.selector).__name__}")
        base = capabilities_of(self.selector)
        why = ("it is budgeted (the window may hold fewer masked positions than a step's "
               "budget: use an adaptive rule such as threshold, factor or eb)" if base.budgeted
               else "it edits committed tokens" if base.edits
               else "it commits past its block itself (lookahead)" if base.lookahead
               else "it commits inside sub-blocks" if base.sub_block_size
               else "it proposes after selecting (Dream's origin)" if base.proposes_after_select
               else None)
        if why:
            raise ValueError(f"DSB cannot wrap {type(self.selector).__name__}: {why}")

    @property
    def capabilities(self) -> Capabilities:
        """The base selector's, plus the cross-block ``lookahead`` set at bind."""
        return replace(capabilities_of(self.selector), lookahead=self.lookahead,
                       noise_kinds=("mask",), slides_blocks=True)

    def window_size(self, block: int) -> int | None:
        """The span cap for ``B = block`` (``None``: greedy)."""
        m = self.max_block_length
        return None if m == -1 else block if m is None else m

    def bind(self, model: Any, cfg: Any = None) -> DynamicSlidingBlock:
        """Bind the base; read the loop's block length and the cache mode from ``cfg``.

        Raises:
            ValueError: under ``cache="dsb"``, a ``block`` / span cap that differs from the
                plan's (``refresh_every`` or 32, ``window_tokens``).
        """
        sel = bind_of(self.selector, model, cfg)
        if cfg is None:
            return self if sel is self.selector else replace(self, selector=sel)
        g, k = cfg.gen_length, cfg.block_length or cfg.gen_length
        block = self.block or DSB_BLOCK
        plan = CacheMode(cfg.cache) is CacheMode.DSB
        if plan:
            plan_block = cfg.refresh_every or DSB_BLOCK
            if block != plan_block:
                raise ValueError(f"cache='dsb' slides a window of refresh_every ({plan_block}) "
                                 f"but the dsb selector has block={block}: pass "
                                 f"refresh_every={block}")
            if self.window_size(block) != cfg.window_tokens:
                want = self.window_size(block)
                raise ValueError(f"cache='dsb' caps the window span at window_tokens "
                                 f"({cfg.window_tokens}) but the dsb selector's cap is {want} "
                                 f"(max_block_length={self.max_block_length!r}): pass "
                                 f"window_tokens={want}")
        return replace(self, selector=sel, block=block, lookahead=max(g - k, 0),
                       plan_window=plan)

    def init_memory(self, batch: int, length: int, device: torch.device) -> Any:
        return init_memory_of(self.selector, batch, length, device)

    def fuse_logits(self, *args: Any, **kwargs: Any) -> Tensor:
        """The base's score transform (a base declaring ``fuses_logits``, e.g. ``credit``)."""
        return self.selector.fuse_logits(*args, **kwargs)

    def window(self, state: StepState) -> Tensor:
        """``[B, L]`` bool: positions left of each row's window end ``e``."""
        block = self.block or DSB_BLOCK
        _, e = dsb_bounds(state.masked, state.gen_start, block, self.window_size(block))
        return positions(state.masked.shape[-1], state.masked.device) < e

    def select(self, state: StepState) -> Any:
        """The base selector over the eligible positions inside the window (under
        ``cache="dsb"``: the positions the plan marked, see the module docstring)."""
        if self.plan_window:
            return self.selector.select(state)
        return self.selector.select(replace(state, eligible=state.eligible & self.window(state)))


def dsb_policy(base: str | Any = "threshold", block: int | None = None,
               max_block_length: int | None = -1, *, preset: str = "dsb", **params: Any
               ) -> Policy:
    """The ``dsb`` preset: DSB greedy over ``base`` (the scripts': ``threshold`` 0.9).

    ``max_block_length``: ``-1`` greedy (the code's default and the README's main rows),
    ``None`` const (``= B``, preset ``dsb_const``), an int caps the span. Other parameters go to
    the base preset; a base with a stopper / truncator keeps it."""
    if not isinstance(base, str) and params:
        raise ValueError(f"parameters {sorted(params)} given for a base selector object")
    built = make_policy(base, **params)
    inner = built.selector
    if isinstance(inner, Supervised):  # Policy re-pairs the stopper around the window
        inner = inner.selector
    window = DynamicSlidingBlock(inner, block=block, max_block_length=max_block_length)
    name = preset if base == "threshold" else f"{preset}+{built.name}"
    return Policy(selector=window, stopper=built.stopper, truncator=built.truncator,
                  name=name)
