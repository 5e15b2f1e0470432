"""Method benchmark: S2D2 vs its base rule (SDAR-style) and Window-Diffusion vs low-confidence
(LLaDA-style): NFE, tokens per forward (answer tokens up to EOS per forward, ``dllm_decode.speed``)
and tokens per step (gen length / NFE), wall time, agreement with the exact decoder; CSV rows.

S2D2: Han et al., arXiv 2603.25702. Window-Diffusion: Zuo et al., arXiv 2601.20332.

Models: the bundled trained checkpoints ``tiny-sdar`` / ``tiny-llada`` when they exist under
``dllm_decode/models/assets``, otherwise tiny **random-weight** models, whose rows are labelled
``plumbing-only``. This script measures speed and forwards at long generation lengths on
synthetic prompts; accuracy per task on held-out prompts comes from the grids
``benchmarks/grids/methods_tiny.yaml`` / ``methods_sdar.yaml`` through ``bench_policies.py``.

Timing follows ``dllm_decode.bench``: one thread, thread CPU time, warm-up excluded,
p20/p50/p80 over repeats. Rows use the ``dllm_decode.bench.HEADER`` schema.

    python benchmarks/bench_methods.py --repeats 3 --out benchmarks/results/methods.csv
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dllm_decode import DiffusionSampler
from dllm_decode.bench import environment, pct, timed, write_csv
from dllm_decode.models.loading import build_model, bundled_models, load_model
from dllm_decode.speed import TPF_UNIT, generation_tpf, model_stop_ids

RESULTS = Path(__file__).parent / "results"

#: random-weight stand-ins (same shapes as the tiny trainer's defaults, vocabulary 4096)
RANDOM = {
    "sdar": {"model_type": "sdar", "hidden_size": 256, "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "intermediate_size": 640, "vocab_size": 4096, "mask_token_id": 4095,
             "eos_token_id": 4094, "pad_token_id": 4094, "max_position_embeddings": 1024,
             "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "block_size": 4, "qk_norm": True},
    "llada": {"model_type": "llada", "d_model": 256, "n_layers": 4, "n_heads": 4,
              "n_kv_heads": 4, "mlp_hidden_size": 640, "vocab_size": 4096,
              "embedding_size": 4096, "mask_token_id": 4095, "eos_token_id": 4094,
              "pad_token_id": 4094, "max_sequence_length": 1024, "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class Case:
    """One decoder configuration; ``reference`` names the case whose tokens it is compared to."""

    label: str
    policy: str
    params: dict[str, Any] = field(default_factory=dict)
    reference: str | None = None


SDAR_CASES = [
    Case("base:low_confidence_dynamic", "low_confidence_dynamic",
         dict(cache="block_causal", causal_prefix=True)),
    Case("s2d2:score_threshold", "s2d2", {}, "base:low_confidence_dynamic"),
    Case("s2d2:hysteresis", "s2d2", dict(router="score_hysteresis", score_type="dynamic"),
         "base:low_confidence_dynamic"),
    Case("s2d2:bandit", "s2d2", dict(router="contextual_bandit_ucb"),
         "base:low_confidence_dynamic"),
    Case("s2d2:always", "s2d2", dict(router="always"), "base:low_confidence_dynamic"),
]
LLADA_CASES = [
    Case("low_confidence:none", "low_confidence", dict(cache="none")),
    Case("window:64/16/32", "window", {}, "low_confidence:none"),
    Case("window:32/8/16", "window", dict(window_tokens=32, active_tokens=8, refresh_every=16),
         "low_confidence:none"),
]


def _model(family: str) -> tuple[Any, str]:
    name = f"tiny-{family}"
    if name in bundled_models():
        return load_model(name), name
    return build_model(RANDOM[family], seed=0, init_std=0.05), f"random-{family}(plumbing-only)"


def run_suite(family: str, cases: list[Case], *, batch: int, prompt: int, gen: int,
              repeats: int) -> list[dict[str, Any]]:
    """Benchmark rows for ``cases`` on the family's model (``HEADER`` schema)."""
    model, name = _model(family)
    env = environment()
    torch.set_num_threads(1)
    vocab = model.vocab_size
    ids = torch.randint(0, vocab - 2, (batch, prompt), generator=torch.Generator().manual_seed(0))
    outputs: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for case in cases:
        sampler = DiffusionSampler(model, case.policy, gen_length=gen, seed=0, **case.params)
        result: dict[str, Any] = {}

        def run(s: DiffusionSampler = sampler, r: dict = result) -> None:
            r.clear()  # the policy's per-generation memory is kept for its counters
            r["out"] = s.generate(ids, on_step=lambda st, c: r.setdefault("memory", st.memory))

        wall = timed(run, repeats, warmup=1)
        out = result["out"]
        outputs[case.label] = out
        nfe = float(out.nfe.double().mean())
        metrics: list[tuple[str, str, float]] = [
            ("forwards", "forwards", float(out.forwards)), ("nfe", "forwards/row", nfe),
            ("tpf", TPF_UNIT, generation_tpf(out, model_stop_ids(model))[0]),
            ("tokens_per_step", "gen tokens/forward", gen / max(nfe, 1.0)),
            ("steps", "steps", float(out.steps)),
        ]
        if case.reference is not None:
            ref = outputs[case.reference]
            same = (out.answer == ref.answer).double().mean()
            metrics.append(("agreement", "fraction of tokens equal to reference", float(same)))
        mem = result.get("memory")
        if mem is not None and hasattr(mem, "verified"):
            verified = float(mem.verified.sum())
            metrics += [("verify_rate", "verifications/step", verified / max(out.steps * batch, 1)),
                        ("accepted_per_verify", "drafts/verification",
                         float(mem.accepted.sum()) / max(verified, 1.0))]
        base = dict(suite="methods", name=name, provider="torch", policy=case.label,
                    cache=sampler.config.cache.value, B=batch, P=prompt, G=gen,
                    K=model.block_size or gen, V=vocab, device=env.device, torch=env.torch,
                    triton=env.triton, commit=env.commit, timestamp=env.timestamp)
        p20, p50, p80 = pct(wall)
        rows.append(base | dict(metric="end_to_end", unit="s", p20=p20, p50=p50, p80=p80))
        for metric, unit, val in metrics:
            rows.append(base | dict(metric=metric, unit=unit, p20=val, p50=val, p80=val))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--sdar-gen-length", type=int, default=64)
    ap.add_argument("--llada-gen-length", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "methods.csv")
    args = ap.parse_args()
    rows = run_suite("sdar", SDAR_CASES, batch=args.batch, prompt=args.prompt_length,
                     gen=args.sdar_gen_length, repeats=args.repeats)
    rows += run_suite("llada", LLADA_CASES, batch=args.batch, prompt=args.prompt_length,
                      gen=args.llada_gen_length, repeats=args.repeats)
    write_csv(rows, args.out)
    for r in rows:
        if r["metric"] in ("end_to_end", "forwards", "tpf", "tokens_per_step", "agreement",
                           "accepted_per_verify", "verify_rate"):
            print(f"{r['name']:>28} {r['policy']:>28} {r['metric']:>20}: {r['p50']:.4g} "
                  f"{r['unit']}")
    print(f"rows appended to {args.out}")


if __name__ == "__main__":
    main()
