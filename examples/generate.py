"""Minimal end to end: load a model, decode one prompt with a policy, print NFE and TPF.

    python examples/generate.py                       # bundled default (or a seeded stand-in)
    python examples/generate.py --model DIR --policy threshold --cache dual
"""

from __future__ import annotations

import argparse

import torch

from dllm_decode import DiffusionSampler
from dllm_decode.cli import encode_prompt, load_model_and_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--policy", default="low_confidence")
    ap.add_argument("--cache", default="none")
    ap.add_argument("--prompt", default='Please copy the list: ["Ann Lee", "Bo Kim"]')
    args = ap.parse_args()
    model, tok, desc = load_model_and_tokenizer(args.model)
    prompt = torch.tensor([encode_prompt(tok, args.prompt)])
    sampler = DiffusionSampler(model, args.policy, cache=args.cache, gen_length=32,
                               block_length=8)
    out = sampler.generate(prompt)
    print(desc)
    print(tok.decode(out.answer[0].tolist()))
    print(f"NFE {int(out.nfe[0])}, tokens/forward {32 / int(out.nfe[0]):.2f}")


if __name__ == "__main__":
    main()
