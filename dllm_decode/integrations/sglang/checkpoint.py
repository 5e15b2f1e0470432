"""What SGLang reads from a checkpoint folder for a dLLM server, read from the files alone.

SGLang 0.5.23 ends a request at a token of its *stop set*: the config's ``eos_token_id`` (an
int or a list), united with ``generation_config.json``'s ``eos_token_id`` when that is truthy
(``ModelConfig._get_hf_eos_token_id``; an ``eos_token_id`` of ``0`` there is skipped, as
SGLang skips it), plus the tokenizer's ``eos_token_id`` and the ids of the turn-final markers
``<|eom_id|>``, ``<|content_model_end_sampling|>``, ``<|ifm|im_end|>`` when the tokenizer has
them as added tokens (``Req._check_token_based_finish``; none with ``--skip-tokenizer-init``).
Per-request ``stop_token_ids`` come on top, per request.

``read_checkpoint`` reads those files with ``models.weights.read_json`` (size-limited, one-line
errors) from a local folder, a bundled name or a Hub id already in the local Hugging Face
cache; it never downloads. ``SGLANG_DLLM_PARAMS`` is SGLang's per-architecture block size and
mask id (``DllmConfig.from_server_args``). No SGLang import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dllm_decode.models.weights import read_json

#: SGLang 0.5.23's ``DLLM_PARAMS`` for the mask-token architectures: block size, mask id
SGLANG_DLLM_PARAMS: Final[dict[str, tuple[int, int]]] = {
    "LLaDA2MoeModelLM": (32, 156895),
    "SDARForCausalLM": (4, 151669),
    "SDARMoeForCausalLM": (4, 151669),
}
#: added tokens SGLang also stops on (``attach_additional_stop_token_ids``)
ADDITIONAL_STOP_TEXTS: Final = ("<|eom_id|>", "<|content_model_end_sampling|>",
                                "<|ifm|im_end|>")
#: the files read here (and fetched by nothing: a Hub id must already be cached)
CHECKPOINT_FILES: Final = ("config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "special_tokens_map.json",
                           "added_tokens.json", "vocab.json")


@dataclass(frozen=True)
class TokenizerStops:
    """The tokenizer's part of the stop set.

    Attributes:
        eos_text: the tokenizer's ``eos_token`` (``None``: it names none).
        eos_id: its id (``None``: no EOS, or ``eos_text`` is in no vocabulary file read).
        extra_ids: ids of ``ADDITIONAL_STOP_TEXTS`` among the added tokens, sorted.
    """

    eos_text: str | None = None
    eos_id: int | None = None
    extra_ids: tuple[int, ...] = ()

    @property
    def ids(self) -> tuple[int, ...]:
        return (() if self.eos_id is None else (self.eos_id,)) + self.extra_ids


@dataclass(frozen=True)
class CheckpointFiles:
    """A checkpoint's files as a dLLM server reads them.

    Attributes:
        directory: the local folder.
        config: ``config.json``.
        generation: ``generation_config.json`` (``None``: absent).
        tokenizer: the tokenizer's stops (``None``: no tokenizer, or ``skip_tokenizer``).
    """

    directory: Path
    config: dict[str, Any]
    generation: dict[str, Any] | None = None
    tokenizer: TokenizerStops | None = field(default=None)

    @property
    def architecture(self) -> str:
        arch = self.config.get("architectures") or ["?"]
        return str(arch[0]) if isinstance(arch, list) else str(arch)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """SGLang's stop set for this checkpoint (``stop_token_set``)."""
        return stop_token_set(self.config.get("eos_token_id"),
                              None if self.generation is None
                              else self.generation.get("eos_token_id"),
                              () if self.tokenizer is None else self.tokenizer.ids)


