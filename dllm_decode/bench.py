"""Decode benchmark core: cache modes x policies -> NFE, tokens per forward, per-step and
end-to-end time.

CPU timing follows kernels.md §4.5: one thread, ``time.thread_time`` around each call, warm-ups
excluded, min/percentiles over repeats. CPU ratios measure *algorithmic* savings (fewer rows per
forward, fewer forwards); GPU numbers are projected with ``roofline`` and labelled estimates.
"""

from __future__ import annotations

import csv
import datetime as _dt
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch

from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.models.loading import build_model
from dllm_decode.samplers.sampler import DiffusionSampler
from dllm_decode.speed import TPF_UNIT, generation_tpf, model_stop_ids, tokens_per_step
from dllm_decode.types import CacheMode

HEADER = ["suite", "name", "provider", "policy", "cache", "B", "P", "G", "K", "V", "metric",
          "unit", "p20", "p50", "p80", "device", "torch", "triton", "commit", "timestamp"]

#: kernels.md §3 benchmark model (LLaDA-like, random weights: only time is meaningful)
BENCH_CONFIG: dict[str, Any] = {
    "model_type": "llada", "d_model": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 4,
    "mlp_hidden_size": 768, "vocab_size": 4096, "embedding_size": 4096, "mask_token_id": 4095,
    "eos_token_id": 4094, "max_sequence_length": 4096, "rope_theta": 500000.0,
}


@dataclass(frozen=True)
class Env:
    device: str
    torch: str
    triton: str
    commit: str
    timestamp: str


