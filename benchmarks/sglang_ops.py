"""Ops per first-done-first-out round through SGLang's real ``DllmAlgorithm.run`` (CPU).

The work an algorithm adds to each SGLang round (its ``init_step_state`` and ``step``; the
model forward excluded) counted in aten ops, the hardware-independent cost of the host-bound
step at small models: ``DllmDecode`` with a preset against SGLang's ``LowConfidence``, at batch 1
and with staggered requests (one joins per round until ``batch`` are live, then a finished
request is replaced at once, as SGLang's scheduler refills the batch; prompts of random length,
so first blocks are cut by their prompt tail; logits from ``tests.sglang_serving``'s synthetic
source: a random share of confident positions per step, so rows drift to different steps of
their blocks). Also reports how the adapter split the rows (``BlockDecoder.split``) and its
calls per round. Used by ``bench_sglang.py --staggered`` and ``tests/test_sglang_batching.py``.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: block size, vocabulary, mask and EOS ids of the scripted model (SDAR-shaped config)
K, VOCAB, MASK, EOS = 16, 64, 2, 1


class OpCounter(TorchDispatchMode):
    """Counts aten ops while ``active`` (the scripted model's forward pauses it)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops, self.active = 0, True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        if self.active:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def _algorithm(name: str, config: dict[str, Any], max_requests: int) -> Any:
    from sglang.srt.dllm.algorithm.low_confidence import LowConfidence
    from sglang.srt.dllm.config import DllmConfig

    from dllm_decode.integrations.sglang.algorithm import DllmDecodeAlgorithm

    cls = LowConfidence if name == "LowConfidence" else DllmDecodeAlgorithm
    return cls(DllmConfig(algorithm=name, algorithm_config=config, block_size=K, mask_id=MASK,
                          max_running_requests=max_requests, first_done_first_out_mode=True))


def _hf_config() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(architectures=["SDARForCausalLM"], eos_token_id=EOS,
                           vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1)


def ops_per_round(name: str, config: dict[str, Any], *, batch: int, rounds: int = 48,
                  warm: int = 24, seed: int = 0) -> dict[str, Any]:
    """Mean aten ops per round over ``rounds`` rounds after ``warm`` (all ``batch`` requests
    live and staggered), with the adapter's split mode and calls per round."""
    from tests.sglang_serving import Req, ScriptedRunner, dllm_batch, start_block, synthetic_logits

    rng = random.Random(seed)
    logits_fn = synthetic_logits(VOCAB, MASK, confident=0.3)
    counter = OpCounter()

    def paused(fb: Any) -> torch.Tensor:
        counter.active = False
        try:
            return logits_fn(fb)
        finally:
            counter.active = True

    runner = ScriptedRunner(paused, _hf_config())
    algorithm = _algorithm(name, config, batch)
    made = 0

    def new_request() -> Req:
        nonlocal made
        made += 1
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 3 * K))]
        return Req(f"q{made}", prompt, max_new_tokens=4 * K)

    live: list[Req] = []
    counts: list[int] = []
    calls: list[int] = []
    for rnd in range(warm + rounds):
        live = [r for r in live if not r.finished]
        if len(live) < batch:  # one joins per round while filling, then refill at once
            live += [new_request() for _ in range(1 if rnd < batch else batch - len(live))]
        order = list(live)
        rng.shuffle(order)
        for r in order:
            if r.block is None:
                start_block(r, K, MASK)
        fb = dllm_batch(order, K)
        before = getattr(getattr(algorithm, "decoder", None), "calls", 0)
        counter.ops = 0
        with counter:
            _, next_ids, accepted, states, _ = algorithm.run(runner, fb,
                                                             [r.state for r in order])
        if rnd >= warm:
            counts.append(counter.ops)
            calls.append(getattr(getattr(algorithm, "decoder", None), "calls", 0) - before)
        for i, r in enumerate(order):
            tail = max(r.committed - r.offset, 0)
            if accepted[i] == 0:
                r.block, r.state = list(next_ids[i]), states[i]
                continue
            new = list(next_ids[i])[tail:]
            r.block, r.state = None, None
            r.output += new
            r.finished = EOS in new or len(r.output) >= r.max_new_tokens
    decoder = getattr(algorithm, "decoder", None)
    return {"algorithm": name, "policy": config.get("policy", "-"), "B": batch,
            "ops_per_round": round(sum(counts) / len(counts), 1),
            "calls_per_round": round(sum(calls) / len(calls), 2) if decoder else 1.0,
            "split": getattr(decoder, "split", "-")}


#: the presets the README's "runs inside SGLang" table lists, plus sampling
SERVED: dict[str, dict[str, Any]] = {
    **{name: {"policy": name} for name in (
        "low_confidence", "maskgit_plus", "topk_margin", "entropy", "random",
        "low_confidence_dynamic", "ccd", "klass", "learn2pd", "threshold", "factor", "eb",
        "entropy_threshold", "ete", "fastdllm_v2", "llada2", "frechet", "dus", "wide_in",
        "credit", "llada21", "edit", "sched", "prophet", "eotp", "learn2pd_eot")},
    "low_confidence@T0.7": {"policy": "low_confidence", "params": {"temperature": 0.7}},
    "threshold@T0.7": {"policy": "threshold", "params": {"temperature": 0.7}},
}


def table(batches: tuple[int, ...] = (1, 32), presets: dict[str, dict] | None = None
          ) -> list[dict[str, Any]]:
    """Rows for ``LowConfidence`` and every preset at each batch size."""
    rows = [ops_per_round("LowConfidence", {"threshold": 0.95}, batch=b) for b in batches]
    for label, config in (presets or SERVED).items():
        for b in batches:
            row = ops_per_round("DllmDecode", config, batch=b)
            row["policy"] = label
            rows.append(row)
    return rows
