"""Per-row (per-request) seeded random numbers and sampling: batch-invariant, exact.

Row b's uniforms and tokens are a function of ``row_seeds[b]`` (and its logits) only: the same
in a batch of B rows, alone, or with the rows permuted; the Triton vocabulary pass hashes the
same bits in-kernel (interpreter on a CPU) and its tokens equal the reference's.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from dllm_decode import kernels
from dllm_decode.kernels import reference, rng, selfcheck
from dllm_decode.kernels.common import RNG_GAMMA

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = torch.tensor([0, 1, -1, 2**63 - 1, -2**63, 123456789, 42], dtype=torch.int64)


def _splitmix64(seed: int, n: int) -> list[int]:
    """The textbook splitmix64 stream, in plain Python integers (no torch)."""
    state, out = seed & (2**64 - 1), []
    for _ in range(n):
        state = (state + RNG_GAMMA) & (2**64 - 1)
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        out.append(z ^ (z >> 31))
    return out


def _logits(*shape: int, seed: int = 0) -> torch.Tensor:
    """Tie-free logits (continuous random values)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2


# ---- row_uniform / mix_seeds ----------------------------------------------------------------


def test_row_uniform_is_splitmix64_of_the_row_key() -> None:
    # the published splitmix64 stream for seed 0 starts 0xE220A8397B1DCDAF
    assert _splitmix64(0, 1) == [0xE220A8397B1DCDAF]
    u = kernels.row_uniform(SEEDS, (7, 2, 3))
    assert u.dtype == torch.float64 and u.shape == (7, 2, 3)
    for b, seed in enumerate(SEEDS.tolist()):
        signed = [z - 2**64 if z >> 63 else z for z in _splitmix64(seed, 6)]
        want = [0.5 + ((z >> 11) | 1) * 2.0**-53 for z in signed]
        assert u[b].flatten().tolist() == want


def test_row_uniform_is_batch_invariant() -> None:
    shape = (7, 5, 11)
    full = kernels.row_uniform(SEEDS, shape)
    for b in range(7):
        alone = kernels.row_uniform(SEEDS[b:b + 1], (1, *shape[1:]))
        assert torch.equal(alone[0], full[b])
    perm = torch.tensor([3, 0, 6, 2, 5, 1, 4])
    assert torch.equal(kernels.row_uniform(SEEDS[perm], shape), full[perm])
    bigger = torch.cat([SEEDS, torch.arange(9, dtype=torch.int64)])
    assert torch.equal(kernels.row_uniform(bigger, (16, 5, 11))[:7], full)


def test_row_uniform_statistics() -> None:
    u = kernels.row_uniform(torch.arange(64, dtype=torch.int64), (64, 4096))
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert abs(float(u.mean()) - 0.5) < 0.002  # sd of the mean: 0.29 / 512
    ordered = u.flatten().sort().values
    grid = torch.arange(1, u.numel() + 1, dtype=torch.float64) / u.numel()
    ks = float((ordered - grid).abs().max())
    assert ks < 1.63 / math.sqrt(u.numel()) * 1.5  # KS at p = 0.01, with slack
    assert len(set(u[:, 0].tolist())) == 64  # every seed its own stream
    # the extreme hash bits land strictly inside (0, 1): all zeros, all ones, the sign bit
    edges = rng.bits_to_uniform(torch.tensor([-2**63, 2**63 - 1, 0, -1, 2047, 4096]))
    assert edges.tolist() == [2.0**-53, 1 - 2.0**-53, 0.5 + 2.0**-53, 0.5 - 2.0**-53,
                              0.5 + 2.0**-53, 0.5 + 3 * 2.0**-53]


def test_different_seeds_and_counters_differ() -> None:
    a = kernels.row_uniform(torch.tensor([5, 6]), (2, 100))
    assert (a[0] != a[1]).all()
    keys = torch.stack([kernels.mix_seeds(SEEDS, step) for step in range(50)])
    assert len(set(keys.flatten().tolist())) == keys.numel()
    assert not torch.equal(keys[0], SEEDS)


def test_mix_seeds_int_and_tensor_counters_agree_and_are_per_row() -> None:
    steps = torch.tensor([0, 3, 3, 9, -4, 2**40, 7])
    per_row = kernels.mix_seeds(SEEDS, steps)
    for b in range(7):
        assert int(kernels.mix_seeds(SEEDS[b:b + 1], int(steps[b]))) == int(per_row[b])
    perm = torch.tensor([6, 5, 4, 3, 2, 1, 0])
    assert torch.equal(kernels.mix_seeds(SEEDS[perm], steps[perm]), per_row[perm])
    host = [rng.mix_seeds_int(s, c) for s, c in zip(SEEDS.tolist(), steps.tolist(), strict=True)]
    assert per_row.tolist() == host  # the host twin (no tensor) gives the same keys


