"""What the word-level oracles share (``models/oracle.py``: the Waiting Line test bed;
``models/long_oracle.py``: Test bed III): their ``DiffusionLM`` attributes and the check that a
forward's mask is plain full visibility, the only kind an oracle serves exactly."""

from __future__ import annotations

import torch
from torch import Tensor

PAD, EOS, MASK = "<pad>", "<eos>", "<mask>"


class WordOracleAttrs:
    """The ``DiffusionLM`` attributes every word-level oracle shares (bidirectional,
    position-aligned, no cache), from its ``vocab`` and ``token_id``."""

    attention: str = "bidirectional"
    block_size: int | None = None
    logit_shift: int = 0
    vocab: tuple[str, ...]
    token_id: dict[str, int]

    @property
    def mask_token_id(self) -> int:
        return self.token_id[MASK]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return (self.token_id[EOS],)

    @property
    def pad_token_id(self) -> int:
        return self.token_id[PAD]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def rope_positions(self, valid: Tensor) -> Tensor:
        """Positions ``[B, L]`` (unused by an oracle; present for sampler compatibility)."""
        b, length = valid.shape
        return torch.arange(length, device=valid.device).expand(b, length)


def visible_keys(mask: Tensor | None, b: int, n: int, device: torch.device, *,
                 refused: str, use_instead: str) -> Tensor:
    """The keys ``[B, N]`` (bool) every query of a plain full-visibility ``mask`` sees
    (``None``: all of them); any other mask is refused (see ``WaitingLineOracle.forward``;
    ``refused`` / ``use_instead`` word the error for the oracle that refuses)."""
    if mask is None:
        return torch.ones(b, n, dtype=torch.bool, device=device)
    if mask.dtype != torch.bool or tuple(mask.shape) not in ((b, n), (b, n, n)):
        raise ValueError(f"{refused}: the mask must be bool [B, N] = {[b, n]} or [B, N, N] = "
                         f"{[b, n, n]} (keys = the fed canvas); got {mask.dtype} "
                         f"{list(mask.shape)}{use_instead}")
    if mask.dim() == 3:
        if not bool((mask == mask[:, :1]).all()):
            raise ValueError(f"{refused}: the mask lets queries see different keys (packed "
                             f"branches, a shadow block or a verifier's rows){use_instead}")
        mask = mask[:, 0]
    return mask.to(device)
