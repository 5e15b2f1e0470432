"""Input embeddings rewritten before a forward, for policies that feed a soft input state.

ReMix (Rejection Mixing, arXiv 2602.22868; ``policies.remix``) feeds a still-masked position
not as the mask token's embedding but as a mix of it and the embeddings of the tokens the
model predicted there at the previous step; its authors call the model with ``inputs_embeds``
(``Serpientw/ReMix-DLLM`` ``LLaDA/model/decoding.py``). ``feed_embeddings`` gives
``DecoderLM`` that path without a new forward signature: while its context is open, a forward
hook on the model's input embedding (``DecoderLM.embed``) hands the looked-up embeddings
``[B, N, H]`` of the fed tokens to ``transform`` and feeds what it returns (same shape and
dtype) to the layers. Outside the context nothing is hooked. ``transform`` sees the fed
tokens' embeddings in canvas order; callers that need canvas-wide inputs (ReMix) run uncached
forwards over the whole canvas and check ``N`` themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from torch import Tensor, nn


class FedEmbeddings:
    """A context in which the forwards of ``model`` feed ``transform(embeds)`` instead of the
    embeddings of their tokens.

    Args:
        model: a ``DecoderLM`` (an ``embed`` ``nn.Embedding`` whose output the layers read).
        transform: ``[B, N, H]`` embeddings -> ``[B, N, H]`` embeddings (same dtype).

    Raises:
        ValueError: a model without an ``nn.Embedding`` ``embed``.
    """

    def __init__(self, model: nn.Module, transform: Callable[[Tensor], Tensor]) -> None:
        embed = getattr(model, "embed", None)
        if not isinstance(embed, nn.Embedding):
            raise ValueError(f"soft inputs replace DecoderLM's input embeddings; this model "
                             f"({type(model).__name__}) has no nn.Embedding 'embed'")
        self._embed = embed
        self._transform = transform
        self._handle: Any = None

    def __enter__(self) -> FedEmbeddings:
        self._handle = self._embed.register_forward_hook(self._hook)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.remove()
        self._handle = None

    def _hook(self, module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
        new = self._transform(out)
        if new.shape != out.shape or new.dtype != out.dtype:
            raise ValueError(f"soft inputs must keep the embeddings' shape and dtype "
                             f"{tuple(out.shape)} {out.dtype}, got {tuple(new.shape)} "
                             f"{new.dtype}")
        return new


def feed_embeddings(model: nn.Module, transform: Callable[[Tensor], Tensor]) -> FedEmbeddings:
    """``FedEmbeddings(model, transform)`` (checked now; hooked only inside ``with``)."""
    return FedEmbeddings(model, transform)
