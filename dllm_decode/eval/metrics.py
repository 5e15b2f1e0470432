"""Speed / quality metrics for parallel decoding, as pure functions over per-sample numbers.

Conventions (see ``shared/research/evaluation.md`` section 3):

* **NFE**: model forward passes per sample (cache refreshes and verifier passes count).
* **TPF** (tokens per forward, ``dllm_decode.speed``): *micro* = sum(tokens) / sum(NFE); *macro*
  = mean(tokens_i / NFE_i), with the answer tokens up to the first EOS (``gen_tokens_useful``).
  The same pooled ratio over ``gen_tokens_budget`` (the generation length, EOS fill included) is
  ParallelBench's "tokens per step", reported under that name.
* **Tokens per second** = sum(tokens) / sum(seconds); **speed-up** = method / baseline
  throughput (or baseline NFE / method NFE for a hardware-independent speed-up).
* **QPS** (SchED): speedup * (score / baseline_score) ** gamma, gamma = 4.
* **AUP** (d3LLM / hao-ai-lab): weighted trapezoid area under accuracy-vs-TPF.
* **PBx** (ParallelBench v2): the largest tokens-per-step whose average score is still >= x.
* **Decoding-order Kendall tau**: tau-b between each position's commit step and its index
  (1 = strictly left to right).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from dllm_decode.speed import tokens_per_forward

#: SchED's quality exponent: a 1 % score drop costs about 4 % of the speed-up.
QPS_GAMMA: Final[float] = 4.0
#: AUP weight sharpness alpha in W(y) = min(exp(-alpha (1 - y / y_max)), 1).
AUP_ALPHA: Final[float] = 3.0
#: AUP keeps points within this many accuracy points (percent) of the lowest-TPF point.
AUP_CUTOFF: Final[float] = 5.0
#: Score thresholds (percent) reported as PB90 / PB80 / PB70 / PB60.
PBX_LEVELS: Final[tuple[float, ...]] = (90.0, 80.0, 70.0, 60.0)

Point = tuple[float, float]


def _check_same_length(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b):
        raise ValueError(f"length mismatch: {len(a)} vs {len(b)}")
    if not a:
        raise ValueError("need at least one sample")


def nfe_mean(nfe: Sequence[float]) -> float:
    """Mean forward passes per sample."""
    if not nfe:
        raise ValueError("need at least one sample")
    return float(sum(nfe)) / len(nfe)


#: tokens per forward, pooled: ``sum(tokens) / sum(nfe)`` (dInfer's "TPF"; ``speed``'s one
#: definition, with the answer tokens up to EOS as ``tokens``)
tpf_micro = tokens_per_forward


def tpf_macro(tokens: Sequence[float], nfe: Sequence[float]) -> float:
    """Tokens per forward, per-sample mean: ``mean(tokens_i / nfe_i)``."""
    _check_same_length(tokens, nfe)
    if any(n <= 0 for n in nfe):
        raise ValueError("every sample needs NFE > 0")
    return sum(t / n for t, n in zip(tokens, nfe, strict=True)) / len(nfe)


def tokens_per_second(tokens: Sequence[float], seconds: Sequence[float]) -> float:
    """Throughput ``sum(tokens) / sum(seconds)`` (Fast-dLLM ``show_speed``)."""
    _check_same_length(tokens, seconds)
    total = float(sum(seconds))
    if total <= 0:
        raise ValueError("total time must be > 0")
    return float(sum(tokens)) / total


def speedup(method: float, baseline: float) -> float:
    """``method / baseline`` for a higher-is-better rate (tokens/s, TPF). For NFE or latency
    (lower is better) pass them swapped: ``speedup(nfe_baseline, nfe_method)``."""
    if baseline <= 0 or method < 0:
        raise ValueError(f"need baseline > 0 and method >= 0, got {baseline}, {method}")
    return method / baseline


def qps(speed_up: float, score: float, baseline_score: float, gamma: float = QPS_GAMMA) -> float:
    """Quality-penalised speed (SchED): ``speed_up * (score / baseline_score) ** gamma``."""
    if baseline_score <= 0:
        raise ValueError(f"baseline score must be > 0, got {baseline_score}")
    return speed_up * (score / baseline_score) ** gamma


def _best_per_x(points: Sequence[Point]) -> list[Point]:
    """Sort by x and keep the highest y among points sharing an x."""
    best: dict[float, float] = {}
    for x, y in points:
        best[x] = max(y, best.get(x, -math.inf))
    return sorted(best.items())


def aup(
    points: Sequence[Point],
    y_max: float,
    alpha: float = AUP_ALPHA,
    cutoff: float = AUP_CUTOFF,
) -> float:
    """Accuracy under parallelism.

    Args:
        points: ``(tpf, accuracy_percent)`` per decoding config of one method on one task.
        y_max: best accuracy of *any* method on the task (AUP compares within a task).
        alpha: weight sharpness; cutoff: accuracy points below the first point to keep.

    Points are sorted by TPF (a duplicated TPF keeps its best accuracy); points with accuracy
    below ``y_1 - cutoff`` are dropped (``y_1`` = accuracy at the lowest TPF); then
    ``AUP = rho_1 y_1 + sum_i (rho_i - rho_{i-1}) (y_i W(y_i) + y_{i-1} W(y_{i-1})) / 2`` with
    ``W(y) = min(exp(-alpha (1 - y / y_max)), 1)``. A single point gives ``rho_1 y_1``.
    """
    if not points:
        raise ValueError("AUP needs at least one point")
    if y_max <= 0:
        raise ValueError(f"y_max must be > 0, got {y_max}")
    ordered = _best_per_x(points)
    first = ordered[0][1]
    kept = [(x, y) for x, y in ordered if y >= first - cutoff]

    def weighted(y: float) -> float:
        return y * min(math.exp(-alpha * (1.0 - y / y_max)), 1.0)

    area = kept[0][0] * kept[0][1]
    for (x0, y0), (x1, y1) in zip(kept, kept[1:], strict=False):
        area += (x1 - x0) * (weighted(y1) + weighted(y0)) / 2.0
    return area


def pbx(points: Sequence[Point], x: float, *, adaptive: bool) -> float | None:
    """ParallelBench PBx: the largest tokens-per-step at which the average score is >= ``x``.

    Args:
        points: ``(tokens_per_step, score_percent)``, one per decoding config (already averaged
            over tasks). A duplicated tokens-per-step keeps its best score.
        x: score threshold in percent (90 for PB90, ...).
        adaptive: top-k methods (``False``) take the largest tokens-per-step meeting ``x``;
            adaptive methods (``True``) take the last point if it meets ``x``, else interpolate
            linearly at the rightmost crossing ``lo -> hi`` (``S_lo >= x > S_hi``):
            ``T_lo + (S_lo - x) / (S_lo - S_hi) * (T_hi - T_lo)``.

    Returns:
        The PBx value, or ``None`` when no config reaches ``x``.
    """
    if not points:
        raise ValueError("PBx needs at least one point")
    ordered = _best_per_x(points)
    meeting = [t for t, s in ordered if s >= x]
    if not meeting:
        return None
    if not adaptive:
        return max(meeting)
    if ordered[-1][1] >= x:
        return ordered[-1][0]
    for (t_lo, s_lo), (t_hi, s_hi) in reversed(list(zip(ordered, ordered[1:], strict=False))):
        if s_lo >= x > s_hi:
            return t_lo + (s_lo - x) / (s_lo - s_hi) * (t_hi - t_lo)
    raise AssertionError("a point meets x, so a crossing exists")


def kendall_tau(commit_step: Sequence[int], length: int | None = None) -> float | None:
    """Kendall tau-b between each position's commit step and its index.

    Args:
        commit_step: ``[G]`` step at which each generated position was committed (-1 never).
        length: only score the first ``length`` positions (e.g. up to the first EOS).

    Returns:
        tau-b in [-1, 1] (ties, i.e. positions committed in the same step, are handled by the
        tau-b correction), or ``None`` when fewer than two committed positions exist or every
        position was committed in the same step (undefined).
    """
    steps = np.asarray(commit_step[:length] if length is not None else commit_step)
    index = np.flatnonzero(steps >= 0)
    steps = steps[index]
    if len(steps) < 2:
        return None
    upper = np.triu_indices(len(steps), k=1)
    step_sign = np.sign(steps[:, None] - steps[None, :])[upper]
    index_sign = np.sign(index[:, None] - index[None, :])[upper]  # never tied
    concordance = float(np.sum(step_sign * index_sign))
    untied_steps = float(np.count_nonzero(step_sign))
    if untied_steps == 0:
        return None
    return concordance / math.sqrt(untied_steps * len(step_sign))


def pareto_front(points: Sequence[Point]) -> list[int]:
    """Indices of the points not dominated in (x up, y up), ordered by increasing x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best_y = [], -math.inf
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return front[::-1]
