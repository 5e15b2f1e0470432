"""The test bed's exact oracle as a **uniform-noise** model (DiffusionGemma's noise kind).

``UniformOracle(WaitingLineOracle(...))`` answers the question a uniform-noise denoiser answers:
given the prompt and a canvas whose every position is either the answer's token or uniform
noise, what is each position's distribution? Under the forward process "each answer token is
kept with probability ``a`` and replaced by a uniformly random token otherwise" (a token kept
or drawn equal to itself both read as a match), the exact posterior over the task's valid
answers (uniform a priori, as the generators draw them) is

    w(ans) ∝ mean_a prod_i (a [x_i = ans_i] + (1 - a) / V)

with the clean fraction ``a`` unknown to the model (DiffusionGemma is not told the step
either), averaged over a uniform grid ``ALPHAS``; positions of earlier canvases are committed
(exact matches). Each canvas position gets the marginal of ``w`` (floored at ``FLOOR``, as
logits). It is the uniform counterpart of the mask oracle's exact conditionals: errors a
decoder makes against it come from decoding, not from the model. Self-conditioning is ignored.

Interface: the parts of ``models.diffusion_gemma.DiffusionGemmaModel`` that the uniform noise
kind uses (``samplers.uniform``, ``cache.canvas``: ``noise_kind``, ``canvas_length``,
``new_cache``, ``encode``, ``decode``). Host-side Python per row (it parses prompts), as the
mask oracle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.models.oracle import WaitingLineOracle

#: the clean-fraction grid the posterior averages over (a uniform prior on (0, 1))
ALPHAS: Final = tuple((i + 0.5) / 20 for i in range(20))
#: probability floor of impossible tokens (log = -20.7)
FLOOR: Final = 1e-9


def noisy_posterior(answers: Tensor, canvas: Tensor, keep: Tensor, vocab_size: int, *,
                    noise_tokens: int | None = None, known: Tensor | None = None,
                    prior: Tensor | None = None) -> Tensor:
    """Exact posterior marginals ``[R, G, V]`` (float64) of the clean answer behind noisy
    canvases that share one prompt.

    Forward process: every known canvas position holds the answer's token with probability
    ``a`` and a token drawn uniformly from ``noise_tokens`` tokens otherwise (a draw equal to the
    answer's token reads as a match), with the keep probability ``a`` unknown: uniform over the
    grid ``keep``. Unknown positions (``known`` False: masked) carry no evidence. The answer is
    uniform over the rows of ``answers`` a priori (times ``prior``, e.g. 0 / 1 for answers an
    earlier commit rules out), so

        w(ans) ∝ prior(ans) mean_a prod_{i known} (a [x_i = ans_i] + (1 - a) / noise_tokens)

    and each position's marginal is the ``w``-weighted histogram of ``answers[:, i]``.

    Args:
        answers: ``[M, G]`` the valid answers; canvas: ``[R, G]`` token ids.
        keep: ``[A]`` float64 keep probabilities (the prior grid of ``a``).
        vocab_size: the output's last dimension (token ids index it).
        noise_tokens: how many tokens the noise draws from (``None``: ``vocab_size``).
        known: ``[R, G]`` bool, positions that carry evidence (``None``: all).
        prior: ``[M]`` non-negative answer weights (``None``: uniform).
    """
    match = (answers[None] == canvas[:, None]).double()  # [R, M, G]
    a = keep.double()[:, None, None, None]  # [A, 1, 1, 1]
    log_l = torch.log(a * match[None] + (1 - a) / (noise_tokens or vocab_size))  # [A,R,M,G]
    if known is not None:
        log_l = log_l * known[None, :, None, :]
    log_w = torch.logsumexp(log_l.sum(-1), 0)  # [R, M]
    if prior is not None:
        log_w = log_w + torch.log(prior.double().clamp_min(1e-300))[None]
    w = torch.softmax(log_w, -1)  # [R, M]
    r, g = canvas.shape
    probs = torch.zeros(r, g, vocab_size, dtype=torch.float64, device=canvas.device)
    index = answers.T[None].expand(r, g, -1)  # [R, G, M]
    return probs.scatter_add_(2, index, w[:, None, :].expand(r, g, -1))


@dataclass
class OracleCache:
    """Per row: the prompt ids (padding removed) and the committed answer tokens so far."""

    max_len: int
    prompts: list[list[int]] = field(default_factory=list)
    committed: list[list[int]] = field(default_factory=list)
    prompt_length: int = 0
    length: int = 0


class UniformOracle:
    """A ``WaitingLineOracle`` seen as a uniform-noise model with one canvas per
    ``canvas_length`` answer tokens (module docstring)."""

    noise_kind = "uniform"
    mask_token_id = None
    attention = "bidirectional"
    block_size = None
    logit_shift = 0
    family = "oracle_uniform"

    def __init__(self, oracle: WaitingLineOracle, canvas_length: int,
                 generation: dict[str, Any] | None = None) -> None:
        self.oracle = oracle
        self.canvas_length = canvas_length
        self.generation_defaults = dict(generation or {})
        self.vocab_size = oracle.vocab_size
        self.eos_token_ids = tuple(oracle.eos_token_ids)
        self.pad_token_id = oracle.pad_token_id
        self.max_length = oracle.max_length
        self.device = torch.device("cpu")
        self._alphas = torch.tensor(ALPHAS, dtype=torch.float64)

    def new_cache(self, batch_size: int, max_len: int) -> OracleCache:
        return OracleCache(max_len=max_len)

    def encode(self, tokens: Tensor, cache: OracleCache, valid: Tensor | None = None, *,
               prompt: bool = True) -> None:
        """The prompt (first call) or a finished canvas (committed answer tokens)."""
        rows = tokens.tolist()
        if prompt:
            keep = valid.tolist() if valid is not None else [[True] * len(r) for r in rows]
            cache.prompts = [[t for t, k in zip(r, m, strict=True) if k]
                             for r, m in zip(rows, keep, strict=True)]
            cache.committed = [[] for _ in rows]
            cache.prompt_length = tokens.shape[1]
        else:
            for done, r in zip(cache.committed, rows, strict=True):
                done.extend(r)
        cache.length += tokens.shape[1]

    def decode(self, canvas: Tensor, cache: OracleCache,
               self_conditioning: Tensor | None = None) -> Tensor:
        """Log posterior marginals ``[B, C, V]`` (float32) of the canvas positions."""
        g = cache.max_len - cache.prompt_length
        v = self.vocab_size
        out = torch.empty(*canvas.shape, v, dtype=torch.float64)
        for r, (prompt, done) in enumerate(zip(cache.prompts, cache.committed, strict=True)):
            answers = self.oracle.answer_table(prompt, g)  # [M, G]
            k0 = len(done)
            weight = torch.ones(answers.shape[0], dtype=torch.float64)
            if done:  # earlier canvases are committed: exact matches only
                ok = (answers[:, :k0] == torch.tensor(done)).all(1)
                weight = ok.double() if ok.any() else weight
            span = answers[:, k0:k0 + canvas.shape[1]]  # [M, C]
            probs = noisy_posterior(span, canvas[r][None], self._alphas, v, prior=weight)[0]
            out[r] = probs.clamp_min(FLOOR).log()
        return out.float()

    forward = decode
