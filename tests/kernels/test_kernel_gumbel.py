"""gumbel_sample: exact against the reference with supplied noise; in-kernel Philox noise
checked for determinism and, statistically, against softmax(logits / T)."""

from __future__ import annotations

import pytest
import torch
from kernel_utils import special_logits

from dllm_decode import kernels
from dllm_decode.kernels import reference

pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

#: chi-square critical values at p = 0.001 by degrees of freedom
CHI2_CRIT = {6: 22.458, 7: 24.322}


@pytest.mark.parametrize(("rows", "vocab", "dtype", "temperature"), [
    (16, 7, torch.float32, 0.7),
    (4, 1000, torch.float16, 1.0),
    (3, 5003, torch.float32, 1.9),
    (3, 5003, torch.bfloat16, 0.3),
])
def test_gumbel_with_noise_matches_reference(rows, vocab, dtype, temperature, device):
    logits = special_logits(rows, vocab, dtype, seed=vocab).to(device)
    noise = torch.rand(logits.shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(rows)).to(device)
    got = kernels.gumbel_sample(logits, temperature, noise=noise, impl="triton")
    want = reference.gumbel_sample(logits, temperature, noise=noise)
    assert torch.equal(got.token, want.token)
    torch.testing.assert_close(got.p_token, want.p_token, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.lse, want.lse, atol=1e-4, rtol=1e-6)
    finite = logits.float().gather(-1, got.token[:, None])[:, 0]
    assert torch.isfinite(finite).all()  # a -inf logit is never drawn


def test_gumbel_zero_temperature_is_argmax(device):
    logits = special_logits(6, 1000, torch.float32, seed=2).to(device)
    got = kernels.gumbel_sample(logits, 0.0, impl="triton")
    stats = reference.confidence_stats(logits)
    assert torch.equal(got.token, stats["token"])
    torch.testing.assert_close(got.p_token, stats["p_max"], atol=5e-5, rtol=0)


def test_philox_stream_is_deterministic(device):
    logits = torch.zeros(8, 100, device=device)  # uniform: the token is the noise argmax
    a = kernels.gumbel_sample(logits, 1.0, seed=5, offset=0, impl="triton").token
    b = kernels.gumbel_sample(logits, 1.0, seed=torch.tensor(5, device=device), offset=0,
                              impl="triton").token
    c = kernels.gumbel_sample(logits, 1.0, seed=5, offset=8 * 100, impl="triton").token
    d = kernels.gumbel_sample(logits, 1.0, seed=6, offset=0, impl="triton").token
    assert torch.equal(a, b)
    assert (a != c).sum() >= 6 and (a != d).sum() >= 6  # fresh noise: almost all rows differ
    assert len(set(a.tolist())) >= 6  # rows get different noise


def test_gumbel_active_rows(device):
    logits = torch.randn(5, 7, device=device)
    active = torch.tensor([True, False, True, True, False], device=device)
    got = kernels.gumbel_sample(logits, 1.0, seed=1, active=active, impl="triton")
    assert (got.token[~active] == -1).all() and torch.isneginf(got.p_token[~active]).all()
    assert (got.token[active] >= 0).all()


def test_gumbel_frequencies_match_softmax(device):
    """5,120 draws packed 128 rows per program: chi-square against softmax(z / T)."""
    temperature, draws = 0.8, 5120
    z = torch.tensor([0.3, -1.2, 2.0, 0.0, -float("inf"), 1.1, -0.4, 0.9])
    logits = z.expand(draws, -1).contiguous().to(device)
    got = kernels.gumbel_sample(logits, temperature, seed=1234, impl="triton")
    counts = torch.bincount(got.token.cpu(), minlength=8).double()
    probs = torch.softmax(z.double() / temperature, dim=0)
    assert counts[4] == 0  # zero-probability token never drawn
    keep = probs > 0
    expected = probs[keep] * draws
    chi2 = (((counts[keep] - expected) ** 2) / expected).sum().item()
    assert chi2 < CHI2_CRIT[int(keep.sum()) - 1], (chi2, counts.tolist())
    # p_token is the un-noised, untempered probability of the drawn token
    p = torch.softmax(z.double(), 0)[got.token.cpu()].float()
    torch.testing.assert_close(got.p_token.cpu(), p, atol=1e-6, rtol=1e-5)
