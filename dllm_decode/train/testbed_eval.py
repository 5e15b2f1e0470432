"""Grading and export of test-bed models (learned or the oracle itself), on held-out prompts."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.train.testbed import (
    TESTBED_GEN_LENGTH,
    TESTBED_TASKS,
    grade,
    waiting_line_records,
    write_tokenizer,
)

#: the budget rule of test-bed decodes (evaluations, on-policy rollouts): the even split, i.e.
#: exactly ``G / steps`` commits per step on every family (recorded in a run's ``run.json``)
EVEN_SPLIT = "llada"


def held_out_prompts(oracle: WaitingLineOracle, task: str, n: int, seed: int | None = None,
                     split: str = "test") -> tuple[list[dict[str, Any]], list[list[int]]]:
    """``n`` records of ``task`` from ``split`` (its own generator seed, offset by ``seed``)
    and their prompts in the oracle's format."""
    from dllm_decode.eval.parallelbench.generate import split_seed

    base = split_seed(f"waiting_line/{task}", split)
    records = waiting_line_records(task, n, base + (seed or 0), split=split)
    return records, [oracle.encode_prompt(task, r) for r in records]


@torch.no_grad()
def decode_tasks(model: Any, oracle: WaitingLineOracle, n: int, *, seed: int | None = None,
                 tasks: Sequence[str] = TESTBED_TASKS, policy: str = "low_confidence",
                 split: str = "test", **sampler_kwargs: Any) -> dict[str, list[dict[str, Any]]]:
    """Decode ``n`` held-out prompts per task; per task a list of ``{valid, nfe, text, steps,
    positions}`` (``steps``: the decoding steps the row took part in, one after its last
    commit; ``positions``: the token positions the model ran through during them,
    ``Generation.step_positions``, the batch's left padding included).

    ``seed`` offsets the record generator (``None``: the split's own seed), so other seeds draw
    other held-out prompts. ``sampler_kwargs`` go to ``DiffusionSampler`` (``steps``,
    ``cache``, policy parameters, ...); the default is one token per step, one block (block-
    diffusion models: their own block size).

    Fixed-step budgets use the even split (``schedule="llada"``) for every family unless the
    policy asks for a schedule of its own (Dream's ``origin``) or the caller passes one, so
    ``steps = G / k`` commits exactly ``k`` tokens per step. Dream's own time grid does not: at
    ``steps = G = 16`` its first step commits ``int(16 * (1 - t1 / t0)) = int(0.999) = 0`` and
    its last step the remaining two, i.e. two names at once on a random task (pass
    ``schedule="dream"`` to measure that schedule).
    """
    from dllm_decode.eval.runner import left_pad
    from dllm_decode.samplers.sampler import DiffusionSampler

    g = TESTBED_GEN_LENGTH
    # block_length None: one block of g, or a block-diffusion model's own block size
    kwargs = {"gen_length": g, "block_length": None, "steps": g, "temperature": 0.0}
    kwargs |= sampler_kwargs
    sampler = DiffusionSampler(model, policy, **kwargs)
    # the even split unless the caller or the policy (Dream's ``origin``) names a schedule
    named = sampler.config.schedule or sampler.capabilities.selector.preferred_schedule
    even = {} if named else {"schedule": EVEN_SPLIT}
    out: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        records, prompts = held_out_prompts(oracle, task, n, seed, split)
        ids, attn = left_pad(prompts, oracle.pad_token_id)  # block models align themselves
        gen = sampler.generate(ids, attn, **even)
        rows = []
        steps = (gen.commit_step.max(1).values + 1).tolist()  # a row runs until its last commit
        done = [0.0, *itertools.accumulate(gen.step_positions or [])]
        for rec, answer, nfe, k in zip(records, gen.answer.tolist(), gen.nfe.tolist(), steps,
                                       strict=True):
            text = oracle.decode(answer)
            rows.append({"valid": grade(task, rec, text), "nfe": nfe, "text": text, "steps": k,
                         "positions": done[min(k, len(done) - 1)]})
        out[task] = rows
    return out


def evaluate_testbed(model: Any, oracle: WaitingLineOracle, n: int, *, seed: int = 0,
                     tokens_per_step: int = 1) -> dict[str, float]:
    """Share of valid answers per task (and ``mean``) at ``tokens_per_step`` (low_confidence)."""
    steps = TESTBED_GEN_LENGTH // tokens_per_step
    rows = decode_tasks(model, oracle, n, seed=seed, steps=steps)
    scores = {t: round(sum(r["valid"] for r in v) / len(v), 4) for t, v in rows.items()}
    scores["mean"] = round(sum(scores.values()) / len(scores), 4)
    return scores


