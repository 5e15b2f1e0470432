"""The Waiting Line oracle serves plain forwards of whole canvases exactly and refuses the rest.

Issue 52, item 2: the oracle used to ignore ``mask`` and read every row as one canvas, so
LoPA's packed branch forward and WINO's shadow block got garbage from it, silently. Now every
forward it cannot serve exactly (a mask whose queries see different keys, keys beyond the fed
tokens, a hidden prompt token, packed rows) is refused with one line; plain full visibility
(no mask, a key mask, left padding, hidden answer positions) is served exactly.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from dllm_decode import DiffusionSampler
from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.train.testbed import waiting_line_oracle, waiting_line_records

REFUSED = "cannot serve this forward exactly"
G = 16


def canvas(oracle: WaitingLineOracle, tasks: tuple[str, ...] = ("shuffle", "insert_index"),
           seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """One held-out prompt per task, left-padded to a common width, plus ``G`` masks: the
    canvas ``[B, L]``, its positions and key validity (False: left padding)."""
    rows = [oracle.encode_prompt(t, waiting_line_records(t, 1, seed, split="test")[0])
            for t in tasks]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width + G), oracle.mask_token_id)
    valid = torch.ones_like(ids, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :width - len(r)] = oracle.pad_token_id
        ids[i, width - len(r):width] = torch.tensor(r)
        valid[i, :width - len(r)] = False
    return ids, torch.arange(ids.shape[1]).expand_as(ids), valid


def oracles() -> list[WaitingLineOracle]:
    exact = waiting_line_oracle()
    return [exact, exact.calibrated(temperature=1.5, noise=0.25, confusion=0.01)]


def refused(call) -> str:
    with pytest.raises(ValueError, match=REFUSED) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("policy,params", [("lopa", {}), ("lopa", {"branches": 2}),
                                           ("wino", {}), ("wino", {"threshold": 0.9})])
def test_lopa_and_wino_are_refused(policy: str, params: dict) -> None:
    """Their extra forwards (packed branches, the shadow block) are refused at the first one,
    with what to use instead; before, ``lopa`` decoded EOS into name slots silently."""
    oracle = waiting_line_oracle()
    ids, _, valid = canvas(oracle)
    prompt, attention = ids[:, :-G], valid[:, :-G].long()
    sampler = DiffusionSampler(oracle, policy, **params)
    message = refused(lambda: sampler.generate(prompt, attention_mask=attention, gen_length=G,
                                               block_length=G))
    assert "different keys" in message and "testbed-llada" in message
    # their drafting rules alone run no extra forward and are served
    base = DiffusionSampler(oracle, policy, **(params | {
        "branches": 0} if policy == "lopa" else {"threshold": 0.9, "verify": False}))
    out = base.generate(prompt, attention_mask=attention, gen_length=G, block_length=G)
    assert not (out.answer == oracle.mask_token_id).any()


@pytest.mark.parametrize("oracle", oracles(), ids=["exact", "calibrated"])
def test_every_other_forward_is_refused(oracle: WaitingLineOracle) -> None:
    ids, pos, valid = canvas(oracle)
    b, n = ids.shape
    plain = valid[:, None, :].expand(-1, n, -1)
    per_query = plain.clone()
    per_query[:, -1, -2] = False  # one query does not see one answer key (a shadow row)
    assert "different keys" in refused(lambda: oracle(ids, pos, mask=per_query))
    # keys beyond the fed tokens: a packed extra forward's [B, N, L + N] or a cache's
    wide = torch.cat([plain, plain], 2)
    assert "[B, N, N]" in refused(lambda: oracle(ids, pos, mask=wide))
    assert "bool" in refused(lambda: oracle(ids, pos, mask=plain.float()))
    # two canvases packed in one row, positions restarting (LoPA's branches without a mask)
    twice, twice_pos = torch.cat([ids, ids], 1), torch.cat([pos, pos], 1)
    assert "positions" in refused(lambda: oracle(twice, twice_pos))
    # ... or numbered on: two <answer> tokens
    assert "<answer>" in refused(lambda: oracle(twice, torch.arange(2 * n).expand(b, -1)))
    hide_prompt = valid.clone()
    hide_prompt[:, n - G - 2] = False  # the list's closing bracket
    assert "prompt position" in refused(lambda: oracle(ids, pos, mask=hide_prompt))


@pytest.mark.parametrize("oracle", oracles(), ids=["exact", "calibrated"])
def test_plain_visibility_is_served_exactly(oracle: WaitingLineOracle) -> None:
    """No mask, a key mask, its per-query form and left padding give the same logits; a
    padded row gives the logits it has alone; a hidden answer key is that position masked."""
    ids, pos, valid = canvas(oracle)
    b, n = ids.shape
    ids[:, n - G:n - G + 3] = ids[:, n - G - 11:n - G - 8]  # commit a few answer tokens
    base = oracle(ids, pos)
    assert (base.argmax(-1)[:, n - G:n - G + 3] == ids[:, n - G:n - G + 3]).all()
    for mask in (torch.ones_like(valid), valid, valid[:, None, :].expand(-1, n, -1)):
        assert torch.equal(oracle(ids, pos, mask=mask), base)
    pad = int((~valid[0]).sum())
    assert pad > 0
    alone = oracle(ids[:1, pad:], pos[:1, :n - pad])
    assert torch.equal(base[0, pad:], alone[0])
    hide = torch.ones_like(valid)
    hide[:, n - G + 1] = False  # a committed answer token nobody sees
    unknown = ids.clone()
    unknown[:, n - G + 1] = oracle.mask_token_id
    assert torch.equal(oracle(ids, pos, mask=hide), oracle(unknown, pos))
    assert not torch.equal(oracle(ids, pos, mask=hide), base)
    rows = torch.tensor([n - G, n - 1])
    assert torch.equal(oracle(ids, pos, mask=valid, hidden_rows=rows), base[:, rows])
