"""Record Streaming-dLLM conformance cases from the authors' ``generate_with_prefix_cache`` on
llada-tiny.

Reference: xiaoshideta/Streaming-dLLM ``LLaDA-1.5/generate.py`` ``generate_with_prefix_cache``
(suffix window + tail via ``LLaDA-1.5/sampler.py`` ``deterministic_window_tail_sampler``,
the mask-ratio threshold ``context_aware_threshold``, the EOS early exit) with the
repository's own ``LLaDA-1.5/model/modeling_llada.py`` (it takes ``position_ids`` together
with ``past_key_values``), at the commit below. Run in a separate environment (torch 2.13 CPU,
transformers 4.49.0) with a local snapshot of the repository::

    OMP_NUM_THREADS=1 python benchmarks/conformance/record_streaming_dllm.py \
        --repo /path/to/Streaming-dLLM --checkpoint ../shared/conformance/llada-tiny \
        --out tests/fixtures/methods2026/streaming_dllm.json

Nothing of the authors' code is patched: ``mask_id`` and ``eos_id`` are arguments of
``generate_with_prefix_cache`` (500 and 499 on llada-tiny), ``threshold`` is passed (tau0).
The model package is imported as ``model`` from the export folder, as ``generate.py`` imports
it (its ``modeling_llada.py`` imports its configuration relatively). Two module globals are
wrapped for *recording* only (they return what they wrap): ``get_transfer_index`` (the
committed positions per step) and ``context_aware_threshold`` (tau per step).

Each case keeps the reference's output ids, its NFE, per block the kept positions ``K_n`` (the
position ids of the block's first forward), per step the committed answer positions and tau,
and whether the early exit fired. A case is kept only if it is unchanged when N(0, 1e-6) noise
is added to every logit (three draws) and when the reference is rerun.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tools import export, write_fixture  # noqa: E402

REPO = "xiaoshideta/Streaming-dLLM"
COMMIT = "c4320c2d42f049f4610d8273217f5d168146d016"
MASK_ID = 500
EOS_ID = 499  # llada-tiny's EOS; ids >= this are special
SPECIAL = 499

#: (name, prompt length, gen_length, block_length, threshold tau0, window, alpha, prompt seed)
SETTINGS = [
    ("w32_a03_b16", 8, 64, 16, 0.9, 32, 0.3, 1),
    ("w8_a04_b16", 10, 64, 16, 0.7, 8, 0.4, 2),
    ("w16_a06_b8", 9, 48, 8, 0.5, 16, 0.6, 3),
    ("w4_a03_b8", 12, 40, 8, 0.3, 4, 0.3, 4),
    ("w96_a04_b32", 7, 64, 32, 0.6, 96, 0.4, 5),   # L - be <= window: no separate tail
    ("w0_tail_only_b16", 11, 48, 16, 0.5, 0, 0.3, 6),
    ("w12_a09_b16", 6, 64, 16, 0.8, 12, 0.9, 7),
    ("w24_a00_b16", 10, 80, 16, 0.4, 24, 0.0, 8),
    ("w32_a06_b32", 9, 96, 32, 0.2, 32, 0.6, 9),
    ("w8_a03_b4", 8, 32, 4, 0.6, 8, 0.3, 10),
]
#: prompt seeds tried (beyond each setting's own) for cases whose early exit fires
EXIT_SEEDS = range(100, 400)


def load_model(checkpoint: Path, scratch: Path) -> Any:
    """``LLaDAModelLM`` of the exported ``model`` package with the checkpoint's weights."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(scratch))
    conf = importlib.import_module("model.configuration_llada")
    mod = importlib.import_module("model.modeling_llada")
    cfg = conf.LLaDAConfig(**json.loads((checkpoint / "config.json").read_text()))
    cfg.init_device = "cpu"
    model = mod.LLaDAModelLM(cfg, init_params=False)
    missing, unexpected = model.load_state_dict(load_file(str(checkpoint / "model.safetensors")),
                                                strict=False)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    return model.float().eval()


