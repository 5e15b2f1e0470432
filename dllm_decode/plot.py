"""Pictures of how a canvas was decoded (``dllm-decode generate --plot``).

``plot_decoding(generation)`` draws, for one row of a ``Generation``:

* **commit order**: a generated-positions x steps map; a cell is blank while the position is
  masked and coloured by its commit step from then on (the staircase of LLaDA's figure), the
  commit itself marked; positions cut by a truncator (EoTP) are hatched grey; token edits
  (``Generation.edits``: a committed position rewritten, LLaDA2.1) are marked with a red cross;
* **tokens per step**: tokens committed at each step (and positions edited, for editing
  policies), model forwards that step (S2D2's verifier adds some) and their ratio (commits per
  forward, EOS fill included), with full cache refreshes marked (every step without a cache).

The title gives the row's tokens per forward as ``dllm_decode.speed`` defines it (answer tokens
up to EOS per forward) when the stop tokens are passed, else the committed positions per
forward, labelled as such.

Needs matplotlib (the ``eval`` extra); it is imported on first use, with the Agg canvas only
(the caller's pyplot backend is left alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import torch

from dllm_decode.speed import TPF_UNIT, answer_lengths, tokens_per_forward
from dllm_decode.types import Generation

#: default figure size (inches) and resolution: 1000 x 700 pixels
FIGSIZE: Final[tuple[float, float]] = (10.0, 7.0)
DPI: Final[int] = 100
#: at most this many token labels on the position axis (more would overlap)
_MAX_LABELS: Final[int] = 64


def plot_decoding(generation: Generation, path: str | Path | None = None, *, row: int = 0,
                  decode: Callable[[Sequence[int]], str] | None = None,
                  stop_token_ids: Sequence[int] | None = None, title: str | None = None,
                  figsize: tuple[float, float] = FIGSIZE, dpi: int = DPI) -> Any:
    """Draw the commit order of one row of ``generation``; save a PNG if ``path`` is given.

    Args:
        generation: the result of ``DiffusionSampler.generate`` (uses ``commit_step [B, G]``,
            ``lengths [B]``, ``refreshed [B, steps]`` and ``step_forwards``).
        path: where to write the PNG (``figsize * dpi`` pixels exactly); ``None``: don't save.
        row: which batch row to draw.
        decode: token ids -> text, to label positions with their final tokens (e.g. a
            tokenizer's ``decode``); ``None``: position indices.
        stop_token_ids: the ids that end an answer (``TextGeneration.stop_token_ids``): the
            title then gives the row's tokens per forward (answer tokens up to EOS per
            forward, ``dllm_decode.speed``); ``None``: committed positions per forward.
        title: figure title (default: steps, forwards and the per-forward figure above).
        figsize, dpi: figure size in inches and resolution.

    Returns: the ``matplotlib.figure.Figure``. Syncs (reads the tensors to the host).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    b = generation.commit_step.shape[0]
    if not 0 <= row < b:
        raise ValueError(f"row must be in [0, {b}), got {row}")
    order = generation.commit_step[row].cpu()
    steps = max(generation.steps, 1)
    length = int(generation.lengths[row])
    per_step = generation.commits_per_step()[row].cpu()
    forwards = torch.tensor(generation.step_forwards or [1] * generation.steps)
    refreshed = (generation.refreshed[row].cpu() if generation.refreshed is not None
                 else torch.zeros(generation.steps, dtype=torch.bool))

    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
    top.tick_params(labelbottom=True)  # shared steps axis: label it under both panels
    edited = _order_panel(fig, top, generation, row, order, steps, length, decode)
    _step_panel(top, bottom, generation, per_step, forwards, refreshed, edited)
    n_fwd = int(forwards.sum())
    n_steps = f"{generation.steps} step{'s' if generation.steps != 1 else ''}"
    if stop_token_ids is not None:
        tokens = answer_lengths(generation.answer[row:row + 1], stop_token_ids, [length])[0]
        nfe = int(generation.nfe[row])  # the row's forwards (a separate prefill included)
        rate = f"{tokens_per_forward([tokens], [max(nfe, 1)]):.2f} {TPF_UNIT} ({tokens} answer " \
               f"tokens up to EOS / NFE {nfe})"
    else:
        rate = f"{int(per_step.sum()) / max(n_fwd, 1):.2f} committed positions/forward"
    fig.suptitle(title or f"row {row}: {n_steps}, {n_fwd} forward{'s' if n_fwd != 1 else ''}, "
                 f"{rate}")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    return fig


