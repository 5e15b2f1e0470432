"""Ahead-of-time compile every kernel variant for NVIDIA targets, without a GPU.

``python -m dllm_decode.kernels.triton.aot [--arch 90 80] [--json]`` compiles each variant
with ``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", arch, 32))``
and, when the ``ptxas-blackwell`` bundled with the Triton wheel is present, runs it with ``-v``
on the PTX to report registers and spills. This catches GPU-only compile errors (dot shape
rules, layouts) that the interpreter accepts. Must run with ``TRITON_INTERPRET`` unset: the
interpreter replaces ``@triton.jit`` functions at definition time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Triton signature types of the torch dtypes used here
_PTR = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16", "fp64": "*fp64", "i64": "*i64",
        "i32": "*i32", "bool": "*i1"}


@dataclass(frozen=True)
class Variant:
    """One compiled specialisation: kernel, argument types, constexpr values, launch warps."""

    name: str
    kernel: Any
    types: dict[str, str]  # non-default argument types ("i32" otherwise)
    constexprs: dict[str, Any]
    num_warps: int
    options: tuple[tuple[str, Any], ...] = ()  # extra compile options, e.g. no FMA contraction
    core: bool = False  # in the quick subset: the most demanding variant of each kernel


def _signature(kernel: Any, types: dict[str, str], constexprs: dict[str, Any]) -> dict[str, str]:
    return {name: "constexpr" if name in constexprs else types.get(name, "i32")
            for name in kernel.arg_names}


def variants() -> list[Variant]:
    """The variants the launchers pick for typical shapes (same heuristics as at run time)."""
    import torch

    from dllm_decode.kernels.common import attention_blocks, kv_write_blocks, vocab_blocks
    from dllm_decode.kernels.triton.attention import _block_attention_kernel
    from dllm_decode.kernels.triton.kv_write import _kv_write_kernel
    from dllm_decode.kernels.triton.vocab import (
        NOISE_OFF,
        NOISE_PHILOX,
        NOISE_ROWS,
        NOISE_TENSOR,
        _vocab_kernel,
    )

    out: list[Variant] = []
    vocab_cases = [  # name, logits dtype, rows, V, stats, noise, active
        ("stats_fp32_V126k", "fp32", 32, 126464, True, NOISE_OFF, False),
        ("stats_bf16_V152k", "bf16", 32, 152064, True, NOISE_OFF, True),
        ("stats_fp16_V50_packed", "fp16", 4096, 50, True, NOISE_OFF, True),
        ("propose_philox_bf16_V126k", "bf16", 32, 126464, True, NOISE_PHILOX, False),
        ("gumbel_philox_fp32_V8_packed", "fp32", 8192, 8, False, NOISE_PHILOX, False),
        ("gumbel_noise_fp32_V126k", "fp32", 32, 126464, False, NOISE_TENSOR, True),
        ("propose_rows_bf16_V126k", "bf16", 32, 126464, True, NOISE_ROWS, False),
        ("gumbel_rows_fp32_V8_packed", "fp32", 8192, 8, False, NOISE_ROWS, True),
    ]
    for name, dt, rows, vocab, stats, noise, active in vocab_cases:
        block_r, block_v, warps = vocab_blocks(rows, vocab, noise != NOISE_OFF)
        types = {"x_ptr": _PTR[dt], "active_ptr": _PTR["bool"], "noise_ptr": _PTR["fp64"],
                 "seed_ptr": _PTR["i64"], "token_ptr": _PTR["i64"], "sample_ptr": _PTR["i64"],
                 "out_ptr": _PTR["fp32"], "temperature": "fp32", "offset": "i64",
                 "seed_inner": "i32"}
        const = {"HAS_ACTIVE": active, "STATS": stats, "NOISE": noise, "BLOCK_R": block_r,
                 "BLOCK_V": block_v}
        core = name == "propose_philox_bf16_V126k"
        out.append(Variant(f"vocab/{name}", _vocab_kernel, types, const, warps, core=core))

    attn_cases = [  # name, dtype, Lq, D, has_new, q_start, new_mask, kv_mask, lse
        ("bf16_D128_Lq32_cache", "bf16", 32, 128, False, False, False, False, False),
        ("bf16_D128_Lq64_all", "bf16", 64, 128, True, True, True, True, True),
        ("fp16_D128_Lq32_fresh", "fp16", 32, 128, True, False, True, False, False),
        ("fp16_D64_Lq32_dual", "fp16", 32, 64, True, True, False, False, True),
        ("fp32_D64_Lq32_all", "fp32", 32, 64, True, True, True, True, True),
        ("fp32_D128_Lq7", "fp32", 7, 128, False, False, False, True, False),
    ]
    torch_dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    for name, dt, q_len, head_dim, new, q_start, new_mask, kv_mask, lse in attn_cases:
        block_m, block_n, block_d, warps = attention_blocks(q_len, head_dim, torch_dt[dt])
        types = {n: _PTR[dt] for n in ("q_ptr", "k_ptr", "v_ptr", "kn_ptr", "vn_ptr", "o_ptr")}
        types.update({"lse_ptr": _PTR["fp32"], "kv_start_ptr": _PTR["i32"],
                      "kv_end_ptr": _PTR["i32"], "q_start_ptr": _PTR["i32"],
                      "new_mask_ptr": _PTR["bool"], "kv_mask_ptr": _PTR["bool"],
                      "qk_scale": "fp32"})
        const = {"HAS_NEW": new, "HAS_Q_START": q_start, "HAS_NEW_MASK": new_mask,
                 "HAS_KV_MASK": kv_mask, "RETURN_LSE": lse,
                 "DOT_PRECISION": "ieee" if dt == "fp32" else "tf32",
                 "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": block_d}
        out.append(Variant(f"attention/{name}", _block_attention_kernel, types, const, warps,
                           core=name == "bf16_D128_Lq64_all"))

    for dt, n_new, head_dim in (("bf16", 32, 128), ("fp16", 7, 64)):
        block_t, block_d, warps = kv_write_blocks(n_new, head_dim)
        for mode, rope in ((0, 0), (1, 1), (2, 2)):
            types = {"kc_ptr": _PTR[dt], "vc_ptr": _PTR[dt], "kn_ptr": _PTR[dt],
                     "vn_ptr": _PTR[dt], "pos_ptr": _PTR["i64"], "cos_ptr": _PTR["fp32"],
                     "sin_ptr": _PTR["fp32"]}
            const = {"POS_MODE": mode, "ROPE": rope, "BLOCK_T": block_t, "BLOCK_D": block_d}
            out.append(Variant(f"kv_write/{dt}_pos{mode}_rope{rope}_D{head_dim}",
                               _kv_write_kernel, types, const, warps,
                               (("enable_fp_fusion", False),), core=rope == 2 and dt == "bf16"))

    from dllm_decode.kernels.triton.layer import _qkv_rope_kernel, _silu_mul_kernel, layer_blocks

    for name, dt, heads, kv_heads, head_dim, norm, write in (  # the fused layer ops
            ("llada8b_bf16_write", "bf16", 32, 32, 128, False, True),
            ("sdar8b_bf16_norm_write", "bf16", 32, 8, 128, True, True),
            ("dream7b_fp16_norope_write", "fp16", 28, 4, 128, False, False),
            ("fp32_D64_norm", "fp32", 4, 2, 64, True, False)):
        block_h, block_half, warps = layer_blocks(heads + (2 if write else 1) * kv_heads,
                                                  head_dim)
        types = {"x_ptr": _PTR[dt], "cos_ptr": _PTR["fp32"], "sin_ptr": _PTR["fp32"],
                 "qw_ptr": _PTR[dt], "kw_ptr": _PTR[dt], "kc_ptr": _PTR[dt], "vc_ptr": _PTR[dt],
                 "slot_ptr": _PTR["i64"], "eps": "fp32"}
        const = {"NORM": norm, "WRITE": write, "BLOCK_H": block_h, "BLOCK_HALF": block_half}
        out.append(Variant(f"qkv_rope/{name}", _qkv_rope_kernel, types, const, warps,
                           (("enable_fp_fusion", False),), core=name.startswith("sdar")))
    for dt in ("bf16", "fp32"):
        types = {"x_ptr": _PTR[dt], "out_ptr": _PTR[dt]}
        out.append(Variant(f"silu_mul/{dt}", _silu_mul_kernel, types, {"BLOCK": 1024}, 4,
                           core=dt == "bf16"))
    from dllm_decode.kernels.triton.rng import _BLOCK, _row_uniform_kernel

    out.append(Variant("rng/row_uniform", _row_uniform_kernel,
                       {"seed_ptr": _PTR["i64"], "out_ptr": _PTR["fp64"]}, {"BLOCK": _BLOCK}, 4))
    return out


def _ptxas() -> Path | None:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas-blackwell"
    return path if path.exists() else None


def _parse_ptxas(log: str) -> dict[str, int] | None:
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if regs is None or spills is None:
        return None
    return {"registers": int(regs.group(1)), "spill_stores": int(spills.group(1)),
            "spill_loads": int(spills.group(2))}


def _ptxas_report(ptxas: Path, ptx: str, arch: int) -> dict[str, int] | None:
    """Registers and spill bytes from ``ptxas-blackwell -v`` on the PTX."""
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([str(ptxas), "-v", f"--gpu-name={gpu}", str(src), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True,
                             check=True)
    return _parse_ptxas(res.stdout + res.stderr)


def compile_all(archs: tuple[int, ...] = (90, 80), core_only: bool = False
                ) -> list[dict[str, Any]]:
    """Compile every variant (or the ``core`` subset) for each ``sm_<arch>``; one result dict
    per (variant, arch) with ``ok``, ``error``, ``shared`` bytes and, when ``ptxas-blackwell``
    is bundled, ``registers``, ``spill_stores`` and ``spill_loads`` bytes."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile-only needs TRITON_INTERPRET unset")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptxas = _ptxas()
    results = []
    for var in variants():
        if core_only and not var.core:
            continue
        sig = _signature(var.kernel, var.types, var.constexprs)
        for arch in archs:
            row: dict[str, Any] = {"name": var.name, "arch": arch, "num_warps": var.num_warps}
            start = time.perf_counter()
            try:
                src = ASTSource(var.kernel, sig, var.constexprs)
                options = {"num_warps": var.num_warps, **dict(var.options)}
                compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                          options=options)
                row.update(ok=True, shared=compiled.metadata.shared, error="")
                if ptxas is not None:
                    row.update(_ptxas_report(ptxas, compiled.asm["ptx"], arch) or {})
            except Exception as err:  # report every failing variant, not just the first
                row.update(ok=False, error=f"{type(err).__name__}: {err}"[:2000])
            row["seconds"] = round(time.perf_counter() - start, 2)
            results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    parser.add_argument("--core", action="store_true", help="only the most demanding variants")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    args = parser.parse_args(argv)
    results = compile_all(tuple(args.arch), core_only=args.core)
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            detail = (f"shared={r.get('shared')}B regs={r.get('registers')} "
                      f"spills={r.get('spill_stores')}/{r.get('spill_loads')}"
                      if r["ok"] else r["error"])
            print(f"sm_{r['arch']} {r['name']:<45} {'ok ' if r['ok'] else 'FAIL'} {detail} "
                  f"({r['seconds']}s)")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
