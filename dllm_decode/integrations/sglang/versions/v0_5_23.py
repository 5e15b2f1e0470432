"""SGLang 0.5.23: ``step`` receives the ``full_logits`` tensor; the runtime context
(``sglang.srt.runtime_context``) holds the served model and the parallel layout.

``TpModelWorker`` publishes its ``ServerArgs`` (role ``scheduler``) before it builds the model
runner and the dLLM algorithm, so ``server_model`` reads, in the algorithm's ``__init__``: the
model config (``process_model_config``: SGLang's memoised ``ModelConfig``), the device
(``get_device()``: the device type and the GPU the launcher assigned) and the tensor-parallel
width (``get_parallel().tp_size``; the model runner has no ``tp_size`` attribute).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dllm_decode.integrations.sglang.compat import ServerModel

if TYPE_CHECKING:
    from torch import Tensor


def step_logits(logits: Any) -> Tensor:
    """``DllmAlgorithm.step``'s ``full_logits``: already the ``[B * K, V]`` tensor."""
    return logits


def _published() -> bool:
    from sglang.srt.runtime_context import get_server_args

    try:
        get_server_args()
    except ValueError:  # "Global server args is not set yet!"
        return False
    return True


def tp_size() -> int:
    """``get_parallel().tp_size``; 1 when nothing is published in this process."""
    from sglang.srt.runtime_context import get_parallel

    return int(get_parallel().tp_size) if _published() else 1


def server_model() -> ServerModel | None:
    """The served model from the runtime context, ``None`` when nothing is published."""
    if not _published():
        return None
    from sglang.srt.runtime_context import (
        get_device,
        get_exec,
        get_model,
        get_serving,
        process_model_config,
    )

    model_config = process_model_config()
    where = get_device()
    device = str(where.device or "cpu")
    gpu = getattr(where, "gpu_id", None)
    if gpu is not None and device != "cpu" and ":" not in device:
        device = f"{device}:{gpu}"
    serving = get_serving()
    return ServerModel(
        hf_config=model_config.hf_config, model_path=str(model_config.model_path),
        revision=get_model().revision, tokenizer_path=serving.tokenizer_path,
        skip_tokenizer=bool(serving.skip_tokenizer_init),
        config_path=get_exec().dllm.dllm_algorithm_config, device=device, tp_size=tp_size())
