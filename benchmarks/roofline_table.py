"""Print the H100 roofline projection table for LLaDA-8B and Dream-7B (an estimate).

    python benchmarks/roofline_table.py
"""

from __future__ import annotations

from dllm_decode.roofline import DREAM_7B, H100_SXM, LLADA_8B, forward_seconds, generation_seconds


def main() -> None:
    print("| model | forward | B | query rows | total ms | linear | LM head | attention |")
    print("|---|---|---|---|---|---|---|---|")
    for arch in (LLADA_8B, DREAM_7B):
        for label, b, q in (("no cache", 1, 768), ("prefix", 1, 160), ("dual", 1, 32),
                            ("dual", 8, 32), ("dual", 32, 32)):
            f = forward_seconds(arch, H100_SXM, b, q, 768, 32)
            print(f"| {arch.name} | {label} | {b} | {q} | {f['total'] * 1e3:.2f} | "
                  f"{f['linear'] * 1e3:.2f} | {f['head'] * 1e3:.2f} | "
                  f"{f['attention'] * 1e3:.2f} |")
    print()
    print("| model | steps/block | none s | prefix s (x) | dual s (x) |")
    print("|---|---|---|---|---|")
    for arch in (LLADA_8B, DREAM_7B):
        for s in (8, 32):
            kw = dict(batch=1, prompt=512, gen=256, block=32, steps_per_block=s)
            t = {c: generation_seconds(arch, H100_SXM, cache=c, **kw)
                 for c in ("none", "prefix", "dual")}
            print(f"| {arch.name} | {s} | {t['none']:.2f} | {t['prefix']:.2f} "
                  f"({t['none'] / t['prefix']:.1f}x) | {t['dual']:.2f} "
                  f"({t['none'] / t['dual']:.1f}x) |")


if __name__ == "__main__":
    main()
