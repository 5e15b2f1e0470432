"""Resolve a model argument to a local directory: a path, a bundled name or a Hub id.

A Hub id (``"org/name"``) goes through ``huggingface_hub.snapshot_download`` with
``allow_patterns``, so only what this library reads is fetched: ``config.json``,
``generation_config.json``, safetensors weights (+ index) and the tokenizer files. The Hub
cache, ``HF_HUB_CACHE`` / ``HF_HOME``, ``HF_HUB_OFFLINE`` (``TRANSFORMERS_OFFLINE``),
``local_files_only`` and ``token`` are honoured; the environment is read at call time, so a
variable set after ``import huggingface_hub`` still counts.

Every failure raises ``HubError`` naming the id, the file and what to do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from dllm_decode.models.weights import read_json

#: files a model load needs (weights are safetensors only; ``*.bin`` is never fetched)
MODEL_PATTERNS: Final = ("config.json", "generation_config.json", "*.safetensors",
                         "model.safetensors.index.json")
#: files a tokenizer load needs (fast and slow tokenizer formats, chat templates)
TOKENIZER_PATTERNS: Final = ("tokenizer.json", "tokenizer_config.json",
                             "special_tokens_map.json", "added_tokens.json", "vocab.json",
                             "merges.txt", "tokenizer.model", "chat_template.json",
                             "chat_template.jinja", "generation_config.json", "config.json")

#: ``org/name``: Hub naming rules (letters, digits, ``-``, ``_``, ``.``; no ``--`` or ``..``)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
_TRUE: Final = {"1", "on", "yes", "true"}


class HubError(FileNotFoundError):
    """A Hub id that cannot be turned into a complete local snapshot (message says why)."""


def looks_like_hub_id(name: str | Path) -> bool:
    """``"org/name"`` that is not an existing local path."""
    s = str(name)
    if isinstance(name, Path) or Path(s).exists() or s.startswith((".", "/", "~")):
        return False
    return bool(_HUB_ID.match(s)) and "--" not in s and ".." not in s


def offline() -> bool:
    """``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` (read now) or huggingface_hub's setting."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return True
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def cache_dir() -> Path:
    """The Hub cache: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _offline_switches(local_files_only: bool | None) -> list[str]:
    """What turned downloads off: ``local_files_only=True``, else the variables that are set,
    else huggingface_hub's own setting."""
    if local_files_only:
        return ["local_files_only=True"]
    found = [f"{v}={os.environ[v]}" for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
             if os.environ.get(v, "").strip().lower() in _TRUE]
    return found or ["huggingface_hub.constants.HF_HUB_OFFLINE"]


def _what_to_do(repo_id: str, switches: list[str]) -> str:
    """The fixes for a snapshot missing from the cache; ``switches``: what turned downloads
    off (empty when they were on: then switching them on again is no fix)."""
    again = f", or call again without {' / '.join(switches)}" if switches else ""
    return (f"download it once with network access (`hf download {repo_id}`{again}), point "
            f"HF_HUB_CACHE at a cache that has it, or pass a local directory with config.json "
            f"and *.safetensors")


def snapshot(repo_id: str, *, revision: str | None = None, patterns: tuple[str, ...],
             local_files_only: bool | None = None, token: str | bool | None = None,
             purpose: str = "model") -> Path:
    """Local snapshot directory of ``repo_id`` holding the files matching ``patterns``.

    Args:
        repo_id: ``"org/name"``.
        revision: branch, tag or commit (default ``main``).
        patterns: ``allow_patterns`` for ``snapshot_download``.
        local_files_only: never touch the network (``None``: only when offline mode is on).
        token: Hub token (``None``: the logged-in token / ``HF_TOKEN``).
        purpose: ``"model"`` or ``"tokenizer"``, for error messages.

    Raises: ``HubError`` (unknown id, gated repo, bad revision, offline cache miss, network).
    """
    try:
        import huggingface_hub
    except ImportError as err:  # pragma: no cover - huggingface_hub comes with transformers
        raise HubError(f"loading the Hub id {repo_id!r} needs huggingface_hub "
                       f"(pip install huggingface_hub)") from err
    try:
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:  # huggingface_hub < 0.24 keeps them in utils
        from huggingface_hub.utils import (  # type: ignore[no-redef]
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    snapshot_download = huggingface_hub.snapshot_download
    local_only = offline() if local_files_only is None else bool(local_files_only)
    cache = cache_dir()
    rev = revision or "main"
    where = f"{repo_id!r} (revision {rev!r})"
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=str(cache),
                                 allow_patterns=list(patterns), local_files_only=local_only,
                                 token=token)
    except GatedRepoError as err:
        raise HubError(f"{where} is a gated repository: accept its terms at "
                       f"https://huggingface.co/{repo_id} and pass token=... (or set HF_TOKEN / "
                       f"run `hf auth login`); or pass a local directory") from err
    except RepositoryNotFoundError as err:
        raise HubError(f"{repo_id!r} is not a local directory and no Hub repository has that "
                       f"id: check the spelling (it is 'org/name'); "
                       f"if it is private, pass token=... or set HF_TOKEN; or pass a local "
                       f"directory") from err
    except RevisionNotFoundError as err:
        raise HubError(f"{where}: the revision does not exist; pass an existing branch, tag or "
                       f"commit") from err
    except LocalEntryNotFoundError as err:
        switches = _offline_switches(local_files_only) if local_only else []
        mode = (f"downloads are off ({' / '.join(switches)})" if local_only
                else "the Hub could not be reached")
        raise HubError(f"{purpose} {where} is not a local directory, not in the Hub cache "
                       f"{cache} (or its snapshot there is "
                       f"incomplete) and {mode}: {_what_to_do(repo_id, switches)}") from err
    except Exception as err:
        network = isinstance(err, (OSError, ConnectionError)) or \
            type(err).__module__.split(".")[0] in ("httpx", "httpx2", "requests", "urllib3")
        if isinstance(err, HubError) or not network:
            raise
        raise HubError(f"could not fetch {purpose} {where} from the Hub ({type(err).__name__}: "
                       f"{err}): check the network (and, for a private or gated repository, "
                       f"pass token=... or set HF_TOKEN), or set HF_HUB_OFFLINE=1 to use the "
                       f"cache {cache}; or pass a local directory") from err
    return Path(path)


def check_model_snapshot(directory: Path, repo_id: str) -> None:
    """Raise ``HubError`` naming the first file a model load needs that the snapshot lacks."""
    def missing(name: str, why: str) -> HubError:
        return HubError(f"the Hub snapshot of {repo_id!r} at {directory} has no {name} ({why}): "
                        f"the cache is incomplete; "
                        f"{_what_to_do(repo_id, _offline_switches(None) if offline() else [])}")

    if not (directory / "config.json").is_file():
        raise missing("config.json", "the architecture")
    index = directory / "model.safetensors.index.json"
    if (directory / "model.safetensors").is_file():
        return
    if not index.is_file():
        bins = sorted(p.name for p in directory.glob("*.bin"))
        hint = f"; found {bins[:3]}: only safetensors weights are read" if bins else ""
        raise missing("model.safetensors or model.safetensors.index.json", "the weights" + hint)
    weight_map = read_json(index).get("weight_map", {})
    for shard in sorted(set(weight_map.values())):
        if not (directory / shard).is_file():
            raise missing(shard, f"a weight shard listed in {index.name}")
