"""Tokens per forward: the one speed figure every part of the library reports.

**Tokens per forward** (``tpf``, printed ``tokens/forward``) = the answer's tokens up to its
first stop token (EOS, end of turn; the whole answer when there is none; a truncator's cut
ends it too), summed over rows, divided by the forwards those rows took (NFE), summed over
rows. It is the figure papers report (EOS filling after the answer is not speed), and it is
what ``dllm-decode generate`` prints, the ``--plot`` title, ``examples/compare_policies.py``,
``check_policy``'s report, ``eval analyze``'s ``tpf`` column and the benchmarks' ``tpf`` rows
show. Each of them calls :func:`answer_lengths` and :func:`tokens_per_forward`.

Figures that count something else carry their own name:

* **tokens per step** (``tokens_per_step``): the generation budget (``gen_length``, EOS fill
  included) / NFE; ParallelBench's x axis, ``gen_length / steps`` for fixed schedules;
* **commits per forward**: positions committed per forward in one step (EOS fill included; the
  per-step dots of ``plot_decoding``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from torch import Tensor

#: how the figure is printed (``tokens/forward=2.50``) and explained next to it
TPF_UNIT: Final[str] = "tokens/forward"
TPF_MEANING: Final[str] = "answer tokens up to EOS per forward"
TOKENS_PER_STEP_MEANING: Final[str] = "generation budget (EOS fill included) per forward"


def answer_length(ids: Sequence[int], stop_ids: Iterable[int]) -> int:
    """Tokens of one answer ``ids`` before its first stop token (all of them if none)."""
    stops = set(stop_ids)
    return next((i for i, token in enumerate(ids) if token in stops), len(ids))


def answer_lengths(answer: Tensor | Sequence[Sequence[int]], stop_ids: Iterable[int],
                   lengths: Tensor | Sequence[int] | None = None) -> list[int]:
    """Per row, the answer tokens up to the first stop token.

    Args:
        answer: ``[B, G]`` generated tokens (``Generation.answer``) or lists of ids.
        stop_ids: EOS / end-of-turn ids (``text.stop_token_ids``, ``model.eos_token_ids``).
        lengths: ``[B]`` each row's length after truncation (``Generation.lengths``): a row
            ends there even without a stop token.

    Returns: ``[B]`` counts (syncs: read after decoding, never inside the step loop).
    """
    rows = answer.tolist() if isinstance(answer, Tensor) else [list(r) for r in answer]
    if lengths is not None:
        cut = lengths.tolist() if isinstance(lengths, Tensor) else list(lengths)
        rows = [row[: int(n)] for row, n in zip(rows, cut, strict=True)]
    stops = set(stop_ids)
    return [answer_length(row, stops) for row in rows]


def tokens_per_forward(tokens: Sequence[float], nfe: Sequence[float]) -> float:
    """Pooled ``sum(tokens) / sum(nfe)`` (dInfer's TPF); with ``tokens`` from
    :func:`answer_lengths` it is *the* tokens per forward.

    Raises: ``ValueError`` for sequences of different lengths, none, or no forwards.
    """
    if len(tokens) != len(nfe):
        raise ValueError(f"length mismatch: {len(tokens)} token counts vs {len(nfe)} NFE")
    if not tokens:
        raise ValueError("need at least one sample")
    total = float(sum(nfe))
    if total <= 0:
        raise ValueError("total NFE must be > 0")
    return float(sum(tokens)) / total


def tokens_per_step(budget: Sequence[float], nfe: Sequence[float]) -> float:
    """Pooled ``sum(gen_length) / sum(nfe)``: the generation budget per forward, EOS fill
    included (not tokens per forward: it counts the fill). Raises as
    :func:`tokens_per_forward`."""
    return tokens_per_forward(budget, nfe)


def generation_tpf(generation: Any, stop_ids: Iterable[int]) -> tuple[float, list[int]]:
    """``(tokens per forward, answer lengths [B])`` of a ``Generation`` (zero forwards: 0)."""
    useful = answer_lengths(generation.answer, stop_ids, generation.lengths)
    nfe = generation.nfe.tolist()
    return (tokens_per_forward(useful, nfe) if sum(nfe) > 0 else 0.0), useful


def model_stop_ids(model: Any) -> tuple[int, ...]:
    """The model's own EOS ids (``eos_token_ids``, else ``eos_token_id``), for callers without
    a tokenizer (``check_policy``, benchmarks on random weights)."""
    ids = getattr(model, "eos_token_ids", None)
    if ids:
        return tuple(int(i) for i in ids)
    eos = getattr(model, "eos_token_id", None)
    return () if eos is None else (int(eos),)
