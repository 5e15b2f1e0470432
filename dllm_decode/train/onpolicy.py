"""On-policy distillation states for the test bed: the student's own greedy decode, stopped
where it would go wrong (DAgger-style).

Random mask patterns rarely put a model in the states its own confidence order leads to. The
Dream-like test-bed student shows why this matters: 96 % of its failures on the random tasks
repeat a name it already committed, and it commits those duplicates with high confidence, so
low-confidence decoding picks them first (a random order avoids most of them).
``onpolicy_rows`` replaces a share of a batch's rows by states read off the student's greedy
one-token-per-step ``low_confidence`` decode (the sampler's own), each stopped after a random
number of commits or just before its first commit that no valid answer contains. The oracle's exact
conditionals of those states are the targets, so the loss lands where the student's decode goes
wrong. With ``hard`` > 0 that share of the rows is instead stopped just before the rollout's
first step that commits a token the oracle does not rank first at that state (a disagreement
with the teacher's argmax, which decides a greedy commit), where the rollout has one; in a
parallel decode these are the steps that complete a random task's answer by chance.

S. Ross, G. Gordon, D. Bagnell, "A Reduction of Imitation Learning and Structured Prediction
to No-Regret Online Learning" (AISTATS 2011): training on the learner's own state
distribution.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.train.distill_batch import batch_prompts


def onpolicy_rows(model: Any, oracle: WaitingLineOracle, frac: float, seed: int,
                  tokens: Tensor, valid: Tensor, masked: Tensor, targets: Tensor,
                  prompt_width: int, *,
                  per_step: int = 1, hard: float = 0.0
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A batch with ``round(frac * B)`` rows replaced by on-policy states (see the module).

    The states come from the library's own decode (``DiffusionSampler`` with
    ``low_confidence``, ``per_step`` tokens per step (fixed steps, ``ceil(G / per_step)``),
    one block, greedy): the state after ``j`` steps keeps the positions committed in its first
    ``j`` steps.

    Args:
        model: the student (put in eval mode for the decode, then restored).
        oracle: the Waiting Line oracle (answer tables, exact conditionals).
        frac: share of rows to replace, in ``[0, 1]``.
        seed: seeds which rows and how many commits (per training step).
        tokens, valid: ``[B, P + G]`` the batch canvas and key validity (``make_batch``).
        masked: ``[B, G]`` bool masked answer positions; ``targets``: ``[B, G, V]`` float32.
        prompt_width: ``P``, where the answer region starts.
        per_step: tokens committed per rollout step (the even split of ``G`` over the steps).
        hard: share of the replaced rows, in ``[0, 1]``, stopped at the state before the
            rollout's first step that commits a token outside the oracle's most likely ones
            at that state (a disagreement); rows without one keep their random stop.

    Returns: ``(tokens, valid, masked, targets)``, new tensors (the inputs are not modified).
    """
    b, g = masked.shape
    n = round(frac * b)
    if n == 0:
        return tokens, valid, masked, targets
    mask_id, p = oracle.mask_token_id, prompt_width
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(b, generator=gen)[:n]
    steps = -(-g // per_step)
    stop = torch.randint(0, steps, (n,), generator=gen)  # steps to keep per row
    # drawn only when asked, so runs without it keep their rows and stops
    hard_rows = torch.rand(n, generator=gen) < hard if hard else torch.zeros(n, dtype=torch.bool)
    out, states = rollout_states(model, tokens[rows, :p], valid[rows, :p], g, per_step)
    prompts = batch_prompts(tokens, valid, p, rows)
    tables = [oracle.answer_table(prompt, g) for prompt in prompts]
    regions = []
    for row, table in enumerate(tables):
        state = states[row]  # [steps + 1, G]
        ok = ((table[None] == state[:, None]) | (state[:, None] == mask_id)).all(-1).any(-1)
        # stop before the first commit that no valid answer contains
        last_ok = int(ok.long().cumprod(0).sum()) - 1
        keep = int(stop[row])
        if hard_rows[row]:
            keep = first_disagreement(oracle, table, state, out.answer[row],
                                      out.commit_step[row], keep)
        regions.append(state[min(keep, last_ok)])
    region = torch.stack(regions)
    new_targets = torch.cat([oracle.marginals(tab, r[None]) for tab, r in
                             zip(tables, region, strict=True)]).to(targets.dtype)
    tokens, valid, masked, targets = tokens.clone(), valid.clone(), masked.clone(), \
        targets.clone()
    tokens[rows, p:], valid[rows, p:] = region, True  # a fresh answer region (no EOS cut)
    masked[rows], targets[rows] = region == mask_id, new_targets
    return tokens, valid, masked, targets


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode inside the block (a rollout), its training mode restored after."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def rollout_states(model: Any, prompts: Tensor, valid: Tensor, g: int, per_step: int
                   ) -> tuple[Any, Tensor]:
    """The student's greedy ``low_confidence`` decode of ``prompts [n, P]`` (``valid [n, P]``
    False = left padding) at ``per_step`` tokens per step (fixed steps ``ceil(g / per_step)``,
    the even split on every family, one block), and its states: ``(Generation, states [n,
    steps + 1, g])`` where ``states[:, j]`` keeps the commits of the first ``j`` steps and
    masks the rest. The model is put in eval mode for the decode, then restored."""
    from dllm_decode.samplers.sampler import DiffusionSampler
    from dllm_decode.train.testbed_eval import EVEN_SPLIT

    steps = -(-g // per_step)
    with eval_mode(model):
        # the even split for every family (Dream's time grid commits none at the first step
        # and two at the last when steps == g)
        out = DiffusionSampler(model, "low_confidence", gen_length=g, steps=steps,
                               block_length=None, temperature=0.0,
                               schedule=EVEN_SPLIT).generate(prompts, valid.long())
    first = torch.arange(steps + 1)[None, :, None]
    order = out.commit_step[:, None, :]
    states = torch.where((order >= 0) & (order < first), out.answer[:, None, :],
                         model.mask_token_id)
    return out, states


def first_disagreement(oracle: WaitingLineOracle, table: Tensor, states: Tensor,
                       answer: Tensor, commit_step: Tensor, default: int) -> int:
    """The first step of a rollout that commits a token the oracle does not rank first.

    Args:
        table: ``[M, G]`` the prompt's valid answers; ``states``: ``[S + 1, G]`` the rollout's
            state before each step (``states[j]`` keeps the commits of steps ``< j``).
        answer, commit_step: ``[G]`` the rollout's tokens and the step each was committed at
            (``-1``: never).
        default: returned when every commit is one of the oracle's most likely tokens.

    Returns: the smallest ``j`` at which a token committed at step ``j`` has a lower exact
    conditional at ``states[j]`` than that position's most likely token (ties count as
    agreement).
    """
    probs = oracle.marginals(table, states)  # [S + 1, G, V]
    at = commit_step.clamp_min(0)
    pos = torch.arange(answer.shape[0])
    chosen = probs[at, pos, answer]
    best = probs[at, pos].max(-1).values
    miss = (commit_step >= 0) & (chosen < best - 1e-9)
    return int(commit_step[miss].min()) if bool(miss.any()) else default
