"""Loop overhead per decode step: model forward vs the work around it, per cache mode and policy.

For every (model, cache mode, policy family) cell: thread CPU ms per step inside the model
forward and outside it, and top-level aten ops per step outside the forward (torch.profiler;
every op is a kernel launch on a GPU). Models: the bundled ``tiny-llada`` (2 layers, d=256)
and ``tiny-sdar`` (block-causal), and the 4-layer d=256 random model of ``bench_decode.py``
(``--models``). ``--compile`` adds ``DiffusionSampler(compile=True)`` rows; ``--scaling``
writes the G-scaling table (forward attention vs rest, refresh, loop per generated token).
``--step-programs`` times the three programs of "the work after the forward" on the same cells
(``fused``: ``samplers.fused.fused_step``, the eager default for ``TopK(prob)`` /
``Threshold(prob)``; ``generic``: ``samplers.step.post_forward``, every policy; ``static``:
``samplers.static_step`` run eagerly on its static buffers, ``graphs=True``, what a CUDA graph
captures), with their tokens checked equal (``step_programs.csv``).
``--reference`` compares the whole decode with the public reference loops on the same weights
(LLaDA ``generate``, Fast-dLLM's three loops, Dream ``diffusion_generate``; tokens must be
identical; ``overhead_reference.py``); they run only where ``DLLM_REF_PYTHON`` names a Python
with transformers 4.46.2 and ``DLLM_REF_SRC`` the directory holding their public code,
otherwise the comparison is skipped and the reason printed.

    OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py --models tiny bench4
    OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py --scaling --gen-length 128 256 512 1024
    OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py --step-programs --models tiny bench4 \
        --policies low_confidence threshold
    OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py --reference --models conformance tiny \
        bench4 --gen-length 64 --block-length 16
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dllm_decode.bench import BENCH_CONFIG, environment, write_csv
from dllm_decode.models.loading import build_model, load_model
from dllm_decode.overhead import measure_overhead
from dllm_decode.samplers import mask_setup
from dllm_decode.samplers.sampler import DiffusionSampler

RESULTS = Path(__file__).parent / "results"

#: policy family -> (preset, params); budgeted ones run one token per step
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "low_confidence": ("low_confidence", {}),
    "threshold": ("threshold", {"tau": 0.9}),
    "entropy": ("entropy", {}),
    "sched": ("sched", {}),
}
#: block-diffusion twin of BENCH_CONFIG (SDAR layout, blocks of 4)
SDAR_BENCH: dict[str, Any] = {
    "model_type": "sdar", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 768, "vocab_size": 4096,
    "mask_token_id": 4095, "eos_token_id": 4094, "max_position_embeddings": 4096,
    "block_size": 4, "rope_theta": 10000.0, "qk_norm": True,
}


def models(names: list[str]) -> list[tuple[str, Any, Any]]:
    """``(name, bidirectional model, block-causal model)`` per requested size."""
    out = []
    for name in names:
        if name == "tiny":
            out.append(("tiny", load_model("tiny-llada"), load_model("tiny-sdar")))
        elif name == "bench4":
            out.append(("4L-d256", build_model(BENCH_CONFIG, seed=0),
                        build_model(SDAR_BENCH, seed=0)))
        else:
            raise SystemExit(f"unknown model {name!r} (tiny, bench4)")
    return out


def reference_env() -> tuple[bool, str]:
    """Whether the reference decoders can run, and why not (``overhead_reference``)."""
    from overhead_reference import reference_env as probe

    return probe()


#: step program -> ``DiffusionSampler`` keywords (``generic``: the fused step switched off)
STEP_PROGRAMS: dict[str, dict[str, Any]] = {
    "fused": {"graphs": False}, "generic": {"graphs": False}, "static": {"graphs": True},
}


def cell_rows(env: Any, model_name: str, model: Any, cache: str, family: str,
              compile_: bool, g: int, block: int, repeats: int, program: str | None = None
              ) -> tuple[list[dict], Any, torch.Tensor]:
    preset, params = POLICIES[family]
    torch.manual_seed(0)
    vocab = model.vocab_size
    prompt = torch.randint(3, min(vocab, 1000), (1, 32))
    steps = {"steps": g} if family in ("low_confidence", "entropy", "sched") else {}

    def make(m: Any) -> DiffusionSampler:
        kw = dict(params, **STEP_PROGRAMS.get(program, {}))
        if compile_:
            kw["compile"] = True
        block_kw = {} if cache == "block_causal" else {"block_length": block}
        return DiffusionSampler(m, preset, cache=cache, gen_length=g, **block_kw, **steps, **kw)

    with _generic_step(program == "generic"):
        o = measure_overhead(make, model, prompt, repeats=repeats)
        tokens = make(model).generate(prompt).tokens
    name = f"{model_name}{'+compile' if compile_ else ''}"
    base = dict(suite="overhead", name=name, provider="dllm_decode", policy=family, cache=cache,
                B=1, P=prompt.shape[1], G=g, K=block, V=vocab, device=env.device,
                torch=env.torch, triton=env.triton, commit=env.commit, timestamp=env.timestamp)
    if program is not None:  # the fixed row schema has no column for it: the provider names it
        base["provider"] = f"dllm_decode:{program}_step"
    rows = []
    for metric, unit, v in (("model_per_step", "ms", o.model_ms),
                            ("loop_per_step", "ms", o.loop_ms),
                            ("loop_ops_per_step", "ops", o.loop_ops),
                            ("loop_kernels_per_step", "ops", o.loop_kernels),
                            ("steps", "count", o.steps), ("forwards", "count", o.forwards)):
        rows.append({**base, "metric": metric, "unit": unit, "p20": v, "p50": v, "p80": v})
    return rows, o, tokens


@contextlib.contextmanager
def _generic_step(on: bool) -> Iterator[None]:
    """Switch ``samplers.fused`` off (every step runs ``post_forward``) while ``on``."""
    if not on:
        yield
        return
    real = mask_setup.span_selector
    mask_setup.span_selector = lambda *args, **kwargs: None
    try:
        yield
    finally:
        mask_setup.span_selector = real


def step_program_rows(env: Any, args: Any) -> list[dict]:
    """Every cell once per step program; the tokens must agree across programs."""
    rows: list[dict] = []
    print("| model | cache | policy | step program | loop ms/step | loop ops/step |")
    print("|---|---|---|---|---|---|")
    for name, bidir, causal in models(args.models):
        for cache in args.caches:
            model = causal if cache == "block_causal" else bidir
            for family in args.policies:
                tokens = {}
                for program in STEP_PROGRAMS:
                    rs, o, tokens[program] = cell_rows(env, name, model, cache, family, False,
                                                       args.gen_length[0], args.block_length,
                                                       args.repeats, program)
                    rows += rs
                    print(f"| {name} | {cache} | {family} | {program} | {o.loop_ms:.3f} | "
                          f"{o.loop_ops:.1f} |", flush=True)
                if any(not torch.equal(t, tokens["generic"]) for t in tokens.values()):
                    raise SystemExit(f"{name} {cache} {family}: the step programs disagree")
    return rows


def scaling_rows(env: Any, gens: list[int], repeats: int) -> list[dict]:
    """G-scaling of threshold 0.9 + dual cache on the 4-layer model, per generated token."""
    model = build_model(BENCH_CONFIG, seed=0)
    prompt = torch.randint(3, 1000, (1, 128), generator=torch.Generator().manual_seed(0))
    rows = []
    print("| G | steps | ms/token | attention | forward rest | refresh | loop | loop ms/step |"
          " loop ops/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for g in gens:
        def make(m: Any, g: int = g) -> DiffusionSampler:
            return DiffusionSampler(m, "threshold", cache="dual", tau=0.9, gen_length=g,
                                    block_length=32)

        o = measure_overhead(make, model, prompt, repeats=repeats)
        per_tok = o.steps / g  # per-step ms -> per-token ms
        attention = o.attention_ms * per_tok
        rest = (o.model_ms - o.refresh_ms - o.attention_ms) * per_tok
        refresh, loop = o.refresh_ms * per_tok, o.loop_ms * per_tok
        total = 1e3 * o.total_s / g
        print(f"| {g} | {o.steps} | {total:.2f} | {attention:.2f} | {rest:.2f} | {refresh:.2f} |"
              f" {loop:.2f} | {o.loop_ms:.3f} | {o.loop_ops:.1f} |")
        base = dict(suite="overhead_scaling", name="4L-d256", provider="dllm_decode",
                    policy="threshold", cache="dual", B=1, P=128, G=g, K=32, V=4096,
                    device=env.device, torch=env.torch, triton=env.triton, commit=env.commit,
                    timestamp=env.timestamp)
        for metric, v in (("per_token", total), ("attention_per_token", attention),
                          ("forward_rest_per_token", rest), ("refresh_per_token", refresh),
                          ("loop_per_token", loop), ("loop_per_step", o.loop_ms)):
            rows.append({**base, "metric": metric, "unit": "ms", "p20": v, "p50": v, "p80": v})
        rows.append({**base, "metric": "loop_ops_per_step", "unit": "ops", "p20": o.loop_ops,
                     "p50": o.loop_ops, "p80": o.loop_ops})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["name"], r["cache"], r["policy"]) for r in rows
                    if r["suite"] == "overhead"})
    get = {(r["name"], r["cache"], r["policy"], r["metric"]): r["p50"] for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(12, max(3.0, 0.28 * len(cells) + 1)))
    labels = [f"{n} {c} {p}" for n, c, p in cells]
    y = list(range(len(cells)))
    model = [get.get((*c, "model_per_step"), 0.0) for c in cells]
    loop = [get.get((*c, "loop_per_step"), 0.0) for c in cells]
    ops = [get.get((*c, "loop_ops_per_step"), 0.0) for c in cells]
    axes[0].barh(y, model, label="model forward")
    axes[0].barh(y, loop, left=model, label="loop (non-model)")
    axes[0].set_yticks(y, labels, fontsize=7)
    axes[0].set_xlabel("thread CPU ms per step")
    axes[0].legend()
    axes[1].barh(y, ops, color="tab:orange")
    axes[1].set_yticks(y, [""] * len(y))
    axes[1].set_xlabel("top-level aten ops per step outside the model")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "bench4"])
    ap.add_argument("--caches", nargs="+", default=["none", "prefix", "dual", "block_causal"])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--gen-length", type=int, nargs="+", default=[64])
    ap.add_argument("--block-length", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also DiffusionSampler(compile=True)")
    ap.add_argument("--scaling", action="store_true", help="the G-scaling table only")
    ap.add_argument("--step-programs", action="store_true",
                    help="fused vs generic vs static step per cell (step_programs.csv)")
    ap.add_argument("--reference", action="store_true",
                    help="only the comparison with the reference loops (models: conformance, "
                         "tiny, bench4)")
    ap.add_argument("--prompt-length", type=int, default=32, help="--reference prompt length")
    ap.add_argument("--out", type=Path, default=RESULTS / "overhead.csv")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="CSV of an earlier run: assert at most half its loop ops per step")
    args = ap.parse_args()
    torch.set_num_threads(1)
    env = environment()
    if args.scaling:
        write_csv(scaling_rows(env, args.gen_length, args.repeats),
                  args.out.with_name("overhead_scaling.csv"))
        return
    if args.step_programs:
        write_csv(step_program_rows(env, args), args.out.with_name("step_programs.csv"))
        return
    ok, why = reference_env()
    if args.reference:
        if not ok:
            print(f"reference comparison skipped: {why}")
            return
        from overhead_reference import run_comparison

        out = args.out if args.out.name != "overhead.csv" else RESULTS / "overhead_reference.csv"
        raise SystemExit(run_comparison(
            args.models, args.gen_length[0], args.block_length, args.prompt_length,
            args.repeats, out, Path(tempfile.gettempdir()) / "dllm_ref_checkpoints"))
    if not ok:
        print(f"reference comparison skipped: {why}")
    rows: list[dict] = []
    print("| model | cache | policy | steps | model ms/step | loop ms/step | loop ops/step |"
          " of which kernels |")
    print("|---|---|---|---|---|---|---|---|")
    for name, bidir, causal in models(args.models):
        for cache in args.caches:
            model = causal if cache == "block_causal" else bidir
            for family in args.policies:
                for compile_ in ((False, True) if args.compile else (False,)):
                    rs, o, _ = cell_rows(env, name, model, cache, family, compile_,
                                         args.gen_length[0], args.block_length, args.repeats)
                    rows += rs
                    tag = f"{name}{'+compile' if compile_ else ''}"
                    print(f"| {tag} | {cache} | {family} | {o.steps} | {o.model_ms:.3f} | "
                          f"{o.loop_ms:.3f} | {o.loop_ops:.1f} | {o.loop_kernels:.1f} |",
                          flush=True)
    write_csv(rows, args.out)
    plot(rows, args.out.with_suffix(".png"))
    if args.baseline is not None:
        check_against(rows, args.baseline)


def check_against(rows: list[dict], baseline: Path) -> None:
    """Print after/before loop ops per step per cell; exit 1 if any cell keeps > half."""
    import csv

    key = ("name", "cache", "policy", "G")
    before = {tuple(str(r[k]) for k in key): float(r["p50"]) for r in csv.DictReader(
        baseline.open()) if r["metric"] == "loop_ops_per_step"}
    worst = 0.0
    for r in rows:
        k = tuple(str(r[c]) for c in key)
        if r["metric"] == "loop_ops_per_step" and k in before:
            ratio = float(r["p50"]) / before[k]
            worst = max(worst, ratio)
            print(f"{' '.join(k)}: {before[k]:.1f} -> {float(r['p50']):.1f} ops/step "
                  f"({ratio:.2f})")
    print(f"worst after/before: {worst:.2f} (target <= 0.50)")
    if worst > 0.5:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
