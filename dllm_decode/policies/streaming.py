"""Streaming-dLLM's decoding rules: the mask-ratio-adaptive threshold and the EOS early exit.

Y. Xiao et al., "Streaming-dLLM: Accelerating Diffusion LLMs via Suffix Pruning and Dynamic
Decoding", arXiv 2601.17917; reference ``generate_with_prefix_cache`` (with
``context_aware_threshold`` and ``get_transfer_index``) in xiaoshideta/Streaming-dLLM
``LLaDA-1.5/generate.py`` @ c4320c2. The method has three parts; the third of them, the suffix
pruning, is the cache plan ``cache="streaming"`` (``dllm_decode.cache.streaming``), which the
preset prefers:

* ``StreamingThreshold`` (selector): Fast-dLLM's rule (every masked block position with
  confidence ``>= tau``, plus always the block's argmax) with the threshold
  ``tau(t) = tau0 * (1 - alpha * (1 - r))``, ``r`` the mask ratio of the forward's query region
  measured before the step's commits (``ratio="query"``, the code: the block, the window and
  the tail, ``Fed.fed_start`` / ``fed_width`` of the plan; the suffix past the block counts
  as masked). The block's first step uses ``tau0`` (the code fixes ``r = 1`` there). On other
  plans the query region is their forward's span: ``prefix`` the block and the whole suffix
  (the unpruned reference), ``dual`` the block, ``none`` the canvas (prompt included).
* ``BlockEosExit`` (truncator ``block_eos_exit``): once a step completes the block and the
  block holds an EOS, the rest of the answer becomes EOS and the row stops (no more forwards).

Paper vs code (the code is the default; each difference an option, arXiv 2601.17917 §3):

* ``ratio="block"``: ``r`` over the current block alone. With the code's query region and a
  large window ``r`` stays near 1 and ``alpha`` barely acts early in a block (the paper's
  Fig. 6 sweep tunes ``alpha`` against that); the block ratio lets it act.
* ``BlockEosExit(eot=True)``: every EOS id of the model (LLaDA's EOT too); the code checks one
  id (``eos_id``, LLaDA's ``<|endoftext|>``), the first of ``model.eos_token_ids`` here. The
  paper exits "when EOS is decoded with high confidence" but names no threshold; the code's
  any-EOS rule is what runs (no confidence option).

Per family (the authors' code differs; the library follows each family's by default):

* ``first="threshold"`` (LLaDA, ``generate_with_prefix_cache``): the block's first step is the
  rule above with ``tau0``.
* ``first="position"`` (Dream, ``Dream/model/generation_utils_block.py::_sample`` with
  ``alg="confidence_threshold"``): the block's first step commits the block's **first
  position** alone (its argmax, whatever its confidence); the ratio rule runs from the second
  step on. The Dream code's later forwards start at the block, so the block's first position
  would read its own (unshifted) output there; committing it first is what makes that
  harmless. ``first=None`` picks by the model family at bind (``FIRST_RULE``).

Not reproduced: the reference's batch coupling (its mask ratio sums masks over the batch and
one row's EOS exits every row; the Dream loop's later steps commit in row 0 only); here every
row decodes as it does alone. With ``block_length=1`` the Dream loop spends one more forward
per block after its first step (it commits nothing); here a completed block ends.

``STREAMING_TASKS``: the paper's Table 11 (``window`` in tokens, ``alpha``) per model row and
task at 256 / 512 generated tokens; ``task`` and ``table`` pick ``alpha`` (at bind, by the
model family and ``gen_length``). The window is the plan's ``window_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.adaptive import fast_dllm_loop, threshold_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import ScoreKind, StepState

#: paper Table 11 (= the authors' scripts): table -> task -> ((window, alpha) at 256 generated
#: tokens, (window, alpha) at 512); tau0 0.9 and blocks of 32 everywhere
STREAMING_TASKS: Final[dict[str, dict[str, tuple[tuple[int, float], tuple[int, float]]]]] = {
    "llada-1.5": {"humaneval": ((96, 0.3), (96, 0.4)), "gsm8k": ((96, 0.4), (128, 0.6)),
                  "mbpp": ((96, 0.3), (96, 0.3)), "math": ((96, 0.4), (192, 0.3))},
    "llada-instruct": {"humaneval": ((192, 0.3), (256, 0.4)), "gsm8k": ((96, 0.3), (96, 0.3)),
                       "mbpp": ((32, 0.3), (32, 0.3)), "math": ((128, 0.3), (256, 0.2))},
    "dream-base": {"humaneval": ((192, 0.7), (128, 0.4)), "gsm8k": ((32, 0.3), (32, 0.3)),
                   "mbpp": ((192, 0.3), (192, 0.6)), "math": ((32, 0.1), (32, 0.3))},
}
#: the table a model family reads by default (others: LLaDA-1.5's, the scripts' model)
FAMILY_TABLE: Final[dict[str, str]] = {"dream": "dream-base"}
#: the block's first-step rule a model family runs by default (others: ``"threshold"``)
FIRST_RULE: Final[dict[str, str]] = {"dream": "position"}
RATIOS: Final = ("query", "block")
FIRSTS: Final = ("threshold", "position")


def task_setting(table: str, task: str, gen_length: int) -> tuple[int, float]:
    """``(window, alpha)`` of ``STREAMING_TASKS`` (the 512 column from 512 tokens on)."""
    if table not in STREAMING_TASKS:
        raise ValueError(f"streaming_dllm table must be one of {sorted(STREAMING_TASKS)}, got "
                         f"{table!r}")
    rows = STREAMING_TASKS[table]
    if task not in rows:
        raise ValueError(f"streaming_dllm task must be one of {sorted(rows)}, got {task!r}")
    return rows[task][1 if gen_length >= 512 else 0]


@dataclass(frozen=True)
class StreamingThreshold:
    """The mask-ratio-adaptive threshold (see the module docstring).

    ``tau``: tau0; ``alpha``: the decay (``None``: ``STREAMING_TASKS[table][task]``, resolved
    at bind); ``task`` / ``table`` (``None``: by the model family); ``ratio``: ``"query"``
    (the code) or ``"block"``; ``first``: the block's first step, ``"threshold"`` (LLaDA's
    code) or ``"position"`` (Dream's code: the block's first position alone); ``None``: by
    the model family at bind.
    """

    tau: float = 0.9
    alpha: float | None = None
    task: str = "gsm8k"
    table: str | None = None
    ratio: str = "query"
    first: str | None = None

    #: adaptive; reads the probability at eligible positions only
    capabilities = Capabilities(budgeted=False, proposal_fields=(), reads_masked_only=True,
                                preferred_cache="streaming")

    def __post_init__(self) -> None:
        check_fields(self, "StreamingThreshold")
        check_range("StreamingThreshold", "tau", self.tau, 0.0, 1.0, lo_open=True)
        if self.alpha is not None:
            check_range("StreamingThreshold", "alpha", self.alpha, 0.0, 1.0)
        if self.ratio not in RATIOS:
            raise ValueError(f"StreamingThreshold ratio must be one of {RATIOS}, got "
                             f"{self.ratio!r}")
        if self.first is not None and self.first not in FIRSTS:
            raise ValueError(f"StreamingThreshold first must be one of {FIRSTS} or None, got "
                             f"{self.first!r}")
        task_setting(self.table or "llada-1.5", self.task, 256)  # names checked here

    @property
    def reference_loop(self) -> str | None:
        """Fast-dLLM's prefix loop (``generate_with_prefix_cache``: its draws)."""
        return fast_dllm_loop(ScoreKind.PROB)

    def bind(self, model: Any, cfg: Any = None) -> StreamingThreshold:
        """Resolve ``alpha`` from the task table (the family's, ``cfg.gen_length``'s column)
        and ``first`` from the family (``FIRST_RULE``); refuse a task whose window differs
        from the plan's default when ``window_tokens`` is not given (the window is the
        plan's, ``cache.streaming``)."""
        family = getattr(model, "family", "")
        table = self.table or FAMILY_TABLE.get(family, "llada-1.5")
        gen = getattr(cfg, "gen_length", 256) or 256
        window, alpha = task_setting(table, self.task, gen)
        cache = getattr(getattr(cfg, "cache", None), "value", None)
        if cache == "streaming" and getattr(cfg, "window_tokens", None) is None:
            default = task_setting(FAMILY_TABLE.get(family, "llada-1.5"), "gsm8k", gen)[0]
            if window != default:
                raise ValueError(f"streaming_dllm task={self.task!r} ({table}, {gen} tokens) "
                                 f"decodes with a window of {window} tokens; the plan's "
                                 f"default is {default}: pass window_tokens={window}")
        first = self.first or FIRST_RULE.get(family, "threshold")
        return replace(self, table=table, alpha=alpha if self.alpha is None else self.alpha,
                       first=first)

    def mask_ratio(self, state: StepState) -> Tensor | None:
        """``[B]`` float64 mask ratio this step (``None``: the block's first step with
        ``ratio="query"``, where the code uses ``tau0``)."""
        bs, be = int(state.block_start), state.block_end
        masked = state.masked
        if self.ratio == "block":
            return masked[:, bs:be].sum(1, dtype=torch.float64) / float(be - bs)
        if state.block_step == 0:
            return None
        qs, width = state.forward_start, state.forward_width
        past = max(qs + width - be, 0)  # the suffix the forward kept: all masks
        count = masked[:, qs:min(be, qs + width)].sum(1, dtype=torch.float64) + float(past)
        return count / float(width)

    def select(self, state: StepState) -> Tensor:
        """Commit eligible positions with ``prob >= tau(t)``, plus each row's best one (at a
        block's first step with ``first="position"``: the block's first position alone)."""
        if self.first == "position" and state.block_step == 0:
            bs = int(state.block_start)  # a host int (no row_steps)
            commit = torch.zeros_like(state.eligible)
            commit[:, bs] = state.eligible[:, bs]
            return commit
        ratio = self.mask_ratio(state)
        alpha = 0.4 if self.alpha is None else self.alpha
        tau: float | Tensor = self.tau
        if ratio is not None:  # the reference's float64 arithmetic, in its order
            tau = (self.tau * (1.0 - alpha * (1.0 - ratio)))[:, None]
        return threshold_mask(state.proposal.prob.double(), state.eligible, tau)


