"""``cache="dllm_cache"``: dLLM-Cache's adaptive feature caching as a cache plan.

Liu et al., "dLLM-Cache: Accelerating Diffusion Large Language Models with Adaptive Caching",
arXiv 2506.06295 (ICML 2026); reference maomaocun/dLLM-cache @ 17235bf
(``dllm_cache/cache/Cache.py`` ``dLLMCache``, ``dllm_cache/hooks/cache_hook_LLaDA.py``). Every
step feeds the whole canvas; inside the forward each layer reuses cached features:

* the prompt's K/V, attention and FFN outputs are recomputed every ``K_p`` forwards
  (``prompt_refresh_every``), the response's every ``K_r`` (``refresh_every``): forward ``s``
  (1-based, counted from the start of ``generate``, across blocks) refreshes the prompt when
  ``(s - 1) % K_p == 0`` and the response when ``(s - 1) % K_r == 0``; the first layer always
  refreshes both (the reference's ``layer_id == 0``);
* between response refreshes, the ``int(rho * G)`` response tokens (``refresh_ratio``; over the
  whole answer, not the block) whose fresh V has the lowest cosine similarity to the cached V
  are recomputed (their Q, K, attention and FFN; V is refreshed for every response token).

The per-layer forward is ``DecoderLM.feature_forward`` (``models.feature_cache``). NFE is
unchanged (one forward per step); what shrinks is the work inside it, recorded as
``Generation.step_positions`` (positions recomputed, averaged over the layers).

Paper defaults (the authors' ``scripts/run_*.sh``; ``DLLM_CACHE_DEFAULTS``): LLaDA-8B-Instruct
GSM8K ``K_p = 50, K_r = 7``, Dream-7B-Instruct GSM8K ``K_p = 25, K_r = 2``, ``rho = 0.25``
everywhere. Deviations: left-padding keys stay hidden (the reference passes no attention
mask); the cached attention / FFN outputs of a refreshing layer are its residual differences
(within an ulp of the projections the reference caches: the refreshing layer itself is then
bit-identical to the uncached one); classifier-free guidance caches both halves per row (the
reference's separate ``cfg_interval_steps`` residual cache is not provided).
"""

from __future__ import annotations

from typing import Any, Final

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.cache.fed import Fed, Feed
from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.types import CacheMode, DiffusionLM, FeatureCachedLM

#: ``(K_p, K_r)`` per model family (the authors' GSM8K scripts for the Instruct models); any
#: other family gets LLaDA's
DLLM_CACHE_DEFAULTS: Final[dict[str, tuple[int, int]]] = {"llada": (50, 7), "dream": (25, 2)}
#: ``rho``, the share of response tokens recomputed between refreshes (every script)
DLLM_CACHE_RATIO: Final = 0.25


class FeatureStore:
    """Per-generation features of every layer (``layers[i]``: ``k``, ``v`` ``[B, Hkv, L, D]``
    with K rotated, ``att``, ``mlp`` ``[B, L, d]``), the prompt/response split and the partial
    refresh rule. ``recomputed``: the last forward's positions recomputed (mean over layers).
    """

    def __init__(self, num_layers: int, prompt_length: int, ratio: float) -> None:
        self.layers: list[dict[str, Tensor]] = [{} for _ in range(num_layers)]
        self.prompt_length, self.ratio = prompt_length, ratio
        self.recomputed = 0.0

    def select(self, v_new: Tensor, v_old: Tensor) -> Tensor:
        """``[B, k]`` response indices to recompute: the ``k = int(G * ratio)`` rows of
        ``v_new`` with the lowest cosine similarity to ``v_old`` (both ``[B, G, C]``;
        ``refresh_index``: ``torch.topk(largest=False)``)."""
        k = int(v_new.shape[1] * self.ratio)
        sim = F.cosine_similarity(v_new, v_old, dim=-1)
        return torch.topk(sim, k=k, largest=False).indices

    def count(self, positions: float) -> None:
        self.recomputed = positions