def _order_panel(fig: Any, top: Any, generation: Generation, row: int, order: torch.Tensor,
                 steps: int, length: int, decode: Callable[[Sequence[int]], str] | None
                 ) -> torch.Tensor | None:
    """The commit-order image ``[G, steps]`` with its commits, edits and truncated tail;
    returns the row's edits ``[steps, G]`` (``None`` without editing)."""
    from matplotlib.ticker import MaxNLocator

    g = order.shape[0]
    # image [G, steps]: NaN while masked, the commit step once committed
    grid = torch.arange(steps, dtype=torch.float32)[None].expand(g, -1)
    done = (order[:, None] >= 0) & (grid >= order[:, None])
    image = torch.where(done, order[:, None].float().expand(-1, steps), torch.nan)
    shown = top.imshow(image.numpy(), aspect="auto", origin="upper", cmap="viridis",
                       interpolation="nearest", extent=(-0.5, steps - 0.5, g - 0.5, -0.5),
                       vmin=-0.5, vmax=steps - 0.5)  # one colour band per step, 1 step too
    at = (order >= 0).nonzero().flatten()
    top.scatter(order[at].numpy(), at.numpy(), s=12, c="white", edgecolors="black",
                linewidths=0.4, zorder=3, label="commit")
    edited = None
    if generation.edits is not None:
        edited = generation.edits[row].cpu()  # [steps, G]
        hit = edited.nonzero()
        if len(hit):
            top.scatter(hit[:, 0].numpy(), hit[:, 1].numpy(), s=20, c="tab:red", marker="x",
                        linewidths=0.9, zorder=4, label="edit")
    if length < g:
        top.axhspan(length - 0.5, g - 0.5, color="0.6", alpha=0.5, hatch="//",
                    label="cut (truncated)")
    top.set_ylabel("generated position")
    if decode is not None and g <= _MAX_LABELS:
        answer = generation.answer[row].tolist()
        top.set_yticks(range(g), [decode([t]) for t in answer], fontsize=6)
    fig.colorbar(shown, ax=top, label="commit step", pad=0.01,
                 ticks=MaxNLocator(integer=True, min_n_ticks=1))
    return edited


def _step_panel(top: Any, bottom: Any, generation: Generation, per_step: torch.Tensor,
                forwards: torch.Tensor, refreshed: torch.Tensor,
                edited: torch.Tensor | None) -> None:
    """Per step: tokens committed (and edited), forwards, commits per forward, the cache
    refreshes (marked on both panels), and the legends."""
    from matplotlib.ticker import MaxNLocator

    x = torch.arange(generation.steps).numpy()
    bottom.bar(x, per_step.numpy(), color="tab:blue", label="tokens committed")
    if edited is not None and edited.any():
        bottom.bar(x, edited.sum(1).numpy(), bottom=per_step.numpy(), color="tab:red",
                   label="tokens edited")
    bottom.step(x, forwards.numpy(), where="mid", color="tab:orange", label="forwards",
                marker="_" if generation.steps < 2 else None, markersize=14)  # 1 step: a dash
    ratio = per_step.float() / forwards.clamp(min=1).float()
    bottom.plot(x, ratio.numpy(), "o", color="black", markersize=3, label="commits per forward")
    fresh = refreshed.nonzero().flatten()
    if len(fresh) and not bool(refreshed.all()):  # without a cache every step recomputes
        for i in fresh.tolist():
            top.axvline(i - 0.5, color="tab:red", linestyle="--", linewidth=0.8, alpha=0.7)
        top.plot([], [], color="tab:red", linestyle="--", label="cache refresh")
    stacked = per_step if edited is None else per_step + edited.sum(1)
    height = float(torch.maximum(stacked.max(), forwards.max())) if generation.steps else 1.0
    top.legend(loc="upper right", fontsize=7)
    bottom.plot(fresh.numpy(), [height * 1.12] * len(fresh), "v", color="tab:red",
                markersize=4, label="full refresh")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    bottom.set_xlabel("step")
    bottom.set_ylabel("per step")
    bottom.set_ylim(0, height * 1.75)  # room for the refresh marks and the legend
    bottom.legend(loc="upper right", fontsize=7, ncols=4)
