"""ParallelBench sweep runner: one model load, many decoding configs, per-sample JSONL rows.

Row schema (one JSON object per line; the single schema every table and plot is built from):
``task, category, doc_id, prediction, reference, score, score_strict, components, nfe,
gen_tokens_useful`` (tokens before the first EOS) ``, gen_tokens_budget`` (= gen_length)
``, wall_time_s`` (the batch's decode time / batch size) ``, prompt_tokens,
decoding_order_tau`` (Kendall tau-b of commit step vs position over the useful tokens)
``, config {model, policy, params, cache, gen_length, block_length, steps, temperature, seed``
``[, stopper, truncator]}`` (the composition; ``params`` keys ``stopper.*`` / ``truncator.*``
address those parts) ``, commit_steps`` (the step at which each generated position was
committed, -1 never; the decoding order that ``eval analyze`` summarises)``,
config_hash, versions {dllm_decode, torch, transformers}``.

Resume and sharding: each process appends to ``rows.rank{r}.jsonl`` (one line per sample,
flushed and fsynced) and skips ``(config_hash, task, doc_id)`` keys already present in any
rows file of the output directory; a truncated last line (a crash mid-write) is dropped.
Under ``torchrun`` (``WORLD_SIZE > 1``) a gloo process group is created, work units are dealt
round-robin over ranks. At the end rank 0 merges everything into ``rows.jsonl`` sorted by
``(config_hash, task, doc_id)``: the result. A single process then deletes the rank files
(all in ``rows.jsonl``): a finished one-process run holds only ``rows.jsonl``, and a rank file
beside it means an interrupted run (the next run resumes it). Rank 0 also writes ``run.json``:
the rows each config is to produce (``rows.write_plan``), from which ``eval analyze`` tells an
incomplete run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from dllm_decode.eval.decoding import DecodeFn, check_block_length, sampler_decode_fn
from dllm_decode.eval.distributed import barrier, process_group, sum_over_ranks
from dllm_decode.eval.metrics import kendall_tau
from dllm_decode.eval.parallelbench.codec import Codec, useful_length
from dllm_decode.eval.parallelbench.grid import DecodeConfig, Grid, expand_configs
from dllm_decode.eval.parallelbench.prompts import NoReferenceError, reference_answer
from dllm_decode.eval.parallelbench.rows import (
    RANK_FILE,
    ROWS_FILE,
    RowWriter,
    merge_rows,
    read_rows,
    row_key,
    rows_files,
    write_plan,
)
from dllm_decode.eval.parallelbench.tasks import task_spec
from dllm_decode.eval.parallelbench.text_graders import TextBackends

__all__ = ["DecodeFn", "RunSummary", "check_block_length", "left_pad", "load_records",
           "run_grid", "run_sweep", "sampler_decode_fn", "versions"]


# ---------------------------------------------------------------- decoding


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``[B, P]`` ids and the ``[B, P]`` int64 attention mask (1 = token)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        if prompt:
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
    return ids, mask


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that change results."""
    out: dict[str, str | None] = {}
    for name in ("dllm_decode", "torch", "transformers"):
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out[name] = None
    if out["dllm_decode"] is None:
        from dllm_decode.version import __version__

        out["dllm_decode"] = __version__
    return out


# ---------------------------------------------------------------- the run


@dataclass
class RunSummary:
    """What one ``run_grid`` call did on this rank.

    ``written`` / ``resumed`` count this rank's work units; ``written_all`` / ``resumed_all``
    every rank's; ``merged`` the rows of the merged ``rows.jsonl`` (rank 0; -1 elsewhere).
    """

    rows_path: Path
    written: int
    resumed: int
    configs: int
    skipped: list[str] = field(default_factory=list)
    rank: int = 0
    world: int = 1
    written_all: int = 0
    resumed_all: int = 0
    merged: int = -1

    def report(self) -> str:
        """The line ``eval parallelbench`` prints (rank 0): totals over every rank."""
        ranks = f" by {self.world} ranks" if self.world > 1 else ""
        return (f"{self.written_all} rows written{ranks}, {self.resumed_all} resumed; "
                f"{self.merged} rows in {self.rows_path}")