class DllmCachePlan(ForwardPlan):
    """The ``dllm_cache`` plan (see the module docstring): a whole-canvas forward every step
    through ``model.feature_forward``; no K/V cache (extra forwards recompute the canvas).

    Args:
        model: a bidirectional ``FeatureCachedLM`` (``DecoderLM``: LLaDA, Dream).
        valid, positions: ``[B', L]`` as ``ForwardPlan``.
        prompt_every, gen_every: ``K_p`` and ``K_r``.
        ratio: ``rho`` in ``[0, 1]``.
    """

    def __init__(self, model: FeatureCachedLM, valid: Tensor, positions: Tensor, *,
                 prompt_every: int, gen_every: int, ratio: float) -> None:
        if model.attention != "bidirectional":
            raise ValueError("cache='dllm_cache' caches the features of bidirectional models "
                             "(LLaDA, Dream); block-diffusion models use cache='block_causal'")
        if not callable(getattr(model, "feature_forward", None)):
            raise ValueError(f"cache='dllm_cache' needs the model's per-layer forward "
                             f"(feature_forward); {type(model).__name__} has none: use "
                             "cache='none', 'prefix' or 'dual'")
        super().__init__(model, CacheMode.NONE, valid, positions)
        self.mode = CacheMode.DLLM_CACHE
        self.prompt_every, self.gen_every, self.ratio = prompt_every, gen_every, ratio
        self.store: FeatureStore | None = None
        self.forwards = 0  # forwards run (the reference's step counter)

    def forward(self, canvas: Tensor, block: tuple[int, int], aligned_start: int,
                step_in_block: int, lo: int, full_span: bool,
                host: list[int] | None = None) -> Fed:
        """The whole canvas; the prompt is everything before the first block."""
        if self.store is None:
            self.store = FeatureStore(len(self.model.layers), block[0], self.ratio)
        return super().forward(canvas, block, aligned_start, step_in_block, lo, full_span,
                               host)

    def run(self, canvas: Tensor, feed: Feed) -> Fed:
        """One forward under the schedule (``feed``: the whole canvas, rows ``[lo, hi)``)."""
        s = self.forwards
        self.forwards += 1
        prompt, gen = s % self.prompt_every == 0, s % self.gen_every == 0
        length = self.length
        if ("dllm",) not in self._memo:  # per generation (``restrict`` clears it)
            self._memo[("dllm",)] = (self.model.rope_tables(self.positions),
                                     self._self_mask(0, length, self._arange(0, length)))
        rope, full_mask = self._memo[("dllm",)]
        rows = None if (feed.lo, feed.hi) == (0, length) else self._arange(feed.lo, feed.hi)
        logits = self.model.feature_forward(
            canvas, self.positions, self.store, refresh_prompt=prompt, refresh_gen=gen,
            full_mask=full_mask, key_mask=None if self.dense else self.valid,
            hidden_rows=rows, rope=rope)
        return Fed(logits, self._arange(feed.lo, feed.hi), 0, length, refresh=prompt and gen,
                   span=(feed.lo, feed.hi), positions=self.store.recomputed)


def dllm_cache_plan(model: DiffusionLM, mode: CacheMode, valid: Tensor, positions: Tensor,
                    cfg: Any, family: str = "", cache: Any = None,
                    sub_block: int | None = None) -> DllmCachePlan:
    """The plan from a ``SamplerConfig``: ``prompt_refresh_every`` (``K_p``), ``refresh_every``
    (``K_r``) and ``refresh_ratio`` (``rho``), each defaulting to ``DLLM_CACHE_DEFAULTS`` /
    ``DLLM_CACHE_RATIO`` for the model's family (a ``cache.table.PLANS`` builder; it keeps
    features, not K/V, so ``cache`` and ``sub_block`` are not used)."""
    kp, kr = DLLM_CACHE_DEFAULTS.get(family, DLLM_CACHE_DEFAULTS["llada"])
    ratio = DLLM_CACHE_RATIO if cfg.refresh_ratio is None else cfg.refresh_ratio
    return DllmCachePlan(model, valid, positions, prompt_every=cfg.prompt_refresh_every or kp,
                         gen_every=cfg.refresh_every or kr, ratio=ratio)
