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

import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor

from dllm_decode.speed import answer_length
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


#: what ``prompts`` may be, for error messages
_ALLOWED: Final = ("a string, a list of strings, one conversation (list of {'role', 'content'} "
                   "dicts) or a list of conversations")


def _as_conversations(prompts: Prompts) -> tuple[list[Any], bool]:
    """(list of prompts, whether they are message lists); empty text is an error."""
    if isinstance(prompts, str):
        items: list[Any] = [prompts]
    elif isinstance(prompts, (Sequence, Mapping)) and not isinstance(prompts, bytes):
        items = [prompts] if isinstance(prompts, Mapping) else list(prompts)
    else:
        raise TypeError(f"prompts must be {_ALLOWED}; got {type(prompts).__name__}")
    if not items:
        raise ValueError(f"prompts is empty: pass {_ALLOWED}")
    if all(isinstance(p, str) for p in items):
        for i, p in enumerate(items):
            if not p.strip():
                where = "the prompt" if len(items) == 1 else f"prompt {i}"
                raise ValueError(f"{where} is empty ({p!r}): pass the text to answer")
        return items, False
    if all(isinstance(p, Mapping) for p in items):
        convs = [items]
    elif all(isinstance(p, Sequence) and not isinstance(p, str) and p
             and all(isinstance(m, Mapping) for m in p) for p in items):
        convs = [list(p) for p in items]
    else:
        raise TypeError(f"prompts must be {_ALLOWED}; got "
                        f"{[type(p).__name__ for p in items][:4]}")
    for conv in convs:
        for m in conv:
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TypeError(f"a chat message needs string 'role' and 'content', got {m!r}")
        if not any(m["content"].strip() for m in conv):
            raise ValueError(f"conversation {conv!r} has no text: pass the text to answer")
    return convs, True


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
            ids = _tokenize(tokenizer, text)
        else:
            try:
                ids = _encode(tokenizer, item)
            except Exception as err:  # tokenizers raises a bare Exception for unknown words
                if "UNK" not in str(err):
                    raise
                raise ValueError(f"prompt {item!r} has words outside this tokenizer's vocabulary "
                                 "(a word-level tokenizer without an unknown token, e.g. a "
                                 "test-bed checkpoint: use its names and symbols only)") from err
        if not ids:
            raise ValueError(f"prompt {item!r} encodes to no tokens")
        rows.append(list(ids))
    codec = _testbed_codec(str(getattr(tokenizer, "name_or_path", "") or ""))
    if codec is not None and not use_chat:
        for row in rows:
            check_testbed_prompt(codec, row)
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