def ambiguous_state(model: Any, oracle: WaitingLineOracle, prompt: list[int]
                    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """A prompt's *ambiguous state* (every answer position on which all valid answers agree
    committed, the others masked) and both conditionals there: ``(table [A, G] valid answers,
    region [G] the state, q [G, V] the oracle's float64 marginals, logp [G, V] the model's
    float64 log-probabilities with the mask token removed)``. The prompt runs alone (no
    padding); ``q`` and ``logp`` are only computed when something is masked (else ``None``)."""
    g, mask_id = TESTBED_GEN_LENGTH, oracle.mask_token_id
    table = oracle.answer_table(prompt, g)
    region = torch.where((table == table[0]).all(0), table[0], mask_id)  # [G]
    if not bool((region == mask_id).any()):  # a single valid answer: no forward
        return table, region, None, None
    q = oracle.marginals(table, region[None])[0]
    tokens = torch.tensor(prompt + region.tolist())[None]
    logits = model(tokens, torch.arange(tokens.shape[1])[None])[0, len(prompt):]
    logits = logits.double().index_fill(-1, torch.tensor([mask_id]), -torch.inf)
    return table, region, q, torch.log_softmax(logits, -1)


@torch.no_grad()
def ambiguous_state_fit(model: Any, oracle: WaitingLineOracle, n: int, task: str, *,
                        seed: int | None = None, split: str = "test") -> dict[str, float]:
    """How well ``model``'s conditionals match the oracle's at each prompt's *ambiguous
    state*: every answer position on which all valid answers agree committed (list symbols,
    EOS, determined names), the others masked.

    That is the state a parallel decode of a random task reaches once the determined tokens are
    in; from there the contested names are committed together from these marginals, so the
    parallel accuracy at k = 4 / 8 follows from how they rank (the oracle: an original
    neighbour on top at every middle slot of insert_random, hence 0 %).

    Returns: ``kl`` the mean KL(oracle || model) in nats over the masked positions,
    ``argmax_miss`` the share of masked positions whose model argmax is not among the
    oracle's most likely tokens (ties within 1e-9), ``prompts_missed`` the share of prompts
    with at least one such position, and ``positions`` the masked positions per prompt.
    Each prompt runs alone (no padding), greedy logits with the mask token removed.
    """
    _, prompts = held_out_prompts(oracle, task, n, seed, split)
    kl = miss = positions = missed = 0.0
    for prompt in prompts:
        _, region, q, logp = ambiguous_state(model, oracle, prompt)
        if q is None:  # nothing contested
            continue
        open_ = region == oracle.mask_token_id
        q_open, logp_open = q[open_], logp[open_]
        kl += float(torch.where(q_open > 0, q_open * (q_open.log() - logp_open), 0.0).sum())
        best = q_open.gather(1, logp_open.argmax(-1, keepdim=True))[:, 0]
        wrong = best < q_open.amax(-1) - 1e-9
        miss += float(wrong.sum())
        missed += float(wrong.any())
        positions += float(open_.sum())
    per = max(positions, 1.0)
    return {"kl": kl / per, "argmax_miss": miss / per, "prompts_missed": missed / len(prompts),
            "positions": positions / len(prompts)}


@torch.no_grad()
def insert_slot_calibration(model: Any, oracle: WaitingLineOracle, n: int, *,
                            seed: int | None = None, split: str = "test"
                            ) -> list[dict[str, float]]:
    """insert_random at its ambiguous state (``ambiguous_state_fit``), per list length and
    answer slot: the mean probability the model and the oracle give there to the inserted name
    and to the original list's left and right neighbours of the slot, and how often the model's
    argmax is the inserted name (the oracle's never is: 1 / (n + 1) against a neighbour's
    ``max(s, n - s) / (n + 1)``). Averages that match with argmax flips left mean the error is
    per prompt, not a slot bias. Prompts whose inserted name repeats a listed one are skipped.

    Returns: one dict per ``(length, slot)``: ``length``, ``slot``, ``prompts``, ``model_x``,
    ``oracle_x``, ``model_left``, ``oracle_left``, ``model_right``, ``oracle_right``,
    ``argmax_x``.
    """
    _, prompts = held_out_prompts(oracle, "insert_random", n, seed, split)
    sums: dict[tuple[int, int], torch.Tensor] = {}
    for prompt in prompts:
        table, _, q, logp = ambiguous_state(model, oracle, prompt)  # table: one row per slot
        slots = (table != table[0]).any(0).nonzero().flatten()  # the contested name slots
        names = table[:, slots]  # [A, S]; row a holds the inserted name at slot a
        a, length = names.shape[0], names.shape[1] - 1
        inserted = names.diagonal() if a == length + 1 else None
        if inserted is None or not bool((inserted == inserted[0]).all()):
            continue  # the inserted name repeats a listed one: the slots are not all contested
        x, original = int(inserted[0]), names[-1, :-1].tolist()
        p = logp.exp()
        for s, pos in enumerate(slots.tolist()):
            left = original[s - 1] if s > 0 else None
            right = original[s] if s < length else None
            row = [p[pos, x], q[pos, x]]
            for nb in (left, right):
                row += [p[pos, nb], q[pos, nb]] if nb is not None else [0.0, 0.0]
            row += [float(int(p[pos].argmax()) == x), 1.0]
            key = (length, s)
            sums[key] = sums.get(key, torch.zeros(8, dtype=torch.float64)) + torch.tensor(row)
    cols = ("model_x", "oracle_x", "model_left", "oracle_left", "model_right", "oracle_right",
            "argmax_x")
    out = []
    for (length, s), v in sorted(sums.items()):
        count = float(v[-1])
        out.append({"length": length, "slot": s, "prompts": count,
                    **{c: float(v[i]) / count for i, c in enumerate(cols)}})
    return out


def export_testbed(model: Any, oracle: WaitingLineOracle, directory: str | Path,
                   dtype: torch.dtype = torch.float16) -> int:
    """Write ``config.json`` + ``model.safetensors`` (``dtype``) + word-level tokenizer files.

    Returns the weight file's size in bytes.
    """
    import copy

    from dllm_decode.models.loading import save_model

    directory = Path(directory)
    save_model(copy.deepcopy(model).to(dtype=dtype), directory)
    write_tokenizer(oracle, directory)
    return (directory / "model.safetensors").stat().st_size