@dataclass(frozen=True)
class BlockEosExit:
    """Truncator: a row whose step completes its block, with an EOS anywhere in that block,
    ends there (its later positions become EOS; no more forwards for it).

    ``eot``: every EOS id of the model (``model.eos_token_ids``); off: the first one only, as
    the reference checks its one ``eos_id``. The ids are read at bind unless ``eos_ids``
    names them.
    """

    eot: bool = False
    eos_ids: tuple[int, ...] = ()

    capabilities = Capabilities(proposal_fields=(), reads_masked_only=True)

    def bind(self, model: Any, cfg: Any = None) -> BlockEosExit:
        if self.eos_ids:  # given explicitly
            return self
        ids = tuple(getattr(model, "eos_token_ids", ()) or ())
        return replace(self, eos_ids=ids if self.eot else ids[:1])

    def truncate(self, state: StepState, commit: Tensor) -> Tensor:
        """``[B]`` int64: ``block_end - gen_start`` for rows that exit, else the answer's
        length."""
        bs, be, g0 = int(state.block_start), state.block_end, int(state.gen_start)
        length = state.canvas.shape[1]
        full = torch.full((state.canvas.shape[0],), length - g0, dtype=torch.long,
                          device=state.canvas.device)
        if not self.eos_ids or be >= length:
            return full
        done = ~(state.masked[:, bs:be] & ~commit[:, bs:be]).any(1)
        block = torch.where(commit[:, bs:be], state.proposal.tokens[:, bs:be],
                            state.canvas[:, bs:be])
        is_eos = block == self.eos_ids[0]
        for eos in self.eos_ids[1:]:
            is_eos = is_eos | (block == eos)
        return torch.where(done & is_eos.any(1), be - g0, full)


def streaming_dllm_policy(task: str = "gsm8k", table: str | None = None, tau: float = 0.9,
                          alpha: float | None = None, ratio: str = "query",
                          early_exit: bool = True, eot: bool = False,
                          first: str | None = None) -> Policy:
    """The ``streaming_dllm`` preset: ``StreamingThreshold`` (the paper's GSM8K row by default;
    ``task``, ``table``, ``alpha`` override it; ``first``: the block's first-step rule, by the
    family when ``None``) with the ``BlockEosExit`` truncator (``early_exit``), on
    ``cache="streaming"`` by default. The authors decode in blocks of 32 (``block_length=32``)."""
    selector = StreamingThreshold(tau=tau, alpha=alpha, task=task, table=table, ratio=ratio,
                                  first=first)
    return Policy(selector=selector, truncator=BlockEosExit(eot=eot) if early_exit else None,
                  name="streaming_dllm")
