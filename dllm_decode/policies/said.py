"""SAID: scaffold-aware iterative decoding, a stage schedule feeding a top-k selector.

Paper: "Accelerating Diffusion-Based Language Models via Scaffold-Aware Iterative Decoding",
arXiv 2606.04974; code ``TH-AI-Lab-PKU/SAID`` @ a2d7f60. Both of the repository's rules are
here, each an order/stage schedule (which masked positions are candidates at a step, how many
of them commit) over the top-k of the confidence ``p(argmax)``:

* ``said`` (``variant="v1"``, ``SAID-v1/my_generate_said.py::generate``, the README's method):
  one block over the whole answer. **Scaffold**: the answer positions with an even canvas index
  (prompt included: the parity moves with the prompt length) over ``T`` steps, ``|S|`` split
  evenly, the remainder to the first steps (``T`` forwards even when some commit nothing).
  **Probe**: one forward commits nothing; the odd positions with ``p >= easy_threshold``
  (0.8) are *easy*, the rest *hard*. **Easy**: one forward commits every easy position.
  **Hard**: up to ``hard_steps`` (3) forwards, ``|Hard|`` split evenly, top-k among the hard
  ones. NFE ``T + 1 + [easy] + min(3, |hard|)``; always greedy. The code has no blocks; with
  ``block_length < gen_length`` the schedule runs in each block (``T = steps // n_blocks``).
* ``said_block`` (``variant="block"``, ``SAID-block/generate_said.py::generate_said``, the
  LLaDA-1.5 configs): per block of ``B``, the offsets split into ``K = num_stages`` stages,
  coarsest grid first (K = 3: ``0 mod 4``, then ``2 mod 4``, then odd), with
  ``compute_stage_steps(K, steps // n_blocks, rec_steps)`` forwards (decreasing, the last
  stage ``rec_steps``); each stage is LLaDA's loop restricted to its positions.

Stop-id demotion (``demote_stops``, the configs' ``confidence_eos_eot_inf=True``): after the
argmax, the logits of EOS and EoT (the code's literals 126081 / 126348; here the model's
``eos_token_ids`` and ``eot_token_id``) are set to -inf before the softmax, so a position
proposing a stop id ranks last (confidence 0) and the others are renormalised without them:
``p / (1 - p_stop)``, computed here from ``state.logits`` (so it holds under either proposal
softmax). v1's probe ranks by the plain ``p``. The code's ``logits_eos_inf`` is the sampler's
option of that name.

Code quirks reproduced by default, each with its fix:

* **idle forwards** (``idle_forwards=True``): v1's probe sees the canvas the easy step sees
  (the same logits: a wasted forward, as the spec notes), and steps whose quota is 0 (a stage
  or scaffold with fewer positions than steps) still forward. ``idle_forwards=False`` commits
  in that forward what the next one would: the same tokens (nothing changed in between),
  fewer NFE;
* v1 parity is absolute (canvas index), the block variant's block-relative, as in the code;
* at ``temperature > 0`` (the block variant; v1 refuses it: the code forces 0) the code's
  in-place zeroing hits the Gumbel tensor for EOS and the logits for EoT, so only EoT is
  demoted (``eos_eot_asymmetry=True``; False demotes both).

The loop caps an adaptive block at its positions (``max_steps_per_block``); a schedule that
may take more forwards (v1 with ``steps`` near ``gen_length``, as the code's defaults 128 / 128,
or tiny blocks) warns at bind, and the cap's step commits what is left unless
``max_steps_per_block`` is raised to the schedule's forwards (``Said.block_forwards``).

Deviations: the library's proposal removes the mask token from the vocabulary (the code keeps
it in the softmax: ``rng="reference"`` restores that confidence); rows are independent (the
code's batch shares its easy / hard loop conditions, which changes a row's NFE, not its
tokens); a block whose last stage has fewer positions than ``rec_steps`` (blocks under 4
positions) ends when nothing is masked, not after the idle forwards; the code's ``remasking=
"random"`` is not offered (CFG is the sampler's ``cfg_scale``, LLaDA's rule as in the code; no
case recorded). The code is LLaDA-only; Dream-family models run it on their shifted logits.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.policies.base import to_canvas, topk_mask
from dllm_decode.policies.capabilities import Capabilities
from dllm_decode.policies.rows import as_rows, per_row
from dllm_decode.policies.validate import check_fields, check_range
from dllm_decode.types import StepState

_VARIANTS: Final = ("v1", "block")


def said_stage_partition(length: int, num_stages: int) -> tuple[tuple[int, ...], ...]:
    """The code's ``said_stage_partition``: offsets ``0 .. length - 1`` in ``num_stages``
    stages, first decoded first: for k = 1 .. K-1 ``U_k = {p : p mod 2^k = 2^(k-1)}`` is taken
    from what is left, then the order is the rest ``R``, ``U_{K-1}``, ..., ``U_1``.

    Example: ``said_stage_partition(8, 3)`` is ``((0, 4), (2, 6), (1, 3, 5, 7))``.
    """
    rest = set(range(length))
    taken: list[tuple[int, ...]] = []
    for k in range(1, num_stages):
        u = {p for p in rest if p % 2 ** k == 2 ** (k - 1)}
        taken.append(tuple(sorted(u)))
        rest -= u
    return (tuple(sorted(rest)), *reversed(taken))


def compute_stage_steps(num_stages: int, total: int, rec_steps: int) -> tuple[int, ...]:
    """The code's ``compute_stage_steps``: forwards per stage of a block of ``total`` steps.

    The generation stages share ``total - rec_steps`` linearly decreasing from ``s_max`` to
    ``s_min = max(1, budget // (2 g))`` (``np.linspace`` then ``np.round``, half to even),
    adjusted by +-1 from the first stage until they sum to the budget, floored at 1; the last
    stage gets ``rec_steps``. ``(4, 2) -> (1, 1, 2)``, ``(8, 2) -> (5, 1, 2)``,
    ``(128, 2) -> (95, 31, 2)`` for K = 3 (the README's "~63 / ~63 / 2" is not the code).
    """
    if num_stages == 1:
        return (total,)
    budget, g = total - rec_steps, num_stages - 1
    if g == 1:
        return (budget, rec_steps)
    s_min = max(1, budget // (g * 2))
    s_max = max(s_min, (2 * budget) // g - s_min)
    step = (s_min - s_max) / (g - 1)  # np.linspace: start + i * step, the end point exact
    raw = [s_max + i * step for i in range(g - 1)] + [float(s_min)]
    steps = [max(round(v), 1) for v in raw]  # round(): half to even, as np.round
    diff = budget - sum(steps)
    for i in range(abs(diff)):
        steps[i % g] += 1 if diff > 0 else -1
    return (*(max(s, 1) for s in steps), rec_steps)


@lru_cache(maxsize=256)
def block_timeline(length: int, block_steps: int, num_stages: int, rec_steps: int,
                   idle: bool = True) -> tuple[tuple[int, int], ...]:
    """``(stage, quota)`` of each forward of a block of ``length`` positions (host only).

    A stage of ``n`` positions and ``s`` steps commits ``n // s`` per step, one more in the
    first ``n % s`` (the code's ``get_num_transfer_tokens``); an empty stage takes no forward
    (``_run_stage`` returns); ``idle=False`` drops the steps whose quota is 0.
    """
    sizes = [len(s) for s in said_stage_partition(length, num_stages)]
    out: list[tuple[int, int]] = []
    for j, (n, s) in enumerate(zip(sizes, compute_stage_steps(num_stages, block_steps,
                                                              rec_steps), strict=True)):
        if n == 0 or s <= 0:
            continue
        base, rem = divmod(n, s)
        out += [(j, base + (i < rem)) for i in range(s) if idle or base + (i < rem)]
    return tuple(out)


#: ``(L, T, K, rec, idle, device)`` -> ``([L + 1, S + 1] stage, [L + 1, S + 1] quota)``
_TABLES: dict[tuple, tuple[Tensor, Tensor]] = {}


def _timeline_tables(length: int, block_steps: int, num_stages: int, rec_steps: int,
                     idle: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    """``block_timeline`` for every block length ``0 .. L`` as int64 tables indexed
    ``[block length, step]``; past a block's last step: stage -1 (every eligible position),
    quota L (a safety net; the schedule commits everything by then). Read-only, cached."""
    key = (length, block_steps, num_stages, rec_steps, idle, device)
    if key not in _TABLES:
        lines = [block_timeline(n, block_steps, num_stages, rec_steps, idle)
                 for n in range(length + 1)]
        width = max(len(line) for line in lines) + 1
        stage = torch.full((length + 1, width), -1, dtype=torch.long)
        quota = torch.full((length + 1, width), length, dtype=torch.long)
        for n, line in enumerate(lines):
            if line:
                stage[n, :len(line)] = torch.tensor([j for j, _ in line])
                quota[n, :len(line)] = torch.tensor([q for _, q in line])
        if len(_TABLES) > 64:
            _TABLES.clear()
        _TABLES[key] = (stage.to(device), quota.to(device))
    return _TABLES[key]


@dataclass
class SaidMemory:
    """v1's probe result, per row: ``easy [B, L]`` bool (the odd positions at or above the
    threshold), ``has_easy [B]`` bool, ``n_hard [B]`` int64 (the hard positions' count)."""

    easy: Tensor
    has_easy: Tensor
    n_hard: Tensor


@dataclass(frozen=True)
class Said:
    """SAID (arXiv 2606.04974), see the module docstring for the two variants' schedules.

    Args:
        variant: ``v1`` (scaffold, probe, easy, hard) or ``block`` (K checkerboard stages).
        total_steps: the code's ``steps`` (v1: the scaffold's forwards; block: over all
            blocks, ``// n_blocks`` each). ``None``: the sampler's ``steps``, else the
            scripts' ratio (v1 ``gen_length // 2``, block ``gen_length // 4``), read at bind.
        easy_threshold: v1's ``CONF_THRESH`` (0.8; the MBPP runs edit it to 0.7).
        hard_steps: v1's hard forwards (3; MBPP 8).
        num_stages: the block variant's K (3).
        rec_steps: the block variant's last-stage forwards (2).
        demote_stops: rank positions proposing a stop id last and renormalise the others
            without the stop ids (the configs' ``confidence_eos_eot_inf=True``).
        stop_ids: the ids demoted (``None``: the model's EOS and EoT, at bind).
        eos_eot_asymmetry: at ``temperature > 0`` demote the EoT id alone (the code's
            aliasing); False: every stop id.
        idle_forwards: spend the code's forwards that commit nothing (v1's probe, quota-0
            steps); False commits their successor's positions in them (same tokens).
        n_blocks: the number of blocks ``total_steps`` is split over (set at bind).

    Adaptive in the loop's sense (``budgeted=False``): the schedule fixes every step's count.
    No host sync in ``select``. Needs a bidirectional model (``requires_attention``): SAID is
    defined on LLaDA's prompt-relative blocks, so SGLang (block-diffusion models) cannot
    serve it.
    """

    variant: str = "v1"
    total_steps: int | None = None
    easy_threshold: float = 0.8
    hard_steps: int = 3
    num_stages: int = 3
    rec_steps: int = 2
    demote_stops: bool = True
    stop_ids: tuple[int, ...] | None = None
    eos_eot_asymmetry: bool = True
    idle_forwards: bool = True
    n_blocks: int = 1

    def __post_init__(self) -> None:
        check_fields(self, "Said")
        if self.variant not in _VARIANTS:
            raise ValueError(f"Said: variant must be one of {_VARIANTS}, got {self.variant!r}")
        if self.total_steps is not None:
            check_range("Said", "total_steps", self.total_steps, 1)
        check_range("Said", "easy_threshold", self.easy_threshold, 0.0, 1.0)
        for name in ("hard_steps", "num_stages", "rec_steps", "n_blocks"):
            check_range("Said", name, getattr(self, name), 1)
        if self.stop_ids is not None:
            ids = (self.stop_ids,) if isinstance(self.stop_ids, int) else tuple(self.stop_ids)
            if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"Said: stop_ids must be token ids >= 0, got "
                                 f"{self.stop_ids!r}")
            object.__setattr__(self, "stop_ids", ids)

    @property
    def capabilities(self) -> Capabilities:
        """Adaptive; reads ``prob`` at eligible positions (and the logits for the stop-id
        demotion); a step may commit nothing (the code's idle forwards; v1's probe); LLaDA's
        prompt-relative blocks of a bidirectional model (no block-diffusion model)."""
        return Capabilities(budgeted=False, proposal_fields=(), reads_masked_only=True,
                            needs_logits=self.demote_stops, may_commit_nothing=True,
                            requires_attention="bidirectional")

    def bind(self, model: Any, cfg: Any = None) -> Said:
        """Resolve the steps and stop ids from the model and config; refuse what the code's
        schedule cannot be (see ``_refusal``)."""
        out = self
        if self.stop_ids is None:
            eos = tuple(int(e) for e in getattr(model, "eos_token_ids", ()) or ())
            eot = getattr(getattr(model, "spec", None), "eot_token_id", None)
            ids = eos + ((int(eot),) if eot is not None and int(eot) not in eos else ())
            if self.eos_eot_asymmetry and getattr(cfg, "temperature", 0) > 0:
                ids = (int(eot),) if eot is not None else ()
            out = replace(out, stop_ids=ids)
        if cfg is None:
            return out
        g, k = cfg.gen_length, getattr(cfg, "block_length", None)
        n_blocks = 1 if k is None else max(1, g // k)
        total = self.total_steps or getattr(cfg, "steps", None) or (
            max(1, g // 2) if self.variant == "v1" else max(n_blocks, g // 4))
        out = replace(out, total_steps=total, n_blocks=n_blocks)
        reason = out._refusal(model, cfg)
        if reason:
            raise ValueError(f"said ({self.variant}): {reason}")
        need = out.block_forwards(k or g)
        cap = getattr(cfg, "max_steps_per_block", None) or k or g
        if need > cap:
            warnings.warn(f"said ({self.variant}): its schedule may take {need} forwards in a "
                          f"block, over the loop's cap of {cap} (the block's positions), whose "
                          f"step commits what is left: pass max_steps_per_block={need} to run "
                          "the code's schedule", stacklevel=2)
        return out

    def block_forwards(self, length: int) -> int:
        """The most forwards the schedule takes in a block of ``length`` positions (host)."""
        steps = int(self.total_steps or 1) // self.n_blocks
        if self.variant == "block":
            return len(block_timeline(length, steps, self.num_stages, self.rec_steps,
                                      self.idle_forwards))
        half = (length + 1) // 2  # the most even (or odd) positions a block holds
        scaffold = max(1, steps) if self.idle_forwards else min(max(1, steps), half)
        return scaffold + int(self.idle_forwards) + min(1 + self.hard_steps, half)

    def _refusal(self, model: Any, cfg: Any) -> str | None:
        """Why this model / config cannot run the code's schedule, or ``None``."""
        if self.demote_stops and getattr(cfg, "confidence_eos_eot_inf", False):
            return ("said demotes the stop ids itself (demote_stops=True, the code's "
                    "confidence_eos_eot_inf): leave the sampler's confidence_eos_eot_inf off")
        vocab = getattr(model, "vocab_size", None)
        if vocab is not None and any(i >= vocab for i in self.stop_ids or ()):
            return f"stop_ids {self.stop_ids} outside the vocabulary ({vocab})"
        if self.variant == "v1" and getattr(cfg, "temperature", 0) > 0:
            return "v1 is greedy (the code forces temperature 0): pass temperature=0"
        return None

    def init_memory(self, batch: int, length: int, device: torch.device) -> SaidMemory | None:
        if self.variant != "v1":
            return None
        return SaidMemory(torch.zeros(batch, length, dtype=torch.bool, device=device),
                          torch.zeros(batch, dtype=torch.bool, device=device),
                          torch.zeros(batch, dtype=torch.long, device=device))

    def confidence(self, state: StepState) -> Tensor:
        """``[B, L]`` float64 score the top-k ranks: ``prob``, or with ``demote_stops``
        ``p / (1 - p_stop)`` (0 where the proposal is a stop id), ``p_stop`` from
        ``state.logits`` under the proposal's normalisation (``p * exp(z_s - z_tok)``)."""
        prob = state.proposal.prob
        ids = self.stop_ids or ()
        if not self.demote_stops or not ids:
            return prob.double()
        logits, rows = state.logits, state.rows
        if logits is None or rows is None:
            raise ValueError("said: demote_stops needs the step's logits (needs_logits)")
        b, length = prob.shape
        at = rows.expand(b, -1) if rows.dim() == 1 else rows  # [B, R]
        tok = state.proposal.tokens.gather(1, at)
        z = logits.double()
        z_tok = z.gather(-1, tok[..., None])  # [B, R, 1]
        stops = torch.tensor(ids, device=z.device)
        ratio = (z.index_select(-1, stops) - z_tok).exp().sum(-1)  # p_stop / p
        p = prob.double().gather(1, at)
        conf = p / (1 - p * ratio)
        conf = torch.where(torch.isin(tok, stops), 0.0, conf)
        return to_canvas(conf, rows, length)

    def select(self, state: StepState) -> Tensor:
        """Commit mask ``[B, L]`` of the step's stage (see the module docstring)."""
        if self.variant == "block":
            return self._select_block(state)
        return self._select_v1(state)

    def _select_block(self, state: StepState) -> Tensor:
        eligible = state.eligible
        b, length = eligible.shape
        device = eligible.device
        start = as_rows(state.block_start, b, device)  # [B]
        step = as_rows(state.block_step, b, device)
        stage_t, quota_t = _timeline_tables(length, int(self.total_steps or 1) // self.n_blocks,
                                            self.num_stages, self.rec_steps,
                                            self.idle_forwards, device)
        size = (state.block_end - start).clamp(0, length)
        at = step.clamp(max=stage_t.shape[1] - 1)
        stage, quota = stage_t[size, at], quota_t[size, at]  # [B]
        rel = torch.arange(length, device=device)[None] - start[:, None]  # [B, L]
        depth = sum(((rel % 2 ** k) == 0).long() for k in range(1, self.num_stages))
        pos_stage = (self.num_stages - 1) - depth if self.num_stages > 1 else rel * 0
        cand = eligible & ((pos_stage == stage[:, None]) | (stage[:, None] < 0))
        return topk_mask(self.confidence(state), cand, quota)

    def _select_v1(self, state: StepState) -> Tensor:
        if per_row(state.block_step) or per_row(state.block_start):
            raise ValueError("said v1 reads shared step values (its parity is absolute)")
        eligible, memory = state.eligible, state.memory
        b, length = eligible.shape
        device = eligible.device
        bs, be, s = int(state.block_start), state.block_end, int(state.block_step)
        total = max(1, int(self.total_steps or 1) // self.n_blocks)  # the block's T
        n_even = (be + 1) // 2 - (bs + 1) // 2  # even canvas indices in [bs, be)
        scaffold = total if self.idle_forwards else min(total, n_even)
        even = (torch.arange(length, device=device) % 2 == 0)[None]
        if s < scaffold:
            base, rem = divmod(n_even, total)
            k = base + (s < rem)
            if k == 0:
                return torch.zeros_like(eligible)
            return topk_mask(self.confidence(state), eligible & even,
                             torch.full((b,), k, dtype=torch.long, device=device))
        odd = eligible & ~even
        if s == scaffold:  # the probe: plain p, nothing demoted
            easy = odd & (state.proposal.prob >= self.easy_threshold)
            memory.easy = easy
            memory.has_easy = easy.any(1)
            memory.n_hard = (odd & ~easy).sum(1)
            if self.idle_forwards:
                return torch.zeros_like(eligible)
        r = s - scaffold - (1 if self.idle_forwards else 0)
        i = r - memory.has_easy.long()  # [B] the hard step (-1: the easy step)
        h = self.hard_steps
        n = memory.n_hard
        k = torch.where((i >= 0) & (i < h), n // h + (i < n % h).long(), 0)
        hard = topk_mask(self.confidence(state), odd & ~memory.easy, k)
        return torch.where((i < 0)[:, None], memory.easy & eligible, hard)


def said_policy(total_steps: int | None = None, easy_threshold: float = 0.8,
                hard_steps: int = 3, demote_stops: bool = True,
                stop_ids: tuple[int, ...] | None = None, idle_forwards: bool = True) -> Said:
    """The ``said`` preset: SAID-v1 as the README runs it (scaffold on even positions, probe
    at 0.8, easy in 1 forward, hard in 3; EOS / EoT demoted; ``steps``: the sampler's, else
    ``gen_length // 2`` as the GSM8K / MATH scripts)."""
    return Said(variant="v1", total_steps=total_steps, easy_threshold=easy_threshold,
                hard_steps=hard_steps, demote_stops=demote_stops, stop_ids=stop_ids,
                idle_forwards=idle_forwards)


def said_block_policy(total_steps: int | None = None, num_stages: int = 3, rec_steps: int = 2,
                      demote_stops: bool = True, stop_ids: tuple[int, ...] | None = None,
                      eos_eot_asymmetry: bool = True, idle_forwards: bool = True) -> Said:
    """The ``said_block`` preset: SAID-block as the LLaDA-1.5 configs run it (K = 3 stages,
    2 reconstruction forwards, EOS / EoT demoted; ``steps``: the sampler's, else
    ``gen_length // 4`` as every LLaDA-1.5 script)."""
    return Said(variant="block", total_steps=total_steps, num_stages=num_stages,
                rec_steps=rec_steps, demote_stops=demote_stops, stop_ids=stop_ids,
                eos_eot_asymmetry=eos_eot_asymmetry, idle_forwards=idle_forwards)
