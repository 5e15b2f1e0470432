"""One prompt through several policies and cache modes: answer, NFE and tokens per forward.

    python examples/compare_policies.py                         # bundled tiny-llada, CPU
    python examples/compare_policies.py --model tiny-sdar        # block diffusion
    python examples/compare_policies.py --model GSAI-ML/LLaDA-8B-Instruct --device cuda \\
        --prompt "Why is the sky blue?" --gen-length 256
"""

from __future__ import annotations

import argparse
import time

from dllm_decode import DiffusionSampler, generate_text, load_model, load_tokenizer

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
    block = args.block_length or model.block_size or args.gen_length
    print(args.model)
    print(f"{'policy':<18} {'cache':<12} {'NFE':>4} {'TPF':>5} {'ms':>7}  answer")
    for policy, cache, params in RUNS:
        if model.attention == "block_causal" and cache != "none":
            cache = "block_causal"
        sampler = DiffusionSampler(model, policy, cache=cache, gen_length=args.gen_length,
                                   block_length=block, **params)
        t0 = time.perf_counter()
        out = generate_text(sampler, tok, args.prompt)
        ms = (time.perf_counter() - t0) * 1e3
        nfe = int(out.generation.nfe[0])
        text = out.texts[0].replace("\n", " ")
        print(f"{policy:<18} {cache:<12} {nfe:>4} {args.gen_length / nfe:>5.2f} {ms:>7.1f}  {text}")


if __name__ == "__main__":
    main()