def test_mix_seeds_never_collides_for_small_seeds_and_counters() -> None:
    # keys of (s1, c1) != (s2, c2) meet only if s1 ^ s2 == (c1 G + SALT) ^ (c2 G + SALT); for
    # counters below 2**20 the xor is >= |c1 G - c2 G| (mod 2**64) >= 2**43 > any s1 ^ s2 with
    # seeds below 2**32
    d = torch.arange(1, 2**20, dtype=torch.int64) * rng._signed(RNG_GAMMA)
    assert int(d.abs().min()) >= 2**43
    keys = torch.stack([kernels.mix_seeds(torch.arange(64, dtype=torch.int64), c)
                        for c in range(64)])
    assert len(set(keys.flatten().tolist())) == keys.numel()


@pytest.mark.parametrize("bad", [torch.tensor([1.0]), torch.tensor([[1]]),
                                 torch.tensor([1], dtype=torch.int32)])
def test_bad_seeds_are_refused(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"row seeds must be a \[B\] int64 tensor"):
        kernels.row_uniform(bad, (1, 3))
    with pytest.raises(ValueError, match="shape must start with B"):
        kernels.row_uniform(SEEDS, (3, 3))
    with pytest.raises(ValueError, match="counter must be"):
        kernels.mix_seeds(SEEDS, torch.zeros(3, dtype=torch.int64))


# ---- propose with row seeds (reference) -----------------------------------------------------


def test_gumbel_tokens_are_gumbel_argmax_of_row_uniform() -> None:
    logits = _logits(4, 6, 50)
    seeds = SEEDS[:4]
    got = kernels.propose(logits, temperature=0.7, row_seeds=seeds, impl="reference")
    noise = kernels.row_uniform(seeds, logits.shape)
    assert torch.equal(got.tokens, reference.gumbel_argmax(logits, 0.7, noise))
    same = kernels.propose(logits, temperature=0.7, noise=noise, impl="reference")
    assert torch.equal(got.tokens, same.tokens) and torch.equal(got.prob, same.prob)
    sample = kernels.gumbel_sample(logits, 0.7, row_seeds=seeds, impl="reference")
    assert torch.equal(sample.token, got.tokens)


@pytest.mark.parametrize(("sampling", "top_p", "top_k"), [
    ("gumbel", None, None), ("categorical", 0.9, None), ("categorical", None, 7),
    ("llada2", 0.8, 10)])
def test_proposal_tokens_are_batch_invariant(sampling, top_p, top_k) -> None:
    logits = _logits(5, 4, 64, seed=1)
    seeds = kernels.mix_seeds(SEEDS[:5], 3)
    kw = {"temperature": 0.9, "sampling": sampling, "top_p": top_p, "top_k": top_k,
          "impl": "reference"}
    full = kernels.propose(logits, row_seeds=seeds, **kw)
    for b in range(5):
        alone = kernels.propose(logits[b:b + 1], row_seeds=seeds[b:b + 1], **kw)
        assert torch.equal(alone.tokens[0], full.tokens[b])
        assert torch.equal(alone.prob[0], full.prob[b])
    perm = torch.tensor([4, 2, 0, 3, 1])
    permuted = kernels.propose(logits[perm], row_seeds=seeds[perm], **kw)
    assert torch.equal(permuted.tokens, full.tokens[perm])
    other = kernels.propose(logits, row_seeds=kernels.mix_seeds(SEEDS[:5], 4), **kw)
    assert not torch.equal(other.tokens, full.tokens)  # a fresh step draws fresh tokens


def test_categorical_noise_is_minus_log_row_uniform() -> None:
    logits = _logits(3, 5, 40, seed=2)
    seeds = SEEDS[2:5]
    got = kernels.propose(logits, temperature=1.3, sampling="categorical", top_p=0.85,
                          row_seeds=seeds)
    noise = (-kernels.row_uniform(seeds, logits.shape).log()).float()
    want = kernels.propose(logits, temperature=1.3, sampling="categorical", top_p=0.85,
                           noise=noise)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.prob, want.prob)
    kept = reference.filter_logits(logits, 1.3, 0.85, None) > torch.finfo(torch.float32).min
    assert bool(kept.gather(-1, got.tokens[..., None]).all())  # never outside the nucleus


