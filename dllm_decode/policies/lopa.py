"""LoPA: lookahead parallel decoding, as a selector of the one loop.

Xu et al., "LoPA: Scaling dLLM Inference via Lookahead Parallel Decoding", arXiv 2512.16229;
reference ``DreamLoRA._generate_enhanced_speculative`` (with ``evaluate_branch_confidence``,
``_generate_additional_branches``, ``sample_tokens``) in zhijie-group/LoPA
``scale_dream_d2f/scale_dream_d2f.py`` @ 433177a. Each step of a block:

1. the step's forward is the **anchor** branch (the canvas as the previous step left it);
   the previous step also spawned up to ``branches`` **lookahead** branches, each the anchor
   plus one more token (the argmax at one of the most confident masked positions), and one
   extra forward runs them all (``state.model.forward``: each branch's block and what follows
   it, against the step's keys left of the block; packed along the sequence, a branch never
   sees another);
2. each branch's confidence is ``alpha * creation + (1 - alpha) * future``: ``future`` the mean
   of the lowest ``max(1, int(n * branch_topp))`` confidences over its ``n`` masked block
   positions (1 when none), ``creation`` the spawned token's confidence (1 for the anchor);
   the highest wins, ties to the earliest lookahead, the anchor last (``force_anchor``: the
   anchor always wins);
3. on the winner, with its logits: commit every masked block position whose top probability is
   ``> threshold`` (strict), else the single most confident one (the D2F rule on a complete
   block), plus the winner's spawned token;
4. from the same logits spawn the next step's lookaheads at the ``branches`` most confident
   masked positions left (ties to the lower position).

A lookahead whose spawned token is the block's last masked position decodes on into the next
block in the same step (its window is then the next block: the reference's branch appends its
next block as soon as its last one is complete), so the loop declares the next block as
``Capabilities.lookahead``. ``branches`` counts lookaheads; the scale script spawns
``branching_factor`` of them and none at ``branching_factor = 1`` (its ``> 1`` guard).

``confidence`` is ``score``: ``neg_entropy`` (the authors' setting, ``sum p log(p + 1e-10)``),
``prob`` (their ``default``) or ``margin`` (top-1 minus top-2 probability). ``branches=0`` is
exactly the base rule (no extra forward).

What is not reproduced: LoPA's headline runs decode with D2F's block pipeline (a new block is
added once the last one is ``tau_add`` decoded, several blocks decode at once, a block becomes
"complete" once its predecessor is ``tau_act`` decoded) on D2F-distilled Dream (LoRA-trained
for it). Here blocks are the loop's, one at a time, always complete: the reference with
``tau_add = 1`` (the recorded cases). Deviations: the branch forwards run as one extra forward
per step (the reference runs one forward per branch; the paper batches or distributes them)
and count one forward and their positions (``Generation.step_positions``); that forward runs
at every step after the first, since whether a row has a lookahead for it is known only on the
device (a row without one does not count it in its NFE); the reference's
prefix K/V are cached when a block completes, here they are whatever the cache plan holds;
the output is the decoded canvas (the reference's EOS stops adding blocks; use
``stop_at_eos``); greedy only (the authors decode at temperature 0); ties of the fallback's
``torch.topk`` go to the lower index; rows of a batch are independent.

``checked=True`` (off by default: the default is the paper's rule and the authors' code, with
the defect below) is a deviation from both. On a block's last step with one masked position
left and no block after it, a lookahead that fills that position has an empty window, so its
``future`` is 1 (as the reference's ``evaluate_branch_confidence``) and it beats the anchor's
negative entropy (<= 0): the step commits the lookahead's token, the previous step's argmax,
which the step's own forward never checked (on shuffle it often repeats a listed name, on
replace_random it leaves the name to replace in place). Measured on the trained
``testbed-llada``, 5 x 48 held-out prompts of copy, shuffle, replace_random and insert_random
at gen 16 (``benchmarks/bench_lopa_checked.py``, ``benchmarks/results/lopa_checked.csv``):
``threshold`` 0.9 99.6 % in 4.25 rounds; ``lopa`` (14 branches) 60.8 % in 2.71;
``checked=True`` 96.3 % in 2.87 (NFE 4.10, branch forwards counted); guard (a) alone 84.6 %
in 2.71. The two guards, applied before the branch forward (a row left without a lookahead
does not count it in its NFE):

(a) a lookahead whose window is empty cannot win (it would win on a score it did not earn);
(b) a lookahead's token must equal the anchor's argmax at its position (the step's own
    forward, on the canvas the lookahead extends). One that disagrees is re-scored without its
    token: without it the branch *is* the anchor (same canvas, logits and score, nothing extra
    to commit), so it is dropped and the anchor stands for it.

Given (b), (a) changes no output (the anchor then commits that last position with the same
token); it is kept so the rule holds on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.base import lowest, to_canvas, topk_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import Selection, StepState

#: the reference's ``sample_tokens`` confidence kinds -> ``Lopa.score`` names
SCORES: Final = ("neg_entropy", "prob", "margin")
#: ``log(p + eps)`` in the reference's negative entropy
NEG_ENTROPY_EPS: Final = 1e-10

#: the paper's Table 5 settings (D2F-Dream; ``threshold`` = tau_conf, ``branches`` = the
#: "LoPA branches" column, read as lookaheads as the scale scripts spawn them)
LOPA_TASKS: Final[dict[str, dict[str, float]]] = {
    "gsm8k": {"threshold": 0.9, "branches": 14}, "math": {"threshold": 0.9, "branches": 7},
    "humaneval": {"threshold": 0.95, "branches": 7}, "mbpp": {"threshold": 0.95, "branches": 7},
}


@dataclass
class LopaMemory:
    """The lookaheads spawned for the next step, ``[B, k]`` each: canvas position (-1: none),
    token and creation confidence."""

    pos: Tensor
    tok: Tensor
    conf: Tensor


@dataclass(frozen=True)
class Lopa:
    """LoPA (see the module docstring)."""

    threshold: float = 0.9
    branches: int = 2
    score: str = "neg_entropy"
    branch_topp: float = 1.0
    alpha: float = 0.0
    force_anchor: bool = False
    #: the two guards (see the module docstring): a deviation from the paper, off by default
    checked: bool = False
    #: set by ``bind``: (logit shift, the cache plan keeps a suffix after the block (dual),
    #: the block length: how far a lookahead that completes its block reaches)
    layout: tuple[int, bool, int] = field(default=(0, False, 0), repr=False)

    def __post_init__(self) -> None:
        check_fields(self, "Lopa")
        check_range("Lopa", "threshold", self.threshold, 0.0, 1.0)
        check_range("Lopa", "branches", self.branches, 0)
        check_range("Lopa", "branch_topp", self.branch_topp, 0.0, 1.0)
        check_range("Lopa", "alpha", self.alpha, 0.0, 1.0)
        if self.score not in SCORES:
            raise ValueError(f"Lopa.score must be one of {SCORES}, got {self.score!r}")

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; reads the step's logits; with branches, extra forwards and the next
        block as lookahead (a branch whose spawned token completes the block decodes on into
        the next one, as the reference's branch appends its next block)."""
        k = self.branches
        return Capabilities(budgeted=False, needs_logits=True, proposal_fields=(),
                            extra_forwards=k > 0, lookahead=self.layout[2] if k else 0)

    def bind(self, model: Any, cfg: Any = None) -> Lopa:
        """Check the settings; record the model's logit shift, whether the cache plan keeps
        a suffix after the block (``dual``) and the block length."""
        if cfg is not None and cfg.temperature > 0:
            raise ValueError("lopa decodes greedily (the authors' runs use temperature 0); "
                             f"got temperature={cfg.temperature}")
        cache = getattr(getattr(cfg, "cache", None), "value", "none")
        if cache in ("window", "sub_block"):
            raise ValueError(f"lopa's branch forwards need the step's keys left of the block; "
                             f"cache={cache!r} feeds per-row position sets: use none, prefix, "
                             "dual, block_causal or dllm_cache")
        block = (getattr(model, "block_size", None) or getattr(cfg, "block_length", None)
                 or getattr(cfg, "gen_length", 0))
        return replace(self, layout=(int(getattr(model, "logit_shift", 0)), cache == "dual",
                                     int(block)))

    def init_memory(self, batch: int, length: int, device: torch.device) -> LopaMemory:
        k = self.branches
        return LopaMemory(torch.full((batch, k), -1, dtype=torch.long, device=device),
                          torch.zeros(batch, k, dtype=torch.long, device=device),
                          torch.zeros(batch, k, dtype=torch.float64, device=device))

    def _stats(self, state: StepState, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``logits [..., V]`` -> argmax, its probability and ``score`` ``[...]``."""
        probs = state.model.probs(logits)
        top = probs.topk(2, dim=-1)
        pmax, tok = top.values[..., 0], top.indices[..., 0]
        if self.score == "prob":
            conf = pmax
        elif self.score == "margin":
            conf = top.values[..., 0] - top.values[..., 1]
        else:
            conf = (probs * torch.log(probs + NEG_ENTROPY_EPS)).sum(-1)
        return tok, pmax.double(), conf.double()

    def _future(self, conf: Tensor, masked: Tensor) -> Tensor:
        """``[..., L]`` confidences over ``masked`` -> ``[...]`` mean of the lowest
        ``max(1, int(n * branch_topp))`` (1 where nothing is masked)."""
        n = masked.sum(-1)
        keep = (n * self.branch_topp).long().clamp(min=1)
        low = torch.where(masked, conf, torch.inf).sort(-1).values
        take = torch.arange(conf.shape[-1], device=conf.device) < keep[..., None]
        mean = torch.where(take & (low < torch.inf), low, 0.0).sum(-1) / keep
        return torch.where(n > 0, mean, 1.0)

    def select(self, state: StepState) -> Selection:
        """Commit the winner's fill and spawned token (see the module docstring)."""
        b, length = state.eligible.shape
        device = state.eligible.device
        pos = torch.arange(length, device=device)
        eligible = state.eligible
        block = eligible & (pos < state.block_end)  # the anchor's window: the block
        after = eligible & (pos >= state.block_end)  # the next block (lookahead)
        windows = [block[:, None]]
        anchor = self._widened(state)
        stats = [[x[:, None] for x in anchor]]
        creation = [torch.ones(b, 1, dtype=torch.float64, device=device)]
        memory: LopaMemory = state.memory
        k = self.branches
        at = valid = None
        if k and state.step > 0:  # spawned by the previous step (none before the first)
            spot = memory.pos.clamp(min=0)
            valid = (memory.pos >= 0) & eligible.gather(1, spot)  # [B, k]
            at = torch.nn.functional.one_hot(spot, length).bool()
            left = block[:, None] & ~at  # a lookahead that completes the block decodes on
            ahead = torch.where(left.any(-1, keepdim=True), left, after[:, None])  # [B, k, L]
            if self.checked:  # (a) a window to earn its score; (b) the anchor's own argmax
                valid = valid & ahead.any(-1) & (anchor[0].gather(1, spot) == memory.tok)
            at = at & valid[..., None]
            windows.insert(0, ahead)
            stats.insert(0, self._lookaheads(state, at, memory.tok, valid))
            creation.insert(0, torch.where(valid, memory.conf, lowest(torch.float64)))
        tok, pmax, conf = (torch.cat(x, 1) for x in zip(*stats, strict=True))
        window, created = torch.cat(windows, 1), torch.cat(creation, 1)  # [B, k' + 1, ...]
        score = self.alpha * created + (1 - self.alpha) * self._future(conf, window)
        if valid is not None:
            score[:, :-1] = torch.where(valid, score[:, :-1], -torch.inf)
        last = score.shape[1] - 1
        win = (torch.full((b,), last, device=device) if self.force_anchor
               else score.argmax(1))  # first max: lookaheads in spawn order, the anchor last
        pick = win[:, None, None].expand(-1, 1, length)
        w_tok, w_pmax, w_conf, w_window = (x.gather(1, pick)[:, 0] for x in
                                           (tok, pmax, conf, window))
        fill = w_window & (w_pmax > self.threshold)
        best = topk_mask(w_conf, w_window, torch.ones_like(win))
        fill = torch.where(fill.any(1, keepdim=True), fill, best)
        commit, tokens = fill, w_tok
        if at is not None:  # a lookahead winner also commits its spawned token
            lw = win.clamp(max=last - 1)[:, None]
            extra = at.gather(1, lw[..., None].expand(-1, 1, length))[:, 0] & \
                (win < last)[:, None]
            tokens = torch.where(extra, memory.tok.gather(1, lw), tokens)
            commit = commit | extra
        if k:
            self._spawn(memory, w_window & ~fill, w_conf, w_tok)
        return Selection(commit & eligible, tokens)

    def _widened(self, state: StepState) -> list[Tensor]:
        """The anchor's argmax, top probability and confidence ``[B, L]`` from the step's
        logits (zeros outside the fed rows)."""
        length = state.eligible.shape[1]
        return [to_canvas(x, state.rows, length) for x in self._stats(state, state.logits)]

    def _lookaheads(self, state: StepState, at: Tensor, spawn_tok: Tensor, valid: Tensor
                    ) -> list[Tensor]:
        """One extra forward of the ``k`` lookahead branches (``at [B, k, L]``: each one's
        spawned position, ``spawn_tok [B, k]`` its token) -> their argmax, top probability and
        confidence ``[B, k, L]``. Each branch feeds its block and what follows it (to the end
        of the next block on block-causal models and with a dual cache) against the step's
        keys left of the block (and the dual cache's suffix). Rows without a valid lookahead
        do not count the forward in their NFE."""
        model = state.model
        shift, suffix, block = self.layout
        b, k, length = at.shape
        device = at.device
        bsz = model.block_size
        start = (state.block_start // bsz) * bsz if bsz else state.block_start
        s0 = max(start - 1, 0) if shift else start
        s1 = min(state.block_end + block, length) if (bsz or suffix) else length
        n = s1 - s0
        canvas = state.canvas[:, None, :].expand(-1, k, -1)
        branch = torch.where(at, spawn_tok[..., None], canvas)[:, :, s0:s1]  # [B, k, N]
        keys = torch.arange(length, device=device)
        outside = (keys < s0) | (suffix & (keys >= s1))
        left = (model.valid & outside[None])[:, None, :].expand(-1, k * n, -1)
        rows = torch.arange(k * n, device=device) // n
        same = (rows[:, None] == rows[None, :])[None] & model.valid[:, s0:s1].repeat(1, k)[
            :, None, :]
        if bsz:  # block-causal inside the span (it crosses a block boundary)
            blk = (torch.arange(s0, s1, device=device) // bsz).repeat(k)
            same = same & (blk[None, :] <= blk[:, None])[None]
        logits = model.forward(branch.reshape(b, k * n), model.positions[:, s0:s1].repeat(1, k),
                               torch.cat([left, same], 2), active=valid.any(1))
        out = []
        for x in self._stats(state, logits.view(b, k, n, -1)):
            full = torch.zeros((b, k, length), dtype=x.dtype, device=device)
            full[:, :, s0:s1] = x
            out.append(full)
        return out

    def _spawn(self, memory: LopaMemory, left: Tensor, conf: Tensor, tok: Tensor) -> None:
        """The next step's lookaheads: the ``branches`` most confident positions of ``left``
        (ties to the lower position), their argmax tokens and confidences."""
        k = self.branches
        key = torch.where(left, conf, lowest(conf.dtype))
        order = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :k]
        ok = left.gather(1, order)
        memory.pos = torch.where(ok, order, -1)
        memory.tok = tok.gather(1, order)
        memory.conf = conf.gather(1, order)


def lopa_policy(threshold: float | None = None, branches: int | None = None,
                task: str = "gsm8k", score: str = "neg_entropy", branch_topp: float = 1.0,
                alpha: float = 0.0, force_anchor: bool = False, checked: bool = False) -> Lopa:
    """The ``lopa`` preset: the paper's Table 5 settings for ``task`` (GSM8K: ``threshold``
    0.9, 14 lookahead branches; ``LOPA_TASKS``), the shipped script's ``neg_entropy``
    confidence, ``branch_topp = 1``, ``alpha = 0``; explicit arguments override.
    ``checked=True`` adds the two guards of the module docstring (a deviation)."""
    if task not in LOPA_TASKS:
        raise ValueError(f"lopa task must be one of {sorted(LOPA_TASKS)}, got {task!r}")
    preset = LOPA_TASKS[task]
    return Lopa(threshold=preset["threshold"] if threshold is None else threshold,
                branches=int(preset["branches"]) if branches is None else branches,
                score=score, branch_topp=branch_topp, alpha=alpha, force_anchor=force_anchor,
                checked=checked)
