"""Peak host memory of ``load_model`` vs checkpoint size, on a >= 1 GB sharded random checkpoint.

    python benchmarks/bench_load.py                      # writes /tmp/dllm_bench_load (~1.1 GB)
    python benchmarks/bench_load.py --size small         # 60 MB, a smoke run

Writes a random LLaDA-layout checkpoint (bf16, ``torch_dtype: bfloat16``, shards of
``--shard-mb``) once, then loads it in a fresh process per case and records the peak resident
set (``ru_maxrss``: anonymous memory plus mapped file pages) above the process's baseline
after imports. Cases:

* ``load_model``: this library (one shard mapped at a time, each tensor cast and copied
  straight to its place), in the checkpoint dtype (``auto`` = bf16) and cast to fp32;
* ``eager``: the previous loader, kept here as the baseline: every shard read with
  ``safetensors.torch.load_file`` into one dict, then cast and assigned.

``overhead = peak - baseline - model bytes``: what the load costs beyond the model itself.
Rows go to ``benchmarks/results/load.csv``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dllm_decode.models.base import to_checkpoint_name
from dllm_decode.models.llada import LLaDAModel, llada_spec

ROOT = Path(__file__).resolve().parents[1]
#: LLaDA layout at ~1.1 GB of bf16 (d 2048, 8 layers, vocab 32000) and a 60 MB smoke size
SIZES = {
    "1gb": {"d_model": 2048, "n_layers": 8, "n_heads": 16, "mlp_hidden_size": 5632,
            "vocab": 32000},
    "small": {"d_model": 512, "n_layers": 4, "n_heads": 8, "mlp_hidden_size": 1408,
              "vocab": 16000},
}


def config(size: str) -> dict:
    s = SIZES[size]
    return {"model_type": "llada", "d_model": s["d_model"], "n_layers": s["n_layers"],
            "n_heads": s["n_heads"], "n_kv_heads": s["n_heads"],
            "mlp_hidden_size": s["mlp_hidden_size"], "vocab_size": s["vocab"],
            "embedding_size": s["vocab"], "mask_token_id": s["vocab"] - 1,
            "eos_token_id": s["vocab"] - 2, "max_sequence_length": 4096,
            "torch_dtype": "bfloat16"}


def write_checkpoint(out: Path, size: str, shard_bytes: int) -> int:
    """Random bf16 tensors under LLaDA's names, sharded; returns the total tensor bytes."""
    cfg = config(size)
    with torch.device("meta"):
        model = LLaDAModel(llada_spec(cfg))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = torch.Generator().manual_seed(0)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for internal, p in model.state_dict().items():
        nbytes = p.numel() * 2
        if shards[-1] and used + nbytes > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append((to_checkpoint_name(LLaDAModel.names, internal), tuple(p.shape)))
        used += nbytes
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
                   for n, shape in names}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map |= {n: fname for n in tensors}
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


def eager_load(directory: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The previous loader: all shards into one dict, then cast and assign."""
    cfg = json.loads((directory / "config.json").read_text())
    with torch.device("meta"):
        model = LLaDAModel(llada_spec(cfg))
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(directory / shard)))
    state = {k: tensors[to_checkpoint_name(LLaDAModel.names, k)].to(dtype)
             for k in model.state_dict()}
    model.load_state_dict(state, assign=True)
    return model


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(method: str, dtype_name: str, directory: Path) -> None:
    """Load once in this process and print one JSON line of measurements."""
    from dllm_decode import load_model

    dtype = {"auto": torch.bfloat16, "float32": torch.float32}[dtype_name]
    # warm-up: lazy imports, the dtype probe, allocator pools; then the baseline
    warm = load_model("tiny-llada", dtype=dtype_name)
    float(sum(p.sum(dtype=torch.float32) for p in warm.parameters()))
    del warm
    base = _rss_mb()
    start = time.perf_counter()
    if method == "load_model":
        model = load_model(directory, dtype=dtype_name)
    else:
        model = eager_load(directory, dtype)
    seconds = time.perf_counter() - start
    # touch every page of every weight (one element per 2 KB) so that lazily mapped pages
    # count wherever a loader left them, without allocating a copy
    checksum = float(sum(p.detach().reshape(-1)[::1024].float().sum()
                         for p in model.parameters()))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert all(p.dtype == dtype for p in model.parameters())
    print(json.dumps({"baseline_mb": base, "peak_mb": peak, "seconds": seconds,
                      "model_mb": model_bytes / 2**20, "checksum": checksum}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1gb", choices=sorted(SIZES))
    ap.add_argument("--shard-mb", type=int, default=256)
    ap.add_argument("--dir", default="/tmp/dllm_bench_load")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "load.csv"))
    ap.add_argument("--child", nargs=3, metavar=("METHOD", "DTYPE", "DIR"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]))
        return
    directory = Path(args.dir) / args.size
    if not (directory / "model.safetensors.index.json").is_file():
        write_checkpoint(directory, args.size, args.shard_mb * 2**20)
    shards = sorted(directory.glob("*.safetensors"))
    ckpt_mb = sum(p.stat().st_size for p in shards) / 2**20
    shard_mb = max(p.stat().st_size for p in shards) / 2**20
    rows = []
    for method in ("load_model", "eager"):
        for dtype_name in ("auto", "float32"):
            res = subprocess.run([sys.executable, __file__, "--child", method, dtype_name,
                                  str(directory)], capture_output=True, text=True, check=True,
                                 env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                                      "PATH": "/usr/bin:/bin"})
            m = json.loads(res.stdout.strip().splitlines()[-1])
            above = m["peak_mb"] - m["baseline_mb"]
            rows.append({
                "method": method, "dtype": "bfloat16 (auto)" if dtype_name == "auto"
                else "float32", "checkpoint_mb": f"{ckpt_mb:.0f}", "shards": len(shards),
                "largest_shard_mb": f"{shard_mb:.0f}", "model_mb": f"{m['model_mb']:.0f}",
                "peak_above_baseline_mb": f"{above:.0f}",
                "overhead_mb": f"{above - m['model_mb']:.0f}",
                "overhead_per_shard": f"{(above - m['model_mb']) / shard_mb:.2f}",
                "seconds": f"{m['seconds']:.2f}",
                "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            })
            print(rows[-1])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
