"""On-policy distillation states for the test bed: the student's own greedy decode, stopped
where it would go wrong (DAgger-style).

Random mask patterns rarely put a model in the states its own confidence order leads to. The
Dream-like test-bed student shows why this matters: 96 % of its failures on the random tasks
repeat a name it already committed, and it commits those duplicates with high confidence, so
low-confidence decoding picks them first (a random order avoids most of them).
``onpolicy_rows`` replaces a share of a batch's rows by states read off the student's greedy
one-token-per-step decode (the ``low_confidence`` order: the most probable token at the most
confident masked position, the mask token excluded), each stopped after a random number of
commits or just before its first commit that no valid answer contains. The oracle's exact
conditionals of those states are the targets, so the loss lands where the student's decode goes
wrong.

S. Ross, G. Gordon, D. Bagnell, "A Reduction of Imitation Learning and Structured Prediction
to No-Regret Online Learning" (AISTATS 2011): training on the learner's own state
distribution.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.models.oracle import WaitingLineOracle


@torch.no_grad()
def onpolicy_rows(model: Any, oracle: WaitingLineOracle, frac: float, seed: int,
                  tokens: Tensor, valid: Tensor, masked: Tensor, targets: Tensor,
                  prompt_width: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A batch with ``round(frac * B)`` rows replaced by on-policy states (see the module).

    Args:
        model: the student (put in eval mode for the rollout, then restored).
        oracle: the Waiting Line oracle (answer tables, exact conditionals).
        frac: share of rows to replace, in ``[0, 1]``.
        seed: seeds which rows and how many commits (per training step).
        tokens, valid: ``[B, P + G]`` the batch canvas and key validity (``make_batch``).
        masked: ``[B, G]`` bool masked answer positions; ``targets``: ``[B, G, V]`` float32.
        prompt_width: ``P``, where the answer region starts.

    Returns: ``(tokens, valid, masked, targets)``, new tensors (the inputs are not modified).
    """
    b, g = masked.shape
    n = round(frac * b)
    if n == 0:
        return tokens, valid, masked, targets
    mask_id, p = oracle.mask_token_id, prompt_width
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(b, generator=gen)[:n]
    stop = torch.randint(0, g, (n,), generator=gen)  # commits to make per row
    tables = [oracle.answer_table(tokens[i, :p][valid[i, :p]].tolist(), g)
              for i in rows.tolist()]
    canvas, keys = tokens[rows].clone(), valid[rows].clone()
    canvas[:, p:], keys[:, p:] = mask_id, True  # a fresh answer region (no EOS cut)
    positions = model.rope_positions(keys)
    answer_rows = torch.arange(p, p + g)
    live = torch.ones(n, dtype=torch.bool)
    training = model.training
    model.eval()
    try:
        for t in range(int(stop.max())):
            todo = live & (stop > t)
            if not bool(todo.any()):
                break
            logits = model(canvas, positions, mask=keys, hidden_rows=answer_rows).float()
            logits[..., mask_id] = -torch.inf
            prob, token = logits.softmax(-1).max(-1)  # [n, G]
            region = canvas[:, p:]
            at = prob.masked_fill(region != mask_id, -1.0).argmax(-1)  # first max: lowest index
            cand = region.clone()
            cand[torch.arange(n), at] = token[torch.arange(n), at]
            ok = torch.stack([((tab == c) | (c == mask_id)).all(-1).any()
                              for tab, c in zip(tables, cand, strict=True)])
            live &= ok | ~todo  # a row stops before its first commit no valid answer has
            canvas[:, p:] = torch.where((todo & ok)[:, None], cand, region)
    finally:
        model.train(training)
    region = canvas[:, p:]
    new_targets = torch.cat([oracle.marginals(tab, r[None]) for tab, r in
                             zip(tables, region, strict=True)]).to(targets.dtype)
    tokens, valid, masked, targets = tokens.clone(), valid.clone(), masked.clone(), \
        targets.clone()
    tokens[rows], valid[rows], masked[rows], targets[rows] = canvas, keys, region == mask_id, \
        new_targets
    return tokens, valid, masked, targets
