"""GPU decode benchmark: the random 8B shape per cache mode, batch, tokens/step, gen length.

One command, about 5 minutes on one H100 / H200 (random LLaDA-8B-shaped weights, bf16; only
time is meaningful)::

    python benchmarks/bench_gpu.py                      # the full grid -> results/gpu.csv
    python benchmarks/bench_gpu.py --smoke              # a tiny shape on any device, seconds

Grid: cache none / prefix / dual x batch 1 / 8 / 32 x tokens per step 1 / 4 x gen length
256 / 1024 (prompt 128, block 32, ``low_confidence``), each with CUDA graphs on (the default
on CUDA, ``samplers.graph``) and off. A whole 8B decode at batch 32 without a cache takes
minutes, so each setting decodes only its first ``--forwards`` steps (the run is cut at the
next forward) and the full decode is assembled from the measured parts:

* ``ms_per_step``: wall time of a non-refresh step (p20/p50/p80 over the steps; ``none``:
  every step), ``ms_per_refresh``: the block-start forward of the cached modes;
* ``ms_per_forward``: wall / NFE of the whole decode, ``(refresh + (S - 1) step) / S`` with S
  steps per block (no refresh in ``none``: the step), ``tokens_per_s``: ``B G`` over it;
  prefix steps shrink as blocks move right, the first block (the slowest) is what is timed;
* ``gpu_busy_ms_per_forward`` / ``kernels_per_forward``: CUDA kernel time and count per
  forward in the profiler (``torch.profiler``, CUPTI; graph-launched kernels included) over
  the same window, ``idle_share``: 1 - busy / wall;
* ``floor_weights``: ``ms_per_step`` over the weight-streaming floor (weight bytes / the
  measured device copy bandwidth, read + write bytes over time); ``floor_compute``: over the
  compute floor (``2 * params * fed tokens`` over the measured bf16 matmul rate);
* ``capture_s``: seconds spent capturing graphs in the setting (graphs on), each capture's
  self-check included (``samplers.graph_selfcheck``); ``graph_shapes_rejected``: the step
  shapes whose first replay disagreed with the eager step (they ran eagerly; the reason is
  printed).

Each setting's rows are appended to ``--out`` as soon as it is measured (a run stopped by a
time limit keeps what it measured).

Rows use the benchmark schema (``dllm_decode.bench.HEADER``): ``provider`` is ``graphs`` or
``eager`` (``static`` on a CPU: the static-buffer step without capture), ``name`` carries the
shape, layers and tokens per step, ``device`` is the GPU's name in every row. Without CUDA the
full grid refuses (exit 2); ``--smoke`` runs a tiny shape (2 layers, d 256, fp32) for two
settings, on the CPU through the same static-buffer step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dllm_decode import DiffusionSampler
from dllm_decode.bench import HEADER, environment, pct, write_csv
from dllm_decode.cache.plans import ForwardPlan
from dllm_decode.doctor import random_model

RESULTS = Path(__file__).parent / "results"


class _Cut(Exception):
    """Raised by the feed hook to end a decode after its measured window."""


@dataclasses.dataclass
class Window:
    """Host times at each forward's start (after the previous step's sync) and its shape."""

    stamps: list[float] = dataclasses.field(default_factory=list)
    refresh: list[bool] = dataclasses.field(default_factory=list)
    fed: list[int] = dataclasses.field(default_factory=list)  # tokens fed per row


@contextlib.contextmanager
def cut_after(n: int, window: Window, device: torch.device) -> Iterator[None]:
    """Record every ``ForwardPlan.feed`` (both loops call it once per forward) and stop the
    decode at forward ``n + 1`` (its stamp closes the window)."""
    real = ForwardPlan.feed

    def feed(self: ForwardPlan, *args: Any, **kwargs: Any) -> Any:
        window.stamps.append(time.perf_counter())
        if len(window.stamps) > n:
            raise _Cut
        out = real(self, *args, **kwargs)
        window.refresh.append(out.refresh and self.mode.value != "none")
        window.fed.append(out.end - out.start)
        return out

    ForwardPlan.feed = feed  # type: ignore[method-assign]
    try:
        yield
    except _Cut:
        pass
    finally:
        ForwardPlan.feed = real  # type: ignore[method-assign]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        window.stamps.append(time.perf_counter())


def run_window(sampler: DiffusionSampler, prompt: torch.Tensor, n: int) -> Window:
    window = Window()
    with cut_after(n, window, prompt.device):
        sampler.generate(prompt)
    return window


def profile_window(sampler: DiffusionSampler, prompt: torch.Tensor, n: int) -> tuple[float, int]:
    """CUDA kernel milliseconds and kernel count over the first ``n`` forwards."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_window(sampler, prompt, n)
    busy_us, count = 0.0, 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            busy_us += ev.device_time
            count += 1
    return busy_us / 1e3, count


