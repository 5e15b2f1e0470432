"""One prompt through several policies and cache modes: answer, NFE and tokens per forward
(answer tokens up to EOS per forward, as ``dllm-decode generate`` prints it).

    python examples/compare_policies.py                         # bundled tiny-llada, CPU
    python examples/compare_policies.py --model tiny-sdar        # block diffusion
    python examples/compare_policies.py --model GSAI-ML/LLaDA-8B-Instruct --device cuda \\
        --prompt "Why is the sky blue?" --gen-length 256
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from dllm_decode import DiffusionSampler, generate_text, load_model, load_tokenizer
from dllm_decode.speed import TPF_MEANING, TPF_UNIT, generation_tpf

#: the training prompt format of the bundled checkpoints (ParallelBench Waiting Line, copy)
PROMPT = (
    "You are managing a waiting line at a customer service desk.\n"
    "You need to record the following people in the order they arrived:\n"
    '["Maya Doyle", "Ivan Bennett", "Pedro Lindqvist"]\n'
    "Please copy the list exactly and provide only the final list.\n"
)

RUNS = [
    ("low_confidence", "none", {}),
    ("low_confidence", "dual", {}),
    ("threshold", "none", {"tau": 0.9}),
    ("threshold", "dual", {"tau": 0.9}),
    ("factor", "none", {"factor": 1.0}),
    ("eb", "none", {"gamma": 0.1}),
    ("entropy_threshold", "none", {"theta": 0.5}),
]


def compare(model: Any, tok: Any, prompt: str, gen_length: int, block_length: int | None = None,
            runs: list[tuple[str, str, dict[str, Any]]] = RUNS) -> list[dict[str, Any]]:
    """One row per (policy, cache): NFE, tokens per forward (answer tokens up to EOS per
    forward, as ``dllm-decode generate`` prints it), milliseconds and the answer."""
    block = block_length or model.block_size or gen_length
    rows = []
    for policy, cache, params in runs:
        if model.attention == "block_causal" and cache != "none":
            cache = "block_causal"
        sampler = DiffusionSampler(model, policy, cache=cache, gen_length=gen_length,
                                   block_length=block, **params)
        t0 = time.perf_counter()
        out = generate_text(sampler, tok, prompt)
        ms = (time.perf_counter() - t0) * 1e3
        tpf, _ = generation_tpf(out.generation, out.stop_token_ids)
        rows.append({"policy": policy, "cache": cache, "nfe": int(out.generation.nfe[0]),
                     "tpf": tpf, "ms": ms, "answer": out.texts[0].replace("\n", " ")})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-llada", help="directory, Hub id or bundled name")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--block-length", type=int, default=None)
    args = ap.parse_args()
    model = load_model(args.model, dtype=args.dtype, device=args.device)
    tok = load_tokenizer(args.model)
    print(f"{args.model} ({TPF_UNIT}: {TPF_MEANING})")
    print(f"{'policy':<18} {'cache':<12} {'NFE':>4} {TPF_UNIT:>14} {'ms':>7}  answer")
    for r in compare(model, tok, args.prompt, args.gen_length, args.block_length):
        print(f"{r['policy']:<18} {r['cache']:<12} {r['nfe']:>4} {r['tpf']:>14.2f} "
              f"{r['ms']:>7.1f}  {r['answer']}")


if __name__ == "__main__":
    main()