class Recorder(torch.nn.Module):
    """The model, recording each forward's position ids and width, optionally adding noise
    to its logits."""

    def __init__(self, model: torch.nn.Module, noise: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.model, self.noise = model, noise
        self.gen = torch.Generator().manual_seed(seed)
        self.calls: list[dict[str, Any]] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, x: torch.Tensor, **kwargs: Any) -> Any:
        self.calls.append({"width": x.shape[1], "positions": kwargs["position_ids"][0].tolist(),
                           "cached": kwargs.get("past_key_values") is not None})
        out = self.model(x, **kwargs)
        if self.noise:
            out.logits = out.logits + self.noise * torch.randn(out.logits.shape,
                                                               generator=self.gen)
        return out


def run(gen_mod: Any, model: Any, prompt: torch.Tensor, g: int, k: int, tau: float, window: int,
        alpha: float, noise: float = 0.0, seed: int = 0) -> tuple[torch.Tensor, int, dict]:
    rec = Recorder(model, noise, seed)
    steps: list[dict[str, Any]] = []
    base_index, base_tau = gen_mod.get_transfer_index, gen_mod.context_aware_threshold

    def threshold(**kw: Any) -> float:
        out = base_tau(**kw)
        steps.append({"tau": out, "mask_ratio": kw["mask_ratio"]})
        return out

    def transfer(*args: Any, **kw: Any) -> Any:
        x0, index = base_index(*args, **kw)
        call = rec.calls[-1]
        offset = len(call["positions"]) - index.shape[1]  # 0 at a block's first step
        steps[-1]["committed"] = [offset + int(i) for i in torch.nonzero(index[0]).flatten()]
        return x0, index

    gen_mod.get_transfer_index, gen_mod.context_aware_threshold = transfer, threshold
    try:
        with torch.no_grad():
            out, nfe = gen_mod.generate_with_prefix_cache(
                rec, prompt, steps=g // k, gen_length=g, block_length=k, temperature=0.0,
                mask_id=MASK_ID, eos_id=EOS_ID, threshold=tau, window_size=window,
                confidence_alpha=alpha)
    finally:
        gen_mod.get_transfer_index, gen_mod.context_aware_threshold = base_index, base_tau
    p = prompt.shape[1]
    kept = [c["positions"] for c in rec.calls if not c["cached"]]
    for s in steps:
        s["committed"] = [i - p for i in s["committed"]]
    info = {"steps": steps, "kept": kept, "widths": [c["width"] for c in rec.calls]}
    return out, int(nfe), info


def stable(gen_mod: Any, model: Any, prompt: torch.Tensor, args: tuple) -> tuple[bool, Any]:
    out, nfe, info = run(gen_mod, model, prompt, *args)
    again, nfe2, _ = run(gen_mod, model, prompt, *args)
    ok = torch.equal(out, again) and nfe == nfe2
    for draw in range(3):
        noisy, nfe3, _ = run(gen_mod, model, prompt, *args, 1e-6, draw)
        ok = ok and torch.equal(out, noisy) and nfe == nfe3
    return ok, (out, nfe, info)


def case(name: str, prompt: torch.Tensor, args: tuple, result: Any) -> dict[str, Any]:
    g, k, tau, window, alpha = args
    out, nfe, info = result
    p = prompt.shape[1]
    exited = bool(nfe < 0) or _exited(out, p, g, k, info)
    return {
        "name": name,
        "reference_repo": REPO, "reference_commit": COMMIT,
        "reference_path": "LLaDA-1.5/generate.py",
        "reference_function": "generate_with_prefix_cache",
        "model_forward": "LLaDA-1.5/model/modeling_llada.py of the same commit (position_ids "
                         "with past_key_values), fp32, CPU",
        "prompt_ids": prompt.tolist(),
        "args": {"gen_length": g, "block_length": k, "steps": g // k, "temperature": 0.0,
                 "mask_id": MASK_ID, "eos_id": EOS_ID, "threshold": tau,
                 "window_size": window, "confidence_alpha": alpha},
        "output_ids": out.tolist(), "nfe": nfe, "early_exit": exited,
        "kept_positions": info["kept"], "forward_widths": info["widths"],
        "steps": info["steps"],
        "checks": {"rerun_identical": True, "unchanged_under_logit_noise_std": 1e-6,
                   "noise_draws": 3},
    }


