"""Declared capabilities: what a selector, stopper or truncator needs from the sampler.

A policy component declares them once, as a class attribute (or a property, when they follow
its parameters)::

    @dataclass(frozen=True)
    class MyRule:
        capabilities = Capabilities(budgeted=False, needs_logits=True)

        def select(self, state): ...

Components without a ``capabilities`` attribute get ``Capabilities()`` (a budgeted selector that
needs nothing special). The sampler reads them once, when it binds the policy
(``policy_capabilities``), and nowhere else; unknown names are a ``TypeError`` when the
``Capabilities`` is built, and a capability spelled as a plain attribute of the component (the
pre-``Capabilities`` style, e.g. ``needs_logits = True``) is an error at bind time unless it
agrees with the declared value. ``proposal_fields`` says which optional ``Proposal`` fields a
part reads (``margin``, ``logit_margin``, ``neg_entropy``); the sampler computes only those the
parts declare, and every field when any part leaves it unset (the default), so a policy that
declares nothing keeps working unchanged. ``bind(model, cfg)`` may resolve the capabilities that
depend on the model (ETE's ``lookahead`` is 0 on block-causal models unless ``cross_block``):
``generate`` re-reads the declaration of a part that ``bind`` replaced, for the decode loop;
what ``__init__`` uses (``preferred_cache``, ``requires_attention``) comes from the unbound part.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from dataclasses import dataclass, fields
from typing import Any, Final

from dllm_decode.types import OPTIONAL_FIELDS, PROPOSAL_FIELDS, ScoreKind

_CACHES: Final[tuple[str, ...]] = ("none", "prefix", "dual", "block_causal", "window",
                                   "sub_block", "dllm_cache", "streaming")
_SCHEDULES: Final[tuple[str, ...]] = ("llada", "dream")
_ATTENTIONS: Final[tuple[str, ...]] = ("bidirectional", "block_causal")
#: how a model marks unknown positions (``model.noise_kind``; models without one: ``mask``)
NOISE_KINDS: Final[tuple[str, ...]] = ("mask", "uniform")
#: capabilities a stopper or truncator may declare (the rest describe how a selector selects)
_ANY_ROLE: Final[frozenset[str]] = frozenset({"full_span", "needs_logits", "requires_attention",
                                              "proposal_fields", "reads_masked_only",
                                              "noise_kinds", "row_steps"})
#: how close a bool attribute's name must be to a capability name to be reported as a typo
_TYPO_CUTOFF: Final[float] = 0.88


@dataclass(frozen=True)
class Capabilities:
    """What a policy component needs from the decode loop, and what it offers.

    Args:
        budgeted: uses the scheduled per-step budget (``state.budget``, fixed ``steps``) and
            commits that many positions per row (more is a ``PolicyContractError`` unless
            ``at_least_budget``); False = adaptive, open-ended steps (blocks run until nothing
            is masked).
        at_least_budget: a budgeted selector that may commit more positions than
            ``state.budget``: a confidence rule with the schedule's top-k as its floor (SDAR's
            dynamic threshold, KLASS, CCD, Learn2PD, S2D2's accepted drafts) or one position
            per full step whatever the schedule (Window-Diffusion's Dream rule); the block
            still ends after its scheduled steps.
        needs_logits: wants the step's raw logits in ``state.logits`` (``[B, R, V]``).
        full_span: wants proposals over the whole canvas, not only the current block
            (stoppers always get it).
        lookahead: positions past the current block the selector may commit (cross-block),
            in rows that still have a mask in the current block (a row whose block is done
            waits for the batch, as alone it would be in its next block: batch invariance).
        preferred_cache: cache mode used when the caller gives none (``None``: ``"none"``).
        preferred_schedule: ``"llada" | "dream"`` budget rule used when the caller gives none
            (``None``: the model family's).
        causal_prefix: AR-like prefix caching on block-diffusion models, unless the config
            says otherwise.
        draft_causal: on block-causal models, the forward plan also computes the current
            block's draft-causal rows (S2D2's partially-causal drafting, ``draft_ver``);
            ignored on other attentions.
        causal_forwards: runs extra forwards with causal attention inside a block (S2D2's
            block-size-1 verifier). This, ``draft_causal`` and ``causal_prefix`` run a
            block-causal model as it runs only when trained for it (or initialised from an
            AR model): a model declaring ``supports_causal_in_block = False`` is refused at
            bind (``check_model_needs``).
        requires_attention: the model attention the policy needs (``"bidirectional"`` or
            ``"block_causal"``); checked when the sampler is built.
        proposes_after_select: tokens of committed positions are drawn after the selection
            (Dream ``origin``); also puts the selector on the Dream time grid.
        may_commit_nothing: a step may commit nothing although positions are eligible (the
            commit contract's ">= 1 per row" is waived in ``check_commit``).
        extra_forwards: runs extra model forwards (``state.model.forward``), so NFE may exceed
            the generation length (declarative: read by tests and tools, not the loop).
        stochastic: random even at temperature 0 (declarative, as ``extra_forwards``).
        proposal_fields: the ``Proposal`` fields the part reads, any of ``types.PROPOSAL_FIELDS``
            (``ScoreKind`` values work: ``score_fields``); ``tokens``, ``prob`` and ``argmax``
            are always computed, ``margin``, ``logit_margin`` and ``neg_entropy`` only when a
            part declares them. ``None`` (the default): every field. Stored as the sorted
            tuple of the optional fields named.
        reads_masked_only: the part reads the proposal only at masked positions (eligible
            ones, or masked ones anywhere in the fed rows). When every part says so, the
            sampler may score only the masked fed positions (as Dream's reference does):
            ``StepState.fresh`` then marks those, and the proposal elsewhere is unscored (the
            canvas token, 0). Default False: every fed position is scored.
        noise_kinds: the model noise kinds the part works with (``NOISE_KINDS``): ``mask``
            (a mask token marks unknown positions: LLaDA, Dream, SDAR) and/or ``uniform`` (the
            canvas holds random tokens, re-noised until accepted: DiffusionGemma,
            ``policies.renoise``). Checked against ``model.noise_kind`` when the sampler is
            built: a mask-token policy on a uniform model (or the reverse) is an error.
        edits: the selector may rewrite committed positions (token editing, LLaDA2.1's T2T;
            re-noising an accepted position on a uniform-noise model is the same capability):
            ``select`` may return ``types.Selection(commit, tokens, edit=...)`` with ``edit`` a
            subset of ``StepState.editable`` (committed, generated, inside the current block,
            fed this step). The decode contract checks that subset and bounds the edits: a
            block whose positions are all committed keeps running only while its rows edit,
            at most ``max_post_steps`` steps (``samplers.editing``). Implies
            ``reads_masked_only=False`` (committed positions are scored too).
        samples_tokens: the selector draws the tokens it commits itself at ``temperature > 0``
            (from ``state.logits`` with ``state.model.probs`` and ``state.generator``, e.g. only
            over the rows it may commit, as Fast-dLLM v2 samples its sub-block), returning them
            as ``Selection.tokens``; the proposal then stays greedy and draws nothing.
        remasks: with ``edits``, an edit may write the mask token (re-masking a committed
            position: WINO's narrow-out). The loop never re-masks on a block's last step (that
            step commits what is left), so the block still ends.
        max_post_steps: with ``edits``, the steps a block may run after its last mask is
            committed (LLaDA2.1 ``max_post_steps``; a post step that edits nothing ends the
            row's block). Must be 0 without ``edits``.
        sub_block_size: the selector commits inside sub-blocks of this many positions
            (aligned inside the block, each row's first sub-block with a mask), as Fast-dLLM
            v2's rule does; ``cache="sub_block"`` (``cache.sub_block``) feeds them. ``None``:
            no sub-blocks.
        fuses_logits: the selector rewrites the step's logits before anything is scored
            (a score transform with per-generation state, e.g. CreditDecoding's credit,
            ``policies.credit``): the loop calls its ``fuse_logits(logits, rows, masked,
            memory, block)`` (``policies.base.LogitsFuser``) right after the mask token is
            removed, so the proposal (greedy or sampled), the selector, a stopper, a truncator
            and the recorded probabilities all see the fused scores.
        row_steps: the part accepts a ``StepState`` whose step values are per row (``[B]``
            tensors: ``step``, ``block_step``, ``steps_left``, ``progress``, ``block_start``,
            ``gen_start``, ``times``, ``extras["total_steps"]``) and draws from
            ``state.row_seeds`` when set, giving each row exactly what a call on that row
            alone gives (``policies.rows``: the helpers and the rules its memory follows;
            a ``fuses_logits`` selector also takes ``block_step=`` in ``fuse_logits``). A
            serving engine then decides rows at different steps in one call; without it,
            one call per step value. Any role may declare it.
        attention_maps: the selector reads ``StepState.attention`` (``[B, L, L]``, the
            head-averaged softmax attention of the model's last ``attention_maps`` layers,
            averaged over them, from the step's own forward; DAWN, ``policies.dawn``): the
            step's proposal then covers every position up to the block's end (prompt
            included); needs ``cache="none"`` and a model with ``capture_attention``
            (``models.attention_maps``). 0: none.
        edits_prompt: with ``edits``, ``StepState.editable`` also holds the prompt's
            positions (reproducing a reference defect: DAWN's position-0 overwrite).
        slides_blocks: the selector's decode window slides across the loop's block
            boundaries (DSB, ``policies.dsb``): it needs the whole generation in view
            (declarative; a serving engine that shows one fixed block refuses it).
        soft_inputs: the selector rewrites the step's input embeddings before its forward
            (ReMix's mixed mask / token state, ``policies.remix``): the loop calls its
            ``mix_inputs(embeds, canvas, memory, weight, mask_id, block, step, block_step)``
            on the ``[B, L, H]`` embeddings of the fed canvas; needs ``cache="none"``, no CFG
            and a model with ``feed_embeddings`` (``models.soft_inputs``: ``DecoderLM``).
    """

    budgeted: bool = True
    at_least_budget: bool = False
    needs_logits: bool = False
    full_span: bool = False
    lookahead: int = 0
    preferred_cache: str | None = None
    preferred_schedule: str | None = None
    causal_prefix: bool = False
    draft_causal: bool = False
    causal_forwards: bool = False
    requires_attention: str | None = None
    proposes_after_select: bool = False
    may_commit_nothing: bool = False
    extra_forwards: bool = False
    stochastic: bool = False
    proposal_fields: tuple[str, ...] | None = None
    reads_masked_only: bool = False
    noise_kinds: tuple[str, ...] = ("mask",)
    edits: bool = False
    samples_tokens: bool = False
    remasks: bool = False
    max_post_steps: int = 0
    sub_block_size: int | None = None
    fuses_logits: bool = False
    row_steps: bool = False
    attention_maps: int = 0
    edits_prompt: bool = False
    slides_blocks: bool = False
    soft_inputs: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Capabilities:
        """Refuse an unknown keyword before the dataclass ``__init__`` sees it (one line:
        the closest name, the caller's file:line); ``dataclasses.replace`` comes here too."""
        if not kwargs.keys() <= cls.__dataclass_fields__.keys():
            raise _unknown_keyword(cls.__name__, kwargs, cls.__dataclass_fields__)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        kinds = self.noise_kinds
        if isinstance(kinds, str) or not kinds or any(k not in NOISE_KINDS for k in kinds):
            raise ValueError(f"Capabilities.noise_kinds must be a non-empty tuple of "
                             f"{NOISE_KINDS}, got {kinds!r}")
        if self.proposal_fields is not None:
            object.__setattr__(self, "proposal_fields", _check_fields(self.proposal_fields))
        for name, value, valid in (("preferred_cache", self.preferred_cache, _CACHES),
                                   ("preferred_schedule", self.preferred_schedule, _SCHEDULES),
                                   ("requires_attention", self.requires_attention, _ATTENTIONS)):
            if value is not None and value not in valid:
                raise ValueError(f"Capabilities.{name} must be None or one of {valid}, "
                                 f"got {value!r}")
        if isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int) or (
                self.lookahead < 0):
            raise ValueError(f"Capabilities.lookahead must be an int >= 0, got {self.lookahead!r}")
        post = self.max_post_steps
        if isinstance(post, bool) or not isinstance(post, int) or post < 0:
            raise ValueError(f"Capabilities.max_post_steps must be an int >= 0, got {post!r}")
        if self.remasks and not self.edits:
            raise ValueError("Capabilities.remasks needs edits=True (a re-mask is an edit that "
                             "writes the mask token)")
        if post and not self.edits:
            raise ValueError("Capabilities.max_post_steps needs edits=True (post steps exist "
                             "only for selectors that rewrite committed positions)")
        sub = self.sub_block_size
        if sub is not None and (isinstance(sub, bool) or not isinstance(sub, int) or sub < 1):
            raise ValueError(f"Capabilities.sub_block_size must be None or an int >= 1, got "
                             f"{sub!r}")
        if self.at_least_budget and not self.budgeted:
            raise ValueError("Capabilities.at_least_budget describes a budgeted selector: "
                             "it needs budgeted=True (an adaptive one has no budget)")
        maps = self.attention_maps
        if isinstance(maps, bool) or not isinstance(maps, int) or maps < 0:
            raise ValueError(f"Capabilities.attention_maps must be an int >= 0, got {maps!r}")
        if self.edits_prompt and not self.edits:
            raise ValueError("Capabilities.edits_prompt needs edits=True (a prompt rewrite is "
                             "an edit)")
        if self.edits and self.reads_masked_only:
            raise ValueError("Capabilities(edits=True) reads committed positions: "
                             "reads_masked_only must be False")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every capability name."""
        return tuple(f.name for f in fields(cls))


def _unknown_keyword(kind: str, given: Any, valid: Any) -> TypeError:
    """The one-line ``TypeError`` for the names in ``given`` not in ``valid``: the closest valid
    name of each and the file:line of the first caller outside this module and ``dataclasses``."""
    unknown = [n for n in given if n not in valid]
    close = [difflib.get_close_matches(n, list(valid), n=1) for n in unknown]
    named = ", ".join(f"{n!r}" + (f" (did you mean {c[0]!r}?)" if c else "")
                      for n, c in zip(unknown, close, strict=True))
    frame = sys._getframe(1)  # walked only on this error path
    while frame.f_back is not None and frame.f_code.co_filename in (__file__, dataclasses.__file__):
        frame = frame.f_back
    names = "" if all(close) else f"; valid names: {', '.join(valid)}"
    return TypeError(f"{kind}() got unknown keyword(s) {named} at "
                     f"{frame.f_code.co_filename}:{frame.f_lineno}{names}")


def _check_fields(names: Any) -> tuple[str, ...]:
    """``proposal_fields`` as given -> the sorted tuple of optional fields it names."""
    if isinstance(names, str):
        raise TypeError(f"Capabilities.proposal_fields must be a tuple of field names, got the "
                        f"string {names!r} (write ({names!r},))")
    try:
        given = [n.value if isinstance(n, ScoreKind) else n for n in names]
    except TypeError:
        raise TypeError(f"Capabilities.proposal_fields must be a tuple of field names or None, "
                        f"got {names!r}") from None
    bad = [n for n in given if n not in PROPOSAL_FIELDS]
    if bad:
        raise ValueError(f"Capabilities.proposal_fields: unknown field(s) {bad}; Proposal fields "
                         f"are {list(PROPOSAL_FIELDS)}")
    return tuple(sorted(set(given) & set(OPTIONAL_FIELDS)))


def score_fields(*scores: ScoreKind | str | None) -> tuple[str, ...]:
    """The optional ``Proposal`` fields that ranking by ``scores`` reads (``prob`` and
    ``random`` read none; ``None`` entries are skipped), for ``proposal_fields``."""
    out = {ScoreKind(s).value for s in scores if s is not None}
    return tuple(sorted(out & set(OPTIONAL_FIELDS)))


def union_fields(*declared: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Combine ``proposal_fields`` declarations: ``None`` (every field) if any is ``None``."""
    if any(d is None for d in declared):
        return None
    return tuple(sorted({f for d in declared for f in d}))  # type: ignore[union-attr]


DEFAULT: Final[Capabilities] = Capabilities()
NAMES: Final[tuple[str, ...]] = Capabilities.names()


def capabilities_of(component: Any, role: str = "selector") -> Capabilities:
    """The validated ``Capabilities`` of a selector, stopper or truncator.

    Args:
        component: the policy part (``None``: an absent stopper / truncator).
        role: ``selector | stopper | truncator``, for the checks and error messages.

    Raises:
        TypeError: ``capabilities`` is not a ``Capabilities``.
        ValueError: a capability written as a plain attribute that disagrees with the declared
            value (or a likely misspelling of one); a stopper or truncator declaring a
            selector-only capability.
    """
    if component is None:
        return DEFAULT
    kind = type(component).__name__
    caps = getattr(component, "capabilities", DEFAULT)
    if not isinstance(caps, Capabilities):
        raise TypeError(f"{role} {kind}.capabilities must be a dllm_decode.Capabilities, got "
                        f"{type(caps).__name__}")
    for name in NAMES:
        try:
            value = getattr(component, name)
        except AttributeError:
            continue
        if callable(value) or value == getattr(caps, name):
            continue
        raise ValueError(
            f"{role} {kind} sets {name}={value!r} as a plain attribute, but the sampler only "
            f"reads declared capabilities ({kind}.capabilities.{name} is "
            f"{getattr(caps, name)!r}); declare it instead: capabilities = "
            f"Capabilities({name}={value!r}), or a property returning one")
    _check_typos(component, role, kind)
    if role != "selector":
        extra = [n for n in NAMES if n not in _ANY_ROLE and getattr(caps, n) != getattr(DEFAULT, n)]
        if extra:
            raise ValueError(f"{role} {kind} declares selector capabilities {extra}; a {role} may "
                             f"only declare {sorted(_ANY_ROLE)}")
    return caps


def _check_typos(component: Any, role: str, kind: str) -> None:
    names = set(vars(type(component))) | set(getattr(component, "__dict__", {}))
    for attr in sorted(names):
        if attr.startswith("_") or attr in NAMES:
            continue
        value = getattr(component, attr, None)
        if not isinstance(value, bool):
            continue
        close = difflib.get_close_matches(attr, NAMES, n=1, cutoff=_TYPO_CUTOFF)
        if close:
            raise ValueError(f"{role} {kind} has attribute {attr!r}: did you mean the capability "
                             f"{close[0]!r}? Declare capabilities = Capabilities({close[0]}=...)")


@dataclass(frozen=True)
class PolicyCapabilities:
    """What the sampler reads off a whole policy (selector + stopper + truncator), once.

    ``selector`` holds the selector's declaration; ``full_span`` / ``needs_logits`` are true when
    any part asks (a stopper always implies ``full_span``); ``requires_attention`` is the one
    attention any part requires (``None``: any); ``proposal_fields`` the optional ``Proposal``
    fields the present parts read (``None``: every field, when any part does not declare them);
    ``masked_only`` whether every present part ``reads_masked_only``; ``noise_kinds`` the
    model noise kinds every present part works with; ``row_steps`` whether every present part
    accepts per-row step values (``Capabilities.row_steps``).
    """

    selector: Capabilities
    full_span: bool
    needs_logits: bool
    requires_attention: str | None
    proposal_fields: tuple[str, ...] | None = None
    masked_only: bool = False
    noise_kinds: tuple[str, ...] = ("mask",)
    row_steps: bool = False


#: what each causal-in-block capability does, for ``check_model_needs``'s error
_CAUSAL_USES: Final[dict[str, str]] = {
    "causal_forwards": "its verifier runs the model in block-size-1 (causal) mode",
    "draft_causal": "draft_causal: decoded positions of the block attend causally in the draft",
    "causal_prefix": "causal_prefix: committed blocks are cached with causal attention",
}


def check_model_needs(model: Any, caps: PolicyCapabilities, causal_prefix: bool | None,
                      policy: str) -> None:
    """Refuse, at bind, a policy that runs a block-causal ``model`` with causal attention
    inside a block (``causal_forwards``, ``draft_causal``, ``causal_prefix``: the config's
    value, else the selector's) when the model says it was not trained for that.

    ``model.supports_causal_in_block`` (``config.json``): ``True`` (trained with block-size-1
    steps, as ``tiny-sdar``), ``False`` (trained only in its own blocks, as ``testbed-llada2``:
    its block-size-1 predictions are untrained) or ``None`` / absent (not stated: allowed, as
    S2D2's authors run the released AR-initialised SDAR, LLaDA2.x and Fast-dLLM v2).

    Raises:
        ValueError: one line naming what the policy runs causally and what to use instead.
    """
    if getattr(model, "attention", None) != "block_causal" or getattr(
            model, "supports_causal_in_block", None) is not False:
        return
    sel = caps.selector
    on = {"causal_forwards": sel.causal_forwards, "draft_causal": sel.draft_causal,
          "causal_prefix": sel.causal_prefix if causal_prefix is None else causal_prefix}
    uses = [_CAUSAL_USES[name] for name, value in on.items() if value]
    if uses:
        raise ValueError(
            f"policy {policy!r} runs this {getattr(model, 'family', '')} model with causal "
            f"attention inside a block ({'; '.join(uses)}), which it was not trained for "
            "(supports_causal_in_block is false in its config.json: those predictions are "
            "untrained); use a model trained for it (e.g. tiny-sdar), or turn them off: "
            "draft_causal=False, causal_prefix=False and, for s2d2, router='never' (its "
            "fallback rule alone)")


def noise_kind_of(model: Any) -> str:
    """``model.noise_kind`` (``"mask"`` for models that do not declare one)."""
    kind = getattr(model, "noise_kind", "mask")
    if kind not in NOISE_KINDS:
        raise ValueError(f"model.noise_kind must be one of {NOISE_KINDS}, got {kind!r}")
    return kind


def policy_capabilities(selector: Any, stopper: Any = None,
                        truncator: Any = None) -> PolicyCapabilities:
    """Validate every part's declaration and combine them (see ``PolicyCapabilities``).

    Raises:
        ValueError: parts that require different model attentions, or any error of
            ``capabilities_of``.
    """
    parts = {"selector": capabilities_of(selector, "selector"),
             "stopper": capabilities_of(stopper, "stopper"),
             "truncator": capabilities_of(truncator, "truncator")}
    present = [role for role, part in (("selector", selector), ("stopper", stopper),
                                       ("truncator", truncator)) if part is not None]
    need = {c.requires_attention for c in parts.values()} - {None}
    if len(need) > 1:
        raise ValueError(f"policy parts require different model attentions: {sorted(need)}")
    return PolicyCapabilities(
        selector=parts["selector"],
        full_span=stopper is not None or any(c.full_span for c in parts.values()),
        needs_logits=any(c.needs_logits for c in parts.values()),
        requires_attention=next(iter(need), None),
        proposal_fields=union_fields(*(parts[role].proposal_fields for role in present)),
        masked_only=all(parts[role].reads_masked_only for role in present),
        noise_kinds=tuple(k for k in NOISE_KINDS
                          if all(k in parts[role].noise_kinds for role in present)),
        row_steps=all(parts[role].row_steps for role in present),
    )