def device_rates(device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """Measured copy bandwidth (bytes/s, read + write) and matmul rate (FLOP/s)."""
    if device.type != "cuda":
        return float("nan"), float("nan")
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    bw = 2 * x.numel() * 20 / (start.elapsed_time(end) / 1e3)
    del x, y
    a = torch.randn(8192, 8192, device=device, dtype=dtype)
    for _ in range(3):
        a @ a
    start.record()
    for _ in range(10):
        a @ a
    end.record()
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 10 / (start.elapsed_time(end) / 1e3)
    return bw, flops


def measure(model: Any, cfg: dict[str, Any], graphs: bool, n: int, rates: tuple[float, float],
            weight_bytes: int, n_params: int) -> dict[str, tuple[float, float, float]]:
    """The metrics of one setting (``{metric: (p20, p50, p80)}``)."""
    device = next(model.parameters()).device
    b, p, g, k = cfg["B"], cfg["P"], cfg["G"], cfg["k"]  # k: tokens per step
    vocab = model.spec.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab - 2, (b, p), generator=gen).to(device) for _ in range(2)]
    sampler = DiffusionSampler(model, "low_confidence", cfg["cache"], gen_length=g,
                               block_length=cfg["K"], steps=g // k,
                               graphs=graphs)
    # warm-up windows: the first run of a step key is eager, the second captures it
    for i in range(2 if graphs else 1):
        run_window(sampler, prompts[i % 2], n)
    win = run_window(sampler, prompts[0], n)
    stamps = torch.tensor(win.stamps, dtype=torch.float64)
    ms = ((stamps[1:] - stamps[:-1]) * 1e3).tolist()[:len(win.refresh)]
    steps = [t for t, r in zip(ms, win.refresh, strict=True) if not r] or ms
    refresh = [t for t, r in zip(ms, win.refresh, strict=True) if r]
    per_block = cfg["K"] // k
    step = pct(steps)[1]
    fwd = step if not refresh else (pct(refresh)[1] + (per_block - 1) * step) / per_block
    wall = sum(ms)
    out: dict[str, tuple[float, float, float]] = {"ms_per_step": pct(steps)}
    if refresh:
        out["ms_per_refresh"] = pct(refresh)
    out["ms_per_forward"] = (fwd,) * 3
    out["tokens_per_s"] = (b * k / (fwd / 1e3),) * 3  # one forward commits B x k tokens
    if device.type == "cuda":
        busy, kernels = profile_window(sampler, prompts[1], n)
        out["gpu_busy_ms_per_forward"] = (busy / len(ms),) * 3
        out["kernels_per_forward"] = (kernels / len(ms),) * 3
        out["idle_share"] = (max(0.0, 1 - busy / wall),) * 3
    bw, flops = rates
    fed = min(f for f, r in zip(win.fed, win.refresh, strict=True) if not r) \
        if not all(win.refresh) else win.fed[0]
    out["floor_weights"] = (step / (weight_bytes / bw * 1e3),) * 3
    out["floor_compute"] = (step / (2 * n_params * b * fed / flops * 1e3),) * 3
    if graphs and sampler.step_graphs is not None:
        stats = sampler.step_graphs.stats
        out["capture_s"] = (stats.capture_seconds,) * 3
        # step shapes whose first replay disagreed with the eager step (they ran eagerly)
        out["graph_shapes_rejected"] = (float(stats.rejected),) * 3
        if stats.rejected:
            print(f"  graph self-check: {sampler.graph_reason}", flush=True)
    del sampler
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape, two settings, any device")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--caches", nargs="+", default=["none", "prefix", "dual"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--tokens-per-step", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--gen-length", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--forwards", type=int, default=6, help="forwards timed per setting")
    ap.add_argument("--graphs", nargs="+", default=["on", "off"], choices=["on", "off"])
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu.csv")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("bench_gpu.py needs a CUDA device (none here); --smoke runs a tiny shape on the "
              "CPU", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    shape, dtype = ("llada-8b", torch.bfloat16) if not args.smoke else ("small", torch.float32)
    layers = 2 if args.smoke else args.layers
    if args.smoke:
        args.caches, args.batch, args.tokens_per_step = ["none", "dual"], [1], [1]
        args.gen_length, args.prompt_length, args.block_length = [16], 8, 8
        args.forwards = min(args.forwards, 4)
    model = random_model(shape, layers, device, dtype)
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    n_params = sum(t.numel() for n, t in model.named_parameters() if "embed" not in n)
    rates = device_rates(device, dtype)
    env = environment()
    dev_name = torch.cuda.get_device_name(device) if cuda else env.device
    print(f"{dev_name}: {shape} x {layers} layers, {weight_bytes / 1e9:.2f} GB of weights; "
          f"copy {rates[0] / 1e12:.2f} TB/s, matmul {rates[1] / 1e12:.0f} TFLOP/s")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for cache in args.caches:
        for b in args.batch:
            for k in args.tokens_per_step:
                for g in args.gen_length:
                    cfg = dict(cache=cache, B=b, P=args.prompt_length, G=g,
                               K=args.block_length, k=k)
                    for mode in args.graphs:
                        on = mode == "on"
                        metrics = measure(model, cfg, on, args.forwards, rates, weight_bytes,
                                          n_params)
                        print(f"[{time.perf_counter() - t0:6.1f}s] {cache:<6} B={b:<3} "
                              f"tokens/step={k} G={g:<5} graphs={mode:<3} "
                              f"{metrics['ms_per_forward'][1]:8.2f} ms/forward "
                              f"{metrics['tokens_per_s'][1]:9.1f} tok/s", flush=True)
                        setting = []
                        for metric, (p20, p50, p80) in metrics.items():
                            setting.append(dict(
                                suite="gpu", name=f"{shape}-{layers}L-k{k}",
                                provider=("graphs" if cuda else "static") if on else "eager",
                                policy="low_confidence",
                                cache=cache, B=b, P=args.prompt_length, G=g,
                                K=args.block_length, V=model.spec.vocab_size, metric=metric,
                                unit=_unit(metric), p20=p20, p50=p50, p80=p80,
                                device=dev_name, torch=env.torch, triton=env.triton,
                                commit=env.commit, timestamp=env.timestamp))
                        assert all(set(r) == set(HEADER) for r in setting)
                        write_csv(setting, args.out)  # as measured: a cut run keeps its rows
                        rows += setting
    print(f"{len(rows)} rows -> {args.out}")
    return 0


def _unit(metric: str) -> str:
    if metric.startswith("ms_") or metric.startswith("gpu_busy"):
        return "ms"
    return {"tokens_per_s": "tokens/s", "capture_s": "s",
            "graph_shapes_rejected": "count"}.get(metric, "ratio")


if __name__ == "__main__":
    sys.exit(main())
