"""Kernel benchmark: provider (reference vs triton) x shape sweep, rows in the fixed schema.

On a CUDA machine both providers run on GPU tensors (timing bracketed by synchronisation,
warm-up and compilation excluded). On CPU only the reference provider runs: the Triton
interpreter measures Python overhead, not a kernel, so it is never timed (kernels.md §4.5);
CPU timing is single-threaded thread CPU time. Bandwidth-bound ops also get a GB/s row.

    python benchmarks/bench_kernels.py              # full sweep
    python benchmarks/bench_kernels.py --quick      # small shapes, a few seconds on CPU

Columns: ``B`` batch (vocab ops: rows N), ``P`` cache length L_max, ``K`` query/new rows Lq,
``V`` vocabulary; head counts, head dim and dtype are in ``name``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dllm_decode import kernels
from dllm_decode.bench import HEADER, environment, pct, write_csv

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Case:
    """One benchmark point: ``make`` builds the call for a provider; ``nbytes`` is the
    minimum memory traffic (for GB/s) or 0."""

    op: str
    name: str
    shape: dict[str, int]
    make: Callable[[str], Callable[[], Any]]
    nbytes: int


def vocab_cases(device: torch.device, dtype: torch.dtype, quick: bool) -> Iterator[Case]:
    rows = (32,) if quick else (32, 256)
    vocabs = (4096, 32_000) if quick else (4096, 126_464, 152_064)
    for n in rows:
        for v in vocabs:
            logits = torch.randn(n, v, device=device).to(dtype)
            traffic = logits.numel() * logits.element_size()
            tag = f"[{str(dtype).removeprefix('torch.')}]"
            yield Case("confidence_stats", f"confidence_stats{tag}", {"B": n, "V": v},
                       lambda impl, x=logits: lambda: kernels.confidence_stats(x, impl=impl),
                       traffic)
            yield Case("gumbel_sample", f"gumbel_sample[T=1]{tag}", {"B": n, "V": v},
                       lambda impl, x=logits: lambda: kernels.gumbel_sample(x, 1.0, seed=0,
                                                                             impl=impl),
                       traffic)


def attention_cases(device: torch.device, dtype: torch.dtype, quick: bool) -> Iterator[Case]:
    # (B, H, H_kv, D, L_max): LLaDA-like MHA and Dream-like GQA at GPU scale, tiny on CPU
    if device.type == "cuda":
        configs = [(1, 32, 32, 128, 768), (8, 32, 32, 128, 768), (8, 28, 4, 128, 1024)]
    else:
        configs = [(1, 4, 4, 64, 256)] if quick else [(1, 4, 4, 64, 256), (8, 4, 4, 64, 512),
                                                      (4, 8, 2, 64, 512)]
    q_len = 32
    for b, h, h_kv, d, max_len in configs:
        g = torch.Generator(device="cpu").manual_seed(0)
        q = torch.randn(b, h, q_len, d, generator=g).to(device, dtype)
        k = torch.randn(b, h_kv, max_len, d, generator=g).to(device, dtype)
        v = torch.randn(b, h_kv, max_len, d, generator=g).to(device, dtype)
        k_new = torch.randn(b, h_kv, q_len, d, generator=g).to(device, dtype)
        start = torch.zeros(b, dtype=torch.int32, device=device)
        end = torch.full((b,), max_len, dtype=torch.int32, device=device)
        q_start = torch.full((b,), max_len // 2, dtype=torch.int32, device=device)
        tag = f"[H={h},H_kv={h_kv},D={d},{str(dtype).removeprefix('torch.')}]"
        shape = {"B": b, "P": max_len, "K": q_len}
        traffic = 2 * k.numel() * k.element_size()  # K and V of the cache, read once
        yield Case("block_attention", f"block_attention{tag}", shape,
                   lambda impl, a=(q, k, v, start, end): lambda: kernels.block_attention(
                       *a, impl=impl), traffic)
        yield Case("block_attention", f"block_attention_dual{tag}", shape,
                   lambda impl, a=(q, k, v, start, end), kn=k_new, qs=q_start:
                   lambda: kernels.block_attention(*a, k_new=kn, v_new=kn, q_start=qs,
                                                   impl=impl), traffic)
        cos = torch.randn(max_len, d, device=device)
        yield Case("kv_write_", f"kv_write_rope{tag}", shape,
                   lambda impl, a=(k, v, k_new, k_new, max_len // 2, cos, cos):
                   lambda: kernels.kv_write_(*a, impl=impl), 4 * k_new.numel() * k.element_size())


def layer_cases(device: torch.device, dtype: torch.dtype, quick: bool) -> Iterator[Case]:
    """The fused layer ops at batch 1-8, 32 fed rows: the numbers behind
    ``kernels.AUTO_ON_CUDA`` for ``qkv_rope`` and ``silu_mul``."""
    from dllm_decode.models.functional import rope_cos_sin

    # (B, H, H_kv, D, MLP, q/k norm): LLaDA-8B, Dream-7B, SDAR-8B (Qwen3) layers; tiny on CPU
    if device.type == "cuda":
        configs = [(1, 32, 32, 128, 12288, False), (8, 32, 32, 128, 12288, False),
                   (1, 28, 4, 128, 18944, False), (1, 32, 8, 128, 12288, True)]
    else:
        configs = [(1, 4, 4, 64, 768, False)] if quick else [(1, 4, 4, 64, 768, False),
                                                             (4, 8, 2, 64, 768, True)]
    n, max_len = 32, 768
    for b, h, h_kv, d, mlp, norm in configs:
        g = torch.Generator(device="cpu").manual_seed(0)
        qkv = torch.randn(b, n, (h + 2 * h_kv) * d, generator=g).to(device, dtype)
        rope = kernels.rope_rows(*rope_cos_sin(torch.arange(n, device=device).expand(b, n), d,
                                               10000.0))
        w = torch.ones(d, device=device, dtype=dtype) if norm else None
        kc, vc = (torch.zeros(b, h_kv, max_len, d, device=device, dtype=dtype) for _ in "kv")
        slots = torch.arange(n, device=device).expand(b, n)
        tag = f"[H={h},H_kv={h_kv},D={d},norm={int(norm)},{str(dtype).removeprefix('torch.')}]"
        yield Case("qkv_rope", f"qkv_rope_write{tag}", {"B": b, "P": max_len, "K": n},
                   lambda impl, a=(qkv, rope, h, h_kv, d), kw=dict(
                       q_norm=w, k_norm=w, eps=1e-6, k_cache=kc, v_cache=vc, slots=slots):
                   lambda: kernels.qkv_rope(*a, **kw, impl=impl),
                   2 * qkv.numel() * qkv.element_size())
        gate_up = torch.randn(b, n, 2 * mlp, generator=g).to(device, dtype)
        yield Case("silu_mul", f"silu_mul[I={mlp},{str(dtype).removeprefix('torch.')}]",
                   {"B": b, "K": n}, lambda impl, x=gate_up: lambda: kernels.silu_mul(
                       x, impl=impl), gate_up.numel() * gate_up.element_size() * 3 // 2)


def time_call(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int
              ) -> list[float]:
    """Seconds per call: GPU wall time between synchronisations, or CPU thread time."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        else:
            t0 = time.thread_time()
            fn()
            out.append(time.thread_time() - t0)
    return out


