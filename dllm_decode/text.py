"""Text in, text out: prompts or chat messages -> decoded answers (plus the ``Generation``).

``generate_text(sampler, tokenizer, prompts)`` renders each prompt with the tokenizer's chat
template when it has one (a plain string becomes one user turn), left-pads the batch with an
attention mask, decodes with the sampler, cuts every answer at its first stop token and
decodes it without special tokens.

Stop tokens (``stop_token_ids``) are the union of: the model's EOS ids (``config.json``),
``eos_token_id`` of ``generation_config.json`` beside the tokenizer (int or list), the
tokenizer's EOS token, and the end-of-turn token the chat template writes after an assistant
message (LLaDA-Instruct ``<|eot_id|>``, Qwen-style ``<|im_end|>``), found by rendering a
probe conversation rather than from a list of known strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.types import Generation

#: assistant text used to find what the chat template writes right after an answer
_PROBE: Final = "dllm-decode-probe-answer"

Message = Mapping[str, str]
Prompts = str | Sequence[str] | Sequence[Message] | Sequence[Sequence[Message]]


@dataclass
class TextGeneration:
    """Result of ``generate_text``.

    texts: one decoded answer per prompt (cut at the first stop token, specials removed).
    stopped: per prompt, whether a stop token ended the answer (False: ``gen_length`` ran out).
    generation: the sampler's ``Generation`` (tokens ``[B, P + G]``, NFE, ...).
    prompt_ids: ``[B, P]`` int64 left-padded prompts; attention_mask ``[B, P]`` (0 = pad).
    stop_token_ids: the ids that ended answers.
    """

    texts: list[str]
    stopped: list[bool]
    generation: Generation
    prompt_ids: Tensor
    attention_mask: Tensor
    stop_token_ids: tuple[int, ...]


def _as_conversations(prompts: Prompts) -> tuple[list[Any], bool]:
    """(list of prompts, whether they are message lists)."""
    if isinstance(prompts, str):
        return [prompts], False
    items = list(prompts)
    if not items:
        raise ValueError("prompts is empty: pass a string, a list of strings, one conversation "
                         "(list of {'role', 'content'} dicts) or a list of conversations")
    if all(isinstance(p, Mapping) for p in items):
        return [items], True
    if all(isinstance(p, str) for p in items):
        return items, False
    if all(isinstance(p, Sequence) and not isinstance(p, str) and p
           and all(isinstance(m, Mapping) for m in p) for p in items):
        return [list(p) for p in items], True
    raise TypeError("prompts must be a string, a list of strings, one conversation (list of "
                    "{'role', 'content'} dicts) or a list of conversations; got "
                    f"{[type(p).__name__ for p in items][:4]}")


def encode_prompts(tokenizer: Any, prompts: Prompts, *, chat: bool | None = None,
                   pad_token_id: int | None = None) -> tuple[Tensor, Tensor]:
    """Tokenize and left-pad ``prompts``.

    Args:
        tokenizer: a Hugging Face tokenizer (or anything with ``encode``).
        prompts: see ``generate_text``.
        chat: apply the chat template (``None``: when the tokenizer has one). Message lists
            require a template.
        pad_token_id: id written into padding (never attended); default the tokenizer's pad,
            else its EOS, else 0.

    Returns: ``(prompt_ids [B, P] int64, attention_mask [B, P] int64)``, left-padded.
    """
    items, are_messages = _as_conversations(prompts)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    use_chat = has_template if chat is None else chat
    if use_chat and not has_template:
        raise ValueError("chat=True (or chat messages) needs a tokenizer with a chat template; "
                         "this one has none: pass plain strings with chat=False")
    if are_messages and not use_chat:
        raise ValueError("chat messages need the chat template; pass chat=None or True")
    rows: list[list[int]] = []
    for item in items:
        if use_chat:
            messages = item if are_messages else [{"role": "user", "content": item}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer.encode(item)
        if not ids:
            raise ValueError(f"prompt {item!r} encodes to no tokens")
        rows.append(list(ids))
    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "eos_token_id", None)
    pad = int(pad_token_id) if pad_token_id is not None else 0
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


def _end_of_turn_id(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}],
            tokenize=False)
    except Exception:  # a template that rejects the probe conversation: no EOT from it
        return None
    after = text.split(_PROBE, 1)[1] if _PROBE in text else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    # special: the named specials plus added tokens flagged special (LLaDA's <|eot_id|>)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special.update(int(i) for i, t in added.items() if getattr(t, "special", False))
    for i in ids:  # the first token after the answer that is not whitespace
        if tokenizer.decode([i]).strip():
            return int(i) if i in special else None
    return None


def _generation_config_eos(tokenizer: Any) -> list[int]:
    path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def stop_token_ids(tokenizer: Any, model: Any = None) -> tuple[int, ...]:
    """EOS / EOT ids that end an answer (see the module docstring), sorted."""
    ids = set(getattr(model, "eos_token_ids", ()) or ())
    ids.update(_generation_config_eos(tokenizer))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    eot = _end_of_turn_id(tokenizer)
    if eot is not None:
        ids.add(eot)
    return tuple(sorted(ids))


def decode_answers(tokenizer: Any, answer: Tensor, stop_ids: Sequence[int],
                   mask_token_id: int | None = None) -> tuple[list[str], list[bool]]:
    """Cut each row of ``answer [B, G]`` at its first stop id and decode it.

    Special tokens (padding, role markers, a leftover mask) are dropped from the text.
    Returns ``(texts, stopped)``. One host transfer for the whole batch.
    """
    rows = answer.tolist()
    stops = set(stop_ids)
    texts, stopped = [], []
    for row in rows:
        cut = next((i for i, t in enumerate(row) if t in stops), len(row))
        kept = [t for t in row[:cut] if t != mask_token_id]
        try:
            text = tokenizer.decode(kept, skip_special_tokens=True)
        except TypeError:  # a minimal tokenizer without the keyword
            text = tokenizer.decode(kept)
        texts.append(text)
        stopped.append(cut < len(row))
    return texts, stopped


def generate_text(sampler: Any, tokenizer: Any, prompts: Prompts, *, chat: bool | None = None,
                  on_step: Any = None, **overrides: Any) -> TextGeneration:
    """Decode answers to ``prompts`` as text.

    Args:
        sampler: a ``DiffusionSampler`` (its model, policy, cache and config are used).
        tokenizer: the model's tokenizer (``load_tokenizer``).
        prompts: a string, a list of strings (a batch), one conversation (list of
            ``{"role", "content"}`` dicts) or a list of conversations.
        chat: apply the chat template (``None``: when the tokenizer has one).
        on_step: optional ``(state, commit)`` callback, as for ``DiffusionSampler.generate``.
        **overrides: ``SamplerConfig`` fields for this call (``gen_length``, ``steps``, ...).

    Returns: ``TextGeneration`` (texts, stopped flags, the ``Generation``, the padded prompt).

    Example::

        model = load_model("GSAI-ML/LLaDA-8B-Instruct", device="cuda")
        tok = load_tokenizer("GSAI-ML/LLaDA-8B-Instruct")
        sampler = DiffusionSampler(model, "threshold", cache="dual", gen_length=256,
                                   block_length=32)
        print(generate_text(sampler, tok, "Why is the sky blue?").texts[0])
    """
    model = sampler.model
    ids, mask = encode_prompts(tokenizer, prompts, chat=chat)
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    device = first.device if first is not None else torch.device("cpu")
    ids, mask = ids.to(device), mask.to(device)
    padded = bool((mask == 0).any())
    out = sampler.generate(ids, mask if padded else None, on_step=on_step, **overrides)
    stops = stop_token_ids(tokenizer, model)
    texts, stopped = decode_answers(tokenizer, out.answer, stops,
                                    getattr(model, "mask_token_id", None))
    return TextGeneration(texts=texts, stopped=stopped, generation=out, prompt_ids=ids,
                          attention_mask=mask, stop_token_ids=stops)