def test_generator_path_and_errors_unchanged() -> None:
    logits = _logits(2, 3, 30, seed=3)
    a = kernels.propose(logits, temperature=0.8, generator=torch.Generator().manual_seed(1))
    b = kernels.propose(logits, temperature=0.8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens)
    noise = torch.rand(logits.shape, dtype=torch.float64)
    with pytest.raises(ValueError, match="noise or row_seeds, not both"):
        kernels.propose(logits, temperature=0.8, noise=noise, row_seeds=SEEDS[:2])
    with pytest.raises(ValueError, match=r"one seed per batch row \(2\)"):
        kernels.propose(logits, temperature=0.8, row_seeds=SEEDS[:3])


# ---- Triton (the interpreter on a CPU) ------------------------------------------------------


@pytest.fixture
def triton_device():
    """Where Triton runs: CUDA, else the CPU interpreter (TRITON_INTERPRET, tests/conftest)."""
    pytest.importorskip("triton")
    from dllm_decode.kernels import triton as backend

    cuda = torch.cuda.is_available()
    if cuda == backend.INTERPRETED:
        pytest.skip("Triton was loaded for the other device kind in this process")
    with warnings.catch_warnings():
        for message in selfcheck.INTERPRETER_NUMPY_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=RuntimeWarning,
                                    module=selfcheck.INTERPRETER_MODULE)
        yield torch.device("cuda" if cuda else "cpu")


def test_triton_row_uniform_bits_equal_the_reference(triton_device) -> None:
    seeds = SEEDS.to(triton_device)
    for shape in ((7, 1), (7, 3, 5), (7, 1500)):
        got = kernels.row_uniform(seeds, shape, impl="triton")
        assert torch.equal(got.cpu(), kernels.row_uniform(SEEDS, shape, impl="reference"))


@pytest.mark.parametrize(("shape", "dtype", "temperature"), [
    ((3, 4, 37), torch.float32, 0.8), ((5, 300), torch.float16, 1.0),
    ((2, 2, 2500), torch.bfloat16, 0.5)])
def test_triton_propose_equals_reference(shape, dtype, temperature, triton_device) -> None:
    logits = _logits(*shape, seed=4).to(triton_device, dtype)
    seeds = SEEDS[:shape[0]].to(triton_device)
    got = kernels.propose(logits, temperature=temperature, row_seeds=seeds, impl="triton")
    want = kernels.propose(logits, temperature=temperature, row_seeds=seeds,
                           impl="reference")
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.greedy, want.greedy)
    torch.testing.assert_close(got.prob, want.prob, atol=1e-5, rtol=1e-4)
    sample = kernels.gumbel_sample(logits, temperature, row_seeds=seeds, impl="triton")
    assert torch.equal(sample.token, want.tokens)


def test_triton_uniform_logits_pick_the_largest_uniform(triton_device) -> None:
    # equal logits: the Gumbel-max token is the argmax of the row's uniforms (exact bits)
    logits = torch.zeros(3, 4, 700, device=triton_device)
    seeds = SEEDS[:3].to(triton_device)
    got = kernels.propose(logits, temperature=1.0, row_seeds=seeds, impl="triton")
    assert torch.equal(got.tokens.cpu(),
                       kernels.row_uniform(SEEDS[:3], logits.shape).argmax(-1))


def test_triton_tokens_are_batch_invariant(triton_device) -> None:
    logits = _logits(4, 3, 90, seed=5).to(triton_device)
    seeds = SEEDS[:4].to(triton_device)
    full = kernels.propose(logits, temperature=0.9, row_seeds=seeds, impl="triton").tokens
    for b in range(4):
        alone = kernels.propose(logits[b:b + 1], temperature=0.9, row_seeds=seeds[b:b + 1],
                                impl="triton").tokens
        assert torch.equal(alone[0], full[b])
    perm = torch.tensor([2, 0, 3, 1], device=triton_device)
    strided = logits[perm].transpose(0, 1).contiguous().transpose(0, 1)  # any strides
    permuted = kernels.propose(strided, temperature=0.9, row_seeds=seeds[perm], impl="triton")
    assert torch.equal(permuted.tokens, full[perm])


def test_triton_gumbel_sample_active_rows(triton_device) -> None:
    logits = _logits(5, 40, seed=6).to(triton_device)
    seeds = SEEDS[:5].to(triton_device)
    active = torch.tensor([True, False, True, True, False], device=triton_device)
    got = kernels.gumbel_sample(logits, 0.6, row_seeds=seeds, active=active, impl="triton")
    want = kernels.gumbel_sample(logits, 0.6, row_seeds=seeds, active=active,
                                 impl="reference")
    assert torch.equal(got.token, want.token)
    assert got.token[1] == -1 and got.token[4] == -1


@pytest.mark.parametrize("op", ["propose", "gumbel_sample", "row_uniform"])
def test_selfcheck_covers_row_seeds(op, triton_device) -> None:
    assert selfcheck.check(op, triton_device) is None
