"""Noise kinds: what the one decode loop (``samplers.loop``) means by a block, eligibility, a
commit and the end of a block, chosen once per sampler from ``model.noise_kind``.

* ``MASK`` (LLaDA, Dream, SDAR, LLaDA2, Fast-dLLM v2): the canvas starts as mask tokens,
  eligible = still masked, a commit is final (editing policies aside), a block ends when no
  mask is left in it. Its generation: ``samplers.mask_run.MaskRun``.
* ``UNIFORM`` (DiffusionGemma): a block is one canvas of random tokens started by the
  encoder-decoder cache plan, eligible = not yet accepted, a commit is an acceptance and every
  other position is re-noised, a block ends when every row is accepted or stable, or at the step
  budget. Its generation: ``samplers.uniform.UniformRun``; its policies are ``gemma_renoise``
  or an acceptance rule that declares ``"uniform"`` (``eb``, ``threshold``,
  ``entropy_threshold``), wrapped in ``policies.renoise.Renoise``. It runs the eager step
  (``graph_support.UNIFORM_EAGER``, logged where the static step was wanted).

A policy and a model of different noise kinds are refused when the sampler is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from torch import Tensor

from dllm_decode.config import SamplerConfig
from dllm_decode.policies.capabilities import noise_kind_of
from dllm_decode.policies.policy import Policy
from dllm_decode.samplers.graph_support import eager_noise_kind
from dllm_decode.samplers.loop import DecodeRun
from dllm_decode.samplers.mask_run import MaskRun
from dllm_decode.samplers.uniform import UniformRun, uniform_policy


@dataclass(frozen=True)
class NoiseKind:
    """A noise kind's hooks for ``DiffusionSampler`` (stateless; the generation's state lives
    in the ``DecodeRun`` that ``begin`` returns). This base is the mask kind."""

    name: str = "mask"

    def prepare_policy(self, policy: Policy, model: Any) -> Policy:
        """The policy this noise kind runs (a ``ValueError`` for what cannot run on it)."""
        return policy

    def check(self, caps: Any, policy_name: str, model: Any) -> None:
        """``ValueError`` unless every part of the policy (``PolicyCapabilities``) declares
        this noise kind."""
        if self.name in caps.noise_kinds:
            return
        works = " / ".join(repr(k) for k in caps.noise_kinds) or "no"
        family = getattr(model, "family", type(model).__name__)
        raise ValueError(f"policy {policy_name!r} works on {works} models; this model "
                         f"({family}) has noise_kind {self.name!r}: use a masked-decoding "
                         "policy (low_confidence, threshold, ...) on mask models and "
                         "'gemma_renoise' (or eb / threshold / entropy_threshold acceptance) "
                         "on uniform-noise models such as DiffusionGemma")

    def begin(self, sampler: Any, cfg: SamplerConfig, caps: Any, bound: tuple[Any, ...],
              prompt: Tensor, valid: Tensor, on_step: Callable[..., None] | None) -> DecodeRun:
        """A generation of ``prompt [B, P]`` (``valid [B, P]``) with the bound parts."""
        return MaskRun(sampler, cfg, caps, bound, prompt, valid, on_step,
                       sampler.step_function(caps, cfg, prompt.device))


@dataclass(frozen=True)
class UniformNoise(NoiseKind):
    """The uniform kind: ``Renoise`` policies, ``UniformRun`` generations, the eager step."""

    name: str = "uniform"

    def prepare_policy(self, policy: Policy, model: Any) -> Policy:
        """An acceptance rule is wrapped in ``Renoise`` (``samplers.uniform.uniform_policy``)."""
        return uniform_policy(policy, model)

    def begin(self, sampler: Any, cfg: SamplerConfig, caps: Any, bound: tuple[Any, ...],
              prompt: Tensor, valid: Tensor, on_step: Callable[..., None] | None) -> DecodeRun:
        eager_noise_kind(sampler, cfg, prompt.device)
        selector, stopper, _ = bound
        return UniformRun(sampler.model, selector, stopper, prompt, valid, cfg,
                          sampler.policy.name, on_step)


MASK: Final = NoiseKind()
UNIFORM: Final = UniformNoise()
NOISE_KINDS: Final[dict[str, NoiseKind]] = {"mask": MASK, "uniform": UNIFORM}


def noise_kind(model: Any) -> NoiseKind:
    """``model``'s noise kind (``policies.capabilities.noise_kind_of``: ``"mask"`` unless the
    model declares ``noise_kind``)."""
    return NOISE_KINDS[noise_kind_of(model)]
