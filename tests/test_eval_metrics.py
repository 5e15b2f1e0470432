"""Metric formulas on hand-computed fixtures (values worked out by hand in the comments)."""

from __future__ import annotations

import math

import pytest

from dllm_decode.eval.metrics import (
    aup,
    kendall_tau,
    nfe_mean,
    pareto_front,
    pbx,
    qps,
    speedup,
    tokens_per_second,
    tpf_macro,
    tpf_micro,
)


def test_tpf_micro_macro_and_throughput() -> None:
    tokens, nfe = [10, 30], [5, 10]
    assert tpf_micro(tokens, nfe) == pytest.approx(40 / 15)  # pooled
    assert tpf_macro(tokens, nfe) == pytest.approx((2 + 3) / 2)  # per-sample mean
    assert nfe_mean(nfe) == 7.5
    assert tokens_per_second(tokens, [2.0, 6.0]) == 5.0
    assert speedup(50.0, 10.0) == 5.0 and speedup(32, 8) == 4.0  # NFE baseline / method
    with pytest.raises(ValueError):
        tpf_micro([1], [1, 2])
    with pytest.raises(ValueError):
        tpf_macro([1, 2], [1, 0])
    with pytest.raises(ValueError):
        nfe_mean([])
    with pytest.raises(ValueError):
        speedup(1.0, 0.0)


def test_qps() -> None:
    assert qps(2.0, 90.0, 100.0) == pytest.approx(2.0 * 0.9**4)  # 1.3122
    assert qps(3.0, 50.0, 50.0) == 3.0
    with pytest.raises(ValueError):
        qps(1.0, 1.0, 0.0)


def test_aup_hand_computed() -> None:
    # y_max 100: W(90) = e^-0.3, W(88) = e^-0.36; area = 1*90 + 2 * (88 W88 + 90 W90) / 2.
    expected = 90 + (88 * math.exp(-0.36) + 90 * math.exp(-0.3))
    assert aup([(3.0, 88.0), (1.0, 90.0)], y_max=100.0) == pytest.approx(expected)
    # 70 < 80 - 5 is cut; both kept points sit at y_max, so W = 1: 1*80 + 1 * (80+80)/2.
    assert aup([(1, 80), (2, 80), (4, 70)], y_max=80) == pytest.approx(160.0)
    assert aup([(2.0, 50.0)], y_max=90.0) == 100.0  # single point: rho_1 * y_1
    # Duplicate TPF keeps the best accuracy.
    assert aup([(1, 60), (1, 80), (2, 80)], y_max=80) == pytest.approx(160.0)
    # W is capped at 1 when y exceeds y_max (y_max from another method's leaderboard).
    assert aup([(1, 90), (2, 90)], y_max=80) == pytest.approx(90 + 90)
    with pytest.raises(ValueError):
        aup([], y_max=1.0)
    with pytest.raises(ValueError):
        aup([(1, 1)], y_max=0.0)


def test_pbx_discrete() -> None:
    points = [(1, 95), (2, 85), (4, 72), (8, 40)]
    assert [pbx(points, x, adaptive=False) for x in (90, 80, 70, 60)] == [1, 2, 4, 4]
    assert pbx(points, 99, adaptive=False) is None  # no config meets x
    assert pbx([(1, 95), (2, 50), (4, 92)], 90, adaptive=False) == 4  # non-monotone curve
    assert pbx([(2, 60), (2, 91)], 90, adaptive=False) == 2  # duplicate x keeps best score
    assert pbx([(3, 100)], 90, adaptive=True) == 3  # single point


def test_pbx_interpolated() -> None:
    points = [(1.5, 95), (3, 85), (6, 55)]
    assert pbx(points, 90, adaptive=True) == pytest.approx(1.5 + 5 / 10 * 1.5)  # 2.25
    assert pbx(points, 60, adaptive=True) == pytest.approx(3 + 25 / 30 * 3)  # 5.5
    assert pbx(points, 50, adaptive=True) == 6  # last point still meets x
    assert pbx(points, 96, adaptive=True) is None
    # Two crossings of 90: the rightmost (3 -> 4) is used: 3 + (92 - 90) / (92 - 50) * 1.
    wiggly = [(1, 95), (2, 80), (3, 92), (4, 50)]
    assert pbx(wiggly, 90, adaptive=True) == pytest.approx(3 + 2 / 42)


def test_kendall_tau() -> None:
    assert kendall_tau([0, 1, 2, 3]) == 1.0
    assert kendall_tau([3, 2, 1, 0]) == -1.0
    # Ties: pairs (0,1) and (2,3) tied in step; 4 concordant. tau-b = 4 / sqrt(6 * 4).
    assert kendall_tau([0, 0, 1, 1]) == pytest.approx(4 / math.sqrt(24))
    assert kendall_tau([0, -1, 1, -1, 2]) == 1.0  # never-committed positions are skipped
    assert kendall_tau([2, 0, 1, 3], length=2) == -1.0
    assert kendall_tau([5, 5, 5]) is None  # all tied: undefined
    assert kendall_tau([0]) is None and kendall_tau([]) is None


def test_kendall_tau_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    steps = [4, 0, 0, 2, 7, 2, 1, 1, 5, 3]
    expected = stats.kendalltau(list(range(len(steps))), steps).statistic
    assert kendall_tau(steps) == pytest.approx(expected)


def test_pareto_front() -> None:
    points = [(1, 90), (2, 85), (2, 80), (3, 70), (1.5, 60)]
    assert pareto_front(points) == [0, 1, 3]
    assert pareto_front([(1, 1)]) == [0] and pareto_front([]) == []
