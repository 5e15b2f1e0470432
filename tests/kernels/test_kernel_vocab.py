"""confidence_stats and propose: Triton (interpreter on CPU) against the torch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_utils import SENTINEL, embed, outside_untouched, special_logits

from dllm_decode import kernels
from dllm_decode.kernels import reference
from dllm_decode.kernels.common import STAT_NAMES

pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

#: absolute tolerances per statistic (one-pass online rescaling vs torch); kernels.md §4.4
ATOL = {"lse": 1e-4, "p_max": 5e-5, "margin": 5e-5, "logit_margin": 1e-4, "neg_entropy": 1e-4}


def assert_stats_close(got: dict, want: dict, active: torch.Tensor | None = None) -> None:
    assert torch.equal(got["token"].cpu(), want["token"].cpu())
    for name, atol in ATOL.items():
        g, w = got[name].cpu(), want[name].cpu()
        if active is not None:
            assert torch.isneginf(g[~active.cpu()]).all(), name
            g, w = g[active.cpu()], w[active.cpu()]
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-5, equal_nan=False, msg=name)


CASES = [  # rows, V, dtype
    (24, 7, torch.float32),
    (6, 1000, torch.float16),
    (5, 5003, torch.float32),
    (5, 5003, torch.bfloat16),  # bf16 storage only: loaded and converted to fp32
    (1, 1, torch.float32),
]


@pytest.mark.parametrize(("rows", "vocab", "dtype"), CASES)
def test_confidence_matches_reference(rows, vocab, dtype, device):
    logits = special_logits(rows, vocab, dtype, seed=rows + vocab).to(device)
    got = kernels.confidence_stats(logits, impl="triton")
    want = reference.confidence_stats(logits)
    assert_stats_close(got, want)
    if rows > 4:  # the edge rows behave as documented
        assert got["token"][1].item() == vocab // 3  # tie -> lowest index, across chunks
        assert got["token"][4].item() == 0 and got["margin"][4].item() == 0.0


def test_confidence_strided_3d_and_active(device):
    """[B, L, V] slice whose rows cannot merge, inside a NaN-padded buffer; some rows off."""
    full = special_logits(2 * 9, 1000, torch.float32, seed=3).view(2, 9, 1000)
    padded, _ = embed(full.to(device))
    logits = padded[:, 2:7, :]  # [2, 5, 1000], stride (9*row, row, 1), row = 1008
    active = torch.ones(2, 5, dtype=torch.bool, device=device)
    active[0, 1] = active[1, 4] = False
    got = kernels.confidence_stats(logits, active, impl="triton")
    want = reference.confidence_stats(logits.contiguous())
    assert (got["token"][~active] == -1).all()
    want["token"] = want["token"].masked_fill(~active, -1)
    assert_stats_close(got, want, active)


def test_confidence_canaries(device):
    """Outputs written exactly where they belong; padding of inputs never read."""
    from dllm_decode.kernels.triton import N_OUT, launch_vocab

    logits, _ = embed(special_logits(7, 5003, torch.float32, seed=5).to(device), pad=16)
    token, token_base = embed(torch.zeros(7, dtype=torch.int64, device=device), fill=-5)
    sample, sample_base = embed(torch.zeros(7, dtype=torch.int64, device=device), fill=-5)
    out, out_base = embed(torch.zeros(N_OUT, 7, device=device), fill=SENTINEL)
    launch_vocab(logits, token, sample, out, stats=True)
    assert outside_untouched(token, token_base, -5)
    assert outside_untouched(out, out_base, SENTINEL)
    assert outside_untouched(sample, sample_base, -5) and not sample.any()  # not sampling
    want = reference.confidence_stats(logits)
    got = {"token": token, **{n: out[i] for i, n in enumerate(STAT_NAMES)}}
    assert_stats_close(got, want)
    assert not torch.isnan(out[: len(STAT_NAMES)]).any()


def test_propose_greedy_matches_reference(device):
    logits = special_logits(12, 1000, torch.float16, seed=8).view(2, 6, 1000).to(device)
    got = kernels.propose(logits, temperature=0.0, impl="triton")
    want = reference.propose(logits, temperature=0.0)
    assert torch.equal(got.tokens, want.tokens)
    for field in ("prob", "margin", "logit_margin", "neg_entropy"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), atol=1e-4,
                                   rtol=1e-5, msg=field)


@pytest.mark.parametrize("fields", [(), ("margin",), ("logit_margin", "neg_entropy")])
def test_propose_returns_the_asked_fields_on_both_paths(fields, device):
    logits = special_logits(12, 1000, torch.float16, seed=8).view(2, 6, 1000).to(device)
    got = kernels.propose(logits, temperature=0.0, impl="triton", fields=fields)
    want = reference.propose(logits, temperature=0.0, fields=fields)
    assert torch.equal(got.tokens, want.tokens) and got.lse is not None
    for field in ("margin", "logit_margin", "neg_entropy"):
        assert got.has(field) == want.has(field) == (field in fields), field
        if field in fields:
            torch.testing.assert_close(got.get(field), want.get(field), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.5, 1.3])
def test_propose_gumbel_with_noise_is_exact(temperature, device):
    logits = (torch.randn(2, 3, 5003, generator=torch.Generator().manual_seed(1)) * 2).to(device)
    noise = torch.rand(logits.shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(2)).to(device)
    got = kernels.propose(logits, temperature=temperature, noise=noise, impl="triton")
    want = reference.propose(logits, temperature=temperature, noise=noise)
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.prob, want.prob, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.neg_entropy, want.neg_entropy, atol=1e-4, rtol=1e-5)


def test_propose_generator_path(device):
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(4)).to(device)
    gen = torch.Generator(device=device)
    first = kernels.propose(logits, temperature=1.0, generator=gen.manual_seed(7), impl="triton")
    again = kernels.propose(logits, temperature=1.0, generator=gen.manual_seed(7), impl="triton")
    assert torch.equal(first.tokens, again.tokens)
    p = torch.softmax(logits.double(), -1).gather(-1, first.tokens[..., None])[..., 0]
    torch.testing.assert_close(first.prob, p.float(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 5.0])
@pytest.mark.parametrize("path", ["noise", "generator"])
def test_propose_greedy_is_the_argmax_on_every_path(temperature, path, device):
    """``Proposal.greedy`` is ``logits.argmax`` whatever the temperature and noise source, on
    the Triton path as on the reference (stoppers, KLASS, CCD and Learn2PD read it)."""
    logits = (torch.randn(2, 5, 3001, generator=torch.Generator().manual_seed(11)) * 3).to(device)
    want = logits.argmax(-1)
    noise = None
    if path == "noise":
        noise = torch.rand(logits.shape, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(12)).to(device)
    for impl in ("triton", "reference"):
        gen = torch.Generator(device=device).manual_seed(3)
        got = kernels.propose(logits, temperature=temperature, noise=noise, generator=gen,
                              impl=impl)
        assert torch.equal(got.greedy, want), impl
        if temperature > 0:
            assert got.argmax is not None, impl
    if temperature >= 5.0:  # hot sampling: the sampled tokens differ from the argmax
        assert not torch.equal(got.tokens, want)


def test_propose_categorical_routing(device):
    logits = torch.randn(1, 4, 30, device=device)
    with pytest.raises(NotImplementedError, match="categorical"):
        kernels.propose(logits, sampling="categorical", impl="triton")
    got = kernels.propose(logits, sampling="categorical", top_p=0.9, impl="auto")
    want = reference.propose(logits, sampling="categorical", top_p=0.9)
    assert torch.equal(got.tokens, want.tokens)


@pytest.mark.slow
def test_confidence_llada_vocab(device):
    """Opt-in (-m slow): one full LLaDA-size vocabulary, several seconds in the interpreter."""
    logits = special_logits(5, 126_464, torch.float32, seed=11).to(device)
    assert_stats_close(kernels.confidence_stats(logits, impl="triton"),
                       reference.confidence_stats(logits))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_confidence_and_propose_full_vocab_on_gpu(dtype, device):
    """Dream-size vocabulary, bf16 logits, many rows (GPU only: seconds in the interpreter)."""
    logits = special_logits(64, 152_064, dtype, seed=12).to(device)
    assert_stats_close(kernels.confidence_stats(logits, impl="triton"),
                       reference.confidence_stats(logits))
    noise = torch.rand(logits.shape, dtype=torch.float64, device=device)
    got = kernels.propose(logits, temperature=0.9, noise=noise, impl="triton")
    want = reference.propose(logits, temperature=0.9, noise=noise)
    assert torch.equal(got.tokens, want.tokens)
