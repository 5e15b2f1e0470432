"""The request features ``DllmDecode`` does not honor, refused per request with the reason.

SGLang asks the algorithm class about every new request (``DllmAlgorithm.validate_request``,
called by the scheduler; a string answers the request with HTTP 400 and that message). The
adapter commits a block's tokens with the YAML's policy, so what SGLang's sampler would do
per request does not happen: log-probabilities, sampling masks, grammars, logit processing
(``logit_bias``, penalties, ``min_p``, custom logit processors, watermarks), ``min_new_tokens``,
a ``sampling_seed`` (each request draws from a generator seeded by the YAML's ``seed``, the
request id and the block's position), and a ``temperature`` / ``top_p`` / ``top_k`` other than
SGLang's defaults (unset) and the YAML's own values. A value equal to what the server fills
into requests that leave it unset (the checkpoint's ``generation_config.json`` under SGLang's
default ``--sampling-defaults model``, ``--preferred-sampling-params``) counts as unset.
``ignore_eos`` is refused when a policy part acts on EOS. Stop strings, ``stop_token_ids``,
``max_new_tokens`` and ``n`` are SGLang's and honored (checked after each block).

The YAML's values (``ServedSampling``) come from the server's runtime context: the YAML the
server started with, resolved once per process (``check.runtime_sampling``). Attribute names
are SGLang 0.5.23's (``Req``, ``SamplingParams``). Imports nothing: neither SGLang nor the
policy stack.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

#: SGLang's ``top_k`` meaning the whole vocabulary (``sampling_params.TOP_K_ALL``)
TOP_K_ALL: Final = 1 << 30

#: why each group of features is refused
WHY: Final[dict[str, str]] = {
    "logprobs": "no token log-probabilities are computed: the policy commits a block's tokens "
                "over several forwards",
    "sampling_mask": "no sampling mask is made: SGLang's sampler does not run",
    "grammar": "a block's positions are committed in any order, which no grammar backend "
               "can constrain",
    "logits": "SGLang's logit processing does not run in dLLM decoding: the policy reads the "
              "model's raw logits",
    "min_new_tokens": "the policy decides where a block commits its stop token; it cannot be "
                      "held back per request",
    "seed": "each request draws from a generator seeded by the YAML's seed, the request id "
            "and the block's position; a request's own seed cannot reproduce an output",
}


def _sp(name: str) -> Callable[[Any], Any]:
    return lambda req: getattr(req.sampling_params, name)


#: (feature, how to read it off SGLang's ``Req``, is it set, group): checked in this order
FEATURES: Final[tuple[tuple[str, Callable[[Any], Any], Callable[[Any], bool], str], ...]] = (
    ("return_logprob", lambda r: r.return_logprob, bool, "logprobs"),
    ("top_logprobs_num", lambda r: r.logprob.top_logprobs_num, bool, "logprobs"),
    ("token_ids_logprob", lambda r: r.logprob.token_ids_logprob, bool, "logprobs"),
    ("return_flat_raw_top_logprobs", lambda r: r.return_flat_raw_top_logprobs, bool,
     "logprobs"),
    ("return_sampling_mask", lambda r: r.return_sampling_mask, bool, "sampling_mask"),
    ("json_schema", _sp("json_schema"), lambda v: v is not None, "grammar"),
    ("regex", _sp("regex"), lambda v: v is not None, "grammar"),
    ("ebnf", _sp("ebnf"), lambda v: v is not None, "grammar"),
    ("structural_tag", _sp("structural_tag"), lambda v: v is not None, "grammar"),
    ("logit_bias", _sp("logit_bias"), bool, "logits"),
    ("frequency_penalty", _sp("frequency_penalty"), lambda v: v != 0.0, "logits"),
    ("presence_penalty", _sp("presence_penalty"), lambda v: v != 0.0, "logits"),
    ("repetition_penalty", _sp("repetition_penalty"), lambda v: v != 1.0, "logits"),
    ("min_p", _sp("min_p"), lambda v: v != 0.0, "logits"),
    ("custom_logit_processor", lambda r: r.custom_logit_processor, bool, "logits"),
    ("watermark", _sp("watermark"), lambda v: getattr(v, "enabled", None) is True, "logits"),
    ("min_new_tokens", _sp("min_new_tokens"), lambda v: v != 0, "min_new_tokens"),
    ("sampling_seed", _sp("sampling_seed"), lambda v: v is not None, "seed"),
)


#: what SGLang's ``--sampling-defaults model`` (its default) takes from ``generation_config.json``
#: for OpenAI-API requests that leave them unset (``ModelConfig.get_default_sampling_params``)
MODEL_DEFAULT_KEYS: Final = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")


def model_defaults(generation: Mapping[str, Any] | None,
                   preferred: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The values SGLang fills into a request that leaves them unset, as its ``SamplingParams``
    then holds them: ``generation``'s ``MODEL_DEFAULT_KEYS`` (``--sampling-defaults model``),
    updated with ``preferred`` (``--preferred-sampling-params``); a temperature of 0 becomes
    ``temperature=1.0, top_k=1`` and ``top_k=-1`` the whole vocabulary, as SGLang normalises
    them."""
    found = {k: generation[k] for k in MODEL_DEFAULT_KEYS
             if generation and generation.get(k) is not None}
    found.update({k: v for k, v in (preferred or {}).items() if v is not None})
    temp = found.get("temperature")
    if isinstance(temp, (int, float)) and 0 <= temp < 1e-6:
        found["temperature"], found["top_k"] = 1.0, 1
    if found.get("top_k") == -1:
        found["top_k"] = TOP_K_ALL
    return found


