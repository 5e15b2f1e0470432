"""Serve any dllm-decode policy with SGLang: ``--dllm-algorithm DllmDecode``.

``pip install "dllm-decode[sglang]"`` installs the tested SGLang and an entry point in SGLang's
plugin group ``sglang.srt.plugins``; SGLang runs ``register`` in every process it starts (the
launcher, the scheduler and tensor-parallel workers, which are spawned), so that
``--dllm-algorithm DllmDecode --dllm-algorithm-config policy.yaml`` resolves everywhere:

    python -m sglang.launch_server --model-path inclusionAI/LLaDA2.0-mini \\
        --dllm-algorithm DllmDecode --dllm-algorithm-config policy.yaml

with ``policy.yaml`` naming the policy as the CLI does (``spec``). Modules: ``spec`` (the YAML,
resolved and checked), ``block`` (per-request block state and the step), ``views`` (what a
policy sees besides the proposal) — none imports SGLang — and ``algorithm`` (the
``DllmAlgorithm`` subclass; imports SGLang).
"""

from __future__ import annotations

from typing import Any, Final

from dllm_decode.integrations.sglang.spec import ALGORITHM_NAME

#: SGLang versions the integration is tested with (the ``sglang`` extra pins them)
SUPPORTED_SGLANG: Final[tuple[str, ...]] = ("0.5.23",)

__all__ = ["ALGORITHM_NAME", "SUPPORTED_SGLANG", "register", "unsupported_message"]


def unsupported_message(version: str) -> str:
    """Why ``DllmDecode`` refuses SGLang ``version``, and what to install."""
    tested = ", ".join(SUPPORTED_SGLANG)
    return (f"dllm-decode's {ALGORITHM_NAME} supports SGLang {tested}; this is SGLang "
            f"{version}: install a tested version (pip install 'dllm-decode[sglang]', i.e. "
            f"sglang=={SUPPORTED_SGLANG[-1]})")


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: make ``DllmDecode`` resolvable in this process.

    Imports SGLang lazily: a no-op where SGLang is not installed. On an untested SGLang the
    name still resolves, to a class whose server-start check raises ``unsupported_message``
    (so ``--dllm-algorithm DllmDecode`` fails with the reason, not as an unknown name).
    """
    try:
        import sglang
    except ImportError:
        return
    version = str(getattr(sglang, "__version__", "unknown"))
    try:
        from sglang.srt.dllm import algorithm as registry
    except ImportError:
        if version in SUPPORTED_SGLANG:  # a broken installation: its own error
            raise
        raise RuntimeError(unsupported_message(version)) from None  # no dLLM registry
    if version not in SUPPORTED_SGLANG:
        registry.algo_name_to_cls[ALGORITHM_NAME] = _unsupported(version)
        return
    from dllm_decode.integrations.sglang.algorithm import DllmDecodeAlgorithm

    registry.algo_name_to_cls[ALGORITHM_NAME] = DllmDecodeAlgorithm


def _unsupported(version: str) -> type:
    """A stand-in that refuses at server start (and if built anyway) with the reason."""
    message = unsupported_message(version)

    class DllmDecodeUnsupported:
        supported_architectures: tuple[str, ...] = ()
        requires_separate_context_encoding = False
        capture_input_preparation = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(message)

        @classmethod
        def configure_server_args(cls, server_args: Any) -> None:
            raise RuntimeError(message)

    return DllmDecodeUnsupported
