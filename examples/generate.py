"""Minimal end to end: load a model and its tokenizer, decode prompts as text, print NFE.

    python examples/generate.py                                  # bundled tiny-llada, CPU
    python examples/generate.py --model GSAI-ML/LLaDA-8B-Instruct --device cuda \\
        --policy threshold --cache dual --prompt "Why is the sky blue?" --gen-length 256

The default prompts are Waiting Line tasks in the format the bundled checkpoints were trained
on (they are task models, not chat models): the answer is the list, copied.
"""

from __future__ import annotations

import argparse

from dllm_decode import DiffusionSampler, generate_text, load_model, load_tokenizer
from dllm_decode.policies.defaults import apply_family_default
from dllm_decode.speed import TPF_UNIT, generation_tpf

#: the training prompt format of the bundled checkpoints (ParallelBench Waiting Line, copy)
WAITING_LINE = (
    "You are managing a waiting line at a customer service desk.\n"
    "You need to record the following people in the order they arrived:\n"
    "{people}\n"
    "Please copy the list exactly and provide only the final list.\n"
)
PROMPTS = [
    WAITING_LINE.format(people='["Maya Doyle", "Ivan Bennett", "Pedro Lindqvist"]'),
    WAITING_LINE.format(people='["Ivan Bennett", "Maya Doyle"]'),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-llada", help="directory, Hub id or bundled name")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--policy", default=None, help="default: the model family's preset")
    ap.add_argument("--cache", default=None, help="default: the family's / policy's cache")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--block-length", type=int, default=None)
    ap.add_argument("--prompt", action="append", default=None, help="repeat for a batch")
    args = ap.parse_args()
    model = load_model(args.model, dtype=args.dtype, device=args.device)
    tok = load_tokenizer(args.model)
    # no --policy: the family's preset with its settings (llada2 on LLaDA2, gemma_renoise on
    # DiffusionGemma, ...); block_length None: one block of G, or the model's own block size
    policy, params, cache = apply_family_default(model, args.policy, None, args.cache)
    sampler = DiffusionSampler(model, policy, cache=cache, gen_length=args.gen_length,
                               block_length=args.block_length, **params)
    out = generate_text(sampler, tok, args.prompt or PROMPTS)
    for text in out.texts:
        print(text)
    tpf, _ = generation_tpf(out.generation, out.stop_token_ids)  # answer tokens up to EOS
    print(f"NFE per prompt {out.generation.nfe.tolist()}, {TPF_UNIT} {tpf:.2f}")


if __name__ == "__main__":
    main()