def environment() -> Env:
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "absent"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    return Env(device=f"cpu:{platform.processor() or platform.machine()}",
               torch=torch.__version__, triton=tv, commit=commit,
               timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


def timed(fn: Callable[[], Any], repeats: int, warmup: int) -> list[float]:
    """Thread CPU seconds of ``fn`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        out.append(time.thread_time() - t0)
    return out


def pct(xs: list[float]) -> tuple[float, float, float]:
    t = torch.tensor(xs, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


def step_times(model: Any, mode: CacheMode, batch: int, prompt: int, gen: int, block: int,
               repeats: int, warmup: int) -> list[float]:
    """Seconds of one non-refresh step of ``mode`` (``none``: a full forward) mid-generation."""
    length = prompt + gen
    canvas = torch.randint(0, model.vocab_size - 2, (batch, length))
    valid = torch.ones(batch, length, dtype=torch.bool)
    pos = model.rope_positions(valid)
    plan = ForwardPlan(model, mode, valid, pos)
    bs = prompt + (gen // block // 2) * block  # a block in the middle of the generation
    with torch.inference_mode():
        plan.forward(canvas, (bs, bs + block), bs, 0, bs, full_span=False)
        step = 0 if mode is CacheMode.NONE else 1
        return timed(lambda: plan.forward(canvas, (bs, bs + block), bs, step, bs, False),
                     repeats, warmup)


def iter_decode_rows(model: Any, *, batches: Iterable[int], gens: Iterable[int], prompt: int,
                     block: int, steps_per_block: int, modes: Iterable[str], policy: str,
                     repeats: int, warmup: int,
                     name: str = "bench-llada-4x256") -> Iterator[dict[str, Any]]:
    """Benchmark rows (HEADER schema) for every batch x gen length x cache mode, each yielded
    as soon as it is measured (``bench`` writes it to the CSV then, so an interrupt keeps it).

    Per config: ``end_to_end`` (s), then the hardware-independent ``nfe``, ``tpf`` (answer
    tokens up to EOS per forward, ``dllm_decode.speed``; the model's EOS ids), and
    ``tokens_per_step`` (the gen length, EOS fill included, per forward), ``tokens_per_s``
    (generated tokens, EOS fill included, per second), then ``step`` (s)."""
    env = environment()
    torch.set_num_threads(1)
    v = model.vocab_size
    stops = model_stop_ids(model)
    for b in batches:
        for g in gens:
            prompt_ids = torch.randint(0, v - 2, (b, prompt),
                                       generator=torch.Generator().manual_seed(0))
            steps = (g // block) * steps_per_block
            for mode in modes:
                sampler = DiffusionSampler(model, policy, cache=mode, gen_length=g,
                                           block_length=block, steps=steps)
                result: dict[str, Any] = {}

                def run(s: DiffusionSampler = sampler, r: dict = result,
                        x: torch.Tensor = prompt_ids) -> None:
                    r["out"] = s.generate(x)

                base = dict(suite="decode", name=name, provider="torch", policy=policy,
                            cache=mode, B=b, P=prompt, G=g, K=block, V=v, device=env.device,
                            torch=env.torch, triton=env.triton, commit=env.commit,
                            timestamp=env.timestamp)
                e2e = timed(run, repeats, warmup)
                yield base | _spread("end_to_end", "s", e2e)
                out = result["out"]
                nfe = float(out.nfe.float().mean())
                tpf, _ = generation_tpf(out, stops)
                for metric, unit, val in (
                        ("nfe", "forwards", nfe), ("tpf", TPF_UNIT, tpf),
                        ("tokens_per_step", "gen tokens/forward", tokens_per_step([g], [nfe])),
                        ("tokens_per_s", "gen tokens/s", b * g / pct(e2e)[1])):
                    yield base | dict(metric=metric, unit=unit, p20=val, p50=val, p80=val)
                per_step = step_times(model, CacheMode(mode), b, prompt, g, block,
                                      max(repeats, 3), 1)
                yield base | _spread("step", "s", per_step)


def _spread(metric: str, unit: str, values: list[float]) -> dict[str, Any]:
    p20, p50, p80 = pct(values)
    return dict(metric=metric, unit=unit, p20=p20, p50=p50, p80=p80)


def decode_rows(model: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """Every row of :func:`iter_decode_rows` (same arguments), as a list."""
    return list(iter_decode_rows(model, **kwargs))


def ratios(rows: list[dict]) -> list[dict]:
    """Speed-up of every cache mode over ``none`` (median end-to-end and per-step)."""
    key = {(r["B"], r["G"], r["cache"], r["metric"]): r["p50"] for r in rows}
    out = []
    for (b, g, mode, metric), val in sorted(key.items()):
        if mode == "none" or metric not in ("end_to_end", "step"):
            continue
        base = key.get((b, g, "none", metric))
        if base:
            out.append(dict(B=b, G=g, cache=mode, metric=metric, speedup=base / val))
    return out


def write_csv(rows: list[dict], path: Path) -> None:
    """Append ``rows`` (``HEADER`` schema) to the CSV at ``path`` (header first if new)."""
    with CsvAppender(path) as out:
        for row in rows:
            out.write(row)


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """``rows`` as a CSV at ``path`` (replaced; parent folders made), columns in the first
    row's order (the benchmark scripts' result tables; ``write_csv`` appends ``HEADER`` rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def add_bench_subcommand(sub: Any) -> None:
    p = sub.add_parser("bench", help="decode benchmark: cache modes vs no cache (CPU ratios)")
    p.add_argument("--batch", type=int, nargs="+", default=[1])
    p.add_argument("--gen-length", type=int, nargs="+", default=[128])
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--steps-per-block", type=int, default=8)
    p.add_argument("--cache", nargs="+", default=["none", "prefix", "dual"])
    p.add_argument("--policy", default="low_confidence")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("dllm_decode_bench.csv"),
                   help="CSV the rows are appended to (default: ./dllm_decode_bench.csv; the "
                        "repository's table benchmarks/results/decode.csv is written by "
                        "benchmarks/bench_decode.py)")
    p.set_defaults(func=_cmd_bench)


#: rows ``iter_decode_rows`` yields per config
_ROWS_PER_CONFIG: Final[int] = 6


def _cmd_bench(args: Any) -> int:
    """Rows are appended to ``args.out`` as they are measured, a progress line per row goes to
    stderr; Ctrl-C keeps what was written, says how much, and exits 130."""
    total = len(args.batch) * len(args.gen_length) * len(args.cache) * _ROWS_PER_CONFIG
    print(f"bench: {total} rows (batch x gen length x cache x {_ROWS_PER_CONFIG} metrics), "
          f"appended to {args.out} as measured", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    out = CsvAppender(args.out)
    try:
        with out:
            model = build_model(BENCH_CONFIG, seed=0)
            for row in iter_decode_rows(
                    model, batches=args.batch, gens=args.gen_length, prompt=args.prompt_length,
                    block=args.block_length, steps_per_block=args.steps_per_block,
                    modes=args.cache, policy=args.policy, repeats=args.repeats, warmup=1):
                out.write(row)
                rows.append(row)
                print(f"[{len(rows)}/{total} rows, {time.perf_counter() - start:.0f} s] "
                      f"B={row['B']} G={row['G']} {row['cache']} {row['metric']}="
                      f"{row['p50']:.4g} {row['unit']}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"interrupted: {out.rows_added()} of {total} rows kept in {args.out}",
              file=sys.stderr)
        return 130
    for r in ratios(rows):
        print(f"B={r['B']} G={r['G']} {r['cache']:>6} {r['metric']:>10}: "
              f"{r['speedup']:.2f}x vs none")
    print(f"{len(rows)} rows appended to {args.out}")
    return 0


class CsvAppender:
    """Appends ``HEADER`` rows to the CSV at ``path``, each flushed as it is written (the
    header first when the file is new); a context manager that closes the file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._before = _data_lines(path)
        new = not path.exists() or path.stat().st_size == 0
        self._fh = path.open("a", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=HEADER)
        if new:
            self._writer.writeheader()
            self._fh.flush()

    def write(self, row: dict[str, Any]) -> None:
        self._writer.writerow(row)
        self._fh.flush()

    def rows_added(self) -> int:
        """Rows on disk that this appender wrote (counted in the file: exact after an
        interrupt at any point)."""
        if not self._fh.closed:
            self._fh.flush()
        return _data_lines(self.path) - self._before

    def __enter__(self) -> CsvAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


def _data_lines(path: Path) -> int:
    """Rows of a ``HEADER`` CSV (its values hold no newlines); 0 for a missing file."""
    if not path.exists():
        return 0
    with path.open() as fh:
        return max(sum(1 for line in fh if line.strip()) - 1, 0)
