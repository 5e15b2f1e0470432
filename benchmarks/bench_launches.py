"""Kernel launches per decoder layer, per family x cache mode x path.

Counted on the CPU with the torch profiler (``dllm_decode.diagnostics.launches``): every layer
call of a batch-1 decode (prompt 4, gen 8, block 4, ``low_confidence``; the cache refreshes
and the cached steps alike). Paths:

* ``reference``: the torch path (what a CPU runs), fp32 and bf16;
* ``cuda-auto``: what ``impl="auto"`` runs on CUDA (``kernels.AUTO_ON_CUDA``): SDPA and the
  Triton layer ops, the Triton kernels run in the interpreter (fp32) and counted as launches.

Rows (benchmark schema, ``results/launches.csv``): metric ``launches_per_layer_max`` and
``launches_per_layer_mean`` (unit ``kernels``; p20 = p50 = p80), ``provider`` = path,
``name`` = family/dtype. ``--label`` overrides the commit column (``before``: main's layers
counted with this counter).

    python benchmarks/bench_launches.py [--label L] [--out benchmarks/results/launches.csv]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():  # Triton kernels run in the interpreter here
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dllm_decode.bench import environment, write_csv  # noqa: E402
from dllm_decode.diagnostics.launches import layer_launches  # noqa: E402
from dllm_decode.models.loading import build_model  # noqa: E402
from dllm_decode.types import Impl  # noqa: E402

#: small configs of each family (GQA for the Qwen-style ones, q/k norm for SDAR)
CONFIGS = {
    "llada": {"model_type": "llada", "d_model": 64, "n_layers": 2, "n_heads": 4,
              "n_kv_heads": 4, "mlp_hidden_size": 128, "vocab_size": 256,
              "embedding_size": 256, "mask_token_id": 255, "eos_token_id": 254,
              "max_sequence_length": 256},
    "dream": {"model_type": "Dream", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
              "vocab_size": 256, "mask_token_id": 255, "eos_token_id": 254,
              "pad_token_id": 254, "max_position_embeddings": 256},
    "sdar": {"model_type": "sdar", "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
             "head_dim": 16, "qk_norm": True, "block_size": 4, "vocab_size": 256,
             "mask_token_id": 255, "eos_token_id": 254, "pad_token_id": 254,
             "max_position_embeddings": 256},
}
MODES = {"llada": ("none", "prefix", "dual"), "dream": ("none", "prefix", "dual"),
         "sdar": ("none", "block_causal")}


def rows(label: str | None) -> list[dict]:
    env = environment()
    fused = hasattr(build_model(CONFIGS["llada"]), "layer_impl")
    paths = [("reference", torch.float32), ("reference", torch.bfloat16)]
    if fused:
        paths.append(("cuda-auto", torch.float32))
    out = []
    for family, config in CONFIGS.items():
        for provider, dtype in paths:
            model = build_model(config, seed=0).to(dtype)
            if provider == "cuda-auto":
                model.layer_impl, model.attn_impl = Impl.TRITON, Impl.REFERENCE
            for mode in MODES[family]:
                count = layer_launches(model, mode, prompt_length=4, gen_length=8,
                                       block_length=4)
                for metric, value in (("launches_per_layer_max", count.max),
                                      ("launches_per_layer_mean", count.mean)):
                    out.append(dict(
                        suite="launches", name=f"{family}/{str(dtype).removeprefix('torch.')}",
                        provider=provider, policy="low_confidence", cache=mode, B=1, P=4, G=8,
                        K=4, V=config["vocab_size"], metric=metric, unit="kernels", p20=value,
                        p50=value, p80=value, device=env.device, torch=env.torch,
                        triton=env.triton, commit=label or env.commit, timestamp=env.timestamp))
                print(f"{family:<6} {mode:<13} {provider:<10} {dtype}: max {count.max} "
                      f"mean {count.mean:.2f}  {count.by_op}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default=None, help="commit column (default: git HEAD)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/launches.csv"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    write_csv(rows(args.label), args.out)
    print(f"rows appended to {args.out}")


if __name__ == "__main__":
    main()
