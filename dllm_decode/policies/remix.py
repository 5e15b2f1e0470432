"""ReMix (Rejection Mixing): a continuous mask / token input state with rejection, as a selector.

Paper: "ReMix: Rejection Mixing for Fast Diffusion LLM Decoding", arXiv 2602.22868; reference
``decoding_remix`` in ``Serpientw/ReMix-DLLM`` ``LLaDA/model/decoding.py`` @ aea1fd9 (built on
WINO's codebase). A still-masked position of the current block is fed to the model not as the
mask embedding but as a mix of it and the embeddings of the tokens predicted there at the
previous step (``Capabilities(soft_inputs=True)``: the loop hands the fed embeddings to
``mix_inputs`` before the forward, ``models.soft_inputs``). With ``W [V, H]`` the input
embedding, ``e = W[mask]``, ``h [V]`` a position's stored distribution (``RemixMemory``):

1. **inputs** (from the block's 2nd forward; the generation's 3rd in block 0): for each masked
   position of the block (``[0, block_end)``), the top 50 of ``h`` (descending) with cumulative
   sums ``S_k``; ``alpha = clip(2 max h, 0.2, 0.9)``; the entries with ``S_k <= alpha`` are
   kept, the top-1 always; ``q`` = their mass (not renormalised);
   ``soft = sum_kept h_v W_v + (1 - q) e``; the input is ``(1 - beta_mix) e + beta_mix soft``.
   Later blocks' masks keep ``e``, committed positions their token's embedding;
2. **commit** (WINO's wide-in rule, ``policies.wino.WideIn``): the masked block positions with
   confidence ``c = p(argmax)`` strictly above ``threshold``, at most
   ``min(max(int(0.7 n), 5), 20)`` of them (``n``: the row's masked block positions before the
   step; the most confident kept), else the single most confident one. ``p`` is the softmax of
   the step's logits in their dtype (the model's: bf16 with the released weights);
3. **rejection** (every forward but the generation's first, which only stores ``h = p``): for
   each position still masked in the block after the commits, the Jensen-Shannon divergence
   ``JS(h, p)`` in float32, both floored at float32 eps (no renormalisation); ``JS >
   js_threshold`` *rejects* the position: ``h = p`` for every position, the rejected rows set
   to zero, so the next step feeds them the pure mask embedding (``q = 0``).

No cache (the authors' loop has none; refused), no CFG, no EOS handling; one forward per step;
NFE = forwards, as the reference counts them. ``temperature`` is ignored, as in the reference
(argmax): the selector declares ``samples_tokens`` and draws nothing, so the proposal stays
greedy at any temperature.

**The sticky-rejection quirk** (reproduced by default, ``sticky=True``): a rejected row is
stored as zeros, so the next JS compares the eps-floored zero row with a real distribution:
``JS ~ ln 2 / 2 ~ 0.35`` (0.32-0.35 at the released vocabulary; near ``ln 2 / 2`` for any
sharp ``p``), above the default ``js_threshold`` 0.3, and the position is rejected again at
every later step until it commits: it never re-enters the mixing state. ``sticky=False`` keeps
the previous distribution for the JS test (a rejected position is fed the mask embedding for
one step, then tested against its real last prediction).

Deviations, each documented where it lives: ``p`` keeps the mask token's column, as the
reference's softmax does, but the committed token is the proposal's (the argmax without the
mask token: the reference would write a mask token that wins its argmax, the library never
does); the soft embedding sums the kept top-50 rows of ``W``
(the reference multiplies a dense ``[L, V]`` by ``W``: the same sum, another order); the
reference mixes every mask before the block's end, here the block's (the same set, except
prompt masks under ``allow_prompt_masks``, fed the mask embedding); ``h`` is held for every
position (``[B, L, V]`` in the logits' dtype, as the reference's ``[1, L, V]``); rows of a batch
are independent (the reference decodes one row: its flat top-k cap works on batch size 1
only), and a row whose block is complete keeps its ``h`` while its neighbours decode. The
reference is LLaDA-only; Dream-family models run it on their shifted logits (the soft state of
position ``i`` mixes the predictions for ``i``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.base import topk_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.policies.wino import WideIn
from dllm_decode.types import StepState

#: ``(threshold, beta_mix)`` of the authors' LLaDA-8B-Instruct configs (``LLaDA/configs/*.yaml``,
#: js_threshold 0.3 in every one; gen_length 256, block_length 128)
REMIX_TASKS: Final[dict[str, tuple[float, float]]] = {
    "gsm8k": (0.9, 0.5), "math500": (0.8, 0.5), "humaneval": (0.8, 0.5), "mbpp": (0.8, 0.5),
    "arc_easy": (0.8, 0.5), "arc_challenge": (0.8, 0.5), "countdown": (0.8, 0.6),
    "sudoku": (0.8, 0.6)}

#: the reference's hard-coded soft-embedding constants: top-k, nucleus mass clip
TOP_K: Final = 50
ALPHA_MIN: Final = 0.2
ALPHA_MAX: Final = 0.9


@dataclass
class RemixMemory:
    """Per-generation ReMix state: ``h [B, L, V]`` the last forward's distribution per position
    (the logits' dtype; ``None`` before the first forward) and ``rejected [B, L]`` bool, the
    positions the last JS test rejected (the reference's zeroed rows)."""

    h: Tensor | None
    rejected: Tensor


def soft_embedding(h: Tensor, weight: Tensor, mask_embed: Tensor, top_k: int = TOP_K) -> Tensor:
    """The reference's soft embedding of distributions ``h [..., V]``: ``[..., H]``.

    The top ``top_k`` entries (descending), kept while their cumulative mass is ``<= clip(2
    max h, 0.2, 0.9)`` (the top-1 always), weight their rows of ``weight [V, H]``; the mass left
    (``1 - kept``) weights ``mask_embed [H]``. A zero row gives ``mask_embed``.
    """
    k = min(top_k, h.shape[-1])
    probs, idx = torch.topk(h, k=k, dim=-1)
    cum = torch.cumsum(probs, dim=-1)
    alpha = (2 * probs[..., :1]).clamp(min=ALPHA_MIN, max=ALPHA_MAX)
    keep = cum <= alpha
    keep[..., 0] = True
    kept = torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
    mass = kept.sum(-1, keepdim=True).clamp(0.0, 1.0)
    rows = weight[idx]  # [..., k, H]
    return (kept[..., None] * rows).sum(-2) + (1.0 - mass) * mask_embed


def js_divergence(prev: Tensor, curr: Tensor) -> Tensor:
    """``[...]`` float32 Jensen-Shannon divergence of ``prev, curr [..., V]`` as the reference
    computes it: both floored at float32 eps (not renormalised), ``0.5 KL(prev||m) +
    0.5 KL(curr||m)`` with ``m`` their mean."""
    eps = torch.finfo(torch.float32).eps
    a, b = prev.clamp_min(eps).float(), curr.clamp_min(eps).float()
    m_log = (0.5 * (a + b)).log()
    return 0.5 * ((a * (a.log() - m_log)).sum(-1) + (b * (b.log() - m_log)).sum(-1))


@dataclass(frozen=True)
class Remix:
    """ReMix (see the module docstring): ``threshold`` tau (strict), ``js_threshold`` delta,
    ``beta_mix`` beta; ``sticky`` the rejection quirk; the cap's constants are WINO's."""

    threshold: float = 0.9
    js_threshold: float = 0.3
    beta_mix: float = 0.5
    sticky: bool = True
    accept_ratio: float = 0.7
    accept_min: int = 5
    accept_max: int = 20

    def __post_init__(self) -> None:
        check_fields(self, "Remix")
        check_range("Remix", "threshold", self.threshold, 0.0, 1.0)
        check_range("Remix", "js_threshold", self.js_threshold, 0.0)
        check_range("Remix", "beta_mix", self.beta_mix, 0.0, 1.0)
        WideIn(self.threshold, self.accept_ratio, self.accept_min, self.accept_max)

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; the logits of every position from the generation's start (``h``), the soft
        input state; no proposal field beyond the token."""
        return Capabilities(budgeted=False, needs_logits=True, full_span=True,
                            proposal_fields=(), soft_inputs=True, samples_tokens=True)

    def bind(self, model: Any, cfg: Any = None) -> Remix:
        """Refuse a model whose input embeddings cannot be replaced, a cache mode or CFG."""
        if not callable(getattr(model, "feed_embeddings", None)):
            raise ValueError(f"remix feeds soft input embeddings; this model "
                             f"({type(model).__name__}) has no input-embedding path: use a "
                             "DecoderLM checkpoint (LLaDA, Dream, SDAR)")
        cache = getattr(getattr(cfg, "cache", None), "value", "none")
        if cache != "none":
            raise ValueError(f"remix needs cache='none' (the authors' loop recomputes every "
                             f"position from its soft inputs), got cache={cache!r}")
        if getattr(cfg, "cfg_scale", 0.0) > 0:
            raise ValueError("remix runs without CFG (the authors' loop has none)")
        return self

    def init_memory(self, batch: int, length: int, device: torch.device) -> RemixMemory:
        return RemixMemory(None, torch.zeros(batch, length, dtype=torch.bool, device=device))

    def mix_inputs(self, embeds: Tensor, canvas: Tensor, memory: RemixMemory, weight: Tensor,
                    mask_id: int, block: tuple[int, int], step: int, block_step: int
                    ) -> Tensor:
        """The step's input embeddings ``[B, L, H]`` from ``embeds`` (the canvas tokens'):
        the masked positions of the block ``[block_start, block_end)`` mixed when the state is
        ready (the block's 2nd forward on, the generation's 3rd), else ``embeds`` itself. The
        soft embeddings cost ``O(W * 50 * H)`` for a block of ``W`` (the reference's dense
        ``[L, V] @ [V, H]``: ``O(L * V * H)``)."""
        if not isinstance(memory, RemixMemory):  # a stopper's ``Supervised``: PairedMemory
            memory = memory.selector
        if memory.h is None or block_step < 1 or step < 2:
            return embeds
        bs, be = int(block[0]), block[1]  # masks before the block: none in the loop
        masked = canvas[:, bs:be] == mask_id  # [B, W]
        # a rejected position: a zero row (q = 0), the pure mask embedding
        h = memory.h[:, bs:be].masked_fill(memory.rejected[:, bs:be, None], 0.0)
        soft = soft_embedding(h.to(weight.dtype), weight, weight[mask_id]).to(embeds.dtype)
        mixed = (1 - self.beta_mix) * embeds[:, bs:be] + self.beta_mix * soft
        out = embeds.clone()
        out[:, bs:be] = torch.where(masked[..., None], mixed, embeds[:, bs:be])
        return out

    def select(self, state: StepState) -> Tensor:
        """``[B, L]`` commits (wide-in on ``p(argmax)``), then the history update."""
        logits, rows = state.logits, state.rows
        if logits is None or rows is None or rows.dim() != 1:
            raise ValueError("remix needs the step's logits over a contiguous span "
                             "(Capabilities(needs_logits=True), cache='none')")
        mask_id = getattr(state.model, "mask_token_id", None)
        if state.mask_logit is not None and mask_id is not None:  # the reference's softmax
            logits = logits.clone()  # keeps the mask column (the proposal removed it)
            logits[..., mask_id] = state.mask_logit.to(logits.dtype)
        p = torch.softmax(logits, dim=-1)  # [B, R, V] in the logits' dtype (the reference's)
        b, length = state.eligible.shape
        memory: RemixMemory = state.memory
        if memory.h is None:
            memory.h = torch.zeros(b, length, p.shape[-1], dtype=p.dtype, device=p.device)
        tokens = state.proposal.tokens.index_select(1, rows)
        conf = torch.zeros(b, length, dtype=p.dtype, device=p.device)
        conf[:, rows] = p.gather(-1, tokens[..., None])[..., 0]
        eligible = state.eligible
        n = eligible.sum(1)
        cap = (n * self.accept_ratio).long().clamp(self.accept_min, self.accept_max)
        high = eligible & (conf > self.threshold)
        count = high.sum(1)
        k = torch.where(count > cap, cap, count.clamp(min=1))
        commit = topk_mask(conf, eligible, k)  # ties to the lower index
        self._update(state, memory, p, rows, eligible & ~commit)
        return commit

    def _update(self, state: StepState, memory: RemixMemory, p: Tensor, rows: Tensor,
                still: Tensor) -> None:
        """``h <- p`` (the rows the forward scored) and the JS rejections of the positions
        ``still [B, L]`` masked in the block (none at the generation's first forward). Rows
        with no eligible position this step (a complete block waiting for its batch) keep
        their state."""
        active = state.eligible.any(1)  # [B]
        h_rows = memory.h[:, rows]  # [B, R, V]
        if state.step != 0:  # the generation's first forward only stores p
            prev = h_rows.masked_fill(memory.rejected[:, rows, None], 0.0) if self.sticky \
                else h_rows
            js = js_divergence(prev, p)  # [B, R]
            rejected = torch.zeros_like(memory.rejected)
            rejected[:, rows] = still[:, rows] & (js > self.js_threshold)
            memory.rejected = torch.where(active[:, None], rejected, memory.rejected)
        memory.h[:, rows] = torch.where(active[:, None, None], p.to(memory.h.dtype), h_rows)


def remix_policy(threshold: float | None = None, js_threshold: float = 0.3,
                 beta_mix: float | None = None, task: str = "gsm8k", sticky: bool = True,
                 accept_ratio: float = 0.7, accept_min: int = 5, accept_max: int = 20) -> Remix:
    """The ``remix`` preset: the authors' LLaDA-8B-Instruct settings (``task`` picks
    ``threshold`` and ``beta_mix`` from ``REMIX_TASKS``: GSM8K 0.9 / 0.5 by default; the
    arguments override them; js_threshold 0.3). The authors decode 256 tokens in blocks of 128
    (``gen_length=256, block_length=128``)."""
    if task not in REMIX_TASKS:
        raise ValueError(f"remix task must be one of {sorted(REMIX_TASKS)}, got {task!r}")
    tau, beta = REMIX_TASKS[task]
    return Remix(threshold=tau if threshold is None else threshold, js_threshold=js_threshold,
                 beta_mix=beta if beta_mix is None else beta_mix, sticky=sticky,
                 accept_ratio=accept_ratio, accept_min=accept_min, accept_max=accept_max)
