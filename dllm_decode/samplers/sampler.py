"""``DiffusionSampler``: the one decode loop every policy and cache mode plugs into."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import SamplerConfig
from dllm_decode.policies.capabilities import (
    Capabilities,
    check_model_needs,
    policy_capabilities,
)
from dllm_decode.policies.defaults import apply_family_default
from dllm_decode.policies.policy import Policy
from dllm_decode.samplers.batching import decode_groups, split_rows
from dllm_decode.samplers.graph_replay import StepGraphs
from dllm_decode.samplers.inputs import check_inputs
from dllm_decode.samplers.loop import decode_loop
from dllm_decode.samplers.noise import noise_kind
from dllm_decode.samplers.params import build_policy, replace_config
from dllm_decode.samplers.step import compile_step, post_forward
from dllm_decode.samplers.stream import StreamEvent, stream_hook, stream_loop
from dllm_decode.types import Generation, StepState

OnStep = Callable[[StepState, Tensor], None]


class DiffusionSampler:
    """Decode a diffusion LM (mask or uniform noise) with any policy and any cache mode.

    One loop (``samplers.loop.decode_loop``) for every model, per block (left to right) and
    per step; what differs by noise kind (``samplers.noise``, chosen here from
    ``model.noise_kind``) is what a block, eligibility, a commit and a block's end mean.
    For a mask model (``samplers.mask_run``):

    1. **block start**: compute the block's budget base (LLaDA) or time grid (Dream);
    2. **sync**: the one host check per step, "is anything still masked in this block?",
       which also reads the few integers the cache plan asked for (``plan.prepare``: the
       window plan's fed width, the sub-block plan's refresh / sub-block calls), the
       contract's flags and, for editing policies, the rows still in a post step;
    3. **forward**: the cache plan feeds the positions this mode recomputes (full canvas,
       block + suffix, block only, block-causal span, per-row window sets, or per-row
       sub-blocks); CFG doubles the batch; with ``graphs``, steps 3-7 run as one step on
       static buffers (``samplers.graph``);
    4. **propose**: per-position token and probability, plus the margins / entropy the policy
       declares it reads (``Capabilities.proposal_fields``; all of them by default), in one
       fused pass over V on a GPU (``kernels.propose``); logits are dropped after this unless
       a policy asks;
    5. **select**: the policy turns the ``StepState`` into a commit mask (subset of eligible);
    6. **stop / truncate**: optional stopper (commit everything at its argmax) and truncator
       (EoTP: shorten the row, crop visible keys);
    7. **commit**: write tokens, record the commit step and the information committed; a
       selector declaring ``Capabilities(edits=True)`` may also rewrite committed positions
       of the block (``Selection.edit``, LLaDA2.1 token editing), and a block whose masks are
       all committed then runs on while its rows edit, at most ``max_post_steps`` steps
       (``samplers.editing``; recorded in ``Generation.edits``).

    Steps 4-7 are ``samplers.step.post_forward``; for exactly ``TopK(prob)`` / ``Threshold(prob)``
    with nothing else reading the step (no stopper, truncator, ``on_step``, ``debug``), every
    step but a block's last runs the bit-identical ``samplers.fused.fused_step`` on the fed span
    instead (eager only).

    Hooks for policies (all optional, read off the selector or the ``StepState``):

    * ``state.model`` (``types.StepModel``): ``forward(tokens, positions, mask, active)`` runs
      an extra forward against the step's keys (the plan's K/V, or the recomputed canvas
      without a cache), stores nothing, and counts in ``Generation.forwards`` and in the
      per-row NFE of ``active`` rows (S2D2's verifier); ``probs(logits)`` is the sampling
      distribution. Unavailable under CFG.
    * ``select`` may return a ``types.Selection(commit, tokens, prob, edit)`` instead of a
      bare mask: ``tokens`` replace the proposal at committed positions (a resampled token);
      ``edit`` rewrites committed positions (selectors declaring ``Capabilities(edits=True)``).
    * declared capabilities (``policies.capabilities.Capabilities``, the ``capabilities``
      attribute of the selector, stopper and truncator): read and checked once, here in
      ``__init__`` (``self.capabilities``); unknown names and capabilities set as plain
      attributes are errors. ``preferred_cache`` / ``preferred_schedule`` apply when the
      config gives none, ``requires_attention`` is checked against the model; at bind
      (``generate``) so is causal attention inside a block (``causal_forwards``,
      ``draft_causal``, ``causal_prefix``) against ``model.supports_causal_in_block``
      (``policies.capabilities.check_model_needs``).

    Args:
        model: any ``DiffusionLM``.
        policy: a preset name (``make_policy``), an import path ``module:Class``, a ``Policy``
            or a selector object (composition by names: ``samplers.build.build_sampler``).
            ``None`` or ``"default"``: the model family's default preset with its parameters
            (``policies.defaults.FAMILY_DEFAULTS``: ``low_confidence`` for LLaDA,
            ``gemma_renoise`` for DiffusionGemma, ...).
        cache: ``"none" | "prefix" | "dual" | "block_causal" | "window" | "sub_block" |
            "dllm_cache"`` (``cache.plans``, ``cache.sub_block``, ``cache.dllm_cache``;
            ``None``: the family default's cache when no policy is given, else the policy's
            ``preferred_cache``, else ``"none"``).
        debug: also assert the full commit contract every step (``check_commit``; the cheap
            part, ``samplers.contract``, is enforced on every run).
        compile: run each step's work after the forward (propose, select, contract, stop,
            commit; ``samplers.step.post_forward``) through ``torch.compile(fullgraph=True)``
            (``mode="reduce-overhead"`` on CUDA); a string names the ``torch.compile``
            backend (``True``: Inductor). Compiled once per sampler, on the first
            ``generate`` (reuse the sampler). Tokens equal the eager loop's; ``bits`` may differ
            in the last float32 digits. Not for policies that run extra forwards or draw
            data-dependent shapes (``rng="reference"`` sampling, Dream ``origin``) or read the
            budget on the host (``rng="reference"`` with a budgeted policy): they raise.
        graphs: run each step (forward + the work after it) on static buffers
            (``samplers.graph``): on CUDA each step shape is captured once as a CUDA graph and
            replayed; on the CPU the same step runs eagerly (for tests). ``None`` (default):
            on for CUDA wherever the policy and settings allow (else the eager loop, the
            reason logged on the ``dllm_decode.graph`` logger and kept in
            ``graph_reason``; ``DLLM_DECODE_GRAPHS=0`` in the environment turns the default
            off); ``False``: never. Tokens equal the eager loop's.
        **params: ``SamplerConfig`` fields and the policy's own parameters (e.g. ``tau``; only
            with a preset name or an import path), split and checked by
            ``samplers.params.build_policy``. Unknown names raise ``ValueError`` with the
            closest valid one.

    Noise kinds (``Capabilities.noise_kinds``, ``model.noise_kind``): a uniform-noise model
    (DiffusionGemma: no mask token, canvases of random tokens) runs the same loop with the
    uniform kind's parts (``samplers.uniform.UniformRun``): a block is one canvas, started by
    the encoder-decoder cache plan (``cache.canvas``: the encoder fills the K/V cache with the
    prompt or the previous canvas); the forward is the self-conditioned decoder; eligible =
    not yet accepted; a commit is an acceptance and every other position is re-noised (an edit,
    ``policies.renoise``); a block ends when every row is accepted or stable, or at the step
    budget. Its policies are ``gemma_renoise`` or an acceptance rule declaring ``"uniform"``
    (``eb``, ``threshold``, ``entropy_threshold``), wrapped in ``Renoise``; it runs the eager
    step. A policy and a model of different noise kinds are refused here, in ``__init__``.

    Batch invariance: a row's greedy tokens and NFE do not depend on its batch neighbours
    (block-causal models split ragged batches by block phase, see ``samplers.batching``); with
    ``temperature > 0`` one generator is shared by the batch unless ``seed`` is a list with one
    int per row, which decodes every row as it decodes alone with its seed.
    """

    def __init__(self, model: Any, policy: str | Policy | Any | None = None,
                 cache: str | None = None, *, debug: bool = False, compile: bool | str = False,
                 graphs: bool | None = None, **params: Any) -> None:
        # no policy (or "default"): the model family's default preset, its parameters (yours
        # win) and its cache mode when none is given (``policies.defaults``)
        policy, params, cache = apply_family_default(model, policy, params, cache)
        cfg_params, self.policy = build_policy(policy, params)  # the one split (with build_sampler)
        self.model = model
        self.noise = noise_kind(model)  # the noise kind's parts of the loop (samplers.noise)
        self.noise_kind = self.noise.name
        self.policy = self.noise.prepare_policy(self.policy, model)
        # the one place the policy's declared capabilities are read and validated
        self.capabilities = policy_capabilities(self.policy.selector, self.policy.stopper,
                                                self.policy.truncator)
        self.noise.check(self.capabilities, self.policy.name, model)
        need = self.capabilities.requires_attention
        if need is not None and getattr(model, "attention", None) != need:
            raise ValueError(f"policy {self.policy.name!r} needs a model with attention={need!r} "
                             "('block_causal': block-diffusion models such as SDAR; "
                             "'bidirectional': LLaDA, Dream); this model's attention is "
                             f"{getattr(model, 'attention', None)!r}")
        if cache is None:
            cache = self.capabilities.selector.preferred_cache or "none"
        self.config = SamplerConfig(cache=cache, **cfg_params)
        if compile and self.noise_kind != "mask":
            raise ValueError(f"compile={compile!r} compiles the mask-model step; a "
                             f"{self.noise_kind}-noise model ({type(model).__name__}) runs its "
                             "step eagerly: use compile=False")
        if graphs is not None and not isinstance(graphs, bool):
            raise ValueError(f"graphs must be None (on for CUDA where the settings allow), True "
                             f"or False, got {graphs!r}")
        self.debug = debug
        self.compile = compile
        self._compiled: Any = None  # the compiled step, built on first use (per device)
        self.graphs = graphs
        self.step_graphs: StepGraphs | None = None  # static buffers and graphs (first use)
        self.graph_reason: str | None = None  # why the last generate ran without them

    def __repr__(self) -> str:
        return f"DiffusionSampler(policy={self.policy.name!r}, cache={self.config.cache.value!r})"

    @torch.inference_mode()
    def generate(self, prompt_ids: Tensor | list[list[int]], attention_mask: Tensor | None = None,
                 *, on_step: OnStep | None = None, **overrides: Any) -> Generation:
        """Decode ``gen_length`` positions after each prompt.

        Args:
            prompt_ids: ``[B, P]`` int64, left-padded.
            attention_mask: ``[B, P]`` 1 = token, 0 = left padding (``None``: no padding).
            on_step: optional callback ``(state, commit)`` after every selection.
            **overrides: ``SamplerConfig`` fields for this call (``gen_length``, ``steps``, ...).

        Returns: ``Generation`` (tokens ``[B, P + G]``, per-row NFE, commit steps, bits).
        """
        cfg, caps, bound, prompt, valid_prompt = self._begin(prompt_ids, attention_mask,
                                                             overrides)
        model = self.model
        groups = split_rows(model, valid_prompt, cfg.seed)
        if groups is not None:  # batch invariance: sub-batches decoded alone, then merged
            return decode_groups(self.generate, prompt, valid_prompt, groups, on_step=on_step,
                                 **{k: v for k, v in overrides.items() if k != "seed"})
        run = self.noise.begin(self, cfg, caps, bound, prompt, valid_prompt, on_step)
        return decode_loop(run)  # the one loop (samplers.loop), for every noise kind

    @torch.inference_mode()
    def stream(self, prompt_ids: Tensor | list[list[int]], attention_mask: Tensor | None = None,
               *, provisional: bool = False, **overrides: Any) -> Iterator[StreamEvent]:
        """Decode one prompt as ``generate`` does, yielding ``samplers.stream.StreamEvent``s.

        An event after every step (``final`` empty), one after every block with the answer
        tokens that became final (a block once the loop leaves it; a uniform-noise canvas
        once decoded; see ``samplers.stream``), and a last one (``done``) with the
        ``Generation``: the concatenated ``final`` tokens equal ``generate(...).answer[0]``.

        Args:
            prompt_ids: ``[1, P]`` int64 (one row; a batch is refused).
            attention_mask: ``[1, P]`` 1 = token, 0 = left padding (``None``: no padding).
            provisional: let events read the current block's canvas (``StreamEvent.provisional``,
                committed tokens plus the argmax of the masked ones). Off: no extra work and no
                host sync per step beyond the loop's one; on: mask models run the eager
                ``post_forward`` step (tokens unchanged) and each event keeps a device copy of
                the block.
            **overrides: ``SamplerConfig`` fields for this call, as for ``generate``.

        The checks (inputs, options, one row) run here; the decode starts at the first
        ``next``. Closing the generator early (``break``, ``close()``) abandons the decode; the
        sampler stays usable.
        """
        cfg, caps, bound, prompt, valid_prompt = self._begin(prompt_ids, attention_mask,
                                                             overrides)
        model = self.model
        if prompt.shape[0] != 1:
            raise ValueError(f"stream decodes one prompt row, got a batch of {prompt.shape[0]}: "
                             "stream each prompt on its own or use generate for a batch")
        groups = split_rows(model, valid_prompt, cfg.seed)  # one row: a per-row seed list
        if groups is not None:
            cfg = replace_config(cfg, {"seed": groups[0][1]})
        hook = stream_hook(self.noise_kind, provisional)
        mask_id = getattr(model, "mask_token_id", None) if self.noise_kind == "mask" else None

        @torch.inference_mode()  # entered around each resumption, not left on between them
        def events() -> Iterator[StreamEvent]:
            run = self.noise.begin(self, cfg, caps, bound, prompt, valid_prompt, hook)
            yield from stream_loop(run, cfg.gen_length, mask_id=mask_id, hook=hook,
                                   provisional=provisional)

        return events()

    def _begin(self, prompt_ids: Tensor | list[list[int]], attention_mask: Tensor | None,
               overrides: dict[str, Any]) -> tuple[SamplerConfig, Any, tuple, Tensor, Tensor]:
        """What ``generate`` and ``stream`` do before decoding: the call's config, the policy's
        parts bound to the model and config (``bind(model, cfg)``: Learn2PD's filter
        fingerprint and block length, EoTP's EOS ids; what depends on the model, such as ETE's
        in-block lookahead on block-causal models, so the loop follows the bound parts'
        declarations), what they need of the model checked (causal attention inside a block),
        and the checked inputs. Returns ``(cfg, caps, bound, prompt, valid_prompt)``."""
        cfg = replace_config(self.config, overrides) if overrides else self.config
        model, policy, caps = self.model, self.policy, self.capabilities
        parts = (policy.selector, policy.stopper, policy.truncator)
        bound = tuple(_bind(c, model, cfg) for c in parts)
        if any(b_ is not c for b_, c in zip(bound, parts, strict=True)):
            caps = policy_capabilities(*bound)
        check_model_needs(model, caps, cfg.causal_prefix, policy.name)
        prompt, valid_prompt = check_inputs(model, prompt_ids, attention_mask, cfg)
        return cfg, caps, bound, prompt, valid_prompt

    def step_function(self, caps: Capabilities, cfg: SamplerConfig,
                      device: torch.device) -> Callable[..., Any]:
        """``post_forward``, compiled when ``compile=True`` (once per sampler and device)."""
        if not self.compile:
            return post_forward
        sel = caps.selector
        reference = cfg.rng == "reference" and (cfg.temperature > 0 or sel.budgeted)
        if sel.extra_forwards or reference or sel.proposes_after_select:
            raise ValueError(f"compile=True does not support policy {self.policy.name!r} with "
                             "these settings (extra forwards, or rng='reference' sampling with "
                             "data-dependent shapes or a budgeted top-k in the reference's tie "
                             "order, which reads its budget on the host); use compile=False")
        if self._compiled is None or self._compiled[0] != device.type:
            backend = "inductor" if self.compile is True else str(self.compile)
            self._compiled = (device.type, compile_step(device, backend))
        return self._compiled[1]


def _bind(component: Any, model: Any, cfg: SamplerConfig) -> Any:
    bind = getattr(component, "bind", None)
    return component if bind is None else bind(model, cfg)