def _exited(out: torch.Tensor, p: int, g: int, k: int, info: dict) -> bool:
    """The early exit fired: fewer blocks were entered than there are."""
    return len(info["kept"]) < g // k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="streaming_ref_"))
    export(args.repo, COMMIT, {"LLaDA-1.5/generate.py": "generate.py",
                               "LLaDA-1.5/sampler.py": "sampler.py"}, scratch)
    export(args.repo, COMMIT, {"LLaDA-1.5/model/__init__.py": "__init__.py",
                               "LLaDA-1.5/model/modeling_llada.py": "modeling_llada.py",
                               "LLaDA-1.5/model/configuration_llada.py":
                               "configuration_llada.py"}, scratch / "model")
    model = load_model(args.checkpoint, scratch)
    gen_mod = importlib.import_module("generate")  # the authors' code, exported above

    cases = []
    for name, p, g, k, tau, window, alpha, seed in SETTINGS:
        prompt = torch.randint(0, SPECIAL, (1, p), generator=torch.Generator().manual_seed(seed))
        ok, result = stable(gen_mod, model, prompt, (g, k, tau, window, alpha))
        print(f"{name}: nfe {result[1]}, blocks entered {len(result[2]['kept'])}, "
              f"noise-stable {ok}")
        if ok:
            cases.append(case(name, prompt, (g, k, tau, window, alpha), result))
    # early exits: the first stable prompts whose exit fires before the last block
    for name, p, g, k, tau, window, alpha, want in (
            ("exit_b8_w16", 8, 64, 8, 0.5, 16, 0.3, 1),
            ("exit_b16_w8", 10, 64, 16, 0.7, 8, 0.4, 1),
            ("exit_b4_w32", 6, 48, 4, 0.3, 32, 0.6, 1)):
        found = 0
        for seed in EXIT_SEEDS:
            prompt = torch.randint(0, SPECIAL, (1, p),
                                   generator=torch.Generator().manual_seed(seed))
            result = run(gen_mod, model, prompt, g, k, tau, window, alpha)
            if not _exited(result[0], p, g, k, result[2]):
                continue
            ok, result = stable(gen_mod, model, prompt, (g, k, tau, window, alpha))
            print(f"{name} (seed {seed}): nfe {result[1]}, blocks entered "
                  f"{len(result[2]['kept'])} of {g // k}, noise-stable {ok}")
            if ok:
                cases.append(case(name, prompt, (g, k, tau, window, alpha), result))
                found += 1
                if found == want:
                    break
    meta = {
        "reference": f"{REPO} @ {COMMIT}, LLaDA-1.5/generate.py generate_with_prefix_cache",
        "checkpoint": "../shared/conformance/llada-tiny (mask 500, EOS 499, vocabulary 512)",
        "command": "OMP_NUM_THREADS=1 python benchmarks/conformance/record_streaming_dllm.py "
                   "--repo <Streaming-dLLM snapshot> --checkpoint "
                   "../shared/conformance/llada-tiny --out "
                   "tests/fixtures/methods2026/streaming_dllm.json",
        "patched": "nothing: mask_id=500 and eos_id=499 are arguments of the reference; "
                   "get_transfer_index and context_aware_threshold are wrapped to record "
                   "(returning what they return)",
        "nfe": "the reference's count: one forward per step (a block's first forward over "
               "[0, block end) + window + tail, then block + window + tail against the "
               "prefix K/V)",
        "steps": "per forward: tau, the mask ratio it used, the committed answer positions",
    }
    write_fixture(args.out, meta, cases)


if __name__ == "__main__":
    main()
