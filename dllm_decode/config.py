"""``SamplerConfig``: one frozen dataclass, validated where it is created."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from dllm_decode.policies.validate import check_fields
from dllm_decode.types import CacheMode, Impl

_SAMPLING = ("gumbel", "categorical", "llada2")
_SCHEDULES = ("llada", "dream")
_RNG = ("compact", "reference")


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in order, in O(sqrt(n)) (listed in error messages only)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class SamplerConfig:
    """Decoding settings shared by every policy.

    Attributes:
        gen_length: G, number of generated positions.
        block_length: K, semi-autoregressive block length (``None``: one block of G); LLaDA /
            Dream need ``G % K == 0`` (``check_block_division``, when decoding). Block-
            diffusion models always use their own block size (``None`` or that size), aligned
            to absolute positions, for any G (the last block is cut at ``P + G``, or decoded
            whole with ``decode_block_padding``); uniform-noise models decode canvases of
            their ``canvas_length`` (``None`` or that length) and cut the last one to G.
        steps: total steps for budgeted policies, split evenly over blocks (``None``: one
            token per step, i.e. G). Adaptive policies ignore it, except ``llada2``, which
            reads it as LLaDA2's ``generate`` does, as steps **per block** (``None``: 32;
            ``policies.editing.MinimalTopK``). Uniform-noise models: the total over their
            canvases (``None``: the policy's budget per canvas).
        temperature: 0 -> argmax proposals; > 0 -> sampling (float64 Gumbel-max for LLaDA).
        cache: which positions each forward recomputes (``none``/``prefix``/``dual``/
            ``block_causal``/``window``/``sub_block``/``dllm_cache``/``dsb``/``streaming``;
            ``dllm_decode.cache.plans``).
        refresh_every: with ``prefix``/``dual``, also refresh the cache every R steps inside
            a block (``None``: only at block start, as Fast-dLLM does); with ``window``, the
            phase length (Window-Diffusion ``refresh_cycle``; ``None``: 32); with
            ``dllm_cache``, the response's refresh interval ``K_r`` (``None``: 7 for LLaDA, 2
            for Dream, the authors' GSM8K settings); with ``dsb``, the DSB Cache's refresh
            period B in commits (``None``: 32; it must equal the ``dsb`` selector's ``block``).
        prompt_refresh_every: ``dllm_cache``: the prompt's refresh interval ``K_p`` (``None``:
            50 for LLaDA, 25 for Dream).
        refresh_ratio: ``dllm_cache``: the share ``rho`` of response tokens recomputed between
            response refreshes, those whose value vectors moved most (``None``: 0.25).
        causal_prefix: block-diffusion models: committed blocks (and the prompt's full blocks)
            attend causally, token by token, when their K/V are computed (S2D2's "AR-like
            caching", ``cache_ver``); the block being denoised still attends block-causally.
            ``None``: the policy's preference (``causal_prefix`` attribute), else off.
        window_tokens: ``cache="window"``: external window, the first W masked positions kept
            (stale) in attention besides decoded ones (``None``: 128 for Dream-family models,
            else 64); ``cache="streaming"``: masks kept after the block (``0``: only the
            tail; ``None``: 96 for LLaDA, 128 from 512 tokens on, 32 for Dream);
            ``cache="dsb"``: the DSB window's span cap (``None``: greedy, unbounded).
        active_tokens: ``cache="window"``: internal window, the first A masked positions
            recomputed and eligible on pruned steps (``None``: 16).
        window_truncate: ``cache="window"``: full steps also drop the far field (Dream's canvas
            truncation); ``None``: on for Dream-family models, off otherwise (LLaDA refreshes
            the whole canvas).
        cfg_scale: unsupervised classifier-free guidance ``un + (s + 1)(cond - un)`` (LLaDA).
        sampling: ``gumbel`` (LLaDA / Fast-dLLM), ``categorical`` with top-p/top-k (Dream) or
            ``llada2`` (categorical with top-k before top-p; with ``rng="reference"`` one
            multinomial draw per row of the current aligned block, as LLaDA2's ``generate``);
            ``None`` picks the model family's reference sampler.
        top_p, top_k: Dream-style filtering of the sampling distribution.
        schedule: per-step budget rule: ``llada`` (even split per block) or ``dream`` (time grid
            ``linspace(1, eps, steps + 1)``); ``None`` picks the family's.
        eps: final time of the Dream grid.
        logits_eos_inf: forbid EOS everywhere (LLaDA option).
        confidence_eos_eot_inf: rank EOS/EoT candidates last (LLaDA option); with
            ``eos_eot_reference_asymmetry`` the reference's behaviour is kept (both demoted at
            T = 0, only EoT at T > 0).
        stop_at_eos: once a row has a committed EOS with nothing masked before it, fill the
            masks after it with EOS and stop that row (dInfer-style early stop).
        eos_stop_on_commit: with ``stop_at_eos``, a row is checked only at a step that commits
            an EOS (LLaDA2.0's ``eos_early_stop``; by default every step checks, so a row also
            stops when the masks before an earlier EOS get committed).
        block_eos_stop: after each block, a row whose generated part so far holds an EOS stops
            (its later masks become EOS, no more forwards), as LLaDA2.0's ``generate`` does
            after every block (LLaDA2.1's with ``eos_early_stop``).
        eos_skip_block_start: with ``block_eos_stop`` on a block-diffusion model, an EOS at a
            block's first position does not stop the row. **A reference quirk, off by
            default**: Fast-dLLM v2's ``batch_sample`` never checks the token its cache forward
            appends at a block boundary against the stop token, so it decodes on past it.
        separate_prefill: block-diffusion caches (``block_causal``, ``sub_block``): the K/V of
            the prompt's complete blocks are computed in a forward of their own before the first
            step when the prompt ends inside a block, as Fast-dLLM v2's reference prefills (it
            counts in ``forwards`` and every row's NFE). Off (default): the first step's forward
            computes them too, one forward fewer for the same K/V and tokens. A block-aligned
            prompt needs no extra forward either way (the first step is the prefill).
        decode_block_padding: block-diffusion models whose last block ends past the answer
            (``P + G`` not a multiple of the block size) decode that block in full and cut
            the canvas back to ``P + G`` afterwards. **A reference quirk, off by default**:
            LLaDA2's ``generate`` rounds its canvas up to whole blocks, so the padding
            positions compete for the last block's commits and cost steps (the recorded
            cases need it); the default decodes exactly the ``G`` requested positions.
        rng: ``compact`` draws noise only for the rows that are scored; ``reference``
            reproduces the reference decoders exactly: noise drawn in their shapes and order
            (exact seeded conformance), the Gumbel path's confidence computed as theirs
            (softmax, then gather; ``ProposalMaker.reference_prob``) and budgeted top-k
            selection in their tie order (``torch.topk`` over the forward span,
            ``policies.base.reference_topk_mask``; it reads the budget on the host, so such
            steps run eagerly: no static-buffer step, no ``compile=True``). ``compact``
            breaks exact ties by the lower index, without host syncs.
        allow_prompt_masks: accept MASK tokens inside the prompt (LLaDA infilling semantics:
            they are eligible like block positions). As in LLaDA's ``generate``, the answer may
            then end with masks (the one exception to the no-masks contract).
        max_steps_per_block: safety cap for adaptive policies (``None``: the block's masked
            count, which always suffices since every step commits at least one position).
        exact_steps: run every scheduled step even after the block is complete, as the
            reference decoders do (their NFE accounting; e.g. Dream always runs ``steps``).
        impl: kernel implementation for the proposal op.
        seed: seed of the ``torch.Generator`` shared by the batch (``None``: 0), or one int per
            row (a list or tuple): every row is then decoded alone with its own generator, so
            sampled tokens do not depend on the batch (``samplers.batching``).
    """

    gen_length: int = 128
    block_length: int | None = None
    steps: int | None = None
    temperature: float = 0.0
    cache: CacheMode = CacheMode.NONE
    refresh_every: int | None = None
    prompt_refresh_every: int | None = None
    refresh_ratio: float | None = None
    causal_prefix: bool | None = None
    window_tokens: int | None = None
    active_tokens: int | None = None
    window_truncate: bool | None = None
    cfg_scale: float = 0.0
    sampling: str | None = None
    top_p: float | None = None
    top_k: int | None = None
    schedule: str | None = None
    eps: float = 1e-3
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False
    eos_eot_reference_asymmetry: bool = True
    stop_at_eos: bool = False
    eos_stop_on_commit: bool = False
    block_eos_stop: bool = False
    eos_skip_block_start: bool = False
    separate_prefill: bool = False
    decode_block_padding: bool = False
    rng: str = "compact"
    allow_prompt_masks: bool = False
    max_steps_per_block: int | None = None
    exact_steps: bool = False
    impl: Impl = Impl.AUTO
    seed: int | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        object.__setattr__(self, "cache", _enum(CacheMode, self.cache, "cache"))
        object.__setattr__(self, "impl", _enum(Impl, self.impl, "impl"))
        check_fields(self, "SamplerConfig")
        if isinstance(self.seed, list):
            object.__setattr__(self, "seed", tuple(self.seed))
        seeds = self.seed if isinstance(self.seed, tuple) else (self.seed,)
        check(self.seed is None or (len(seeds) > 0 and all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds)),
            f"seed must be an int, None, or a list of ints (one per row), got {self.seed!r}")
        check(all(s is None or -(2**63) <= s < 2**64 for s in seeds),
              f"seed must fit in 64 bits (torch.Generator), got {self.seed!r}")
        check(isinstance(self.gen_length, int) and self.gen_length >= 1,
              f"gen_length must be an int >= 1, got {self.gen_length!r}")
        check(self.block_length is None or self.block_length >= 1,
              f"block_length must be >= 1 or None, got {self.block_length!r}")
        check(self.steps is None or self.steps >= 1, f"steps must be >= 1, got {self.steps!r}")
        check(0 <= self.temperature < math.inf,
              f"temperature must be a finite number >= 0, got {self.temperature}")
        check(0 <= self.cfg_scale < math.inf,
              f"cfg_scale must be a finite number >= 0, got {self.cfg_scale}")
        check(self.refresh_every is None or self.refresh_every >= 1,
              f"refresh_every must be >= 1 or None, got {self.refresh_every!r}")
        check(self.prompt_refresh_every is None or self.prompt_refresh_every >= 1,
              f"prompt_refresh_every must be >= 1 or None, got {self.prompt_refresh_every!r}")
        check(self.refresh_ratio is None or 0 <= self.refresh_ratio <= 1,
              f"refresh_ratio must be in [0, 1] or None, got {self.refresh_ratio!r}")
        for name in ("prompt_refresh_every", "refresh_ratio"):
            check(getattr(self, name) is None or self.cache is CacheMode.DLLM_CACHE,
                  f"{name} configures cache='dllm_cache' and does nothing with cache="
                  f"{self.cache.value!r}: pass cache='dllm_cache' or leave {name}=None")
        for name in ("window_tokens", "active_tokens"):
            value = getattr(self, name)
            low = 0 if name == "window_tokens" and self.cache is CacheMode.STREAMING else 1
            check(value is None or (isinstance(value, int) and not isinstance(value, bool)
                                    and value >= low),
                  f"{name} must be an int >= {low} or None, got {value!r}")
        if self.window_tokens is not None and self.active_tokens is not None:
            check(self.active_tokens <= self.window_tokens,
                  f"active_tokens ({self.active_tokens}) must be <= window_tokens "
                  f"({self.window_tokens}): active positions live inside the window")
        check(self.sampling is None or self.sampling in _SAMPLING,
              f"sampling must be one of {_SAMPLING} or None, got {self.sampling!r}")
        check(self.schedule is None or self.schedule in _SCHEDULES,
              f"schedule must be one of {_SCHEDULES} or None, got {self.schedule!r}")
        check(self.rng in _RNG, f"rng must be one of {_RNG}, got {self.rng!r}")
        check(self.top_p is None or 0 < self.top_p <= 1, f"top_p must be in (0, 1], got "
              f"{self.top_p!r}")
        check(self.top_k is None or self.top_k >= 1, f"top_k must be >= 1, got {self.top_k!r}")
        check(0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps}")
        check(self.max_steps_per_block is None or self.max_steps_per_block >= 1,
              f"max_steps_per_block must be >= 1 or None, got {self.max_steps_per_block!r}")
        # options that refine another one: alone they would be silently ignored
        for name, base in (("eos_stop_on_commit", "stop_at_eos"),
                           ("eos_skip_block_start", "block_eos_stop")):
            check(not getattr(self, name) or getattr(self, base),
                  f"{name}=True refines {base} and does nothing without it: pass {base}=True "
                  f"too, or leave {name}=False")

    @property
    def num_blocks(self) -> int:
        """Prompt-relative blocks (LLaDA / Dream): ``G // K``."""
        return self.gen_length // (self.block_length or self.gen_length)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def check_block_division(cfg: SamplerConfig) -> None:
    """``ValueError`` unless ``block_length`` divides ``gen_length``: the rule of prompt-
    relative blocks (LLaDA's ``generate`` asserts it; Dream decodes one block). Not applied
    to block-diffusion or uniform-noise models, whose blocks / canvases are their own and
    whose references accept any length."""
    if cfg.block_length is not None and cfg.gen_length % cfg.block_length:
        raise ValueError(f"gen_length ({cfg.gen_length}) must be divisible by block_length "
                         f"({cfg.block_length}) on a model decoding prompt-relative blocks "
                         f"(LLaDA, Dream); valid block lengths: {_divisors(cfg.gen_length)}, "
                         f"or a gen_length that is a multiple of {cfg.block_length}")


def _enum(cls: type[Enum], value: Any, name: str) -> Enum:
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {[m.value for m in cls]}, got {value!r}") \
            from None
