"""DAWN: dependency-aware parallel decoding from the model's own attention, as a selector.

Luo et al., "DAWN: Dependency-Aware Fast Inference for Diffusion LLMs", arXiv 2602.06953;
reference ``get_transfer_index_dawn`` in ``lizhuo-luo/DAWN`` ``llada/generate.py`` (+
``llada/gdllm_utils.py``, the attention of ``llada/model/modeling_llada.py``) @ ab42898. Each
step reads ``A = StepState.attention`` (``[B, L, L]``, query row, key column: the softmax
attention of the model's last ``attention_layers`` layers, head-averaged, then averaged over the
layers, from the step's own forward; ``Capabilities(attention_maps=n)``) and the confidences
``c`` (``proposal.prob``, every position up to the block's end, prompt included):

1. **sinks**: key columns whose mean incoming attention over the query rows exceeds
   ``tau_sink`` are zeroed, then the diagonal (no renormalisation); an edge ``i -> j`` ("j
   depends on i") is ``A[j, i] >= tau_edge``;
2. ``H``: eligible (masked, in the block) positions with ``c >= tau_high`` (0.9, hard-coded
   in the reference);
3. ``I``: eligible positions with ``c >= tau_induce`` and an edge from an *anchor*: a position
   that is not masked (prompt, committed), before the block's end, with ``c >= tau_high``
   (the model's current top-1 probability there, not that of its token);
4. ``X``: positions with an edge from ``I`` and ``H`` at once (``I ∩ H``, as coded; the README
   suggests ``I ∪ H``: ``neighbours="union"``);
5. ``C``: among the other eligible positions with ``c >= tau_low`` (not in ``H``, ``I``,
   ``X``), greedily the most confident one (ties to the lower index), dropping its conflict
   neighbours (an edge either way), until none is left: a maximal independent set;
6. commit ``H ∪ I ∪ C``; a row with nothing commits its most confident eligible position.

No cache (refused: a cached forward has no ``L x L`` map), no EOS stop, one forward per step.

**The position-0 quirk** (reproduced by default; ``checked=True`` fixes it): the reference's
greedy loop (``select_parallel_tokens_conflict_mis``) runs ``|N|`` iterations (``N`` the
candidates of step 5) whatever the conflicts removed; once no candidate is left,
``argmax`` over an all ``-inf`` row returns index 0, and the canvas's position 0 (the first
prompt token) is overwritten with the model's argmax there. Here that is an edit of the row's
first position (``Capabilities(edits=True, edits_prompt=True)``; the row's first valid
position under left padding, so a row decodes as alone) whenever the greedy set is smaller
than ``N``. ``checked=True`` stops the loop when no candidate is left (no edit).

Deviations, each documented where it lives: the confidence is the proposal's probability
(float32, mask token removed; ``rng="reference"`` keeps its column, as the reference's float64
softmax does); the sink mean runs over each row's valid (not left-padding) query rows, which is
the reference's mean when there is no padding; rows of a batch are independent (the
reference's batch-wide ``min()`` tests run the greedy set and the fallback for all rows when
one row needs them; its recorded runs use batch 1). Defaults: ``generate()``'s (LLaDA); the
authors' Dream scripts use tau_sink 0.03, tau_edge 0.10, tau_induce 0.75, tau_low 0.8
(``diffusion_generate``'s own defaults: tau_induce 0.9, the others as LLaDA's).

**Dream** (``dream/model/generation_utils.py`` ``_sample_block``, ``alg == 'dawn'``, same
commit): the same rule, step for step (``tau_low`` is its ``conf_threshold``; its nodes test
``c < 0.9`` where LLaDA's drop ``H``: the same set), on the shifted logits, with the
confidence of its ``sample_tokens`` (an fp32 softmax over the whole vocabulary, not LLaDA's
float64: ``rng="reference"`` keeps the mask column); the quirk writes at position 0 the
shifted argmax there (the raw output of position 0), as the library's Dream proposal does;
the layer cut-off is ``>= 24`` of Dream-7B's 28 (4 layers, the default). A
``diffusion_generate`` call that leaves ``top_k`` out inherits the model config's legacy
``top_k=50``, which filters the softmax behind the confidences (the authors' ``eval.py``
passes ``top_k=None``): pass ``top_k=50`` to reproduce such a call. Not reproduced: the
reference's padded batches (its modeling ignores the ``tok_idx`` positions it is given and
its attention-map helper adds the boolean padding mask, +1, instead of masking); here a
padded row decodes as alone. Checked token for token (canvas, NFE, each step's sets) on 14
cases recorded from that code on the conformance Dream checkpoint (``dawn_dream.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from dllm_decode.policies.base import top1_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import Selection, StepState

_NEIGHBOURS = ("intersection", "union")


class DawnSets(NamedTuple):
    """One step's sets, ``[B, L]`` bool each: ``high`` (H), ``induced`` (I), ``free`` (C, the
    conflict-free set), ``fallback`` (the best eligible position of rows with nothing else)
    and ``overwrite`` (the quirk's edit of the row's first position; all False when
    ``checked``)."""

    high: Tensor
    induced: Tensor
    free: Tensor
    fallback: Tensor
    overwrite: Tensor


@dataclass(frozen=True)
class Dawn:
    """DAWN's selector (see the module docstring). ``attention_layers``: the last layers whose
    attention is averaged (the reference's ``layer >= 28`` of LLaDA-8B's 32, Dream's ``>= 24``
    of 28: 4)."""

    tau_sink: float = 0.01
    tau_edge: float = 0.07
    tau_induce: float = 0.7
    tau_low: float = 0.7
    tau_high: float = 0.9
    attention_layers: int = 4
    checked: bool = False
    neighbours: str = "intersection"

    def __post_init__(self) -> None:
        check_fields(self, "Dawn")
        check_range("Dawn", "tau_sink", self.tau_sink, 0.0, 1.0)
        check_range("Dawn", "tau_edge", self.tau_edge, 0.0, 1.0, lo_open=True)
        for name in ("tau_induce", "tau_low", "tau_high"):
            check_range("Dawn", name, getattr(self, name), 0.0, 1.0)
        check_range("Dawn", "attention_layers", self.attention_layers, 1)
        if self.neighbours not in _NEIGHBOURS:
            raise ValueError(f"Dawn: neighbours must be one of {_NEIGHBOURS}, got "
                             f"{self.neighbours!r}")

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; the attention maps of the last ``attention_layers`` layers; the quirk's
        prompt edit unless ``checked``."""
        return Capabilities(budgeted=False, proposal_fields=(),
                            attention_maps=self.attention_layers, edits=not self.checked,
                            edits_prompt=not self.checked)

    def bind(self, model: Any, cfg: Any = None) -> Dawn:
        """Refuse a model that cannot materialise its attention maps, or a cache mode."""
        capture = getattr(model, "capture_attention", None)
        if not callable(capture):
            raise ValueError(f"dawn reads the model's attention maps; this model "
                             f"({type(model).__name__}) cannot materialise them: use a "
                             "DecoderLM checkpoint (LLaDA, Dream, SDAR)")
        capture(self.attention_layers)  # checks the layer count and kind
        cache = getattr(getattr(cfg, "cache", None), "value", "none")
        if cache != "none":
            raise ValueError(f"dawn needs cache='none' (an L x L attention map per step; the "
                             f"authors run without a cache), got cache={cache!r}")
        return self

    def sets(self, state: StepState) -> DawnSets:
        """H, I, C, the fallback and the quirk's edit for ``state`` (no host sync)."""
        attn = state.attention
        if attn is None:
            raise ValueError("dawn needs StepState.attention (declared through "
                             "Capabilities(attention_maps=...)); the loop gave none")
        prob, eligible = state.proposal.prob, state.eligible
        length = prob.shape[1]
        device = prob.device
        pos = torch.arange(length, device=device)
        valid = state.model.valid if state.model is not None else torch.ones_like(eligible)
        # 1. sink columns (mean over the valid query rows; every row without padding)
        n_valid = valid.sum(1, keepdim=True)
        padded_mean = (attn * valid[:, :, None]).sum(1) / n_valid
        col_mean = torch.where(n_valid == length, attn.mean(1), padded_mean)
        sinks = col_mean > self.tau_sink
        attn = attn.masked_fill(sinks[:, None, :], 0.0)
        attn = attn.masked_fill((pos[:, None] == pos[None, :])[None], 0.0)
        edge = attn >= self.tau_edge  # edge[b, j, i]: i -> j (query j attends to key i)
        # 2-4. H, anchors, I, excluded neighbours
        high = eligible & (prob >= self.tau_high)
        anchors = ~state.masked & (pos < state.block_end)[None] & (prob >= self.tau_high) & (
            state.fresh)
        induced = eligible & (prob >= self.tau_induce) & (edge & anchors[:, None, :]).any(2)
        source = (induced & high) if self.neighbours == "intersection" else (induced | high)
        excluded = (edge & source[:, None, :]).any(2)
        nodes = eligible & (prob >= self.tau_low) & ~high & ~induced & ~excluded
        # 5. the greedy conflict-free set over the block's window
        free, quirk = self._greedy(state, nodes, prob, edge)
        commit = high | induced | free
        fallback = top1_mask(prob, eligible) & ~commit.any(1, keepdim=True)
        first = valid.int().argmax(1, keepdim=True)  # the row's first valid position
        overwrite = (pos[None] == first) & quirk[:, None]
        return DawnSets(high, induced, free, fallback, overwrite)

    def _greedy(self, state: StepState, nodes: Tensor, prob: Tensor,
                edge: Tensor) -> tuple[Tensor, Tensor]:
        """``(C [B, L], quirk [B])``: the greedy maximal independent set of ``nodes`` under
        the conflict graph (an edge either way), most confident first, ties to the lower index;
        ``quirk``: the reference's loop would have gone on past the candidates (``|C| < |N|``,
        never when ``checked``). At most the block's width of iterations, no host sync."""
        bs, be = int(state.block_start), state.block_end
        width = be - bs
        cand = nodes[:, bs:be]
        sub = edge[:, bs:be, bs:be]
        conflict = sub | sub.transpose(1, 2)
        score = torch.where(cand, prob[:, bs:be], -torch.inf)
        chosen = torch.zeros_like(cand)
        idx = torch.arange(width, device=prob.device)[None]
        n_masked = state.extras.get("n_masked")
        rounds = min(width, n_masked) if isinstance(n_masked, int) else width
        for _ in range(rounds):  # a host bound: each round takes one candidate or none
            best = score.argmax(1, keepdim=True)  # [B, 1] first maximum
            take = cand.gather(1, best)  # [B, 1] a candidate was left
            pick = (idx == best) & take
            near = conflict.gather(1, best[:, :, None].expand(-1, 1, width))[:, 0] & take
            chosen = chosen | pick
            cand = cand & ~pick & ~near
            score = score.masked_fill(~cand, -torch.inf)
        free = torch.zeros_like(nodes)
        free[:, bs:be] = chosen
        if self.checked:
            return free, torch.zeros_like(nodes[:, 0])
        return free, nodes.sum(1) > chosen.sum(1)

    def select(self, state: StepState) -> Tensor | Selection:
        """``H ∪ I ∪ C`` (or the fallback); with the quirk, ``Selection.edit`` of the row's
        first position (its token: the proposal's argmax there)."""
        sets = self.sets(state)
        commit = sets.high | sets.induced | sets.free | sets.fallback
        if self.checked or state.editable is None:
            return commit
        return Selection(commit, None, None, sets.overwrite & state.editable)
