"""Record dLLM-Cache conformance cases from the authors' hooks on llada-tiny.

Reference: maomaocun/dLLM-cache ``dllm_cache/hooks/cache_hook_LLaDA.py``
(``register_cache_LLaDA``: ``cache_hook_feature``, ``refresh_index``, ``_attention``,
``RoPe_forward``), ``dllm_cache/cache/Cache.py`` (``dLLMCache``) and the decoding loop
``utils/generate_function.py`` (``generate``), at the commit below. The hooks patch blocks of
LLaDA's remote-code modeling; the official file is not in the repository, so the blocks are
those of Feng-Hong/WINO-DLLM's ``LLaDA/modeling_llada.py`` (the released file with a mask /
position-id pass-through): every method the hooks call (``attn_norm``, ``q/k/v_proj``,
``attn_out``, ``ff_norm``, ``ff_proj``, ``up_proj``, ``act``, ``ff_out``, ``rotary_emb``,
``_scaled_dot_product_attention``) is the released code. That file's model calls its blocks
with ``attention_mask=`` / ``position_ids=`` keywords, which the hook's signature lacks: a shim
drops them (no mask; the default positions ``0..N-1``, which the hook's RoPE uses too) - the
only adaptation.

Run in a separate environment (torch 2.13 CPU, transformers 4.49.0)::

    OMP_NUM_THREADS=1 python benchmarks/conformance/record_dllm_cache.py \
        --repo /path/to/dLLM-cache --wino-repo /path/to/WINO-DLLM \
        --checkpoint ../shared/conformance/llada-tiny \
        --out tests/fixtures/methods2026/dllm_cache.json

A case is kept only if it is unchanged under N(0, 1e-6) logit noise (three draws) and a rerun,
and if every partial refresh's choice is clear: the ``k``-th and ``k+1``-th lowest cosine
similarities differ by at least ``MIN_GAP`` (response tokens whose values barely moved sit at
similarity 1 - 1e-7, where the last bit of any fp32 computation decides the choice).
``refresh_every_step`` (every feature recomputed every step) must equal the uncached run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import types
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tools import export, load_llada, write_fixture  # noqa: E402

REPO = "maomaocun/dLLM-cache"
COMMIT = "17235bffc8c5b587a2dc6f7dc76fcd01eab76e3a"
WINO_REPO, WINO_COMMIT = "Feng-Hong/WINO-DLLM", "9549a1d0c3cbd9dc9b8f7cd09be8a7aac322d6fb"
MASK_ID = 500
SPECIAL = 499
#: the smallest margin at a partial refresh's cut (see the module docstring)
MIN_GAP = 1e-5

#: (name, prompt length, gen, block, steps, K_p, K_r, rho, prompt seed); K = 0: no cache
SETTINGS = [
    ("no_cache", 10, 16, 8, 16, 0, 0, 0.0, 1),
    ("refresh_every_step", 10, 16, 8, 16, 1, 1, 0.25, 1),
    ("paper_gsm8k_ratio", 12, 32, 8, 32, 50, 7, 0.25, 2),
    ("prompt_5_gen_2", 9, 32, 8, 16, 5, 2, 0.25, 3),
    ("prompt_refresh_only", 8, 24, 8, 24, 1, 4, 0.5, 4),
    ("no_partial_update", 11, 32, 16, 16, 4, 3, 0.0, 5),
    ("gen_refresh_only", 7, 24, 12, 24, 100, 1, 0.25, 6),
    ("sparse_refresh", 14, 40, 8, 20, 9, 5, 0.2, 7),
    ("half_ratio", 6, 32, 32, 32, 6, 4, 0.5, 8),
    ("tenth_ratio", 10, 40, 8, 40, 8, 3, 0.1, 9),
    ("quarter_ratio_short", 8, 16, 8, 16, 3, 2, 0.25, 10),
    ("prompt_every_2", 12, 24, 8, 12, 2, 5, 0.125, 11),
    ("one_block_long", 9, 32, 32, 16, 7, 4, 0.25, 12),
    ("paper_settings_24", 8, 24, 8, 24, 50, 7, 0.25, 13),
    ("paper_settings_16", 10, 16, 8, 16, 50, 7, 0.25, 14),
    ("sixth_ratio", 11, 24, 8, 24, 10, 4, 0.17, 15),
    ("dense_steps", 7, 16, 16, 8, 3, 3, 0.25, 16),
]


class Noisy(torch.nn.Module):
    """The model with N(0, std) added to its logits (``std = 0``: the model itself)."""

    def __init__(self, model: torch.nn.Module, std: float, seed: int) -> None:
        super().__init__()
        self.model, self.std = model, std
        self.gen = torch.Generator().manual_seed(seed)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, x, **kwargs):
        out = self.model(x, **kwargs)
        if not self.std:
            return out
        noise = self.std * torch.randn(out.logits.shape, generator=self.gen)
        return types.SimpleNamespace(logits=out.logits + noise)


def hook(model, dllm_cache) -> None:
    """``register_cache_LLaDA`` on the blocks, then the keyword shim described above."""
    dllm_cache.hooks.register_cache_LLaDA(model, "model.transformer.blocks")
    for block in model.model.transformer.blocks:
        hooked = block.forward

        def forward(x, attention_mask=None, layer_past=None, use_cache=False,
                    position_ids=None, _hooked=hooked):
            # the model fills in the default positions 0..N-1, which the hook's RoPE uses too
            assert attention_mask is None and (position_ids is None or torch.equal(
                position_ids, torch.arange(x.shape[1])))
            return _hooked(x, None, layer_past, use_cache)

        block.forward = forward


def selection_gaps(hooks_mod: Any, gaps: list[float]) -> None:
    """Record, at every ``refresh_index`` call, the margin at its cut (``gaps``)."""
    original = hooks_mod.refresh_index

    def spy(new, cached, ratio, layer_id):
        k = int(new.shape[1] * ratio)
        sims = torch.sort(torch.nn.functional.cosine_similarity(new, cached, dim=-1), -1).values
        if 0 < k < sims.shape[1]:
            gaps.append(float((sims[:, k] - sims[:, k - 1]).min()))
        return original(new, cached, ratio, layer_id)

    hooks_mod.refresh_index = spy


def decode(generate: Any, cache_mod: Any, model: Any, prompt: torch.Tensor, setting: tuple,
           std: float = 0.0, draw: int = 0) -> torch.Tensor:
    """The reference's ``generate`` for one setting (a fresh ``dLLMCache`` when cached)."""
    _, _, g, k, steps, kp, kr, rho, _ = setting
    if kp > 0:
        cache_mod.dLLMCache.new_instance(**asdict(cache_mod.dLLMCacheConfig(
            prompt_interval_steps=kp, gen_interval_steps=kr, transfer_ratio=rho)))
    with torch.no_grad():
        return generate(prompt, None, Noisy(model, std, draw), steps=steps, gen_length=g,
                        block_length=k, temperature=0.0, mask_id=MASK_ID)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--wino-repo", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="dllm_cache_ref_"))
    files = {f"dllm_cache/{p}": f"dllm_cache/{p}" for p in (
        "__init__.py", "cache/__init__.py", "cache/Cache.py", "cache/Config.py",
        "hooks/__init__.py", "hooks/cache_hook_LLaDA.py", "hooks/cache_hook_Dream.py",
        "hooks/cache_hook_LLaDA_V.py", "hooks/cache_hook_MMaDA.py")}
    files["utils/generate_function.py"] = "refutils/generate_function.py"
    for name in ("dllm_cache/cache", "dllm_cache/hooks", "refutils"):
        (scratch / "code" / name).mkdir(parents=True, exist_ok=True)
    code = export(args.repo, COMMIT, files, scratch / "code")
    wino = export(args.wino_repo, WINO_COMMIT,
                  {"LLaDA/modeling_llada.py": "modeling_llada.py",
                   "LLaDA/configuration_llada.py": "configuration_llada.py"}, scratch / "wino")
    sys.path.insert(0, str(code))
    dllm_cache = importlib.import_module("dllm_cache")
    cache_mod = importlib.import_module("dllm_cache.cache")
    generate = importlib.import_module("refutils.generate_function").generate
    gaps: list[float] = []
    selection_gaps(importlib.import_module("dllm_cache.hooks.cache_hook_LLaDA"), gaps)

    cases = []
    plain = load_llada(args.checkpoint, wino, scratch)
    hooked = load_llada(args.checkpoint, wino, scratch / "hooked")
    hook(hooked, dllm_cache)
    settings = {s[0]: s for s in SETTINGS}
    for name, p, g, k, steps, kp, kr, rho, seed in SETTINGS:
        prompt = torch.randint(0, SPECIAL, (1, p), generator=torch.Generator().manual_seed(seed))
        cached = kp > 0
        model = hooked if cached else plain

        def run(std: float = 0.0, draw: int = 0, _a=(model, prompt, name)) -> torch.Tensor:
            return decode(generate, cache_mod, _a[0], _a[1], settings[_a[2]], std, draw)

        gaps.clear()
        out = run()
        margin = min(gaps, default=float("inf"))
        stable = torch.equal(out, run()) and all(torch.equal(out, run(1e-6, d))
                                                 for d in range(3))
        print(f"{name}: noise-stable {stable}, partial refreshes {len(gaps)}, "
              f"smallest cut margin {margin:.2e}")
        if not stable or margin < MIN_GAP:
            continue
        cases.append({
            "name": name,
            "reference_repo": REPO, "reference_commit": COMMIT,
            "reference_function": "utils/generate_function.py generate + "
                                  "dllm_cache/hooks/cache_hook_LLaDA.py register_cache_LLaDA"
                                  if cached else "utils/generate_function.py generate (no cache)",
            "prompt_ids": prompt.tolist(),
            "args": {"steps": steps, "gen_length": g, "block_length": k, "temperature": 0.0,
                     "mask_id": MASK_ID, "prompt_interval_steps": kp,
                     "gen_interval_steps": kr, "transfer_ratio": rho},
            "answer_ids": out.tolist(), "nfe": steps,
            "checks": {"rerun_identical": True, "unchanged_under_logit_noise_std": 1e-6,
                       "noise_draws": 3, "partial_refreshes": len(gaps),
                       "min_cut_margin": None if not gaps else margin},
        })
    by = {c["name"]: c for c in cases}
    assert by["no_cache"]["answer_ids"] == by["refresh_every_step"]["answer_ids"]
    meta = {
        "reference": f"{REPO} @ {COMMIT}: utils/generate_function.py generate, "
                     "dllm_cache/hooks/cache_hook_LLaDA.py, dllm_cache/cache/Cache.py",
        "model_forward": f"blocks of {WINO_REPO} @ {WINO_COMMIT} LLaDA/modeling_llada.py, "
                         "patched by register_cache_LLaDA (keyword shim, see the recorder)",
        "checkpoint": "../shared/conformance/llada-tiny (mask 500, vocabulary 512)",
        "command": "OMP_NUM_THREADS=1 python benchmarks/conformance/record_dllm_cache.py "
                   "--repo <dLLM-cache snapshot> --wino-repo <WINO-DLLM snapshot> "
                   "--checkpoint ../shared/conformance/llada-tiny "
                   "--out tests/fixtures/methods2026/dllm_cache.json",
        "nfe": "steps (the reference runs exactly one forward per step)",
    }
    write_fixture(args.out, meta, cases)


if __name__ == "__main__":
    main()
