"""The small byte-level BPE tokenizer shared by the bundled tiny checkpoints.

Built with ``tokenizers`` and saved as ``tokenizer.json`` + ``tokenizer_config.json`` so that
``transformers.AutoTokenizer.from_pretrained(dir)`` loads it as a ``PreTrainedTokenizerFast``.

Design:

* **Byte level**: the 256 byte symbols are always in the vocabulary, so any text (names never
  seen in training, other scripts, emoji) encodes without an unknown token and decodes back to
  the identical string.
* **Pre-tokenization** (a regex split before the byte mapping) is chosen for the ParallelBench
  prompt shape: a capitalised word is one piece (``"David"``, ``" Owens"``: a name is usually
  two tokens), a run of lower-case words joined by single spaces is one piece (so the fixed
  instruction sentences merge into a handful of tokens and prompts stay short), each digit is
  its own piece (Sudoku grids, indices), and a run of punctuation with inner single spaces is
  one piece (``'", "'`` between two list items is one token).
* **Coverage**: trained on the clean-room generators' prompts, so the generators' names are
  one token per word ("Dara", " Campos") and a generated Waiting Line answer of 6 people is
  about 19 tokens. Names outside those lists (e.g. the released ParallelBench data) fall back
  to sub-word pieces: about 5.4 tokens per full name, so a released answer averages 30 tokens
  and only ~56 % fit ParallelBench's 32-token budget; use ``gen_length=64`` there.
* **Special tokens** (ids 0..5 in this order): pad, EOS, mask and the three chat roles. The
  chat template renders ``<|role|>\\n{content}<|endoftext|>`` per message and, with
  ``add_generation_prompt``, ends with ``<|assistant|>\\n``; the generated answer ends with EOS
  (and is padded with EOS up to the generation length in training data).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

#: directory of the tokenizer shipped with the package (built by ``build_tokenizer``)
BUNDLED_TOKENIZER: Final = Path(__file__).parent / "models" / "assets" / "tiny-tokenizer"

PAD_TOKEN: Final = "<|pad|>"
EOS_TOKEN: Final = "<|endoftext|>"
MASK_TOKEN: Final = "<|mask|>"
ROLE_TOKENS: Final = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS: Final = (PAD_TOKEN, EOS_TOKEN, MASK_TOKEN, *ROLE_TOKENS)

#: default vocabulary size: small, because the bundled models are tiny (embedding + head rows)
DEFAULT_VOCAB_SIZE: Final = 2048

#: the regex split applied before the byte-level mapping (see the module docstring)
PRETOKEN_PATTERN: Final = (
    r" ?\p{Lu}\p{Ll}*"
    r"| ?\p{Ll}+(?: \p{Ll}+)*"
    r"|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+(?: [^\s\p{L}\p{N}]+)*"
    r"| ?\p{L}+"
    r"|\s+"
)

CHAT_TEMPLATE: Final = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)

#: longest canvas the tokenizer advertises (prompt + generation); the tiny models use less
MODEL_MAX_LENGTH: Final = 1024


def new_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE ``Tokenizer`` with this module's pre-tokenizer and decoder."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE,
                    min_frequency: int = 2) -> Tokenizer:
    """Train the byte-level BPE on ``texts``; specials take ids ``0..len(SPECIAL_TOKENS)-1``.

    Args:
        texts: training strings (rendered prompts and answers).
        vocab_size: total vocabulary size including the 256 byte symbols and the specials.
        min_frequency: a merge needs at least this many occurrences.
    """
    floor = 256 + len(SPECIAL_TOKENS)
    if vocab_size <= floor:
        raise ValueError(f"vocab_size must exceed {floor} (256 bytes + specials), "
                         f"got {vocab_size}")
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}, not {i}")
    return tok


def tokenizer_config() -> dict:
    """The ``tokenizer_config.json`` contents (special tokens, chat template, padding side)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "mask_token": MASK_TOKEN,
        "unk_token": None,
        "additional_special_tokens": list(ROLE_TOKENS),
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, t in enumerate(SPECIAL_TOKENS)
        },
    }


