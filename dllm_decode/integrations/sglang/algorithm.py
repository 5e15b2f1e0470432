"""``DllmDecodeAlgorithm``: SGLang's ``DllmAlgorithm`` running any dllm-decode policy.

SGLang (``sglang.srt.dllm.algorithm.base``) owns the loops: ``run`` decodes a batch of blocks
synchronously (``--no-dllm-fdfo``: forward, ``step``, ... until every row is done) or, by
default, first-done-first-out (one forward and one ``step`` per round; an unfinished row's
state comes back with it next round, in any row order). This class supplies the per-request
state (``init_step_state``), the step (``block.BlockDecoder``), the step bound (``max_steps``)
and the server-start check of the YAML (``configure_server_args``). Imports SGLang: load it
only where SGLang is installed (the entry point, ``register``, does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml
from sglang.srt.dllm.algorithm.base import DllmAlgorithm
from sglang.srt.dllm.config import DllmConfig

from dllm_decode.integrations.sglang.block import BlockDecoder, RequestBlock
from dllm_decode.integrations.sglang.spec import ARCHITECTURES, ServedModel, serving_spec


class DllmDecodeAlgorithm(DllmAlgorithm):
    """``--dllm-algorithm DllmDecode --dllm-algorithm-config policy.yaml``.

    The YAML (``spec``) is checked when the server starts (``configure_server_args``, in the
    launcher, against the checkpoint's config) and bound to the served model on the first
    batch (``run``: what needs the weights, e.g. a Learn2PD filter's fingerprint).
    """

    supported_architectures = tuple(ARCHITECTURES)

    def __init__(self, config: DllmConfig) -> None:
        super().__init__(config)
        self.algorithm_config = dict(config.algorithm_config or {})
        self.decoder: BlockDecoder | None = None

    @classmethod
    def configure_server_args(cls, server_args: Any) -> None:
        """Resolve the YAML against the checkpoint's config at server start: unknown names,
        bad parameters and what cannot run inside SGLang fail here, in one line."""
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.configs.model_config import ModelConfig

        view = resolving_view(server_args)
        path = view.dllm_algorithm_config
        config = read_config(path)
        dllm = DllmConfig.from_server_args(server_args)
        model_config = ModelConfig.from_server_args(server_args, model_path=view.model_path,
                                                    model_revision=view.revision)
        served = ServedModel.from_config(model_config.hf_config, dllm.mask_id, dllm.block_size)
        try:
            serving_spec(config, served)
        except ValueError as err:
            raise ValueError(f"--dllm-algorithm-config {path}: {err}") from None

    def run(self, model_runner: Any, forward_batch: Any, algo_states: list[Any] | None = None
            ) -> Any:
        if self.decoder is None:
            self.decoder = self.bind(model_runner)
        return super().run(model_runner, forward_batch, algo_states)

    def bind(self, model_runner: Any) -> BlockDecoder:
        """The decoder for the served model: the YAML resolved against its config and the
        policy bound to it (its output projection goes into fingerprints when one rank holds
        all of it)."""
        hf_config = model_runner.model_config.hf_config
        model = getattr(model_runner, "model", None)
        head = getattr(model, "lm_head", None)  # SGLang's models; the library's: ``head``
        if head is None:
            head = getattr(model, "head", None)
        weight = getattr(head, "weight", None)
        vocab = getattr(hf_config, "vocab_size", None)
        if getattr(model_runner, "tp_size", 1) != 1 or weight is None or \
                weight.shape[0] != vocab:
            head = None  # a shard or a padded vocabulary: no fingerprint of it
        served = ServedModel.from_config(hf_config, self.mask_id, self.block_size, head,
                                         torch.device(model_runner.device))
        decoder = BlockDecoder(serving_spec(self.algorithm_config, served), self.block_size,
                               self.mask_id)
        decoder.bind(served)
        return decoder

    def max_steps(self, block_size: int) -> int:
        """Forwards of one block at most (the last scheduled step commits what is left; editing
        policies add their post steps)."""
        return self.decoder.max_forwards() if self.decoder is not None else block_size + 1

    def init_step_state(self, forward_batch: Any) -> list[RequestBlock]:
        """One fresh ``RequestBlock`` per row, seeded from the request id and the block's
        position."""
        batch = forward_batch.batch_size
        positions = getattr(forward_batch, "positions", None)
        first = None if positions is None else positions.view(batch, self.block_size)[:, 0]
        return self.decoder.start(self._prompt_mask(forward_batch), first,
                                  getattr(forward_batch, "rids", None))

    def step(self, forward_batch: Any, full_logits: torch.Tensor,
             states: list[RequestBlock]) -> list[bool]:
        """Commit in place into ``forward_batch.input_ids`` (the tensor SGLang's CUDA graphs
        read); the done flags follow SGLang's contract (see ``block``)."""
        batch = forward_batch.batch_size
        ids = forward_batch.input_ids.view(batch, self.block_size)
        logits = full_logits.view(batch, self.block_size, full_logits.shape[-1])
        return self.decoder.step(ids, logits, states)


def read_config(path: str | Path | None) -> dict[str, Any]:
    """The YAML mapping at ``path`` (``{}`` for no file), as SGLang reads it; a one-line error
    for a file that is not a YAML mapping."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ValueError(f"--dllm-algorithm-config {path}: {err.strerror}") from None
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ValueError(f"--dllm-algorithm-config {path}: not valid YAML{at}") from None
    if not isinstance(config, dict):
        raise ValueError(f"--dllm-algorithm-config {path}: must be a YAML mapping (policy:, "
                         f"params:, ...), got {type(config).__name__}")
    return config
