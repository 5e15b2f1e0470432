"""One prompt through several policies and cache modes: NFE and tokens per forward.

    python examples/compare_policies.py --model DIR
"""

from __future__ import annotations

import argparse
import time

import torch

from dllm_decode import DiffusionSampler
from dllm_decode.cli import encode_prompt, load_model_and_tokenizer

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
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt", default='Please reverse the list: ["Ann Lee", "Bo Kim", "Cy Roe"]')
    ap.add_argument("--gen-length", type=int, default=32)
    args = ap.parse_args()
    model, tok, desc = load_model_and_tokenizer(args.model)
    prompt = torch.tensor([encode_prompt(tok, args.prompt)])
    print(desc)
    print(f"{'policy':<18} {'cache':<6} {'NFE':>4} {'TPF':>5} {'ms':>7}  text")
    for policy, cache, params in RUNS:
        if model.attention == "block_causal" and cache != "none":
            cache = "block_causal"
        s = DiffusionSampler(model, policy, cache=cache, gen_length=args.gen_length,
                             block_length=8, **params)
        t0 = time.perf_counter()
        out = s.generate(prompt)
        ms = (time.perf_counter() - t0) * 1e3
        nfe = int(out.nfe[0])
        text = tok.decode(out.answer[0].tolist())[:40].replace("\n", " ")
        print(f"{policy:<18} {cache:<6} {nfe:>4} {args.gen_length / nfe:>5.2f} {ms:>7.1f}  {text}")


if __name__ == "__main__":
    main()