def _tokenize(tokenizer: Any, text: str) -> list[int]:
    """Ids of rendered chat text; ``verbose=False`` because an over-long prompt is reported
    by the sampler as an error (with the model's limit), not by transformers' warning about
    ``model_max_length``."""
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _encode(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode(text)``, without transformers' too-long warning (see ``_tokenize``);
    minimal tokenizers without the ``verbose`` keyword work too."""
    try:
        return list(tokenizer.encode(text, verbose=False))
    except TypeError:
        return list(tokenizer.encode(text))


@functools.lru_cache(maxsize=8)
def _testbed_codec(directory: str) -> Any:
    """The word-level codec of a test-bed tokenizer directory (``None`` for other tokenizers)."""
    if not directory:
        return None
    from dllm_decode.models.oracle import VOCAB_FILE, codec_for

    path = Path(directory)
    return codec_for(path) if (path / VOCAB_FILE).is_file() else None


def testbed_gen_length(tokenizer: Any) -> int | None:
    """The answer length a test-bed checkpoint was trained on (its vocabulary file's
    ``gen_length``: the Waiting Line's or the long-answer test bed's), or ``None`` for other
    tokenizers."""
    from dllm_decode.models.long_answer import LONG_VOCAB_FILE
    from dllm_decode.models.oracle import VOCAB_FILE

    directory = str(getattr(tokenizer, "name_or_path", "") or "")
    path = next((Path(directory) / f for f in (VOCAB_FILE, LONG_VOCAB_FILE)
                 if directory and (Path(directory) / f).is_file()), None)
    length = json.loads(path.read_text()).get("gen_length") if path else None
    return int(length) if length else None


def check_testbed_prompt(codec: Any, ids: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``ids`` is a prompt in the test-bed format.

    The format (``dllm_decode.train.testbed``): ``<task> [<index>] [word] [ a , b , ... ]``,
    then ``<fill>`` twice per empty list slot (``2 * (slots - items)``), then ``<answer>``;
    the checkpoints were trained only on it, and a prompt off it decodes to malformed output.
    ``codec`` is the checkpoint's ``WaitingLineOracle`` (``models.oracle.codec_for``).
    """
    from dllm_decode.models.oracle import ANSWER, FILL

    words = [codec.vocab[int(i)] for i in ids]
    shape = ("<task> [<index>] [word] [ name , ... ] <fill>.. <answer>, e.g. '<copy> [ "
             f"{codec.vocab[-1]} , {codec.vocab[-2]} , {codec.vocab[-3]} ] "
             f"{' '.join([FILL] * 2 * ((codec.slots or 3) - 3))} {ANSWER}'")
    try:
        task, items, word, index = codec.parse_prompt(list(ids))
    except ValueError:
        raise ValueError(f"test-bed prompt {' '.join(words)!r} is not in the format "
                         f"{shape}") from None
    head = [codec.token_id[f"<{task}>"]]
    head += [] if index is None else [codec.token_id[f"<{index}>"]]
    head += [] if word is None else [codec.token_id[word]]
    body = head + codec.encode_items(items)
    fills = 2 * (codec.slots - len(items)) if codec.slots is not None else 0
    if codec.slots is not None and len(items) > codec.slots:
        raise ValueError(f"test-bed prompt lists {len(items)} names; at most {codec.slots} fit")
    expected = body + [codec.token_id[FILL]] * fills + [codec.token_id[ANSWER]]
    if list(ids) == expected:
        return
    got = sum(w == FILL for w in words)
    core = [i for i in ids if codec.vocab[int(i)] not in (FILL, ANSWER)]
    if core == body and got != fills:
        well_formed = " ".join(codec.vocab[i] for i in expected)
        raise ValueError(f"test-bed prompt {' '.join(words)!r} is malformed: {len(items)} names "
                         f"need {fills} {FILL} tokens (2 per empty slot of {codec.slots}), got "
                         f"{got}; did you mean {well_formed!r}?")
    raise ValueError(f"test-bed prompt {' '.join(words)!r} is malformed: expected {shape}")


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
    directory = str(getattr(tokenizer, "name_or_path", "") or "")
    path = Path(directory) / "generation_config.json"
    if not directory or not path.is_file():  # no directory: not the working directory's file
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

    Special tokens (padding, role markers, a leftover mask) are dropped from the text. A
    test-bed tokenizer's answers render in the benchmark's list format (``["A B", "C D"]``,
    ``WaitingLineOracle.decode``: what the graders read), not as its word tokens.
    Returns ``(texts, stopped)``. One host transfer for the whole batch.
    """
    rows = answer.tolist()
    stops = set(stop_ids)
    codec = _testbed_codec(str(getattr(tokenizer, "name_or_path", "") or ""))
    texts, stopped = [], []
    for row in rows:
        cut = answer_length(row, stops)
        texts.append(_decode_ids(tokenizer, codec, row[:cut], mask_token_id))
        stopped.append(cut < len(row))
    return texts, stopped


def _decode_ids(tokenizer: Any, codec: Any, ids: Sequence[int], mask_token_id: int | None) -> str:
    """One answer's ids (already cut at its stop) as text: masks and special tokens dropped,
    a test-bed codec's list format (``decode_answers``)."""
    kept = [t for t in ids if t != mask_token_id]
    if codec is not None:
        return str(codec.decode(kept))
    try:
        return str(tokenizer.decode(kept, skip_special_tokens=True))
    except TypeError:  # a minimal tokenizer without the keyword
        return str(tokenizer.decode(kept))


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


@dataclass(frozen=True)
class TextEvent:
    """One event of ``stream_text``.

    delta: text that became final with this event (append-only: the joined deltas are
        ``generate_text``'s text); done: the last event; stopped: a final stop token ended the
        answer (``generate_text``'s flag; once set, no delta follows); step / block: decode
        steps run so far and the current block (``samplers.stream.StreamEvent``);
        generation: the ``Generation`` (the last event only, else ``None``).
    """

    delta: str
    done: bool
    stopped: bool
    step: int
    block: int
    generation: Generation | None = None
    _text: Any = field(default=None, repr=False, compare=False)

    @property
    def provisional(self) -> str | None:
        """The current block's text (committed tokens plus the argmax of masked positions, cut
        at a stop token); ``None`` unless streamed with ``provisional=True``. Decoded on read."""
        return None if self._text is None else self._text()


def stream_text(sampler: Any, tokenizer: Any, prompt: Prompts, *, chat: bool | None = None,
                provisional: bool = False, **overrides: Any) -> Iterator[TextEvent]:
    """Decode one prompt as ``generate_text`` does, yielding ``TextEvent``s as text becomes
    final (``DiffusionSampler.stream`` underneath: a block's text once the loop leaves it, a
    uniform-noise model's per canvas).

    ``delta`` is append-only and UTF-8 safe: the final token prefix is cut at its first stop
    token and decoded as ``generate_text`` decodes, and only the new end of that text is
    yielded, holding back an incomplete trailing character (and, for a tokenizer that cleans
    up spaces before punctuation, the last word) until the next block or the end. Once a stop
    token is final the rest of the text is yielded at once (``stopped``); the decode then runs
    to its end for the last event's ``Generation`` (stop iterating to skip it). Other events
    with an empty ``delta`` come only with ``provisional=True`` (one per step).

    Args:
        sampler: the ``DiffusionSampler`` to decode with (as for ``generate_text``).
        tokenizer: its tokenizer (as for ``generate_text``).
        prompt: one prompt: a string or one conversation.
        chat: render with the chat template (as for ``generate_text``).
        provisional: also show the current block's canvas (``DiffusionSampler.stream``).
        overrides: per-call settings (as for ``generate_text``).

    Example::

        for event in stream_text(sampler, tok, "Why is the sky blue?"):
            print(event.delta, end="", flush=True)
    """
    model = sampler.model
    ids, mask = encode_prompts(tokenizer, prompt, chat=chat)
    if ids.shape[0] != 1:
        raise ValueError(f"stream_text streams one prompt, got {ids.shape[0]}: stream them one "
                         "at a time or use generate_text for a batch")
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    device = first.device if first is not None else torch.device("cpu")
    padded = bool((mask == 0).any())
    events = sampler.stream(ids.to(device), mask.to(device) if padded else None,
                            provisional=provisional, **overrides)
    return _text_events(events, tokenizer, stop_token_ids(tokenizer, model),
                        getattr(model, "mask_token_id", None), provisional)


def _text_events(events: Iterator[Any], tokenizer: Any, stops: Sequence[int],
                 mask_id: int | None, provisional: bool) -> Iterator[TextEvent]:
    """``stream_text``'s generator over ``DiffusionSampler.stream`` events (closes it)."""
    codec = _testbed_codec(str(getattr(tokenizer, "name_or_path", "") or ""))
    hold_word = codec is None and bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))

    def block_text(ev: Any) -> str:
        ids = list(ev.provisional)
        return _decode_ids(tokenizer, codec, ids[:answer_length(ids, stops)], mask_id)

    final: list[int] = []
    emitted, stopped = "", False
    try:
        for ev in events:
            if stopped and not ev.done:
                continue  # the text is decided: only the last event (the Generation) follows
            final.extend(ev.final)
            cut = answer_length(final, stops)
            stopped = cut < len(final)
            text = ready = _decode_ids(tokenizer, codec, final[:cut], mask_id)
            if not (ev.done or stopped):  # hold back what a later token may still change
                ready = text.rstrip("\ufffd")
                if hold_word:  # " ." -> "." may still happen at the end
                    ready = ready[:max(ready.rfind(" "), 0)]
            delta = ready[len(emitted):] if ready.startswith(emitted) else ""
            emitted += delta
            if delta or ev.done or provisional:
                yield TextEvent(delta, ev.done, stopped, ev.step, ev.block, ev.generation,
                                functools.partial(block_text, ev) if provisional else None)
    finally:
        close = getattr(events, "close", None)  # the sampler's generator: stop the decode
        if close is not None:
            close()
