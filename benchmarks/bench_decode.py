"""End-to-end decode benchmark: cache modes vs no cache, NFE and tokens/forward, CSV + plot.

Recipe (kernels.md §4.5): tiny LLaDA-like model (4 layers, d=256, 4 heads, SwiGLU 768,
V=4096, random weights: only time is meaningful), prompt 128, block 32, fixed steps per block,
one thread, thread CPU time, warm-up excluded. Writes rows in the fixed benchmark schema to
``benchmarks/results/decode.csv`` and a ratio plot ``benchmarks/results/decode_ratios.png``.

    python benchmarks/bench_decode.py --batch 1 4 8 --gen-length 128 256 512 1024
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dllm_decode.bench import BENCH_CONFIG, decode_rows, ratios, write_csv
from dllm_decode.models.loading import build_model

RESULTS = Path(__file__).parent / "results"


def plot(rs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, metric in zip(axes, ("step", "end_to_end"), strict=True):
        for (b, mode) in sorted({(r["B"], r["cache"]) for r in rs}):
            pts = sorted((r["G"], r["speedup"]) for r in rs
                         if r["B"] == b and r["cache"] == mode and r["metric"] == metric)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=f"{mode}, B={b}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("generation length")
        ax.set_title(f"{metric.replace('_', ' ')} speed-up vs no cache (CPU)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("x faster than cache='none'")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--gen-length", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--steps-per-block", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "decode.csv")
    args = ap.parse_args()
    model = build_model(BENCH_CONFIG, seed=0)
    rows = decode_rows(model, batches=args.batch, gens=args.gen_length,
                       prompt=args.prompt_length, block=args.block_length,
                       steps_per_block=args.steps_per_block, modes=["none", "prefix", "dual"],
                       policy="low_confidence", repeats=args.repeats, warmup=1)
    write_csv(rows, args.out)
    rs = ratios(rows)
    for r in rs:
        print(f"B={r['B']:<2} G={r['G']:<5} {r['cache']:>6} {r['metric']:>10}: "
              f"{r['speedup']:.2f}x")
    plot(rs, args.out.with_name("decode_ratios.png"))


if __name__ == "__main__":
    main()
