"""Fused decoder layers (``models.fused``, issue 33): released tensor names in and out, the
same function as the unfused reference layers, and the kernel launches per layer."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.diagnostics.launches import layer_launches
from dllm_decode.models import load_model, save_model
from dllm_decode.models.base import Layer
from dllm_decode.models.functional import block_causal_mask
from dllm_decode.models.fused import FusedLayer
from dllm_decode.types import Impl
from tests.helpers import EOS, tiny_model

FAMILIES = ["llada", "dream", "sdar"]
UNFUSED = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
           "mlp.gate_proj.weight", "mlp.up_proj.weight")


@pytest.mark.parametrize("family", FAMILIES)
def test_state_dict_keeps_the_unfused_names_and_round_trips(family, tmp_path) -> None:
    model = tiny_model(family, seed=5)
    state = model.state_dict()
    assert all(f"layers.1.{name}" in state for name in UNFUSED)
    assert not any(".qkv." in k or ".gate_up." in k for k in state)
    # exactly the unfused reference layer's names, in its order
    ref = Layer(model.spec).state_dict()
    assert [k[len("layers.0."):] for k in state if k.startswith("layers.0.")] == list(ref)
    fused = model.layers[0]
    q, k, v = (state[f"layers.0.attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(fused.attn.qkv.weight, torch.cat((q, k, v)))
    if model.spec.qkv_bias:
        assert torch.equal(fused.attn.qkv.bias, torch.cat(
            [state[f"layers.0.attn.{p}_proj.bias"] for p in "qkv"]))
    # state dict -> a fresh model -> the same state dict
    other = tiny_model(family, seed=6)
    other.load_state_dict(state)
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in state.items())
    # release names on disk, and back
    path = save_model(model, tmp_path / family)
    loaded = load_model(path)
    assert loaded.checkpoint_state_dict().keys() == model.checkpoint_state_dict().keys()
    tokens = torch.randint(0, EOS, (2, 7), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        assert torch.equal(loaded(tokens, pos), model(tokens, pos))


def test_a_partial_state_dict_reports_the_unfused_names() -> None:
    model = tiny_model("llada")
    state = model.state_dict()
    del state["layers.0.attn.k_proj.weight"]
    with pytest.raises(RuntimeError, match="layers.0.attn.qkv.weight"):
        model.load_state_dict(state)
    result = model.load_state_dict(state, strict=False)  # the rest still loads
    assert "layers.0.attn.qkv.weight" in result.missing_keys


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache", ["none", "store", "attend"])
def test_fused_layer_equals_the_unfused_reference_layer(family, dtype, cache) -> None:
    """One layer, same weights: fused vs ``base.Layer`` (fp32: 1e-5; bf16: one bf16 rounding
    of the output scale, 2e-2), uncached, writing a cache and attending to one unstored."""
    model = tiny_model(family, seed=2, init_std=0.1).to(dtype)  # trained-size activations
    spec = model.spec
    fused = model.layers[1]
    ref = Layer(spec).to(dtype)
    ref.load_state_dict({k[len("layers.1."):]: v for k, v in model.state_dict().items()
                         if k.startswith("layers.1.")})
    g = torch.Generator().manual_seed(3)
    b, n, length = 2, 5, 9
    h = torch.randn(b, n, spec.hidden_size, generator=g).to(dtype)
    pos = torch.arange(2, 2 + n).expand(b, n)
    cos, sin = model.rope_tables(pos)
    mask = None
    caches = [model.new_cache(b, length) for _ in range(2)]
    for c in caches:
        c.k.copy_(torch.randn(c.k.shape, generator=torch.Generator().manual_seed(4)))
        c.v.copy_(torch.randn(c.v.shape, generator=torch.Generator().manual_seed(5)))
    if cache != "none":
        keys = length + (n if cache == "attend" else 0)
        k_pos = torch.cat((torch.arange(length), pos[0]))[:keys].expand(b, keys)
        mask = block_causal_mask(pos, k_pos, spec.block_size) if spec.block_size else \
            torch.ones(b, n, keys, dtype=torch.bool)
    store = cache == "store"
    kw = dict(cache=None, slots=pos, store=store)
    outs = []
    for layer, c in zip((ref, fused), caches, strict=True):
        kw["cache"] = None if cache == "none" else c
        with torch.no_grad():
            if isinstance(layer, FusedLayer):
                from dllm_decode import kernels

                out = layer(h, kernels.rope_rows(cos, sin), mask, 1, kw["cache"], pos, store,
                            Impl.REFERENCE)
            else:
                out = layer(h, cos, sin, mask, 1, kw["cache"], pos, store, Impl.REFERENCE)
        outs.append(out)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[1], outs[0], atol=tol, rtol=tol)
    if store:
        torch.testing.assert_close(caches[1].k, caches[0].k, atol=tol, rtol=tol)
        torch.testing.assert_close(caches[1].v, caches[0].v, atol=tol, rtol=tol)


@pytest.mark.parametrize(("family", "mode", "most"), [
    ("llada", "none", 12), ("llada", "prefix", 14), ("llada", "dual", 14),
    ("dream", "none", 12), ("dream", "prefix", 14), ("dream", "dual", 14),
    # q/k norm: cat of the two head weights, rms_norm, mul (the Triton op folds them in)
    ("sdar", "none", 15), ("sdar", "block_causal", 17)])
def test_reference_path_launches_per_layer(family, mode, most) -> None:
    """The torch path (CPU): top-level kernel-launching ops per decoder-layer call, every
    forward of a batch-1 decode (main at 2da4814: 34-36 llada/dream, 46-48 sdar in fp32)."""
    count = layer_launches(tiny_model(family), mode, prompt_length=4, gen_length=4,
                           block_length=4)
    assert count.per_range and count.max <= most, count.by_op
    assert "aten::to" not in count.by_op and "aten::copy_" not in count.by_op


def test_reference_path_has_no_dtype_round_trips_in_bf16() -> None:
    count = layer_launches(tiny_model("llada").to(torch.bfloat16), "dual", prompt_length=4,
                           gen_length=4, block_length=4)
    assert count.max <= 14 and "aten::to" not in count.by_op, count.by_op


def test_fused_forward_compiles_with_fullgraph() -> None:
    """The static-buffer step compiles the forward whole (issue 33): no graph break in the
    fused layers, even when the impl is first resolved inside the compiled region."""
    model = tiny_model("llada", seed=1)
    tokens = torch.randint(0, EOS, (1, 4), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(4)[None]
    caches = [model.new_cache(1, 8) for _ in range(2)]
    mask = caches[0].valid_keys()
    model.__dict__.pop("_attn_impl_memo", None)
    # dynamo's tracing is what can break; the eager backend skips Inductor's minutes of codegen
    step = torch.compile(lambda t, p: model(t, p, cache=caches[0], mask=mask), fullgraph=True,
                         backend="eager")
    with torch.no_grad():
        got = step(tokens, pos)
        want = model(tokens, pos, cache=caches[1], mask=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[0].k, caches[1].k, atol=1e-5, rtol=1e-5)
