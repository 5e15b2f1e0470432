"""Serving throughput in SGLang: its built-in ``LowConfidence`` vs ``DllmDecode`` (``llada2``).

The same model is served twice on one GPU, once per algorithm at the same settings (threshold
0.95, else the single most confident position: ``llada2`` at ``LowConfidence``'s settings, which
decode the same tokens), and each run generates ``--max-new-tokens`` for batches of
``--batches`` concurrent requests (greedy, EOS ignored so every request decodes the same
length). Reported per algorithm and batch: generated tokens per second (median of
``--repeats`` timed runs after a warm-up), the ratio of ours to the built-in (target >= 0.95),
and whether the tokens are identical. Rows go to ``results/sglang_serving.csv``:

    python benchmarks/bench_sglang.py                       # a random-weight tiny LLaDA2
    python benchmarks/bench_sglang.py --model-path inclusionAI/LLaDA2.0-mini --tp-size 1

``--staggered`` (CPU, no GPU needed) measures instead what batching costs the adapter under
SGLang's default first-done-first-out scheduling, with requests at different steps of their
blocks (``sglang_ops.py``): aten ops per round through SGLang's real ``DllmAlgorithm.run``
(the forward excluded) for ``LowConfidence`` and every preset the README serves, at batch 1
and 32 staggered, with the adapter's split mode and policy calls per round, into
``results/sglang_ops.csv``:

    OMP_NUM_THREADS=1 python benchmarks/bench_sglang.py --staggered

Without ``--model-path`` a tiny LLaDA2 is built from a config (``tiny_llada2``: the released
architecture, 2 layers, the real vocabulary and mask id) and served with random weights
(``--load-format dummy``). Needs CUDA and ``pip install -e ".[sglang]"``; the GPU test
``tests/test_sglang_gpu.py`` uses the same functions.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
#: the released LLaDA2.x tokenizer's size and ``<|mask|>`` id (SGLang's DLLM_PARAMS mask id)
LLADA2_VOCAB, LLADA2_MASK = 157184, 156895
THRESHOLD = 0.95
ALGORITHMS: dict[str, dict[str, Any]] = {
    "LowConfidence": {"threshold": THRESHOLD},
    "DllmDecode": {"policy": "llada2", "params": {"threshold": THRESHOLD}},
}
#: the configuration module a LLaDA2 checkpoint ships (its model_type is not in transformers)
CONFIG_MODULE = '''"""LLaDA2 MoE configuration (as the released checkpoints ship one)."""

from transformers import PretrainedConfig


class LLaDA2MoeConfig(PretrainedConfig):
    model_type = "llada2_moe"

    def __init__(self, **kwargs):
        defaults = {"embedding_dropout": 0.0, "expert_capacity": None, "norm_head": False,
                    "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
        for key, value in defaults.items():
            kwargs.setdefault(key, value)
        super().__init__(**kwargs)
'''


def tiny_llada2(folder: Path, layers: int = 2, hidden: int = 256) -> Path:
    """A tiny LLaDA2 checkpoint folder for ``--load-format dummy``: the released architecture
    (``LLaDA2MoeModelLM``, MoE with a shared expert, block size 32), the real vocabulary and
    mask id, no weights."""
    from dllm_decode.models.llada2 import llada2_config, llada2_spec

    folder.mkdir(parents=True, exist_ok=True)
    release = {
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": hidden // 4,
        "vocab_size": LLADA2_VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "moe_intermediate_size": hidden // 2, "num_experts": 8, "num_experts_per_tok": 2,
        "n_group": 4, "topk_group": 2, "num_shared_experts": 1, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5, "moe_router_enable_expert_bias": True,
        "partial_rotary_factor": 0.5, "rope_theta": 600000.0, "use_qk_norm": True,
        "score_function": "sigmoid", "block_size": 32, "mask_token_id": LLADA2_MASK,
        "eos_token_id": 156892, "pad_token_id": 156892,
    }
    config = llada2_config(llada2_spec(release))
    config.update({"embedding_dropout": 0.0, "torch_dtype": "bfloat16",
                   "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig"}})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "configuration_llada2_moe.py").write_text(CONFIG_MODULE)
    return folder


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` random ordinary token ids (no special tokens)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 150000) for _ in range(length)] for _ in range(n)]


class Served:
    """One SGLang ``Engine`` with ``algorithm`` (its YAML written beside the checkpoint)."""

    def __init__(self, model_path: str, algorithm: str, config: dict[str, Any], *,
                 dummy: bool, max_batch: int, tp_size: int = 1, folder: Path) -> None:
        import sglang
        import yaml

        path = folder / f"{algorithm}.yaml"
        path.write_text(yaml.safe_dump(config))
        kwargs = {"load_format": "dummy"} if dummy else {}
        self.engine = sglang.Engine(
            model_path=model_path, dllm_algorithm=algorithm, dllm_algorithm_config=str(path),
            trust_remote_code=True, skip_tokenizer_init=True, tp_size=tp_size,
            max_running_requests=max_batch, mem_fraction_static=0.6, random_seed=0,
            log_level="error", **kwargs)

    def generate(self, batch: list[list[int]], max_new: int, temperature: float = 0.0
                 ) -> tuple[list[list[int]], float]:
        """Tokens of ``batch`` (EOS ignored; greedy unless ``temperature``, which must be the
        served YAML's: DllmDecode refuses a request asking for other sampling) and the wall
        seconds."""
        start = time.perf_counter()
        out = self.engine.generate(input_ids=batch, sampling_params={
            "max_new_tokens": max_new, "temperature": temperature, "ignore_eos": True})
        return [list(o["output_ids"]) for o in out], time.perf_counter() - start

    def close(self) -> None:
        self.engine.shutdown()


def measure(model_path: str, *, dummy: bool, batches: list[int], max_new: int,
            prompt_length: int, repeats: int, tp_size: int = 1) -> list[dict[str, Any]]:
    """Rows: algorithm x batch -> tokens/s (median of ``repeats``), tokens identical."""
    import torch

    rows, tokens = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in ALGORITHMS.items():
            served = Served(model_path, name, config, dummy=dummy, max_batch=max(batches),
                            tp_size=tp_size, folder=Path(tmp))
            try:
                for b in batches:
                    batch = prompts(b, prompt_length, seed=b)
                    served.generate(batch, max_new)  # warm-up: graphs, caches, allocator
                    times = []
                    for _ in range(repeats):
                        out, seconds = served.generate(batch, max_new)
                        times.append(seconds)
                    tokens[name, b] = out
                    n = sum(len(o) for o in out)
                    rows.append({"algorithm": name, "B": b, "G": max_new, "P": prompt_length,
                                 "tokens": n, "seconds_p50": round(statistics.median(times), 4),
                                 "tokens_per_s": round(n / statistics.median(times), 1)})
            finally:
                served.close()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    base = {r["B"]: r["tokens_per_s"] for r in rows if r["algorithm"] == "LowConfidence"}
    for r in rows:
        r["ratio_vs_builtin"] = round(r["tokens_per_s"] / base[r["B"]], 3)
        r["tokens_identical"] = tokens["DllmDecode", r["B"]] == tokens["LowConfidence", r["B"]]
        r["model"], r["device"] = model_path if not dummy else "tiny-llada2-random", device
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=None, help="a LLaDA2 checkpoint (default: tiny)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--staggered", action="store_true",
                    help="CPU: ops per FDFO round with staggered requests (sglang_ops.py)")
    args = ap.parse_args()
    from dllm_decode.bench import write_rows

    if args.staggered:
        staggered(args.batches, args.out or RESULTS / "sglang_ops.csv")
        return

    with tempfile.TemporaryDirectory() as tmp:
        dummy = args.model_path is None
        path = str(tiny_llada2(Path(tmp) / "tiny-llada2")) if dummy else args.model_path
        rows = measure(path, dummy=dummy, batches=args.batches, max_new=args.max_new_tokens,
                       prompt_length=args.prompt_length, repeats=args.repeats,
                       tp_size=args.tp_size)
    write_rows(rows, args.out or RESULTS / "sglang_serving.csv")
    print("| algorithm | B | tokens/s | vs built-in | tokens identical |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algorithm']} | {r['B']} | {r['tokens_per_s']} | "
              f"{r['ratio_vs_builtin']} | {r['tokens_identical']} |")


def staggered(batches: list[int], out: Path) -> None:
    """The ``--staggered`` table: ops per round, split mode, calls per round; CSV + markdown."""
    import sys

    import torch

    from dllm_decode.bench import write_rows

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).parent))
    import sglang
    from sglang_ops import table

    torch.set_num_threads(1)
    rows = table(tuple(batches))
    base = {r["B"]: r["ops_per_round"] for r in rows if r["algorithm"] == "LowConfidence"}
    one = {r["policy"]: r["ops_per_round"] for r in rows if r["B"] == min(batches)}
    for r in rows:
        r["vs_low_confidence"] = round(r["ops_per_round"] / base[r["B"]], 2)
        r["vs_own_batch_1"] = round(r["ops_per_round"] / one[r["policy"]], 2)
        r["device"], r["sglang"], r["torch"] = "cpu", sglang.__version__, torch.__version__
    write_rows(rows, out)
    print("| algorithm / preset | B | ops per round | vs LowConfidence | vs own B=1 | split |"
          " calls per round |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name = r["algorithm"] if r["algorithm"] == "LowConfidence" else r["policy"]
        print(f"| {name} | {r['B']} | {r['ops_per_round']} | {r['vs_low_confidence']} | "
              f"{r['vs_own_batch_1']} | {r['split']} | {r['calls_per_round']} |")


if __name__ == "__main__":
    main()