def _reference(record: Mapping[str, Any]) -> str:
    try:
        return reference_answer(record)
    except NoReferenceError:
        return json.dumps(record["answer"])


def _work_units(
    grid: Grid, records: Mapping[str, list[dict[str, Any]]], model: str
) -> list[tuple[DecodeConfig, str, int]]:
    units = []
    for task in grid.tasks:
        docs = range(len(records[task]))
        for config in expand_configs(grid, task, model):
            units.extend((config, task, doc_id) for doc_id in docs)
    return units


def _batches(
    units: Iterable[tuple[DecodeConfig, str, int]], size: int
) -> list[list[tuple[DecodeConfig, str, int]]]:
    batches: list[list[tuple[DecodeConfig, str, int]]] = []
    for unit in units:
        if batches and len(batches[-1]) < size and batches[-1][0][:2] == unit[:2]:
            batches[-1].append(unit)
        else:
            batches.append([unit])
    return batches


def run_grid(
    grid: Grid,
    records: Mapping[str, list[dict[str, Any]]],
    out_dir: str | Path,
    *,
    decode: DecodeFn,
    codec: Codec,
    model: str,
    backends: TextBackends | None = None,
    progress: bool = True,
) -> RunSummary:
    """Decode and grade every (config, task, doc) of ``grid`` not yet in ``out_dir``.

    Args:
        grid: parsed grid (tasks, sweeps, batch size, warm-up).
        records: task id -> records (already limited); ``doc_id`` is the list index.
        out_dir: run directory (created); holds the rows files.
        decode: the decoding function (:func:`sampler_decode_fn` or a test double).
        codec: prompt encoder / answer decoder.
        model: model name recorded in every config (part of the config hash).
        backends: optional grammar / BERTScore backends for the text tasks.
        progress: show a tqdm bar (rank 0 only).

    Returns:
        A :class:`RunSummary`; after the call ``out_dir/rows.jsonl`` holds every row.
    """
    from tqdm.auto import tqdm

    missing = [task for task in grid.tasks if task not in records]
    if missing:
        raise KeyError(f"no records for tasks {missing}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank, world, created = process_group()
    units = _work_units(grid, records, model)
    if rank == 0:  # what the run is meant to produce, for ``eval analyze``
        write_plan(out, (config.config_hash for config, _, _ in units))
    done = {row_key(row) for path in rows_files(out) for row in read_rows(path)}
    mine = units[rank::world]
    todo = [u for u in mine if (u[0].config_hash, u[1], u[2]) not in done]
    stamp = versions()
    prompts: dict[tuple[str, int], list[int]] = {}
    warmed: set[DecodeConfig] = set()
    writer = RowWriter(out / RANK_FILE.format(rank=rank))
    bar = tqdm(total=len(todo), disable=not progress or rank != 0, desc="parallelbench")
    try:
        for batch in _batches(todo, grid.batch_size):
            config, task = batch[0][0], batch[0][1]
            for _, _, doc_id in batch:
                if (task, doc_id) not in prompts:
                    prompts[task, doc_id] = codec.encode(task, records[task][doc_id])
            ids, mask = left_pad([prompts[task, d] for _, _, d in batch], codec.pad_token_id)
            if config not in warmed:
                for _ in range(grid.warmup):
                    decode(ids, mask, config)
                warmed.add(config)
            generation, per_sample = _timed_decode(decode, ids, mask, config, len(batch))
            for row in _graded_rows(batch, generation, records, prompts, codec, backends):
                writer.write({**row, "wall_time_s": per_sample, "versions": stamp})
            bar.update(len(batch))
    finally:
        bar.close()
        writer.close()
    return _finish_run(out, units, todo, mine, rank, world, created, grid)


def _timed_decode(decode: DecodeFn, ids: torch.Tensor, mask: torch.Tensor, config: DecodeConfig,
                  n: int) -> tuple[Any, float]:
    """``decode(ids, mask, config)`` and its wall time per sample (GPU work synchronised)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    generation = decode(ids, mask, config)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return generation, (time.perf_counter() - start) / n


def _graded_rows(batch: list[tuple[DecodeConfig, str, int]], generation: Any,
                 records: Mapping[str, list[dict[str, Any]]],
                 prompts: Mapping[tuple[str, int], list[int]], codec: Codec,
                 backends: TextBackends | None) -> list[dict[str, Any]]:
    """One result row per sample of a decoded batch: the prediction, its grade, NFE, useful
    length and decoding order (without the wall time and versions, which the caller adds)."""
    config, task = batch[0][0], batch[0][1]
    spec = task_spec(task)
    answers = generation.answer.tolist()
    lengths = getattr(generation, "lengths", None)  # EoTP-style truncation, if any
    if lengths is not None:
        answers = [a[: int(n)] for a, n in zip(answers, lengths.tolist(), strict=True)]
    nfe, commit = generation.nfe.tolist(), generation.commit_step.tolist()
    rows = []
    for row_i, (_, _, doc_id) in enumerate(batch):
        record = records[task][doc_id]
        answer = answers[row_i]
        useful = useful_length(answer, codec.eos_token_ids)
        prediction = codec.decode(answer)
        graded = spec.grade(prediction, record, backends=backends)
        rows.append({
            "task": task, "category": spec.category, "doc_id": doc_id,
            "prediction": prediction, "reference": _reference(record),
            "score": graded["score"], "score_strict": graded.get("score_strict"),
            "components": {
                k: v for k, v in graded.items() if k not in ("score", "score_strict")
            },
            "nfe": int(nfe[row_i]), "gen_tokens_useful": useful,
            "gen_tokens_budget": config.gen_length, "wall_time_s": None,
            "prompt_tokens": len(prompts[task, doc_id]),
            "decoding_order_tau": kendall_tau(commit[row_i], useful),
            "commit_steps": commit[row_i],
            "config": config.as_dict(), "config_hash": config.config_hash,
            "versions": None,
        })  # fmt: skip
    return rows


def _finish_run(out: Path, units: list[Any], todo: list[Any], mine: list[Any], rank: int,
                world: int, created: bool, grid: Grid) -> RunSummary:
    """Merge the ranks' rows (rank 0), close the process group this run opened, and the
    ``RunSummary``."""
    written_all, resumed_all = sum_over_ranks(world, len(todo), len(mine) - len(todo))
    rows_path, merged = out / ROWS_FILE, -1
    if rank == 0:
        rows_path = merge_rows(out)
        with rows_path.open() as handle:
            merged = sum(1 for line in handle if line.strip())
        if world == 1:  # rows.jsonl holds every row now: one process leaves no rank journal
            for path in out.glob(RANK_FILE.format(rank="*")):
                path.unlink()
    barrier(world)
    if created:
        import torch.distributed as dist

        dist.destroy_process_group()
    configs = len({u[0] for u in units})
    skipped = list(dict.fromkeys(grid.skipped))
    return RunSummary(rows_path, len(todo), len(mine) - len(todo), configs, skipped, rank,
                      world, written_all, resumed_all, merged)


# ---------------------------------------------------------------- data and CLI entry


def load_records(
    grid: Grid, data: str | Path | None = None, limit: int | None = None,
    *, testbed: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Records per task: the released files (``source: official``; ``data`` overrides
    ``grid.data``) or clean-room sets from the held-out ``test`` split (``generated``).

    ``testbed``: generated Waiting Line records over the word-level test bed's name pool and
    list lengths (``dllm_decode.train.testbed``), for the ``testbed-*`` checkpoints.

    Raises:
        ValueError: no data directory for the official source, or a task the generator lacks.
    """
    from dllm_decode.eval.parallelbench.generate import generate_task, split_seed
    from dllm_decode.eval.parallelbench.loader import load_tasks

    limit = grid.limit if limit is None else limit
    if grid.source == "official":
        root = data or grid.data
        if root is None:
            raise ValueError("source 'official' needs a data directory (grid 'data' or --data)")
        loaded = {name: task.records for name, task in load_tasks(root, grid.tasks).items()}
    else:
        loaded = {}
        for task in grid.tasks:
            seed = split_seed(task, "test") + grid.data_seed
            if testbed:
                from dllm_decode.eval.parallelbench.testbed import waiting_line_records

                loaded[task] = waiting_line_records(task, grid.num_samples, seed)
                continue
            loaded[task] = generate_task(task, grid.num_samples, seed, split="test",
                                         icl_examples=grid.icl_examples)
    return {task: records[:limit] for task, records in loaded.items()}


def _tokenizer_source(model: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    from dllm_decode.models.loading import resolve_path

    try:
        return str(resolve_path(model))
    except FileNotFoundError:
        return model  # a hub name


def _testbed_codec(model: str) -> Any:
    """The word-level codec of a test-bed checkpoint (``None`` for any other model)."""
    from dllm_decode.models.loading import resolve_path
    from dllm_decode.models.oracle import codec_for

    try:
        return codec_for(resolve_path(model))
    except FileNotFoundError:
        return None


def run_sweep(args: Any) -> RunSummary:
    """CLI entry: ``dllm-decode eval parallelbench --model M --grid G --out DIR``.

    Reads ``args.model``, ``args.grid``, ``args.out`` and the optional ``data``, ``tokenizer``,
    ``limit``, ``batch_size``, ``device``, ``dtype`` (default bfloat16 on GPU, float32 on CPU),
    ``no_progress`` attributes. Under ``torchrun`` each rank uses ``cuda:LOCAL_RANK``.
    """
    from dllm_decode.eval.parallelbench.codec import ModelCodec, TokenizerCodec
    from dllm_decode.eval.parallelbench.grid import load_grid
    from dllm_decode.models.loading import load_model

    grid = load_grid(args.grid)
    overrides = {k: getattr(args, k, None) for k in ("batch_size",)}
    grid = replace(grid, **{k: v for k, v in overrides.items() if v is not None})
    model_name = getattr(args, "model", None) or grid.model
    if not model_name:
        raise ValueError("no model: pass --model or set 'model' in the grid")
    device = getattr(args, "device", None) or (
        f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    )
    dtype = getattr(args, "dtype", None) or ("float32" if device == "cpu" else "bfloat16")
    model = load_model(model_name, device=device, dtype=getattr(torch, dtype))
    word_codec = _testbed_codec(model_name)
    records = load_records(grid, getattr(args, "data", None), getattr(args, "limit", None),
                           testbed=word_codec is not None)
    if word_codec is not None:  # a word-level test-bed checkpoint: the oracle's codec
        codec: Codec = ModelCodec(word_codec)
    elif hasattr(model, "encode_prompt"):
        codec = ModelCodec(model)
    else:
        from dllm_decode.tokenizer import load_tokenizer

        source = _tokenizer_source(model_name, getattr(args, "tokenizer", None) or grid.tokenizer)
        from dllm_decode.text import stop_token_ids

        # load_tokenizer, not AutoTokenizer: AutoTokenizer first reads config.json through
        # AutoConfig, which does not know the llada / Dream / sdar model types
        tokenizer = load_tokenizer(source)
        # answers end at the model's EOS, generation_config.json's and the tokenizer's EOS /
        # end-of-turn (the token its chat template writes after an answer: <|im_end|>, ...)
        codec = TokenizerCodec(tokenizer, eos_token_ids=stop_token_ids(tokenizer, model))
    summary = run_grid(
        grid, records, args.out, decode=sampler_decode_fn(model), codec=codec,
        model=str(model_name), progress=not getattr(args, "no_progress", False),
    )  # fmt: skip
    if summary.rank == 0:
        for line in summary.skipped:
            print(f"skipped config: {line}")
        print(summary.report())
    return summary
