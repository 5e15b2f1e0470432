"""``dllm-decode doctor``: validate an installation on the current device.

1. **Facts**: torch / triton / CUDA versions, the GPU (name, capability, memory, native bf16),
   ``DLLM_DECODE_KERNELS`` and what ``impl="auto"`` resolves to here.
2. **Kernels**: every Triton op against its torch reference on this device
   (``kernels.selfcheck``): compiled kernels on CUDA; on a CPU-only machine the Triton
   interpreter (``TRITON_INTERPRET=1``, set by doctor when triton is installed and its
   backend is not imported yet), else reported as skipped.
3. **Decode**: one timed decode per cache mode (none, prefix, dual, window) after one warm-up,
   printed as each finishes, with milliseconds per forward. The model is random: on CUDA
   LLaDA-8B-shaped with 2 layers (hidden 4096, 32 heads, MLP 12288, vocab 126464: the 8B
   model's per-layer and vocabulary costs) in bf16, where the forward is also compared with
   its weight-streaming floor (weight bytes / this device's measured copy bandwidth);
   on a CPU the small shape in fp32 (the 8B shape there takes minutes: ``--shape llada-8b``).
4. **Graphs**: per cache mode, the static-buffer step with graphs (``samplers.graph``): three
   generations, every captured step shape's first replay checked against the eager step
   (``samplers.graph_selfcheck``), the tokens compared with graphs off. On CUDA with CUDA
   graphs; on a CPU CUDA graphs are not run, and the same capture / replay / self-check path
   runs on the CPU stand-in graph (``samplers.graph_backend.StandInGraphs``) instead.
5. **Row**: with ``--out FILE``, appends one CSV row (facts, kernel verdicts, seconds per
   cache mode, the graph verdicts) to it; without, nothing is written (the repository's record
   is ``--out benchmarks/results/doctor.csv``, passed on purpose).
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import importlib.util
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, Final

import torch

#: LLaDA-8B's layer and vocabulary shapes (reference-decoders §4.1), 2 layers instead of 32
SHAPES: Final[dict[str, dict[str, int]]] = {
    "llada-8b": {"d_model": 4096, "n_heads": 32, "mlp_hidden_size": 12288, "vocab": 126464},
    "small": {"d_model": 256, "n_heads": 4, "mlp_hidden_size": 768, "vocab": 4096},
}
CACHE_MODES: Final = ("none", "prefix", "dual", "window")
DEFAULT_OUT: Final = Path("benchmarks/results/doctor.csv")


def facts(device: torch.device) -> dict[str, str]:
    """Versions and device facts as strings."""
    from dllm_decode import kernels

    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda),
           "cuda_available": str(torch.cuda.is_available()), "device": str(device),
           "kernels_env": os.environ.get(kernels.ENV_VAR, "") or "unset"}
    try:  # the version without importing triton (the interpreter must be chosen first)
        out["triton"] = metadata.version("triton")
    except metadata.PackageNotFoundError:
        out["triton"] = "absent"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}",
                "gpu_memory_gb": f"{props.total_memory / 2**30:.1f}",
                "native_bf16": str(torch.cuda.is_bf16_supported(including_emulation=False))}
    else:
        out["gpu"] = "none"
    out["auto_impl"] = kernels.resolve_impl("auto", device).value
    return out


def _backend_status(device: torch.device) -> tuple[torch.device | None, str]:
    """(device to run Triton checks on, how) or (None, why not)."""
    from dllm_decode import kernels

    if importlib.util.find_spec("triton") is None:
        return None, "triton is not installed"
    if device.type == "cpu" and "triton" not in sys.modules:
        # decided when ``triton`` is first imported: interpret its kernels on this CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    how = kernels.triton_status(device)
    if how is None:
        return None, f"Triton kernels cannot run on {device} in this process"
    return device, how


def kernel_report(device: torch.device, dtype: torch.dtype,
                  on_row: Callable[[dict[str, str]], None] | None = None
                  ) -> list[dict[str, str]]:
    """One ``{op, status, detail}`` per op: ``ok`` / ``FAIL`` (with the error) / ``skipped``;
    ``on_row`` sees each as soon as it is known (progress)."""
    from dllm_decode.kernels import selfcheck

    where, how = _backend_status(device)
    rows = []
    for op in selfcheck.CHECKS:
        if where is None:
            rows.append({"op": op, "status": "skipped", "detail": how})
            if on_row is not None:
                on_row(rows[-1])
            continue
        start = time.perf_counter()
        # ``check`` ignores the interpreter's expected numpy warnings (and only those)
        error = selfcheck.check(op, where, dtype if where.type == "cuda" else torch.float32)
        rows.append({"op": op, "status": "ok" if error is None else "FAIL",
                     "detail": f"{how}, {time.perf_counter() - start:.2f}s" if error is None
                     else error})
        if on_row is not None:
            on_row(rows[-1])
    return rows


def random_model(shape: str, layers: int, device: torch.device, dtype: torch.dtype) -> Any:
    """A random LLaDA of ``shape`` built in place on ``device`` (no host copy of the weights)."""
    from dllm_decode.models.llada import LLaDAModel, llada_spec

    s = SHAPES[shape]
    cfg = {"model_type": "llada", "d_model": s["d_model"], "n_layers": layers,
           "n_heads": s["n_heads"], "n_kv_heads": s["n_heads"],
           "mlp_hidden_size": s["mlp_hidden_size"], "vocab_size": s["vocab"],
           "embedding_size": s["vocab"], "mask_token_id": s["vocab"] - 1,
           "eos_token_id": s["vocab"] - 2, "max_sequence_length": 4096, "rope_theta": 500000.0}
    with torch.device("meta"):
        model = LLaDAModel(llada_spec(cfg)).to(dtype)
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def say(line: str) -> None:
    """Print a progress line now (not when the buffer fills)."""
    print(line, flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Measured device copy bandwidth in bytes/s (read + write of a ``nbytes`` buffer, best of
    ``repeats`` after a warm-up; at most a quarter of the free memory)."""
    free, _ = torch.cuda.mem_get_info(device)
    n = max(1 << 20, min(nbytes, free // 4)) // 2
    src = torch.empty(n, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * src.numel() * src.element_size() / best


def weight_bytes(model: Any) -> int:
    """Bytes of every parameter (what a forward streams once; the embedding table included,
    as the 8B model's 16.03 GB in ``benchmarks/README.md`` count it)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _prompt(model: Any, device: torch.device, length: int) -> torch.Tensor:
    """``[1, length]`` seeded random prompt ids (below the mask and EOS ids)."""
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, model.vocab_size - 2, (1, length), generator=gen).to(device)


def time_decodes(model: Any, device: torch.device, prompt_length: int, gen_length: int,
                 block_length: int, steps: int,
                 on_mode: Callable[[str, float, int], None] | None = None
                 ) -> dict[str, tuple[float, int]]:
    """Seconds and NFE of one decode per cache mode (after warm-up decodes: one, and on
    CUDA two, since a step shape seen once per decode is captured as a CUDA graph in the
    second; a timed decode then only replays); ``on_mode(cache, seconds, nfe)`` sees each as
    soon as it is timed (progress)."""
    from dllm_decode.samplers.sampler import DiffusionSampler

    prompt = _prompt(model, device, prompt_length)
    out = {}
    for cache in CACHE_MODES:
        sampler = DiffusionSampler(model, "low_confidence", cache=cache, gen_length=gen_length,
                                   block_length=block_length, steps=steps)
        for _ in range(2 if device.type == "cuda" else 1):
            sampler.generate(prompt)
        _sync(device)
        start = time.perf_counter()
        result = sampler.generate(prompt)
        _sync(device)
        out[cache] = (time.perf_counter() - start, int(result.nfe[0]))
        if on_mode is not None:
            on_mode(cache, *out[cache])
    return out


def _graph_backend(device: torch.device) -> Any:
    """What captures the graphs ``graph_check`` runs: CUDA graphs on CUDA, else the stand-in."""
    from dllm_decode.samplers.graph_backend import CudaGraphs, StandInGraphs

    return CudaGraphs() if device.type == "cuda" else StandInGraphs()


def graph_check(model: Any, device: torch.device, prompt_length: int, gen_length: int,
                block_length: int, steps: int,
                on_mode: Callable[[str, str, str], None] | None = None) -> dict[str, str]:
    """Per cache mode: ``ok`` (every captured step shape passed its self-check and the tokens
    of three generations with graphs equal those without), ``FAIL``, or ``eager`` (the mode
    runs without graphs); ``on_mode(cache, verdict, detail)`` sees each as it is known."""
    from dllm_decode.samplers.graph import StepGraphs
    from dllm_decode.samplers.sampler import DiffusionSampler

    prompt = _prompt(model, device, prompt_length)
    out = {}
    log = logging.getLogger("dllm_decode.graph")
    level = log.level
    log.setLevel(logging.ERROR)  # each reason is reported here, once per mode
    try:
        for cache in CACHE_MODES:
            kw = dict(cache=cache, gen_length=gen_length, block_length=block_length, steps=steps)
            ref = DiffusionSampler(model, "low_confidence", graphs=False, **kw).generate(prompt)
            sampler = DiffusionSampler(model, "low_confidence", graphs=True, **kw)
            sampler.step_graphs = StepGraphs(capture=True, backend=_graph_backend(device))
            same, reasons = True, set()
            for _ in range(3):  # a shape seen once per generation: captured in the 2nd, replayed
                same &= torch.equal(sampler.generate(prompt).tokens, ref.tokens)
                reasons.add(sampler.graph_reason)
            stats = sampler.step_graphs.stats
            reasons.discard(None)
            if stats.captures == 0 and reasons:
                verdict, detail = "eager", f"runs without graphs: {reasons.pop()}"
            else:
                verdict = "ok" if same and stats.rejected == 0 and stats.captures else "FAIL"
                detail = (f"{stats.captures} step shapes captured, "
                          f"{stats.checked - stats.rejected} passed the self-check, "
                          f"{stats.rejected} failed; {stats.replays} replays; tokens equal "
                          f"to graphs off: {'yes' if same else 'NO'}")
                detail += "".join(f"\n      {why}" for why in sorted(reasons))
            out[cache] = verdict
            if on_mode is not None:
                on_mode(cache, verdict, detail)
    finally:
        log.setLevel(level)
    return out


def _commit() -> str:
    try:
        res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False)
        return res.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append ``row`` to the CSV at ``path`` (header written when the file is new; a row with
    columns the header lacks rewrites the file under the widened header, the earlier rows
    empty in the new columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.is_file() or path.stat().st_size == 0
    if not new:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header, rows = list(reader.fieldnames or []), list(reader)
        if set(row) - set(header):
            fields = header + [k for k in row if k not in header]
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields, restval="")
                writer.writeheader()
                writer.writerows(rows)
        row = {k: row.get(k, "") for k in (header + [k for k in row if k not in header])}
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


def run(args: argparse.Namespace) -> int:
    """The ``doctor`` subcommand; returns 1 when a kernel fails its check or a cache mode's
    graphs fail theirs."""
    from dllm_decode.models.placement import parse_dtype, resolve_device

    device = resolve_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = parse_dtype(args.dtype) if args.dtype else (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    args.shape = args.shape or ("llada-8b" if device.type == "cuda" else "small")
    info = facts(device)
    say("== facts")
    for key, value in info.items():
        say(f"  {key:<15} {value}")
    say("== kernels vs reference")
    report = kernel_report(device, dtype, on_row=lambda r: say(
        f"  {r['op']:<17} {r['status']:<8} {r['detail']}"))
    s = SHAPES[args.shape]
    say(f"== decode: random LLaDA ({args.shape}: hidden {s['d_model']}, {s['n_heads']} heads, "
        f"vocab {s['vocab']}, {args.layers} layers), {str(dtype).removeprefix('torch.')}, "
        f"prompt {args.prompt_length}, gen {args.gen_length}, {args.steps} steps")
    model = random_model(args.shape, args.layers, device, dtype)
    floor = None
    if device.type == "cuda":
        bandwidth = copy_bandwidth(device)
        floor = weight_bytes(model) / bandwidth
        say(f"  weights {weight_bytes(model) / 1e9:.2f} GB, copy bandwidth "
            f"{bandwidth / 1e12:.2f} TB/s: weight-streaming floor {floor * 1e3:.3f} ms/forward")

    def report_mode(cache: str, seconds: float, nfe: int) -> None:
        per = seconds / max(nfe, 1)
        ratio = f"  {per / floor:5.1f}x the floor" if floor else ""
        say(f"  cache={cache:<7} {seconds:8.3f}s  NFE={nfe}  {per * 1e3:9.3f} ms/forward"
            f"{ratio}  {args.gen_length / seconds:8.1f} gen tokens/s (EOS fill included)")

    timings = time_decodes(model, device, args.prompt_length, args.gen_length,
                           args.block_length, args.steps, on_mode=report_mode)
    backend = _graph_backend(device)
    if device.type == "cuda":
        say("== CUDA graph self-check per cache mode (each step shape's first replay vs the "
            "eager step; tokens vs graphs off)")
    else:
        say(f"== CUDA graph self-check: not run (no CUDA device; graphs are captured on CUDA "
            f"only). The same capture / replay / self-check on the CPU {backend.name} graph "
            f"(recorded ops replayed), per cache mode:")
    graphs = graph_check(model, device, args.prompt_length, args.gen_length, args.block_length,
                         args.steps, on_mode=lambda cache, verdict, detail: say(
                             f"  cache={cache:<7} {verdict:<6} {detail}"))
    row: dict[str, Any] = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(), **{k: info.get(k, "") for k in
                                ("device", "gpu", "torch", "triton", "cuda")},
        "dtype": str(dtype).removeprefix("torch."), "shape": args.shape, "layers": args.layers,
        "prompt": args.prompt_length, "gen": args.gen_length, "steps": args.steps,
        "kernels_ok": sum(r["status"] == "ok" for r in report),
        "kernels_failed": ";".join(r["op"] for r in report if r["status"] == "FAIL"),
        "kernels_skipped": sum(r["status"] == "skipped" for r in report),
        **{f"s_{cache}": f"{seconds:.4f}" for cache, (seconds, _) in timings.items()},
        "nfe": timings["none"][1],
        "graphs": f"{backend.name}:" + ",".join(f"{c}={v}" for c, v in graphs.items()),
    }
    if args.out:
        append_row(Path(args.out), row)
        say(f"== row appended to {args.out}")
    else:
        say("== no row written (pass --out FILE.csv to append one)")
    failed = any(r["status"] == "FAIL" for r in report) or "FAIL" in graphs.values()
    return 1 if failed else 0


def add_doctor_subcommand(sub: Any) -> None:
    """Register ``dllm-decode doctor``."""
    p = sub.add_parser("doctor", help="check this installation: versions, kernels vs "
                                      "reference, one timed decode per cache mode")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--shape", default=None, choices=sorted(SHAPES),
                   help="llada-8b (default on CUDA): ~3 GB of bf16 weights with 2 layers; "
                        "small (default on CPU): seconds")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prompt-length", type=int, default=64)
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--out", default=None, metavar="CSV",
                   help=f"append the row to this CSV (the repository's record: {DEFAULT_OUT}); "
                        "default: write nothing")
    p.set_defaults(func=run)
