"""Live terminal view of a canvas filling in (``dllm-decode generate --show``), using rich."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text
from torch import Tensor

from dllm_decode.types import StepState


class CanvasView:
    """Context manager; ``update(state, commit)`` is an ``on_step`` callback.

    Masked positions are dimmed, positions committed this step are highlighted. On a terminal
    the frame is redrawn in place; piped, only the last frame is written, on lines of its own.
    """

    def __init__(self, tokenizer: Any, mask_id: int | None, prompt_length: int,
                 console: Console | None = None) -> None:
        self.tok, self.mask_id, self.p = tokenizer, mask_id, prompt_length
        self.live = Live(Text(""), console=console or Console(stderr=True), refresh_per_second=20,
                         transient=False)

    def __enter__(self) -> CanvasView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)
        if not self.live.console.is_terminal:  # piped: rich wrote the last frame without an
            self.live.console.line()           # end of line, the answer would follow on it

    def render(self, canvas: list[int], fresh: list[bool], step: int) -> Text:
        text = Text(f"step {step:>4}  ", style="bold")
        sep = getattr(self.tok, "separator", "")  # token ids (``--token-ids``) need one
        for tok, new in zip(canvas, fresh, strict=True):
            if tok == self.mask_id:
                text.append("░" + sep, style="dim")
            else:
                piece = self.tok.decode([tok]) if hasattr(self.tok, "decode") else str(tok)
                text.append(piece + sep, style="bold green" if new else "")
        return text

    def update(self, state: StepState, commit: Tensor) -> None:
        # display only: this callback syncs (it is off unless --show is given)
        canvas = state.canvas[0, self.p:].clone()
        new = commit[0, self.p:]
        canvas[new] = state.proposal.tokens[0, self.p:][new]
        self.live.update(self.render(canvas.tolist(), new.tolist(), state.step))
