"""The names every module of the adapter shares, and which SGLang versions it supports.

``VERSIONS`` maps a supported ``sglang.__version__`` to its module in ``versions/`` (what
differs between versions: how ``step`` receives the logits, how the runtime context is read;
see ``versions/__init__.py``); ``SUPPORTED_SGLANG`` is its keys. A leaf: nothing here imports
SGLang, the rest of the adapter or the library's policy stack.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

#: the name SGLang resolves (``--dllm-algorithm DllmDecode``)
ALGORITHM_NAME: Final = "DllmDecode"
#: SGLang's dLLM architectures with a mask token -> the library's model family
ARCHITECTURES: Final[dict[str, str]] = {"LLaDA2MoeModelLM": "llada2_moe",
                                        "SDARForCausalLM": "sdar",
                                        "SDARMoeForCausalLM": "sdar_moe"}
#: ``sglang.__version__`` -> its module in ``dllm_decode.integrations.sglang.versions``
VERSIONS: Final[dict[str, str]] = {"0.5.23": "v0_5_23"}
#: SGLang versions the integration is tested with (the ``sglang`` extra pins the newest)
SUPPORTED_SGLANG: Final[tuple[str, ...]] = tuple(VERSIONS)
#: the class attributes SGLang 0.5.23 reads from an algorithm class before it builds one
#: (``DllmConfig.from_server_args``, the server-args passes): a stand-in without the base
#: class carries them
BASE_ATTRIBUTES: Final[dict[str, Any]] = {
    "supported_architectures": (), "requires_separate_context_encoding": False,
    "required_attention_backend": None, "reuse_forward_metadata": False,
    "supported_attention_backends": (), "capture_input_preparation": False}


def unsupported_message(version: str) -> str:
    """Why ``DllmDecode`` refuses SGLang ``version``, and what to install."""
    tested = ", ".join(SUPPORTED_SGLANG)
    return (f"dllm-decode's {ALGORITHM_NAME} supports SGLang {tested}; this is SGLang "
            f"{version}: install a tested version (pip install 'dllm-decode[sglang]', i.e. "
            f"sglang=={SUPPORTED_SGLANG[-1]})")


@dataclass(frozen=True)
class ServerModel:
    """What an SGLang server process serves, from its runtime context.

    Attributes:
        hf_config: the checkpoint's config as SGLang parsed it (``ModelConfig.hf_config``).
        model_path: the checkpoint folder or Hub id SGLang loaded (``ModelConfig.model_path``).
        revision, tokenizer_path, skip_tokenizer: SGLang's ``--revision``,
            ``--tokenizer-path``, ``--skip-tokenizer-init``.
        config_path: ``--dllm-algorithm-config`` (``None``: none given).
        device: where this process's model runs (``"cuda:0"``, ``"cpu"``, ...).
        tp_size: the tensor-parallel width.
    """

    hf_config: Any
    model_path: str
    revision: str | None
    tokenizer_path: str | None
    skip_tokenizer: bool
    config_path: str | None
    device: str
    tp_size: int


def for_version(version: str) -> ModuleType:
    """The module of SGLang ``version`` (``KeyError`` for an unsupported one)."""
    return importlib.import_module(f"dllm_decode.integrations.sglang.versions."
                                   f"{VERSIONS[version]}")


def installed() -> ModuleType:
    """The module of the installed SGLang (``KeyError`` when it is not supported)."""
    import sglang

    return for_version(str(getattr(sglang, "__version__", "unknown")))