def _ids(value: Any) -> list[int]:
    """An ``eos_token_id`` value (an int or a list of ints) as a list."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple, set, frozenset)):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {value!r}")
    values = [value] if isinstance(value, int) else list(value)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad:
        raise ValueError(f"eos_token_id must hold token ids >= 0, got {value!r}")
    return values


def stop_token_set(config_eos: Any, generation_eos: Any = None,
                   tokenizer_ids: Iterable[int] = ()) -> tuple[int, ...]:
    """SGLang's stop set, as a tuple: the config's ids first, in their order (the first is the
    model's EOS, the adapter's truncation fill), then the others sorted; no repeats.

    Args:
        config_eos: the config's ``eos_token_id`` (int, list or ``None``).
        generation_eos: ``generation_config.json``'s (skipped when falsy, as SGLang does).
        tokenizer_ids: the tokenizer's stop ids (``TokenizerStops.ids``).
    """
    first = list(dict.fromkeys(_ids(config_eos)))
    rest = set(_ids(generation_eos) if generation_eos else []) | {int(i) for i in tokenizer_ids}
    return (*first, *sorted(rest - set(first)))


def _text(token: Any) -> str | None:
    """A special token as written in tokenizer files: a string or ``{"content": ...}``."""
    if isinstance(token, str):
        return token
    if isinstance(token, Mapping) and isinstance(token.get("content"), str):
        return token["content"]
    return None


def _optional(path: Path) -> dict[str, Any]:
    return read_json(path) if path.is_file() else {}


def tokenizer_stops(directory: Path) -> TokenizerStops | None:
    """The tokenizer's EOS and extra stop ids from its files, as ``transformers`` resolves them:
    ``eos_token`` from ``tokenizer_config.json`` (``special_tokens_map.json``'s wins when the
    config has no ``added_tokens_decoder``, transformers' legacy rule), its id from the added
    tokens or the vocabulary (``tokenizer.json``, ``added_tokens.json``, ``vocab.json``).
    ``None`` when the folder has no tokenizer files."""
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    if not any((directory / n).is_file() for n in names):
        return None
    config = _optional(directory / "tokenizer_config.json")
    eos = _text(config.get("eos_token"))
    if "added_tokens_decoder" not in config:
        special = _optional(directory / "special_tokens_map.json")
        if "eos_token" in special:
            eos = _text(special["eos_token"])
    added: dict[str, int] = {}
    fast = _optional(directory / "tokenizer.json")
    for tok in fast.get("added_tokens") or []:
        if isinstance(tok, Mapping) and isinstance(tok.get("id"), int) and _text(tok):
            added[str(_text(tok))] = tok["id"]
    for idx, tok in (config.get("added_tokens_decoder") or {}).items():
        if _text(tok) is not None and str(idx).isdigit():
            added.setdefault(str(_text(tok)), int(idx))
    for text, idx in _optional(directory / "added_tokens.json").items():
        if isinstance(idx, int):
            added.setdefault(text, idx)
    vocab = (fast.get("model") or {}).get("vocab")
    if isinstance(vocab, list):  # Unigram: [piece, score] at its id
        vocab = {str(p[0]): i for i, p in enumerate(vocab) if isinstance(p, list) and p}
    if not isinstance(vocab, Mapping):
        vocab = _optional(directory / "vocab.json")
    eos_id = None if eos is None else added.get(eos, vocab.get(eos))
    extra = tuple(sorted({added[t] for t in ADDITIONAL_STOP_TEXTS if t in added}))
    return TokenizerStops(eos, eos_id if isinstance(eos_id, int) else None, extra)


def local_folder(model: str | Path, *, revision: str | None = None,
                 what: str = "--model") -> Path:
    """``model`` as a local folder: a directory, a bundled name, or a Hub id whose snapshot is
    already in the local Hugging Face cache (never downloaded: a one-line error says so)."""
    from dllm_decode.models.hub import HubError, cache_dir, looks_like_hub_id, snapshot
    from dllm_decode.models.loading import ASSETS

    path = Path(model)
    if path.is_dir():
        return path
    if (ASSETS / str(model)).is_dir():
        return ASSETS / str(model)
    if not looks_like_hub_id(model):
        raise FileNotFoundError(f"{what} {model}: no such folder (pass a checkpoint folder with "
                                f"config.json, or a Hub id 'org/name' already downloaded)")
    try:
        return snapshot(str(model), revision=revision, patterns=CHECKPOINT_FILES,
                        local_files_only=True)
    except HubError:
        raise FileNotFoundError(
            f"{what} {model}: not a local folder and not in the local Hugging Face cache "
            f"{cache_dir()}; nothing is downloaded here: run `hf download {model}` first, or "
            f"pass the checkpoint folder") from None


def read_checkpoint(model: str | Path, *, tokenizer_path: str | Path | None = None,
                    revision: str | None = None, skip_tokenizer: bool = False
                    ) -> CheckpointFiles:
    """The files of ``model`` (a folder, bundled name or cached Hub id) a dLLM server reads.

    Args:
        tokenizer_path: SGLang's ``--tokenizer-path`` (``None``: the model's folder).
        revision: SGLang's ``--revision`` (Hub ids only).
        skip_tokenizer: SGLang's ``--skip-tokenizer-init`` (no tokenizer stops).

    Raises:
        FileNotFoundError: no such folder, or no ``config.json``.
        ValueError: an unreadable file (``CheckpointError``) or a malformed ``eos_token_id``.
    """
    directory = local_folder(model, revision=revision)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"--model {model}: {directory} has no config.json")
    config = read_json(config_path)
    gen_path = directory / "generation_config.json"
    generation = read_json(gen_path) if gen_path.is_file() else None
    tokenizer = None
    if not skip_tokenizer:
        tok_dir = directory if tokenizer_path is None else local_folder(
            tokenizer_path, revision=revision, what="--tokenizer-path")
        tokenizer = tokenizer_stops(tok_dir)
    files = CheckpointFiles(directory, config, generation, tokenizer)
    try:
        files.stop_ids  # noqa: B018  (checked here: a malformed eos_token_id, in one line)
    except ValueError as err:
        raise ValueError(f"--model {model}: {err} (config.json / generation_config.json)"
                         ) from None
    return files
