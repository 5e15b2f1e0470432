"""Every built-in name, in one table: presets, stoppers and truncators (``policies.resolve``).

A preset is a selector, or a ``Policy`` composing a selector with a stopper / truncator, built
from its parameters. This module is the only one that knows every method module; it fills
``resolve``'s tables once, when ``dllm_decode.policies`` is imported (before any resolution),
and nothing imports it but the package. A new method adds its module's factories here.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Final

from dllm_decode.policies import resolve
from dllm_decode.policies.adaptive import EntropyBounded, EntropyThreshold, Factor, Threshold
from dllm_decode.policies.confidence import Origin, RandomOrder, TopK
from dllm_decode.policies.credit import credit_policy
from dllm_decode.policies.dawn import Dawn
from dllm_decode.policies.dilated import dus_policy
from dllm_decode.policies.dsb import dsb_policy
from dllm_decode.policies.editing import edit_policy, llada2_policy, llada21_policy
from dllm_decode.policies.ete import ExploreThenExploit
from dllm_decode.policies.fastdllm2 import fastdllm_v2_policy
from dllm_decode.policies.frechet import Frechet
from dllm_decode.policies.history import CCD, KLASS
from dllm_decode.policies.learn2pd import EoTP, eotp_policy, learn2pd_policy
from dllm_decode.policies.lopa import lopa_policy
from dllm_decode.policies.remix import remix_policy
from dllm_decode.policies.renoise import gemma_renoise
from dllm_decode.policies.s2d2 import DynamicThreshold
from dllm_decode.policies.said import said_block_policy, said_policy
from dllm_decode.policies.sched import SchED, prophet_policy, sched_policy
from dllm_decode.policies.speculative import s2d2
from dllm_decode.policies.streaming import BlockEosExit, streaming_dllm_policy
from dllm_decode.policies.window import EosCut, WindowTopK, window_dream
from dllm_decode.policies.wino import wide_in_policy, wino_policy
from dllm_decode.types import ScoreKind

#: the presets whose family default schedule is Dream's (not adaptive, from Dream's ``alg``)
DREAM_NAMES: Final = frozenset({"maskgit_plus", "topk_margin", "entropy", "origin"})


def _prophet_stopper(answer_offset: int = 0, answer_length: int = 5, **params: Any) -> Any:
    """Prophet's stopper alone (``--stopper prophet``): the ``prophet`` preset's stopper."""
    return prophet_policy(base=TopK(), answer_offset=answer_offset,
                          answer_length=answer_length, **params).stopper


BUILT_IN: Final[dict[str, Any]] = {
    # one-rule selectors: LLaDA, Dream, Fast-dLLM, EB-sampler, dParallel
    "low_confidence": lambda **kw: TopK(score=ScoreKind.PROB, **kw),
    "random": lambda **kw: RandomOrder(**kw),
    "maskgit_plus": lambda **kw: TopK(score=ScoreKind.PROB, **kw),
    "topk_margin": lambda **kw: TopK(score=ScoreKind.MARGIN, **kw),
    "entropy": lambda **kw: TopK(score=ScoreKind.NEG_ENTROPY, **kw),
    "origin": lambda **kw: Origin(**kw),
    "threshold": lambda **kw: Threshold(**kw),
    "factor": lambda **kw: Factor(**kw),
    "eb": lambda **kw: EntropyBounded(**kw),
    "entropy_threshold": lambda **kw: EntropyThreshold(**kw),
    # early exit and truncation
    "sched": sched_policy,
    "prophet": prophet_policy,
    "learn2pd": learn2pd_policy,
    "learn2pd_eot": partial(learn2pd_policy, eot=True),
    "eotp": eotp_policy,
    # history, cross-block, window, block-diffusion and speculative rules
    "ete": ExploreThenExploit,
    "klass": KLASS,
    "ccd": CCD,
    "low_confidence_dynamic": lambda **kw: DynamicThreshold(**kw),
    "s2d2": s2d2,
    "window": lambda **kw: WindowTopK(**kw),
    "window_dream": window_dream,
    "fastdllm_v2": fastdllm_v2_policy,
    # token editing (LLaDA2.x) and uniform noise (DiffusionGemma)
    "llada2": llada2_policy,
    "llada21": llada21_policy,
    "edit": edit_policy,
    "gemma_renoise": gemma_renoise,
    # the 2026 methods: Fast-dLLM++ Frechet profile, DUS dilated schedule, credit fusion,
    # WINO's revokable drafting (and its drafting rule alone), LoPA's lookahead branches
    "frechet": Frechet,
    "credit": credit_policy,
    "dus": dus_policy,
    "wino": wino_policy,
    "wide_in": wide_in_policy,
    "lopa": lopa_policy,
    # Streaming-dLLM: mask-ratio threshold + EOS exit on its suffix-pruning plan
    "streaming_dllm": streaming_dllm_policy,
    # DAWN: dependency-aware selection from the attention maps
    "dawn": Dawn,
    # SAID: scaffold first, then details (v1, the README's; the block variant)
    "said": said_policy,
    "said_block": said_block_policy,
    # DSB: the dynamic sliding block (greedy; const: = B) around a threshold rule
    "dsb": dsb_policy,
    "dsb_const": partial(dsb_policy, max_block_length=None, preset="dsb_const"),
    # ReMix: the mixed mask / token input state with JS rejection (soft inputs)
    "remix": remix_policy,
}
BUILT_IN_STOPPERS: Final[dict[str, Any]] = {"sched": lambda **kw: SchED(**kw),
                                            "prophet": _prophet_stopper}
BUILT_IN_TRUNCATORS: Final[dict[str, Any]] = {"eotp": lambda **kw: EoTP(**kw),
                                              "eos_cut": lambda **kw: EosCut(**kw),
                                              "block_eos_exit": lambda **kw: BlockEosExit(**kw)}

resolve.PRESETS.update(BUILT_IN)
resolve.STOPPERS.update(BUILT_IN_STOPPERS)
resolve.TRUNCATORS.update(BUILT_IN_TRUNCATORS)
