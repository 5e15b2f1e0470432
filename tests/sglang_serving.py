"""SGLang's dLLM serving loop around the real ``DllmAlgorithm.run``, on a CPU (test helper).

What SGLang's scheduler does between ``run`` calls (``sglang.srt.dllm.mixin.scheduler``), kept
to what the algorithm sees: each request's next block (the prompt tail then masks for the
first block, aligned to absolute positions; masks after), a real ``ForwardBatch`` in dLLM mode
(``ForwardMode.DLLM_EXTEND``, block positions, request ids, ``dllm_prompt_mask`` when asked),
the first-done-first-out carry (unfinished blocks and their states come back next round, in
the row order the test chooses, new requests joining) or the synchronous whole-block run, and
the end of a request (a stop token in its block, or ``max_new_tokens``).

The model runner is scripted, as in SGLang's own dLLM unit tests: ``ScriptedRunner.forward``
returns logits from a function of the batch. ``synthetic_logits`` makes them from a hash of
each row's request, position and tokens (confident positions far from any threshold, the mask
token never a candidate); ``LibraryBlockLogits`` runs a bundled block-diffusion model through
the library's own block-causal cache plan, one plan per request, so that SGLang's loop and
``DiffusionSampler`` see the same numbers.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

from dllm_decode.cache.table import make_plan
from dllm_decode.config import SamplerConfig
from dllm_decode.types import CacheMode


@dataclass
class Req:
    """One request as the scheduler keeps it (the fields the dLLM path reads)."""

    rid: str
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    block: list[int] | None = None  # the block in progress (carried in FDFO)
    offset: int = 0  # absolute position of the block's first token
    state: Any = None  # dllm_algo_state
    finished: bool = False

    @property
    def committed(self) -> int:
        return len(self.prompt) + len(self.output)


def dllm_batch(reqs: list[Req], k: int, *, prompt_mask: bool = False) -> ForwardBatch:
    """The ``ForwardBatch`` of one dLLM round (``ForwardBatch.init_new``'s dLLM fields)."""
    b = len(reqs)
    ids = torch.tensor([tok for r in reqs for tok in r.block], dtype=torch.long)
    positions = torch.tensor([r.offset + j for r in reqs for j in range(k)], dtype=torch.long)
    seq_lens = torch.tensor([r.offset + k for r in reqs], dtype=torch.long)
    batch = ForwardBatch(forward_mode=ForwardMode.DLLM_EXTEND, batch_size=b, input_ids=ids,
                         req_pool_indices=torch.arange(b), seq_lens=seq_lens,
                         out_cache_loc=torch.arange(b * k), seq_lens_sum=int(seq_lens.sum()),
                         positions=positions, rids=[r.rid for r in reqs])
    if prompt_mask:  # SGLang builds it when committed tokens may hold literal mask ids
        committed = torch.tensor([r.committed for r in reqs])
        batch.dllm_prompt_mask = positions.view(b, k) < committed[:, None]
    return batch


def start_block(req: Req, k: int, mask_id: int) -> None:
    """The request's next block: the first holds the prompt's tail (aligned blocks)."""
    if req.output:
        req.offset += k
        req.block = [mask_id] * k
        return
    req.offset = len(req.prompt) // k * k
    tail = req.prompt[req.offset:]
    req.block = tail + [mask_id] * (k - len(tail))


def serve(algorithm: Any, runner: Any, reqs: list[Req], *, k: int, mask_id: int,
          stop_ids: tuple[int, ...], fdfo: bool,
          order: Callable[[list[Req], int], list[Req]] | None = None,
          arrivals: dict[int, list[Req]] | None = None, prompt_mask: bool = False,
          max_rounds: int = 10_000) -> int:
    """Serve ``reqs`` (plus ``arrivals``: round -> requests joining then) to completion with
    ``algorithm.run``; ``order(live, round)`` permutes each round's rows. Returns the rounds."""
    running = list(reqs)
    arrivals = dict(arrivals or {})
    for rnd in range(max_rounds):
        running += arrivals.pop(rnd, [])
        live = [r for r in running if not r.finished]
        if not live and not arrivals:
            return rnd
        if not live:
            continue
        batch = order(live, rnd) if order is not None else live
        for r in batch:
            if r.block is None:
                start_block(r, k, mask_id)
        fb = dllm_batch(batch, k, prompt_mask=prompt_mask)
        states = [r.state for r in batch] if fdfo else None
        _, next_ids, accepted, states_out, _ = algorithm.run(runner, fb, states)
        for i, r in enumerate(batch):
            tail = max(r.committed - r.offset, 0)  # prompt positions of this block
            if fdfo:
                if accepted[i] == 0:  # unresolved: carried to the next round
                    r.block, r.state = list(next_ids[i]), states_out[i]
                    continue
                new = list(next_ids[i])[tail:]
            else:
                new = next_ids[i].tolist()
            r.block, r.state = None, None
            r.output += new
            r.finished = any(t in stop_ids for t in new) or len(r.output) >= r.max_new_tokens
    raise AssertionError(f"serving did not finish in {max_rounds} rounds")


class ScriptedRunner:
    """SGLang's ``ModelRunner`` as ``DllmAlgorithm.run`` uses it: ``forward(batch)`` returns
    ``logits_fn(batch)`` (``[B * K, V]`` float32) as ``logits_output.full_logits``. Records
    each request's forwards and the block it was fed each time."""

    def __init__(self, logits_fn: Callable[[ForwardBatch], torch.Tensor], hf_config: Any,
                 model: Any = None) -> None:
        self.logits_fn = logits_fn
        self.model_config = SimpleNamespace(hf_config=hf_config)
        self.model, self.device, self.tp_size = model, "cpu", 1
        self.forwards: Counter[str] = Counter()
        #: per request, per forward: (block start, the block's tokens)
        self.fed: dict[str, list[tuple[int, list[int]]]] = defaultdict(list)

    def forward(self, batch: ForwardBatch, pp_proxy_tensors: Any = None) -> Any:
        k = batch.input_ids.numel() // batch.batch_size
        starts = batch.positions.view(-1, k)[:, 0].tolist()
        rows = batch.input_ids.view(-1, k).tolist()
        for rid, start, row in zip(batch.rids, starts, rows, strict=True):
            self.forwards[rid] += 1
            self.fed[rid].append((start, row))
        logits = self.logits_fn(batch)
        return SimpleNamespace(logits_output=LogitsProcessorOutput(next_token_logits=None,
                                                                   full_logits=logits),
                               can_run_graph=False)


def synthetic_logits(vocab: int, mask_id: int, *, confident: float = 0.4,
                     boost: float = 12.0) -> Callable[[ForwardBatch], torch.Tensor]:
    """Logits that depend only on each row's request, block position and tokens: normal
    noise, plus ``boost`` on one random token at a ``confident`` share of the positions (its
    probability then > 0.999, the others' < 0.5: far from any threshold in between), the
    mask token at -inf (never a candidate, so SGLang's built-ins and the library agree)."""

    def logits_fn(batch: ForwardBatch) -> torch.Tensor:
        b = batch.batch_size
        k = batch.input_ids.numel() // b
        rows = []
        ids, pos = batch.input_ids.view(b, k).tolist(), batch.positions.view(b, k).tolist()
        for rid, row, at in zip(batch.rids, ids, pos, strict=True):
            digest = hashlib.blake2b(repr((rid, at[0], row)).encode(), digest_size=8).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
            z = torch.randn(k, vocab, generator=gen)
            hot = torch.rand(k, generator=gen) < confident
            tok = torch.randint(0, vocab, (k,), generator=gen)
            z[torch.arange(k), tok] += boost * hot
            z[:, mask_id] = -torch.inf
            rows.append(z)
        return torch.cat(rows)

    return logits_fn


class LibraryBlockLogits:
    """Logits of a library block-diffusion model for SGLang rows, computed the way
    ``DiffusionSampler(cache="block_causal")`` computes them: one ``ForwardPlan`` per request
    over its canvas ``[prompt | gen_length]``; a block's first forward also stores the previous
    block's final K/V, later ones feed the block alone. Only the rows ``DiffusionSampler``
    scores are computed (the prompt tail's rows are zero: never eligible)."""

    def __init__(self, model: Any, prompts: dict[str, list[int]], gen_length: int) -> None:
        self.model, self.k = model, model.block_size
        self.runs: dict[str, Any] = {}
        for rid, prompt in prompts.items():
            p = len(prompt)
            canvas = torch.full((1, p + gen_length), model.mask_token_id, dtype=torch.long)
            canvas[0, :p] = torch.tensor(prompt)
            valid = torch.ones_like(canvas, dtype=torch.bool)
            cfg = SamplerConfig(gen_length=gen_length, cache="block_causal")
            plan = make_plan(model, CacheMode.BLOCK_CAUSAL, valid, model.rope_positions(valid),
                             cfg, model.family)
            self.runs[rid] = SimpleNamespace(canvas=canvas, plan=plan, p=p, block=None)

    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        with torch.inference_mode():
            out = self._logits(batch)
        return out.clone()  # a normal tensor, as SGLang's runner returns

    def _logits(self, batch: ForwardBatch) -> torch.Tensor:
        b, k = batch.batch_size, self.k
        out = torch.zeros(b, k, self.model.vocab_size)
        ids, pos = batch.input_ids.view(b, k), batch.positions.view(b, k)[:, 0].tolist()
        for row, (rid, aligned) in enumerate(zip(batch.rids, pos, strict=True)):
            run = self.runs[rid]
            length = run.canvas.shape[1]
            end = min(aligned + k, length)
            run.canvas[0, aligned:end] = ids[row, :end - aligned]
            start = max(aligned, run.p)
            step = 0 if run.block != aligned else 1
            run.block = aligned
            fed = run.plan.forward(run.canvas, (start, end), aligned, step, run.p, False)
            out[row, start - aligned:end - aligned] = fed.logits[0].float()
        return out.view(b * k, -1)
