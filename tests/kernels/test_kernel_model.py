"""The Triton attention path of cached model forwards equals the SDPA path.

A cached forward that stores its K/V under a key mask (prefix / dual cache, padding, a
block-causal step inside one block, a pruned Window-Diffusion step) runs
``kv_write_`` + ``block_attention`` when the model's ``attn_impl`` resolves to Triton; here
the kernels run in the interpreter on CPU.
"""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DiffusionSampler
from dllm_decode.types import Impl
from tests.helpers import EOS, tiny_model


@pytest.mark.parametrize("family,mode", [("llada", "dual"), ("dream", "prefix"),
                                         ("sdar", "block_causal"), ("llada", "window")])
def test_cached_decode_with_triton_attention_matches_reference(device, monkeypatch,
                                                                family: str, mode: str) -> None:
    from dllm_decode import kernels

    calls = []
    real = kernels.block_attention

    def counted(*args, **kwargs):
        calls.append(kwargs.get("impl"))
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "block_attention", counted)
    heads = (dict(n_heads=2, n_kv_heads=2) if family == "llada"  # head dim 16
             else dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    model = tiny_model(family, seed=4, **heads).to(device)
    prompt = torch.randint(0, EOS, (2, 4), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], device=device)  # a left-padded row
    kw = dict(gen_length=8, block_length=4, steps=8)
    if mode == "window":  # pruned steps: window 3, active 2, a full forward every 3 steps
        kw |= dict(window_tokens=3, active_tokens=2, refresh_every=3)
    outs = {}
    for impl in (Impl.REFERENCE, Impl.TRITON):
        model.attn_impl = impl
        logits = []

        def grab(state, commit, store=logits):
            store.append(state.proposal.prob.clone())

        outs[impl] = DiffusionSampler(model, "low_confidence", cache=mode, **kw).generate(
            prompt, mask, on_step=grab), logits
    (ref, ref_p), (tri, tri_p) = outs[Impl.REFERENCE], outs[Impl.TRITON]
    assert calls and all(Impl(c) is Impl.TRITON for c in calls)  # the kernel path really ran
    assert torch.equal(ref.tokens, tri.tokens)
    for a, b in zip(ref_p, tri_p, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