def run(device: torch.device, quick: bool, repeats: int) -> list[dict]:
    env = environment()
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else env.device
    providers = ["reference", "triton"] if device.type == "cuda" else ["reference"]
    if device.type != "cuda":
        print("CPU: timing the reference provider only (the Triton interpreter is not timed)")
        torch.set_num_threads(1)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cases = [*vocab_cases(device, dtype, quick), *attention_cases(device, dtype, quick),
             *layer_cases(device, dtype, quick)]
    rows = []
    for case in cases:
        for provider in providers:  # providers interleaved per shape
            secs = time_call(case.make(provider), device, repeats, warmup=2)
            p20, p50, p80 = pct(secs)
            base = dict.fromkeys(HEADER, "") | case.shape | dict(
                suite="kernels", name=case.name, provider=provider, device=dev_name,
                torch=env.torch, triton=env.triton, commit=env.commit, timestamp=env.timestamp)
            rows.append(base | dict(metric="latency", unit="ms", p20=p20 * 1e3, p50=p50 * 1e3,
                                    p80=p80 * 1e3))
            if case.nbytes:  # p20 time -> p80 bandwidth and vice versa
                gbs = [case.nbytes / s / 1e9 for s in (p80, p50, p20)]
                rows.append(base | dict(metric="bandwidth", unit="GB/s", p20=gbs[0],
                                        p50=gbs[1], p80=gbs[2]))
            print(f"{case.name:<52} B={case.shape.get('B', ''):<4} "
                  f"V/P={case.shape.get('V', case.shape.get('P', '')):<7} {provider:<9} "
                  f"p50 {p50 * 1e3:9.3f} ms")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="small sweep")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS / "kernels.csv")
    args = ap.parse_args()
    rows = run(torch.device(args.device), args.quick, args.repeats)
    write_csv(rows, args.out)
    print(f"{len(rows)} rows appended to {args.out}")


if __name__ == "__main__":
    main()
