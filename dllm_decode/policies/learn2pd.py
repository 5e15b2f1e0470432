"""Learn2PD filter selector and the EoTP truncator.

Bao, Chen, Xu, Shang, "Learning to Parallel: Accelerating Diffusion Large Language Models via
Learnable Parallel Decoding", arXiv 2509.25188 (ICLR 2026).

* **Filter** ``f: R^K -> R^K`` (K = block length): a 2-layer MLP over the block's confidence
  vector; ``sigmoid(f(c)) > accept_thres`` marks masked positions whose current proposal is
  predicted to equal the final token. The activation is not stated in the paper; ReLU is our
  default and the choice is recorded with every saved filter.
* **Learn2PD** (``select``): filter-accepted masked positions of the current block, united with
  the scheduled top-k fallback (``steps = gen_length``: one token per step, at least one).
* **EoTP** (``truncate``): after the commit set is chosen, a filter-accepted EOS truncates the
  row right after the first such position; otherwise the masked EOS proposal with the highest
  confidence does. Works with any selector (``with_eotp``).

Contract between the two: the selector records its accepted set ``[B, L]`` bool in
``state.extras[ACCEPTED]``. ``extras`` is created fresh by the sampler for every step and the
same ``StepState`` is handed to the truncator in that step, so nothing outlives the step.

Features (a filter is tied to a model, a block length and a feature):
``llada_prob_all``: probability of the proposed token at all K block positions, decoded ones
included (the model's confidence in its own argmax there); ``dream_negent_masked``:
``sum p log p`` at masked positions, 0 at decoded ones.

Deviations from the paper / released code:

* the filter's activation is not given by the paper (its class file was not readable): ReLU
  by default, recorded with each saved filter; the Dream fallback score (negative entropy) is
  our assumption (the paper has no Dream decoder);
* Learn2PD's scheduled top-k fallback commits everything left at a block's last scheduled
  step (the reference's schedule can leave masks behind with Dream's batch-mean budget);
* EoTP: per row (the reference is batch 1); the fallback scans only *fresh* masked positions
  (every one with ``full_span``, which ``EoTP`` asks for; under ``dual`` the rest are stale);
  truncation fills the dead tail with the EOS id and hides those keys from later forwards
  (``plan.restrict``) instead of slicing the canvas and the K/V cache;
* EoTP over any selector (``with_eotp``) and the ``eotp`` preset (the paper's
  ``generate_predict_eot``: EoTP over top-k ``low_confidence``) are compositions the paper
  runs only with LLaDA; a policy that already truncates is refused, not replaced;
* the mask token is never proposed (its logit is -inf), so it never reaches the filter input.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor, nn

from dllm_decode.policies.base import bind_of, step_score, topk_mask
from dllm_decode.policies.capabilities import NAMES as CAPABILITY_NAMES
from dllm_decode.policies.capabilities import Capabilities, capabilities_of, score_fields
from dllm_decode.policies.confidence import TopK
from dllm_decode.policies.learn2pd_filter import (
    DEFAULT_ACCEPT_THRES,
    FEATURES,
    FilterCard,
    FilterMismatchError,
    L2PFilter,
    LoadedFilter,
    ModelFingerprint,
    block_features,
    check_fingerprint,
    filter_window,
    filter_windows,
    find_bundled_filter,
    load_filter,
    model_device,
    run_filter,
    save_filter,
)
from dllm_decode.policies.policy import Policy
from dllm_decode.policies.resolve import make_policy
from dllm_decode.policies.rows import column, last_step, per_row
from dllm_decode.types import ScoreKind, StepState

#: ``state.extras`` key under which Learn2PD records the filter-accepted set ``[B, L]`` bool
ACCEPTED: Final = "learn2pd_accepted"

__all__ = [
    "ACCEPTED", "DEFAULT_ACCEPT_THRES", "FEATURES", "EoTP", "FilterCard", "FilterMismatchError",
    "FullSpan", "L2PFilter", "Learn2PD", "LoadedFilter", "ModelFingerprint", "block_features",
    "check_fingerprint", "eotp_policy", "filter_window", "filter_windows", "find_bundled_filter",
    "learn2pd_policy", "load_filter", "save_filter", "with_eotp",
]


@dataclass(frozen=True)
class Learn2PD:
    """Filter-accepted masked block positions united with the scheduled top-k (arXiv 2509.25188).

    Args:
        filter: callable ``[B, K] -> [B, K]`` logits (an ``L2PFilter``), or ``None``: the filter
            never fires and only the top-k fallback commits.
        block_length: K; defaults to ``filter.block_length``.
        accept_thres: commit where ``sigmoid(logit) > accept_thres`` (> 1 disables the filter).
        feature: ``llada_prob_all`` or ``dream_negent_masked`` (see the module docstring).
        fallback: score of the top-k fallback (default: prob for LLaDA features, neg-entropy
            for Dream's, the latter our assumption: the paper has no Dream decoder).
        fingerprint: the model the filter was trained for (checked by ``bind``).
        full_span: ask the sampler for logits over the whole canvas (EoTP's EOS scan).

    ``select`` is sync-free; it writes the accepted set to ``state.extras[ACCEPTED]``. The
    fallback commits ``max(budget, 1)`` positions (one per step with ``steps = gen_length``),
    and everything left at a block's last scheduled step (Dream's batch-mean budget may not).
    """

    filter: Any = None
    block_length: int | None = None
    accept_thres: float = DEFAULT_ACCEPT_THRES
    feature: str = "llada_prob_all"
    fallback: ScoreKind | None = None
    fingerprint: ModelFingerprint | None = None
    full_span: bool = False

    @property
    def capabilities(self) -> Capabilities:
        """Budgeted, the budget a floor (the filter may accept more); ``full_span`` as
        configured (EoTP's EOS scan); reads the feature's and the fallback score's proposal
        fields."""
        feature = ("neg_entropy",) if self.feature == "dream_negent_masked" else ()
        return Capabilities(full_span=self.full_span, at_least_budget=True,
                            proposal_fields=(*feature, *score_fields(self.fallback)),
                            # llada_prob_all reads committed positions of the window too
                            reads_masked_only=self.feature == "dream_negent_masked",
                            row_steps=True)

    def __post_init__(self) -> None:
        if self.feature not in FEATURES:
            raise ValueError(f"feature must be one of {FEATURES}, got {self.feature!r}")
        width = getattr(self.filter, "block_length", None)
        if self.block_length is None:
            if self.filter is not None and width is None:
                raise ValueError("pass block_length (the filter's input width)")
            object.__setattr__(self, "block_length", width)
        elif width is not None and width != self.block_length:
            raise FilterMismatchError(f"block_length {self.block_length} != the filter's input "
                                      f"width {width}")
        default = ScoreKind.PROB if self.feature == "llada_prob_all" else ScoreKind.NEG_ENTROPY
        object.__setattr__(self, "fallback", ScoreKind(self.fallback or default))

    @classmethod
    def from_pretrained(cls, path: str | Path, model: Any = None, **kw: Any) -> Learn2PD:
        """Selector from a saved filter (checked against ``model`` when given)."""
        loaded = load_filter(path, model=model)
        kw.setdefault("accept_thres", loaded.card.accept_threshold)
        return cls(filter=loaded.module, feature=loaded.card.feature,
                   fingerprint=loaded.card.fingerprint, **kw)

    def bind(self, model: Any, cfg: Any = None) -> Learn2PD:
        """Check the filter against the model (and the config's block length); a copy of the
        filter is moved to the model's device if needed."""
        if self.filter is None:
            return self._bind_bundled(model, cfg)
        if self.fingerprint is not None:
            diff = self.fingerprint.differences(ModelFingerprint.of(model))
            if diff:
                raise FilterMismatchError("Learn2PD filter was trained for another model; "
                                          f"mismatch in: {'; '.join(diff)}")
        if cfg is not None and getattr(model, "attention", "") != "block_causal":
            k = cfg.block_length or cfg.gen_length
            if k != self.block_length:
                raise FilterMismatchError(f"block_length {k} != the Learn2PD filter's input "
                                          f"width {self.block_length}")
        device = model_device(model)
        if isinstance(self.filter, nn.Module) and model_device(self.filter) != device:
            return replace(self, filter=copy.deepcopy(self.filter).to(device))
        return self

    def _bind_bundled(self, model: Any, cfg: Any) -> Learn2PD:
        """No filter given: use the one shipped beside a bundled checkpoint whose fingerprint
        matches ``model`` (``models/assets/<name>/learn2pd_k<K>``), else warn and fall back."""
        k = None
        if cfg is not None and getattr(model, "attention", "") != "block_causal":
            k = cfg.block_length or cfg.gen_length
        found = find_bundled_filter(model, k)
        if found is None:
            warnings.warn("learn2pd: no trained filter (pass filter=PATH, or ship learn2pd_k{K} "
                          "beside the checkpoint); the filter never fires and only the top-k "
                          "fallback commits", stacklevel=4)
            return self
        card = found.card
        return replace(self, filter=found.module, feature=card.feature,
                       fingerprint=card.fingerprint).bind(model, cfg)

    def accepted(self, state: StepState) -> Tensor:
        """``[B, L]`` bool: eligible positions the filter accepts this step."""
        if self.filter is None:
            return torch.zeros_like(state.eligible)
        feats, start = block_features(state, self.feature, self.block_length)
        ok = torch.sigmoid(run_filter(self.filter, feats)) > self.accept_thres  # [B, K]
        b, length = state.eligible.shape
        if per_row(start):  # each row's window, scattered (never past L + K: no collisions)
            ok = ok & filter_windows(state, self.block_length)[1][:, None]
            at = start[:, None] + torch.arange(self.block_length, device=ok.device)
            window = torch.zeros(b, length + self.block_length, dtype=torch.bool,
                                 device=ok.device).scatter_(1, at, ok)
            return window[:, :length] & state.eligible
        window = torch.zeros(b, max(length, start + self.block_length), dtype=torch.bool,
                             device=ok.device)
        window[:, start:start + self.block_length] = ok
        return window[:, :length] & state.eligible

    def select(self, state: StepState) -> Tensor:
        accept = self.accepted(state)
        state.extras[ACCEPTED] = accept
        score = step_score(state, self.fallback)
        b = score.shape[0]
        if state.budget is None:
            k = torch.ones(b, dtype=torch.long, device=score.device)
        elif per_row(state.steps_left):  # each row's last scheduled step finishes its block
            k = torch.where(last_step(state), score.shape[1], state.budget.clamp_min(1))
        elif state.steps_left == 1:  # the block's last scheduled step finishes it, per row
            k = torch.full_like(state.budget, score.shape[1])
        else:
            k = state.budget.clamp_min(1)
        return accept | topk_mask(score, state.eligible, k)


# ---- the truncator -------------------------------------------------------------------------
@dataclass(frozen=True)
class EoTP:
    """End-of-Text Prediction (arXiv 2509.25188): cut a row right after a predicted EOS.

    Per row, after the commit set is chosen: if a filter-accepted position
    (``state.extras[ACCEPTED]``) proposes EOS, the new end is the first such position; else if
    any fresh masked generation position proposes EOS, the one with the highest probability
    (ties: the leftmost). Rows with neither keep their length.

    Args:
        eos_token_ids: EOS ids; ``None``: ``state.extras["eos_token_ids"]`` if the sampler
            provides it, else truncation is disabled (with a warning).

    Declares ``full_span`` (logits over the whole canvas), so masked EOS predictions beyond the
    block are seen. Sync-free.
    """

    eos_token_ids: tuple[int, ...] | None = None
    #: tokens and prob of masked positions only; per-row ``gen_start`` (``row_steps``)
    capabilities = Capabilities(full_span=True, proposal_fields=(), reads_masked_only=True,
                                row_steps=True)

    def __post_init__(self) -> None:
        if self.eos_token_ids is not None:
            ids = self.eos_token_ids
            ids = (ids,) if isinstance(ids, int) else tuple(int(i) for i in ids)
            object.__setattr__(self, "eos_token_ids", ids)

    def bind(self, model: Any, cfg: Any = None) -> EoTP:
        """With the model's EOS ids filled in."""
        if self.eos_token_ids is not None:
            return self
        return replace(self, eos_token_ids=tuple(model.eos_token_ids))

    def truncate(self, state: StepState, commit: Tensor) -> Tensor:
        """``state``, commit ``[B, L]`` -> new generation length ``[B]`` int64 (from gen start)."""
        tokens, prob = state.proposal.tokens, state.proposal.prob
        b, length = tokens.shape
        g0 = state.gen_start
        rows = per_row(g0)
        current = state.extras.get("lengths")
        if current is None and rows:
            current = length - g0
        elif current is None:
            current = torch.full((b,), length - g0, dtype=torch.long, device=tokens.device)
        ids = self.eos_token_ids or state.extras.get("eos_token_ids")
        if not ids:
            warnings.warn("EoTP has no EOS token ids (pass eos_token_ids=... or for_model=...);"
                          " truncation is disabled", stacklevel=2)
            return current
        is_eos = tokens == ids[0]
        for other in ids[1:]:  # scalar compares: no host-to-device copy of the ids
            is_eos |= tokens == other
        pos = torch.arange(length, device=tokens.device)
        is_eos &= pos >= column(g0)
        accepted = state.extras.get(ACCEPTED)
        by_filter = is_eos & accepted if accepted is not None else torch.zeros_like(is_eos)
        first = torch.where(by_filter, pos, length).min(1).values
        open_eos = is_eos & state.masked & state.fresh
        conf = torch.where(open_eos, prob.float(), -torch.inf)
        best = conf.argmax(1)  # first maximum on ties
        cut = torch.where(by_filter.any(1), first, best)
        new = torch.where(by_filter.any(1) | open_eos.any(1), cut + 1 - g0, current)
        return torch.minimum(new, current)


@dataclass(frozen=True)
class FullSpan:
    """Any selector, asking the sampler for logits over the whole canvas (for EoTP's scan).

    Its capabilities are the wrapped selector's plus ``full_span``; every other attribute
    (``init_memory``, parameters, ...) but the capability names is the wrapped selector's.
    """

    inner: Any

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped selector's, with ``full_span``."""
        return replace(capabilities_of(self.inner), full_span=True)

    def select(self, state: StepState) -> Tensor:
        return self.inner.select(state)

    def bind(self, model: Any, cfg: Any = None) -> FullSpan:
        """A ``FullSpan`` around the bound inner selector (never the inner one alone)."""
        inner = bind_of(self.inner, model, cfg)
        return self if inner is self.inner else replace(self, inner=inner)

    def __getattr__(self, name: str) -> Any:
        # capabilities are the declared ones (an inner ``full_span=False`` field is not ours)
        if name == "inner" or name.startswith("__") or name in CAPABILITY_NAMES:
            raise AttributeError(name)
        return getattr(self.inner, name)


def with_eotp(policy: Any, eos_token_ids: tuple[int, ...] | None = None) -> Policy:
    """Compose EoTP with any policy (a preset name, a ``Policy`` or a selector); a policy that
    already truncates (``eotp``, ``learn2pd_eot``) is refused rather than silently replaced."""
    base = make_policy(policy)
    if base.truncator is not None:
        raise ValueError(f"policy {base.name!r} already has a truncator ({base.truncator!r})")
    sel = base.selector
    if not capabilities_of(sel).full_span:
        sel = FullSpan(sel)
    return Policy(selector=sel, stopper=base.stopper, truncator=EoTP(eos_token_ids),
                  name=f"{base.name}+eotp")


# ---- presets -------------------------------------------------------------------------------
def learn2pd_policy(filter: Any = None, *, for_model: Any = None, accept_thres: float | None =
                    None, eot: bool = False, eos_token_ids: tuple[int, ...] | None = None,
                    filter_block_length: int | None = None) -> Policy:
    """The ``learn2pd`` / ``learn2pd_eot`` presets.

    Args:
        filter: a path (file or directory), a ``LoadedFilter``, or a filter module.
        for_model: the model to check the filter against, to find a bundled filter and to
            take EOS ids from (until the sampler binds policies to its model itself).
        accept_thres: default: the filter card's, else 0.96.
        eot: add EoTP.
        eos_token_ids: EOS ids for EoTP (default: ``for_model``'s, else the card's).
        filter_block_length: which bundled / directory filter to pick (K).
    """
    card = None
    if isinstance(filter, (str, Path)):
        filter = load_filter(filter, model=for_model, block_length=filter_block_length)
    elif filter is None and for_model is not None:
        filter = find_bundled_filter(for_model, filter_block_length)
    if isinstance(filter, LoadedFilter):
        filter, card = filter.module, filter.card
        if for_model is not None:
            check_fingerprint(card, for_model)
    if isinstance(filter, nn.Module) and for_model is not None:
        filter = filter.to(model_device(for_model))
    thres = accept_thres if accept_thres is not None else (
        card.accept_threshold if card else DEFAULT_ACCEPT_THRES)
    sel = Learn2PD(filter=filter, accept_thres=thres, feature=card.feature if card else
                   "llada_prob_all", fingerprint=card.fingerprint if card else None,
                   full_span=eot)
    if not eot:
        return Policy(selector=sel, name="learn2pd")
    ids = eos_token_ids or (tuple(for_model.eos_token_ids) if for_model is not None else None)
    if ids is None and card is not None:
        ids = card.fingerprint.eos_token_ids
    return Policy(selector=sel, truncator=EoTP(ids), name="learn2pd_eot")


def eotp_policy(*, for_model: Any = None, eos_token_ids: tuple[int, ...] | None = None,
                score: ScoreKind | str = ScoreKind.PROB) -> Policy:
    """The ``eotp`` preset: EoTP over top-k ``low_confidence`` (the paper's
    ``generate_predict_eot``)."""
    ids = eos_token_ids or (tuple(for_model.eos_token_ids) if for_model is not None else None)
    return Policy(selector=FullSpan(TopK(score=ScoreKind(score))), truncator=EoTP(ids),
                  name="eotp")

