"""Turn task records into prompt ids and generated ids back into text.

A *codec* is any object with ``encode(task, record) -> list[int]``, ``decode(ids) -> str``,
``eos_token_ids`` and ``pad_token_id``. Two are provided:

* :class:`TokenizerCodec` wraps a Hugging Face tokenizer: the record is rendered to chat
  messages (:func:`~.prompts.render_messages`) and passed through ``apply_chat_template`` when
  the tokenizer has a chat template, else the message contents are joined with newlines.
* :class:`ModelCodec` delegates to a model that encodes prompts itself (e.g. the word-level
  ``WaitingLineOracle`` with ``encode_prompt`` / ``decode``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dllm_decode.eval.parallelbench.prompts import render_messages
from dllm_decode.speed import answer_length


class Codec(Protocol):
    """Prompt encoder / answer decoder used by the runner."""

    eos_token_ids: tuple[int, ...]
    pad_token_id: int

    def encode(self, task: str, record: Mapping[str, Any]) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def useful_length(ids: Sequence[int], eos_token_ids: Sequence[int]) -> int:
    """Number of generated tokens before the first EOS (all of them if there is none): the
    numerator of tokens per forward (``speed.answer_length``)."""
    return answer_length(ids, eos_token_ids)


class TokenizerCodec:
    """Codec over a Hugging Face tokenizer (``PreTrainedTokenizerFast`` or similar).

    Args:
        tokenizer: has ``__call__``, ``decode`` and optionally ``apply_chat_template`` /
            ``chat_template``.
        eos_token_ids: ids that end an answer (default: the tokenizer's ``eos_token_id``).
        joiner: separator of message contents when there is no chat template.
    """

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: Sequence[int] | None = None,
        joiner: str = "\n",
    ) -> None:
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("tokenizer has no eos_token_id; pass eos_token_ids")
            eos_token_ids = (tokenizer.eos_token_id,)
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else self.eos_token_ids[0])
        self.joiner = joiner

    def prompt_text(self, task: str, record: Mapping[str, Any]) -> str:
        """The full prompt string (chat template applied when available)."""
        messages = render_messages(task, record)
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        return self.joiner.join(message["content"] for message in messages)

    def encode(self, task: str, record: Mapping[str, Any]) -> list[int]:
        """Prompt ids; no extra special tokens when a chat template already rendered them."""
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        encoded = self.tokenizer(self.prompt_text(task, record), add_special_tokens=not templated)
        return list(encoded["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the answer up to (excluding) the first EOS, special tokens dropped."""
        cut = list(ids[: useful_length(ids, self.eos_token_ids)])
        return self.tokenizer.decode(cut, skip_special_tokens=True)


class ModelCodec:
    """Codec for models that encode prompts themselves (``encode_prompt`` + ``decode``)."""

    def __init__(self, model: Any) -> None:
        if not (hasattr(model, "encode_prompt") and hasattr(model, "decode")):
            raise TypeError("ModelCodec needs a model with encode_prompt(task, record) and decode")
        self.model = model
        self.eos_token_ids = tuple(model.eos_token_ids)
        self.pad_token_id = int(model.pad_token_id)

    def encode(self, task: str, record: Mapping[str, Any]) -> list[int]:
        return list(self.model.encode_prompt(task, record))

    def decode(self, ids: Sequence[int]) -> str:
        return self.model.decode(list(ids))