@dataclass(frozen=True)
class ServedSampling:
    """What every request decodes with: the YAML's sampling and the parts that act on EOS.

    Attributes:
        temperature: the YAML's (0: greedy); top_p, top_k: its filters (``None``: none).
        eos_parts: the policy's parts and settings that act on EOS (``check.eos_users``).
        policy: the policy's name; source: the YAML, for messages.
        defaults: what the server fills into requests that leave a field unset
            (``model_defaults``): a request holding exactly that value counts as unset.
    """

    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    eos_parts: tuple[str, ...] = ()
    policy: str = ""
    source: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: Any, eos_parts: tuple[str, ...] = (), source: str = "",
                  defaults: Mapping[str, Any] | None = None) -> ServedSampling:
        """From a resolved ``spec.ServingSpec``."""
        cfg = spec.cfg
        return cls(float(cfg.temperature), cfg.top_p, cfg.top_k, tuple(eos_parts),
                   spec.policy.name, source, dict(defaults or {}))

    def describe(self) -> str:
        """The sampling in words."""
        if self.temperature == 0:
            return "temperature 0 (greedy)"
        extra = "".join(f", {n}={v}" for n, v in (("top_p", self.top_p), ("top_k", self.top_k))
                        if v is not None)
        return f"temperature={self.temperature}{extra}"


def _same(a: float, b: float | None) -> bool:
    return b is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _unset(served: ServedSampling | None, name: str, value: Any) -> bool:
    """``value`` is what the server fills in for ``name`` when a request leaves it unset."""
    return served is not None and name in served.defaults and value == served.defaults[name]


def sampling_problems(sp: Any, served: ServedSampling | None) -> list[str]:
    """The request's ``temperature`` / ``top_p`` / ``top_k`` (``SamplingParams``, after SGLang's
    normalisation: a temperature of 0 is ``top_k=1``) that are neither SGLang's defaults (or
    the server's, ``ServedSampling.defaults``) nor what ``served`` decodes with (``None``:
    unknown, only SGLang's defaults pass)."""
    out = []
    greedy = served is not None and served.temperature == 0
    sampled = served is not None and served.temperature > 0
    t, p, k = sp.temperature, sp.top_p, sp.top_k
    if t != 1.0 and not _unset(served, "temperature", t) and not (
            sampled and _same(t, served.temperature)):
        out.append(f"temperature={t}")
    if p != 1.0 and not _unset(served, "top_p", p) and not (
            served is not None and _same(p, served.top_p)):
        out.append(f"top_p={p}")
    if k != TOP_K_ALL and not _unset(served, "top_k", k) and not (greedy and k == 1) and not (
            served is not None and served.top_k is not None and k == served.top_k):
        out.append("temperature=0 (top_k=1)" if k == 1 else f"top_k={k}")
    return out


def request_error(req: Any, served: ServedSampling | None) -> str | None:
    """SGLang's per-request answer: ``None`` (served) or one line naming every feature of
    ``req`` (SGLang's ``Req``) that is not honored, and why."""
    groups: dict[str, list[str]] = {}
    for name, read, is_set, group in FEATURES:
        value = read(req)
        if is_set(value) and not _unset(served, name, value):
            groups.setdefault(group, []).append(name)
    reasons = dict(WHY)
    sampling = sampling_problems(req.sampling_params, served)
    if sampling:
        groups["sampling"] = sampling
        reasons["sampling"] = (
            f"every request decodes with the policy's sampling, {served.describe()} "
            f"({served.source}): leave them unset or set the same values" if served is not None
            else "the YAML's sampling is not known in this process, so only SGLang's defaults "
                 "(unset) are accepted")
    if served is not None and served.eos_parts and req.sampling_params.ignore_eos:
        groups["ignore_eos"] = ["ignore_eos"]
        reasons["ignore_eos"] = f"{_eos_parts(served)}, so the text after an EOS would be EOS fill"
    if not groups:
        return None
    policy = f" (policy {served.policy!r})" if served is not None and served.policy else ""
    parts = "; ".join(f"{', '.join(names)}: {reasons[g]}" for g, names in groups.items())
    return f"DllmDecode{policy} does not support request-level {parts}"


def _eos_parts(served: ServedSampling) -> str:
    verb = "acts" if len(served.eos_parts) == 1 else "act"
    return f"the policy's {', '.join(served.eos_parts)} {verb} on EOS"


def refused_features(served: ServedSampling | None = None) -> list[tuple[str, str]]:
    """``(features, why)`` of every refusal, for ``serve-check`` and the README."""
    out = []
    for group, why in WHY.items():
        names = [name for name, _, _, g in FEATURES if g == group]
        out.append((", ".join(names), why))
    if served is None:
        out.append(("temperature, top_p, top_k", "other than SGLang's defaults (unset) and the "
                    "values the YAML decodes with"))
    else:
        out.append(("temperature, top_p, top_k", f"other than SGLang's defaults (unset) and the "
                    f"policy's {served.describe()}"))
        if served.eos_parts:
            out.append(("ignore_eos", _eos_parts(served)))
    return out