def save_tokenizer(tok: Tokenizer, out_dir: str | Path) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2) + "\n")
    return out


def default_corpus(samples_per_task: int = 400, seed: int = 0) -> Iterator[str]:
    """Rendered ParallelBench-style prompts and answers from the clean-room task generators.

    Every generator task (Waiting Line lengths 3..6 and 15, the puzzles) contributes
    ``samples_per_task`` records with one in-context example, each as its prompt text and its
    answer text.
    """
    from dllm_decode.eval.parallelbench.generate import TASKS, generate_task
    from dllm_decode.eval.parallelbench.prompts import reference_answer, render_messages

    for i, task in enumerate(TASKS):
        for record in generate_task(task, samples_per_task, seed + i, split="train"):
            yield "\n".join(m["content"] for m in render_messages(task, record))
            yield reference_answer(record)


def build_tokenizer(out_dir: str | Path, texts: Iterable[str] | None = None,
                    vocab_size: int = DEFAULT_VOCAB_SIZE) -> Path:
    """Train the tokenizer (on ``default_corpus()`` unless ``texts`` is given) and save it.

    Returns ``out_dir``; load it with ``load_tokenizer(out_dir)`` or ``AutoTokenizer``.
    """
    tok = train_tokenizer(default_corpus() if texts is None else texts, vocab_size)
    return save_tokenizer(tok, out_dir)


def load_tokenizer(name_or_path: str | Path | None = None, *, revision: str | None = None,
                   local_files_only: bool | None = None, token: str | bool | None = None):
    """A Hugging Face tokenizer from a directory, a bundled checkpoint name or a Hub id.

    Args:
        name_or_path: directory with ``tokenizer.json`` / ``tokenizer_config.json``, a bundled
            name (``"tiny-llada"``), or a Hub id (only tokenizer files, ``config.json`` and
            ``generation_config.json`` are fetched). ``None``: the bundled tiny tokenizer.
        revision, local_files_only, token: as for ``load_model`` (Hub ids only).

    Returns a ``PreTrainedTokenizerFast`` (or the class ``tokenizer_config.json`` names;
    remote code is never run).
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from dllm_decode.models.hub import TOKENIZER_PATTERNS, looks_like_hub_id
    from dllm_decode.models.loading import resolve_path

    if name_or_path is None:
        directory = BUNDLED_TOKENIZER
    elif Path(name_or_path).is_dir() or looks_like_hub_id(name_or_path) or \
            "/" not in str(name_or_path):
        directory = resolve_path(name_or_path, revision=revision, patterns=TOKENIZER_PATTERNS,
                                 local_files_only=local_files_only, token=token,
                                 purpose="tokenizer")
    else:
        directory = Path(name_or_path)
    has_fast = (directory / "tokenizer.json").is_file()
    if not has_fast and not (directory / "tokenizer_config.json").is_file():
        raise FileNotFoundError(
            f"{directory} has no tokenizer.json (nor tokenizer_config.json); pass the checkpoint "
            f"directory or Hub id that ships the tokenizer, or build one with "
            f"dllm_decode.tokenizer.build_tokenizer(out_dir)")
    cfg_path = directory / "tokenizer_config.json"
    cls_name = json.loads(cfg_path.read_text()).get("tokenizer_class") if cfg_path.is_file() \
        else None
    if has_fast and cls_name in (None, "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(str(directory))
    from dllm_decode.models.loading import register_auto_config

    register_auto_config()  # AutoTokenizer reads config.json: let AutoConfig know our types
    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except (ValueError, KeyError, OSError) as err:
        if not has_fast:
            raise ValueError(f"could not load the tokenizer in {directory}: {err}") from err
        return PreTrainedTokenizerFast.from_pretrained(str(directory))
