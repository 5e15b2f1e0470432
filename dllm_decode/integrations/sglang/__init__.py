"""Serve any dllm-decode policy with SGLang: ``--dllm-algorithm DllmDecode``.

``pip install "dllm-decode[sglang]"`` installs the tested SGLang and an entry point in SGLang's
plugin group ``sglang.srt.plugins``; SGLang runs ``register`` in every process it starts (the
launcher, the scheduler and tensor-parallel workers, which are spawned), so that
``--dllm-algorithm DllmDecode --dllm-algorithm-config policy.yaml`` resolves everywhere:

    python -m sglang.launch_server --model-path inclusionAI/LLaDA2.0-mini \\
        --dllm-algorithm DllmDecode --dllm-algorithm-config policy.yaml

with ``policy.yaml`` naming the policy as the CLI does (``spec``). ``register`` is thin: it
puts the class in SGLang's registry and imports nothing of the policy stack (SGLang runs it in
processes that never decode: the tokenizer manager, the detokenizer, servers of other models);
the YAML is resolved when ``DllmDecode`` is used, at server start (``algorithm``). Modules:
``compat`` (the names they share, the supported SGLang versions), ``versions`` (what differs
between those versions, one module each), ``spec`` (the YAML, resolved and checked),
``block`` (per-request block state and the step), ``views`` (what a policy sees besides the
proposal) — none imports SGLang — and ``algorithm`` (the ``DllmAlgorithm`` subclass; imports
SGLang).
"""

from __future__ import annotations

import logging
from typing import Any

from dllm_decode.integrations.sglang.compat import (
    ALGORITHM_NAME,
    ARCHITECTURES,
    BASE_ATTRIBUTES,
    SUPPORTED_SGLANG,
    unsupported_message,
)

logger = logging.getLogger(__name__)

__all__ = ["ALGORITHM_NAME", "ARCHITECTURES", "BASE_ATTRIBUTES", "SUPPORTED_SGLANG", "register",
           "unsupported_message"]


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: make ``DllmDecode`` resolvable in this process.

    Imports SGLang lazily: a no-op where SGLang is not installed. On an untested SGLang the
    name still resolves, to a ``DllmAlgorithm`` subclass whose server-start check raises
    ``unsupported_message`` (so ``--dllm-algorithm DllmDecode`` fails with the reason, not as
    an unknown name). Where SGLang has no dLLM registry it logs one ERROR with the remedy and
    returns (SGLang's ``load_plugins`` would only log a raised error, with a traceback).
    """
    try:
        import sglang
    except ImportError:
        return
    version = str(getattr(sglang, "__version__", "unknown"))
    try:
        from sglang.srt.dllm import algorithm as registry
    except ImportError as err:
        if version in SUPPORTED_SGLANG:  # a broken installation
            logger.error("%s is not registered: SGLang %s has no dLLM registry "
                         "(sglang.srt.dllm.algorithm: %s); reinstall it (pip install "
                         "'dllm-decode[sglang]')", ALGORITHM_NAME, version, err)
        else:
            logger.error("%s is not registered: SGLang %s has no dLLM registry "
                         "(sglang.srt.dllm.algorithm); %s", ALGORITHM_NAME, version,
                         unsupported_message(version))
        return
    if version not in SUPPORTED_SGLANG:
        registry.algo_name_to_cls[ALGORITHM_NAME] = _unsupported(version)
        return
    from dllm_decode.integrations.sglang.algorithm import DllmDecodeAlgorithm

    registry.algo_name_to_cls[ALGORITHM_NAME] = DllmDecodeAlgorithm


def _unsupported(version: str) -> type:
    """A stand-in that refuses at server start (and if built anyway) with the reason: a
    subclass of this SGLang's ``DllmAlgorithm`` where it has one, else a class carrying
    ``BASE_ATTRIBUTES``."""
    message = unsupported_message(version)
    try:
        from sglang.srt.dllm.algorithm.base import DllmAlgorithm
        bases: tuple[type, ...] = (DllmAlgorithm,)
    except Exception:  # noqa: BLE001 - any failure to import an untested base: no base
        bases = ()

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(message)

    namespace: dict[str, Any] = {} if bases else dict(BASE_ATTRIBUTES)
    namespace.update(__init__=refuse, __doc__=message,
                     configure_server_args=classmethod(refuse),
                     validate_request=classmethod(lambda cls, req: message))
    return type("DllmDecodeUnsupported", bases, namespace)
