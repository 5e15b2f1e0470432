"""``DllmDecodeAlgorithm``: SGLang's ``DllmAlgorithm`` running any dllm-decode policy.

SGLang (``sglang.srt.dllm.algorithm.base``) owns the loops: ``run`` decodes a batch of blocks
synchronously (``--no-dllm-fdfo``: forward, ``step``, ... until every row is done) or, by
default, first-done-first-out (one forward and one ``step`` per round; an unfinished row's
state comes back with it next round, in any row order). This class supplies the per-request
state (``init_step_state``), the step (``block.BlockDecoder``), the step bound (``max_steps``),
the launcher's check of the YAML (``configure_server_args``) and the server start
(``__init__``, which SGLang's tensor-parallel worker calls right after it built the model
runner: the YAML resolved, the policy bound, the decoder built and one warm-up step run; any
error there is one line and the server does not start). ``run`` never binds in a server.

Imports SGLang (load it only where SGLang is installed: the entry point, ``register``, does)
but not the library's policy stack: ``spec``, ``check`` and ``block`` are imported when
``DllmDecode`` is used. What differs between SGLang versions comes from its module in
``versions`` (``compat.for_version``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import sglang
import torch
from sglang.srt.dllm.algorithm.base import DllmAlgorithm
from sglang.srt.dllm.config import DllmConfig

from dllm_decode.integrations.sglang.compat import (
    ALGORITHM_NAME,
    ARCHITECTURES,
    for_version,
    unsupported_message,
)
from dllm_decode.integrations.sglang.requests import request_error

if TYPE_CHECKING:
    from dllm_decode.integrations.sglang.block import BlockDecoder
    from dllm_decode.integrations.sglang.round_rows import RequestBlock
    from dllm_decode.integrations.sglang.spec import ServedModel

try:  #: what differs in the installed SGLang (``versions``)
    COMPAT = for_version(str(sglang.__version__))
except KeyError:
    raise ImportError(unsupported_message(str(sglang.__version__))) from None

logger = logging.getLogger("dllm_decode.integrations.sglang")
#: the request id of the server-start warm-up step (seeds its draws)
WARM_UP_RID = "dllm-decode-warm-up"


class DllmDecodeAlgorithm(DllmAlgorithm):
    """``--dllm-algorithm DllmDecode --dllm-algorithm-config policy.yaml``.

    The YAML is checked in the launcher (``configure_server_args``, against the checkpoint's
    files) and, in every tensor-parallel worker, resolved, bound and warmed up when SGLang
    builds the algorithm (``__init__``, from its runtime context: the checkpoint, device and
    tensor-parallel width). Fingerprints (a Learn2PD filter's) hash the checkpoint's output
    head (``spec.CheckpointHead``), never a rank's shard.

    Args:
        config: SGLang's ``DllmConfig`` (block size, mask id, the YAML mapping,
            ``max_running_requests``).
        served: the served model, for an algorithm built outside a server (default: the
            runtime context's; with neither, the policy is bound to the model runner's model
            on the first ``run``, as the tests' scripted runners need).
    """

    supported_architectures = tuple(ARCHITECTURES)

    def __init__(self, config: DllmConfig, served: ServedModel | None = None) -> None:
        super().__init__(config)
        self.algorithm_config = dict(config.algorithm_config or {})
        self.max_requests = max(1, int(config.max_running_requests or 1))
        self.config_path: str | None = None
        self.tp_size = 1
        self.decoder: BlockDecoder | None = None
        if served is None:
            served = self._served_at_start()
        if served is not None:
            self.decoder = self.start(served)

    # ---- the launcher --------------------------------------------------------------------
    @classmethod
    def configure_server_args(cls, server_args: Any) -> None:
        """Resolve the YAML against the checkpoint in the launcher (``check``: the resolution
        ``dllm-decode serve-check`` runs): unknown names, bad parameters, what cannot run
        inside SGLang, and a Learn2PD filter trained for another model (when the weights are
        local) fail here, in one line."""
        from sglang.srt.arg_groups.overrides import resolving_view

        from dllm_decode.integrations.sglang.check import read_yaml, resolve_config

        view = resolving_view(server_args)
        path = view.dllm_algorithm_config
        config = read_yaml(path)
        dllm = DllmConfig.from_server_args(server_args)  # SGLang's block size and mask id
        served = _served_from_path(view.model_path, dllm.block_size, dllm.mask_id,
                                   view.tokenizer_path, view.revision,
                                   bool(view.skip_tokenizer_init))
        resolve_config(config, served, path)

    @classmethod
    def validate_request(cls, req: Any) -> str | None:
        """SGLang's per-request check (``Req``): the features this adapter does not honor
        (logprobs, grammars, logit processing, a seed, sampling other than the YAML's, ...)
        refused in one line with the reason (``requests.request_error``), sampling compared
        with the YAML this server decodes with (``check.runtime_sampling``: resolved once)."""
        from dllm_decode.integrations.sglang.check import runtime_sampling

        return request_error(req, runtime_sampling())

    # ---- the server start ----------------------------------------------------------------
    def _served_at_start(self) -> ServedModel | None:
        """The served model from SGLang's runtime context (``None`` outside a server)."""
        server = COMPAT.server_model()
        if server is None:
            return None
        self.config_path, self.tp_size = server.config_path, server.tp_size
        try:
            served = _served_from_path(server.model_path, self.block_size, self.mask_id,
                                       server.tokenizer_path, server.revision,
                                       server.skip_tokenizer)
        except (OSError, ValueError) as err:
            raise ValueError(f"{ALGORITHM_NAME} cannot start: {_one_line(err)}") from None
        return served.to(torch.device(server.device))

    def start(self, served: ServedModel) -> BlockDecoder:
        """The decoder for ``served``: the YAML resolved (``check.resolve_config``), the policy
        bound (fingerprints read the checkpoint's head), one warm-up step (``warm_up``).
        Raises ``ValueError`` (one line) for a YAML or binding the server cannot run."""
        from dllm_decode.integrations.sglang.block import BlockDecoder
        from dllm_decode.integrations.sglang.check import FLAG, resolve_config

        label = self.config_path or "(DllmConfig.algorithm_config)"
        vocab = served.vocab_size
        if vocab > 0 and not 0 <= self.mask_id < vocab:
            raise ValueError(f"{ALGORITHM_NAME} cannot start: SGLang's mask id {self.mask_id} "
                             f"for this architecture is outside the checkpoint's vocabulary "
                             f"[0, {vocab}): it was trained with another mask token, which "
                             f"SGLang's dLLM mode does not read from the checkpoint")
        began = time.perf_counter()
        spec = resolve_config(self.algorithm_config, served, label)
        decoder = BlockDecoder(spec, self.block_size, self.mask_id,
                               max_requests=self.max_requests)
        try:
            decoder.bind(served)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{FLAG} {label}: {_one_line(err)}{_head_note(served)}") from None
        served.head = None  # fingerprints are taken: let go of the checkpoint's mapping
        warm_up(decoder, served)
        try:  # the per-request pool for --max-running-requests, within the YAML's budget
            pool = decoder.reserve(spec.pool_budget)
        except ValueError as err:
            raise ValueError(f"{FLAG} {label}: {_one_line(err)}") from None
        logger.info("%s: policy %r on %s (block %d, tensor parallel %d, %s, up to %d running "
                    "requests, %.1f MiB of per-request policy memory) ready in %.2f s",
                    ALGORITHM_NAME, spec.policy.name, served.family, self.block_size,
                    self.tp_size, served.anchor.device, self.max_requests, pool / 2**20,
                    time.perf_counter() - began)
        return decoder

    def _served_from_runner(self, model_runner: Any) -> ServedModel:
        """Outside a server: the served model from the runner (its config, device, and its
        output head for fingerprints when this rank holds all of it)."""
        from dllm_decode.integrations.sglang.spec import ServedModel

        hf_config = model_runner.model_config.hf_config
        model = getattr(model_runner, "model", None)
        head = getattr(model, "lm_head", None)  # SGLang's models; the library's: ``head``
        if head is None:
            head = getattr(model, "head", None)
        weight = getattr(head, "weight", None)
        vocab = getattr(hf_config, "vocab_size", None)
        if COMPAT.tp_size() != 1 or weight is None or weight.shape[0] != vocab:
            head = None  # a shard or a padded vocabulary: no fingerprint of it
        return ServedModel.from_config(hf_config, self.mask_id, self.block_size, head,
                                       torch.device(model_runner.device))

    # ---- serving -------------------------------------------------------------------------
    def run(self, model_runner: Any, forward_batch: Any, algo_states: list[Any] | None = None
            ) -> Any:
        if self.decoder is None:  # built by hand outside a server: bound to the runner's model
            self.decoder = self.start(self._served_from_runner(model_runner))
        return super().run(model_runner, forward_batch, algo_states)

    def max_steps(self, block_size: int) -> int:
        """Forwards of one block at most (the last scheduled step commits what is left; editing
        policies add their post steps)."""
        return self.decoder.max_forwards() if self.decoder is not None else block_size + 1

    def init_step_state(self, forward_batch: Any) -> list[RequestBlock]:
        """One fresh ``RequestBlock`` per row, seeded from the request id and the block's
        position."""
        positions = getattr(forward_batch, "positions", None)
        first = None if positions is None else positions[::self.block_size]  # [B] block starts
        return self.decoder.start(self._prompt_mask(forward_batch), first,
                                  getattr(forward_batch, "rids", None))

    def step(self, forward_batch: Any, full_logits: Any, states: list[RequestBlock]
             ) -> list[bool]:
        """Commit in place into ``forward_batch.input_ids`` (the tensor SGLang's CUDA graphs
        read); the done flags follow SGLang's contract (see ``block``). ``full_logits``: what
        this SGLang version passes (``versions``: the ``[B * K, V]`` tensor in 0.5.23)."""
        batch = forward_batch.batch_size
        ids = forward_batch.input_ids.view(batch, self.block_size)
        logits = COMPAT.step_logits(full_logits)
        logits = logits.view(batch, self.block_size, logits.shape[-1])
        return self.decoder.step(ids, logits, states)


def _served_from_path(model_path: str, block_size: int, mask_id: int,
                      tokenizer_path: str | None, revision: str | None,
                      skip_tokenizer: bool) -> ServedModel:
    """The served model from the checkpoint's files as SGLang reads them (``check``: the stop
    set), at SGLang's block size and mask id, with the checkpoint's output head
    (``spec.CheckpointHead``, read only if a part fingerprints the model)."""
    from dllm_decode.integrations.sglang.check import served_from_path

    return served_from_path(model_path, block_size=block_size, mask_id=mask_id,
                            tokenizer_path=tokenizer_path, revision=revision,
                            skip_tokenizer=skip_tokenizer)


class _Errors(logging.Handler):
    """The ERROR records of the adapter's logger while it is attached (a contained policy
    error of the warm-up step)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def warm_up(decoder: BlockDecoder, served: ServedModel) -> None:
    """One step of ``decoder`` on a block of masks with seeded random logits, on the serving
    device: the proposal's kernels compile and pass their first-use self-check
    (``kernels.selfcheck``), the policy runs once. A failure (or a policy error the decoder
    contains) is a one-line ``RuntimeError``: the server does not start."""
    k, vocab = decoder.k, served.vocab_size
    if vocab <= 0:
        return
    device = served.anchor.device
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, k, vocab, generator=gen).to(device)
    ids = torch.full((1, k), decoder.mask_id, dtype=torch.long, device=device)
    prompt = torch.zeros(1, k, dtype=torch.bool, device=device)
    start = torch.zeros(1, dtype=torch.long, device=device)
    errors, watch = getattr(decoder, "errors", 0), _Errors()
    logger.addHandler(watch)
    try:
        states = decoder.start(prompt, start, [WARM_UP_RID])
        decoder.step(ids, logits, states)
        release = getattr(getattr(decoder, "pool", None), "release", None)
        for st in states if release is not None else ():
            release(st)  # the warm-up's slot of the per-request pool
    except Exception as err:  # noqa: BLE001 - whatever it is, the server must not start
        raise RuntimeError(f"{ALGORITHM_NAME} cannot start: its warm-up step (a block of "
                           f"masks) failed: {type(err).__name__}: {_one_line(err)}") from err
    finally:
        logger.removeHandler(watch)
    if getattr(decoder, "errors", 0) != errors:
        why = watch.messages[-1] if watch.messages else "see the error logged above"
        raise RuntimeError(f"{ALGORITHM_NAME} cannot start: its warm-up step (a block of "
                           f"masks) failed: {_one_line(why)}")


def _head_note(served: ServedModel) -> str:
    why = getattr(served.head, "why", None)
    return f" (the checkpoint's output head, which fingerprints hash, was not read: {why})" \
        if why else ""


def _one_line(err: Exception | str) -> str:
    return " ".join(str(err).split())
