"""LLaDA2.1's training mixture for the test-bed LLaDA2 student: mask-to-token plus
token-to-token, and the MoE router's load balancing.

Bie et al., "LLaDA2.1: Speeding Up Text Diffusion via Token Editing" (arXiv 2602.08676), §3.1:
"a unified Mixture of M2T and T2T objective", applied in continual pre-training and SFT alike,
with a *drafting stream* (the model "learns to predict the correct token at each masked
position") and an *editing stream* (it "learns to recover original tokens from random noise
perturbations"), plus a Multi-turn Forward (MTF) augmentation "exposing the model to a wider
variety of editing scenarios". The report states no corruption rate, loss weight or MTF
procedure, and the public LLaDA2 trainer it names (inclusionAI/dFactory, ``train_llada2_bd``)
masks only. What this module does, and why:

* **Editing stream** (``editing_rows``): a share ``edit_frac`` of a batch's rows keep their
  masks (the drafting stream) and have each visible answer token replaced, at a rate ``r ~
  U(0, edit_rate)`` drawn per row, by a token drawn uniformly from the vocabulary without the
  mask token ("random vocabulary corruptions", as Yao, arXiv 2606.17175, describes the
  released recipe). Every live answer position of such a row is supervised: masked ones
  (M2T), corrupted ones (T2T: restore) and clean visible ones (T2T: keep, so that an edit
  threshold is not crossed where nothing is wrong; the report's "recover original tokens"
  covers both). Rows outside the share are the plain mask objective.
* **Targets** are the exact posterior of the clean answer given the row's canvas under that
  corruption with the rate unknown (``models.uniform_oracle.noisy_posterior``, rates on a
  uniform grid): the minimiser, in expectation, of the hard-label loss the report describes,
  just as the test bed's soft mask targets are of the mask loss.
* **MTF** (``draft_rows``, our reading of "multi-turn forward"): a share ``mtf_frac`` of the
  rows is replaced by the student's own parallel draft (``mtf_k`` tokens per step, greedy,
  stopped after a random number of steps), its wrong commits kept; the same posterior is the
  target at every position. The first forward's output is the second forward's input, so the
  editing stream also sees the errors parallel decoding actually makes (a repeated name where
  random corruption gives an out-of-list one).

``ExpertBalance`` is the router's auxiliary-loss-free balancing (DeepSeek-V3, arXiv
2412.19437, §2.1.2; Ling-2.0 / LLaDA2 routers carry it as ``expert_bias``, used for selection
only): after each step every layer's bias moves by ``rate`` toward its under-loaded experts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.models.sparse_moe import Router
from dllm_decode.models.uniform_oracle import noisy_posterior
from dllm_decode.train.distill_batch import batch_prompts
from dllm_decode.train.onpolicy import rollout_states

#: points of the uniform grid over the corruption rate that the posterior averages over
RATE_POINTS = 8
#: added to the step seed so the editing stream's draws are independent of the masks'
EDIT_SALT = 0x5EED


def keep_grid(edit_rate: float) -> Tensor:
    """``[RATE_POINTS]`` keep probabilities ``1 - r``, ``r`` on a midpoint grid of
    ``(0, edit_rate)`` (the uniform prior of a row's corruption rate)."""
    rates = (torch.arange(RATE_POINTS, dtype=torch.float64) + 0.5) / RATE_POINTS * edit_rate
    return 1 - rates


def random_tokens(shape: tuple[int, ...], vocab: int, mask_id: int,
                  gen: torch.Generator) -> Tensor:
    """Tokens uniform over the ``vocab - 1`` ids other than ``mask_id``."""
    draw = torch.randint(0, vocab - 1, shape, generator=gen)
    return draw + (draw >= mask_id).long()


def edit_targets(oracle: WaitingLineOracle, prompts: list[list[int]], region: Tensor,
                 known: Tensor, edit_rate: float) -> Tensor:
    """``[R, G, V]`` float32 posterior of the clean answers behind corrupted regions
    ``[R, G]`` (``known`` ``[R, G]``: the visible positions, each possibly corrupted)."""
    keep = keep_grid(edit_rate)
    v = oracle.vocab_size
    return torch.cat([
        noisy_posterior(oracle.answer_table(prompt, region.shape[1]), row[None], keep, v,
                        noise_tokens=v - 1, known=k[None])
        for prompt, row, k in zip(prompts, region, known, strict=True)]).float()


def editing_rows(cfg: Any, oracle: WaitingLineOracle, tokens: Tensor, valid: Tensor,
                 masked: Tensor, targets: Tensor, width: int, step: int
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """The editing stream over a ``make_batch`` batch (see the module docstring).

    Args:
        cfg: the ``DistillConfig`` (``seed``, ``edit_frac``, ``edit_rate``).
        tokens, valid: ``[B, P + G]``; masked: ``[B, G]``; targets: ``[B, G, V]``.
        width: ``P``, where the answer region starts; step: the training step (seeds draws).

    Returns: ``(tokens, supervised [B, G], targets)``, new tensors.
    """
    b, g = masked.shape
    gen = torch.Generator().manual_seed((cfg.seed << 32) + step + EDIT_SALT)
    rows = torch.rand(b, generator=gen) < cfg.edit_frac
    rate = torch.rand(b, 1, generator=gen) * cfg.edit_rate
    hit = torch.rand(b, g, generator=gen) < rate
    draw = random_tokens((b, g), oracle.vocab_size, oracle.mask_token_id, gen)
    region, live = tokens[:, width:], valid[:, width:]
    visible = live & (region != oracle.mask_token_id) & rows[:, None]
    region = torch.where(visible & hit, draw, region)
    tokens = torch.cat([tokens[:, :width], region], 1)
    supervised = masked | visible
    targets = targets.clone()
    picked = rows.nonzero().flatten()
    if picked.numel():
        targets[picked] = edit_targets(oracle, batch_prompts(tokens, valid, width, picked),
                                       region[picked], visible[picked], cfg.edit_rate)
    return tokens, supervised, targets


def draft_rows(model: Any, cfg: Any, oracle: WaitingLineOracle, tokens: Tensor, valid: Tensor,
               supervised: Tensor, targets: Tensor, width: int, step: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """MTF: ``round(mtf_frac * B)`` rows replaced by the student's own draft states (module
    docstring). Returns ``(tokens, valid, supervised, targets)``, new tensors."""
    b, g = supervised.shape
    n = round(cfg.mtf_frac * b)
    if n == 0:
        return tokens, valid, supervised, targets
    gen = torch.Generator().manual_seed((cfg.seed << 32) + step + 2 * EDIT_SALT)
    rows = torch.randperm(b, generator=gen)[:n]
    _, states = rollout_states(model, tokens[rows, :width], valid[rows, :width], g, cfg.mtf_k)
    stop = torch.randint(1, states.shape[1], (n,), generator=gen)  # at least one step
    region = states[torch.arange(n), stop]  # [n, G]
    known = region != oracle.mask_token_id
    tokens, valid = tokens.clone(), valid.clone()
    supervised, targets = supervised.clone(), targets.clone()
    tokens[rows, width:], valid[rows, width:] = region, True
    supervised[rows] = True
    targets[rows] = edit_targets(oracle, batch_prompts(tokens, valid, width, rows), region,
                                 known, cfg.edit_rate)
    return tokens, valid, supervised, targets


class ExpertBalance:
    """Auxiliary-loss-free load balancing of every router with an ``expert_bias`` (module
    docstring): ``reset`` before the training forward, ``update`` after the optimizer step
    (``bias += rate * sign(mean load - load)`` per layer), ``close`` to remove the hooks."""

    def __init__(self, model: torch.nn.Module, rate: float) -> None:
        self.rate = rate
        self.routers = [m for m in model.modules()
                        if isinstance(m, Router) and m.expert_bias is not None]
        self.counts = [torch.zeros(r.spec.num_experts) for r in self.routers]
        self.hooks = [r.register_forward_hook(self._count(i))
                      for i, r in enumerate(self.routers)]

    def _count(self, i: int) -> Any:
        def hook(module: Router, inputs: Any, output: tuple[Tensor, Tensor]) -> None:
            idx = output[0].detach().reshape(-1).cpu()
            self.counts[i] += torch.bincount(idx, minlength=len(self.counts[i])).float()
        return hook

    def reset(self) -> None:
        for c in self.counts:
            c.zero_()

    @torch.no_grad()
    def update(self) -> None:
        for router, count in zip(self.routers, self.counts, strict=True):
            if count.sum() > 0:
                load = count / count.sum()
                router.expert_bias += self.rate * torch.sign(load.mean() - load).to(
                    router.expert_bias.device)
        self.reset()

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
