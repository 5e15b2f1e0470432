"""Shared vocabulary, enums and result types.

Shape letters used in docstrings across the package:
B batch, P prompt length, G generation length, L = P + G canvas length, K block length,
N positions fed to the model in one forward, V vocabulary, H heads, D head dim.

Vocabulary: *canvas* (token buffer [B, L]), *block* (the span being denoised), *eligible*
(masked and committable this step), *proposal* (per position: proposed token and its scores),
*commit* (fix an eligible position to its proposed token), *NFE* (model forward passes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor


class ScoreKind(str, Enum):
    """Which per-position score ranks candidates (higher = more confident)."""

    PROB = "prob"  # probability of the proposed token (LLaDA low_confidence, Dream maskgit_plus)
    MARGIN = "margin"  # top1 - top2 probability (Dream topk_margin)
    NEG_ENTROPY = "neg_entropy"  # sum p log p (Dream entropy)
    LOGIT_MARGIN = "logit_margin"  # top1 - top2 logit (SchED, Prophet)
    #: uniform draws per step (LLaDA / Fast-dLLM ``remasking="random"``); not a proposal field:
    #: selectors get it from ``policies.base.step_score``, which draws from the step's generator
    RANDOM = "random"


class CacheMode(str, Enum):
    """Which positions each forward recomputes (see ``dllm_decode.cache.plans``)."""

    NONE = "none"
    PREFIX = "prefix"
    DUAL = "dual"
    BLOCK_CAUSAL = "block_causal"
    WINDOW = "window"
    SUB_BLOCK = "sub_block"
    DLLM_CACHE = "dllm_cache"
    #: DSB Cache: a full refresh every B commits, else the sliding window recomputed (``cache.dsb``)
    DSB = "dsb"
    #: Streaming-dLLM: prefix K/V + the block + a suffix window + the tail (``cache.streaming``)
    STREAMING = "streaming"


class Impl(str, Enum):
    """Kernel implementation choice: ``auto`` picks Triton only when a kernel can launch."""

    AUTO = "auto"
    REFERENCE = "reference"
    TRITON = "triton"


#: the ``Proposal`` fields computed only for policies that read them (declared as
#: ``Capabilities(proposal_fields=...)``); ``tokens``, ``prob`` and ``argmax`` always are
OPTIONAL_FIELDS: Final[tuple[str, ...]] = ("margin", "logit_margin", "neg_entropy")
#: every ``Proposal`` field name
PROPOSAL_FIELDS: Final[tuple[str, ...]] = ("tokens", "prob", "argmax", *OPTIONAL_FIELDS)


class ProposalFieldError(RuntimeError):
    """A ``Proposal`` field that was not computed this step was read (see ``Proposal``)."""


@dataclass(frozen=True, init=False)
class Proposal:
    """Per-position proposal for one forward.

    All fields are ``[B, N]``: ``tokens`` int64; the rest float32. ``prob`` is the probability
    of ``tokens`` under the scoring distribution, ``margin`` the top-2 probability gap,
    ``logit_margin`` the top-2 raw-logit gap, ``neg_entropy`` is ``sum p log p`` (<= 0).
    ``argmax`` is the greedy token (``None``: same as ``tokens``, i.e. no sampling happened).
    ``lse`` is the log-sum-exp of the scoring logits when the kernel provides it (``None``
    otherwise, and on the canvas-wide ``StepState.proposal``): the decode contract's
    finiteness check reads it when the entropy was not computed.

    The sampler computes ``margin``, ``logit_margin`` and ``neg_entropy`` only when a part of
    the policy reads them (``Capabilities.proposal_fields``; parts that declare nothing get
    every field). A field that was not computed is absent: ``has(name)`` is False and reading
    it raises ``ProposalFieldError`` naming the capability to declare (never a stale or zero
    value).
    """

    tokens: Tensor
    prob: Tensor
    argmax: Tensor | None
    _margin: Tensor | None
    _logit_margin: Tensor | None
    _neg_entropy: Tensor | None
    lse: Tensor | None

    def __init__(self, tokens: Tensor, prob: Tensor, margin: Tensor | None = None,
                 logit_margin: Tensor | None = None, neg_entropy: Tensor | None = None,
                 argmax: Tensor | None = None, lse: Tensor | None = None) -> None:
        put = object.__setattr__  # frozen
        put(self, "tokens", tokens)
        put(self, "prob", prob)
        put(self, "argmax", argmax)
        put(self, "_margin", margin)
        put(self, "_logit_margin", logit_margin)
        put(self, "_neg_entropy", neg_entropy)
        put(self, "lse", lse)

    def has(self, name: str) -> bool:
        """Whether field ``name`` was computed (``tokens`` / ``prob`` always are; ``argmax``
        counts as present: ``greedy`` falls back to ``tokens``)."""
        if name not in PROPOSAL_FIELDS:
            raise ValueError(f"unknown Proposal field {name!r}; fields: {PROPOSAL_FIELDS}")
        return name not in OPTIONAL_FIELDS or getattr(self, f"_{name}") is not None

    def computed(self) -> list[str]:
        """The optional fields that were computed, in ``OPTIONAL_FIELDS`` order."""
        return [n for n, v in zip(OPTIONAL_FIELDS, (self._margin, self._logit_margin,
                                                     self._neg_entropy), strict=True)
                if v is not None]

    def get(self, name: str) -> Tensor | None:
        """Field ``name``, or ``None`` when it was not computed (no error)."""
        if name in OPTIONAL_FIELDS:
            return getattr(self, f"_{name}")
        return getattr(self, name)

    def _field(self, name: str) -> Tensor:
        value = getattr(self, f"_{name}")
        if value is None:
            raise ProposalFieldError(
                f"Proposal.{name} was not computed this step: the sampler computes "
                f"{list(OPTIONAL_FIELDS)} only for policy parts that read them. Declare it on "
                f"the selector / stopper / truncator that reads it: capabilities = "
                f"Capabilities(proposal_fields=({name!r},)) (or leave proposal_fields unset: "
                f"every field)")
        return value

    @property
    def margin(self) -> Tensor:
        """``[B, N]`` float32 top-2 probability gap (``ProposalFieldError`` if not computed)."""
        return self._field("margin")

    @property
    def logit_margin(self) -> Tensor:
        """``[B, N]`` float32 top-2 raw-logit gap (``ProposalFieldError`` if not computed)."""
        return self._field("logit_margin")

    @property
    def neg_entropy(self) -> Tensor:
        """``[B, N]`` float32 ``sum p log p`` (``ProposalFieldError`` if not computed)."""
        return self._field("neg_entropy")

    @property
    def greedy(self) -> Tensor:
        """The argmax token per position (what stoppers commit, even when sampling)."""
        return self.tokens if self.argmax is None else self.argmax

    def score(self, kind: ScoreKind) -> Tensor:
        """The ``[B, N]`` score of the given kind (``random`` is drawn per step, not stored:
        use ``dllm_decode.policies.base.step_score``)."""
        if ScoreKind(kind) is ScoreKind.RANDOM:
            raise ValueError("score 'random' is drawn per step from the sampler's generator; "
                             "selectors read it with dllm_decode.policies.base.step_score")
        kind = ScoreKind(kind)
        return self.prob if kind is ScoreKind.PROB else self._field(kind.value)


class Selection(NamedTuple):
    """What a selector may return instead of a bare commit mask ``[B, L]`` bool.

    ``tokens`` (``[B, L]`` int64, read at committed positions only) replaces the proposal's
    tokens there, e.g. S2D2's residual resample; ``prob`` (``[B, L]`` float) is the probability
    of those tokens, used for ``Generation.bits`` (``None``: the proposal's probability).

    ``edit`` (``[B, L]`` bool, only from selectors declaring ``Capabilities(edits=True)``)
    rewrites already committed positions (LLaDA2.1 token editing): a subset of
    ``StepState.editable``; each takes ``tokens`` there (``None``: the proposal's token).
    """

    commit: Tensor
    tokens: Tensor | None = None
    prob: Tensor | None = None
    edit: Tensor | None = None


@runtime_checkable
class DiffusionLM(Protocol):
    """What the sampler needs from a model.

    ``forward(tokens [B, N], positions [B, N]) -> logits [B, N, V]`` with ``logits[:, i]``
    predicting ``tokens[:, i]``. Models trained with the AR shift (Dream) undo it inside; for
    such models (``logit_shift == 1``) the first fed row has no left neighbour, so its logits are
    only meaningful when it sits at canvas position 0. ``cache`` is a ``cache.kv.BlockKVCache``
    (K/V written at ``slots`` and read back; ``store=False`` writes nothing); ``mask`` a
    ``[B, N, L']`` bool attention mask. ``models.base.DecoderLM`` implements it; the cache
    plans drive any model that does.
    """

    mask_token_id: int
    eos_token_ids: tuple[int, ...]
    attention: str  # "bidirectional" | "block_causal"
    block_size: int | None
    logit_shift: int
    vocab_size: int
    max_length: int

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        *,
        cache: Any = None,
        slots: Tensor | None = None,
        mask: Tensor | None = None,
        store: bool = True,
    ) -> Tensor: ...


class FeatureCachedLM(DiffusionLM, Protocol):
    """A ``DiffusionLM`` that runs dLLM-Cache's per-layer feature reuse (``cache="dllm_cache"``;
    ``models.base.DecoderLM`` with standard layers).

    ``rope_tables(positions [B, L]) -> (cos, sin)``; ``feature_forward(tokens [B, L],
    positions [B, L], store, **plan) -> logits [B, L, V]`` (or ``[B, R, V]`` for ``plan``'s
    ``hidden_rows``), reading and writing the per-layer features in ``store`` (the plan's
    ``cache.dllm_cache.FeatureStore``) as ``plan`` says (``models.feature_cache``).
    """

    layers: Any  # one entry per decoder layer

    def rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]: ...

    def feature_forward(self, tokens: Tensor, positions: Tensor, store: Any,
                        **plan: Any) -> Tensor: ...


class StepModel(Protocol):
    """The model as a policy may use it during one step (``StepState.model``).

    ``forward(tokens [B, N], positions [B, N], mask [B, N, L + N], active=None)`` runs one
    extra forward against this step's keys and stores nothing: mask columns ``[0, L)`` are the
    canvas positions as held in the cache plan's K/V after this step's forward (recomputed from
    the current canvas when the cache mode is ``none``), columns ``[L, L + N)`` the fed tokens
    themselves. It returns logits ``[B, N, V]`` and counts one model forward (``Generation.
    forwards``) plus one NFE for every row in ``active`` (``[B]`` bool; default: rows that still
    have an eligible position). ``probs(logits [..., V])`` is the distribution proposals are
    sampled from (mask token removed, temperature / top-p / top-k applied). ``positions`` and
    ``valid`` are the canvas RoPE positions ``[B, L]`` and key validity ``[B, L]`` (False: left
    padding or a truncated tail).
    """

    mask_token_id: int
    eos_token_ids: tuple[int, ...]
    block_size: int | None
    positions: Tensor
    valid: Tensor

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor,
                active: Tensor | None = None) -> Tensor: ...

    def probs(self, logits: Tensor) -> Tensor: ...


@dataclass
class StepState:
    """Read-only view of one decoding step handed to policies.

    ``proposal`` fields, ``eligible``, ``masked``, ``fresh`` and ``canvas`` are ``[B, L]``
    (proposal values at positions without a fresh proposal this step are stale or zero; see
    ``fresh``: the fed positions, or only their masked ones when every policy part declares
    ``reads_masked_only`` and the sampler scored those alone). ``budget`` is the scheduled
    number of commits per row ``[B]`` (int64) or ``None`` for open-ended (adaptive) steps.
    ``forward_start``/``forward_width`` give the canvas span the reference decoder's forward
    covered (random draws use that shape). ``memory`` is the
    per-generation state object a history policy created with ``init_memory``; it is the only
    mutable thing a policy sees. ``logits`` (only when a part declares ``needs_logits``) are
    ``[B, R, V]`` for the canvas positions ``rows`` (``[R]`` shared by the batch, or ``[B, R]``
    per row for pruned forwards). ``refreshed`` ``[B]`` bool marks rows whose forward this step
    was a full refresh of their cached K/V. ``model`` gives extra forwards and the sampling
    distribution (see ``StepModel``). ``editable`` ``[B, L]`` bool (only for selectors that
    declare ``Capabilities(edits=True)``, else ``None``) marks the committed positions the
    selector may rewrite this step (``Selection.edit``): generated, inside the current block,
    fed this step, in rows still allowed to edit (``samplers.editing``). ``block`` is the
    block's index (a host ``int``). ``mask_logit`` ``[B, R]``
    is the raw logit of the mask token at ``rows`` (only for selectors that sample their own
    tokens, ``Capabilities.samples_tokens``: ``logits`` have it removed). ``reference_order``
    (``rng="reference"``) asks budgeted top-k selections for the reference decoders' order
    (``policies.base.budget_mask``: ``torch.topk`` over the forward's span, ties as there).

    **Step values, in one of two forms.** ``step`` (the generation's step index, 0 at its first
    forward, counting on across blocks), ``block_step`` (the step's index inside its block, 0
    at the block's first forward), ``steps_left`` (scheduled steps left in the block, this one
    included; ``None`` for adaptive steps), ``progress`` (``step / max(T - 1, 1)``),
    ``block_start`` / ``gen_start`` (canvas index of the block's / the generation's first
    position), ``times`` (``(t, s)`` on Dream's time grid, or ``None``) and
    ``extras["total_steps"]`` (T, the steps the progress counts) are

    * **shared** by every row (the library's own loop): host values (``int``, ``float``,
      ``times`` as float32 0-d tensors), or 0-d tensors (``step`` and ``progress`` on the
      static-buffer step of graph-safe presets, ``progress`` under ``compile=True``);
    * **per row** (a serving engine whose rows are at different steps of their blocks, e.g.
      SGLang's first-done-first-out batches): ``[B]`` tensors on the canvas's device,
      int64 (``step``, ``block_step``, ``steps_left``, ``block_start``, ``gen_start``,
      ``extras["total_steps"]``), float64 (``progress``), float32 (``t``, ``s`` of ``times``;
      ``None`` unless every row has them). Only parts declaring
      ``Capabilities(row_steps=True)`` are handed this form (``policies.rows`` has the
      helpers and the memory rules). ``block_end`` stays a host ``int`` in both forms (the
      canvas is the block there: ``block_end = L``), as ``block``.

    ``row_seeds`` (``[B]`` int64, or ``None``): when set, every random draw a policy makes
    comes from ``dllm_decode.kernels.row_uniform(row_seeds, shape)`` (a counter-based hash per
    row: a row's draws depend on its seed alone, not on its batch), never from
    ``generator`` (``policies.rows.uniform``).
    """

    proposal: Proposal
    eligible: Tensor
    masked: Tensor
    fresh: Tensor
    canvas: Tensor
    step: int | Tensor  # host int, 0-d (static step) or [B] int64 (per row)
    block: int
    block_start: int | Tensor  # host int or [B] int64
    block_end: int
    gen_start: int | Tensor  # host int or [B] int64
    steps_left: int | Tensor | None  # host int or [B] int64; None: adaptive
    budget: Tensor | None
    progress: float | Tensor  # host float, 0-d float64 (compile / static step) or [B] float64
    generator: torch.Generator | None
    forward_start: int
    forward_width: int
    times: tuple[Tensor, Tensor] | None = None
    memory: Any = None
    logits: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    rows: Tensor | None = None
    refreshed: Tensor | None = None
    model: StepModel | None = None
    editable: Tensor | None = None
    block_step: int | Tensor = 0  # host int or [B] int64
    mask_logit: Tensor | None = None
    reference_order: bool = False
    row_seeds: Tensor | None = None
    #: ``[B, L, L]`` (query row, key column) head-averaged softmax attention of the model's
    #: last layers, averaged over them, from this step's forward (only for selectors that
    #: declare ``Capabilities(attention_maps=n)``, else ``None``; DAWN)
    attention: Tensor | None = None


@dataclass
class Generation:
    """Result of ``DiffusionSampler.generate``.

    tokens: ``[B, L]`` final canvas (prompt + generation, left padding kept).
    nfe: ``[B]`` forwards each row took part in while it still had masked positions (a
        ``separate_prefill`` forward included; one per step for ``cache="sub_block"``).
    forwards: total model forward calls (a batched or CFG call counts once; a
        ``separate_prefill`` forward and both calls of a ``sub_block`` step whose rows
        disagree included).
    steps: decoding steps (commit rounds) run.
    commit_step: ``[B, G]`` step at which each generated position was committed (-1 never).
    bits: ``[B, steps]`` information committed per step, sum of -log p of committed tokens.
    lengths: ``[B]`` generation length per row after truncation (EoTP), else G.
    refreshed: ``[B, steps]`` bool, whether the step's forward fully refreshed the row's cached
        K/V (every step without a cache); ``None`` when not recorded.
    step_forwards: model calls per step (1, plus extra forwards such as S2D2's verifier, or
        2 for a ``sub_block`` step whose rows disagree; a separate prefill is no step).
    edits: ``[B, steps, G]`` bool, the generated positions each step rewrote after their
        commit (token editing, ``Capabilities(edits=True)``; a re-mask, ``remasks=True``, is
        an edit too); ``None`` for policies that do not edit. ``commit_step`` keeps each
        position's first commit (a re-masked position: its last).
    step_positions: token positions per row each step ran through the model's layers: the
        fed width of its forward(s), extra forwards included (without a cache an extra
        forward recomputes the canvas beside its own tokens); a plan that recomputes only
        some positions at some layers (``cache="dllm_cache"``) counts their mean over the
        layers. ``positions`` is their sum plus a ``separate_prefill`` forward's.
    """

    tokens: Tensor
    nfe: Tensor
    forwards: int
    steps: int
    prompt_length: int
    commit_step: Tensor
    bits: Tensor
    lengths: Tensor
    trace: list[dict[str, Any]] | None = None
    refreshed: Tensor | None = None
    step_forwards: list[int] | None = None
    edits: Tensor | None = None
    step_positions: list[float] | None = None
    positions: float | None = None

    def edits_per_step(self) -> Tensor:
        """``[B, steps]`` int64: generated positions rewritten at each step (zeros when the
        policy does not edit)."""
        if self.edits is None:
            return torch.zeros(self.commit_step.shape[0], self.steps, dtype=torch.long,
                               device=self.commit_step.device)
        return self.edits.sum(2)

    def commits_per_step(self) -> Tensor:
        """``[B, steps]`` int64: generated positions committed at each step (one sync-free
        scatter over ``commit_step``)."""
        b = self.commit_step.shape[0]
        counts = torch.zeros(b, self.steps + 1, dtype=torch.long, device=self.commit_step.device)
        idx = torch.where(self.commit_step >= 0, self.commit_step, self.steps)
        counts.scatter_add_(1, idx, torch.ones_like(idx))
        return counts[:, :self.steps]

    @property
    def answer(self) -> Tensor:
        """``[B, G]`` generated region of the canvas."""
        return self.tokens[:, self.prompt_length :]

    @property
    def nll(self) -> Tensor:
        """``[B]`` sum of -log p of committed tokens along the realised order (nats)."""
        return self.bits.sum(dim=1)

    def rounds_lower_bound(self, budget_nats: float) -> Tensor:
        """``[B]`` bits-to-rounds lower bound: NLL / per-round information budget (ETE)."""
        if budget_nats <= 0:
            raise ValueError(f"budget_nats must be > 0, got {budget_nats}")
        return torch.ceil(self.nll / budget_nats)
