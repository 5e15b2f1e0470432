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

Dream (``--family dream``, fixture ``streaming_dllm_dream.json``): the authors' Dream loop,
``Dream/model/generation_utils_block.py`` ``DreamGenerationMixin.diffusion_generate`` /
``_sample`` bound to the repository's ``Dream/model/modeling_dream.py`` ``DreamModel`` as
``Dream/eval.py`` binds them with ``use_cache=true`` (``alg="confidence_threshold"``), on
dream-tiny (mask 440, EOS 436)::

    OMP_NUM_THREADS=1 python benchmarks/conformance/record_streaming_dllm.py --family dream \
        --repo /path/to/Streaming-dLLM --checkpoint ../shared/conformance/dream-tiny \
        --out tests/fixtures/methods2026/streaming_dllm_dream.json

Runtime patches (Dream): ``matplotlib`` (imported, unused, by ``generation_utils_block.py``;
absent from the reference environment) is an empty stub module; the ``model`` folder is
exported without its ``__init__.py`` (a namespace package: that file imports the tokenizer,
unused here). ``context_aware_threshold`` is wrapped to record tau; the model's ``forward``
is wrapped to record each forward's input (commits: positions masked at one forward and not
at the next) and to add the noise. ``mask_token_id``, ``eos`` (436), ``threshold``,
``block_length``, ``window_size`` and ``confidence_alpha`` are arguments; the Dream code
counts no NFE: the forwards are counted.

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


def stable(gen_mod: Any, model: Any, prompt: torch.Tensor, args: tuple,
           runner: Any = None) -> tuple[bool, Any]:
    """Rerun identical and unchanged under three N(0, 1e-6) logit-noise draws (``runner``:
    ``run`` or ``run_dream``, called with ``gen_mod, model`` / ``model, blk``)."""
    runner = runner or run
    out, nfe, info = runner(gen_mod, model, prompt, *args)
    again, nfe2, _ = runner(gen_mod, model, prompt, *args)
    ok = torch.equal(out, again) and nfe == nfe2
    for draw in range(3):
        noisy, nfe3, _ = runner(gen_mod, model, prompt, *args, 1e-6, draw)
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


# --- Dream: the authors' Dream loop (Dream/model/generation_utils_block.py) on dream-tiny ---

DREAM_MASK, DREAM_EOS = 440, 436  # dream-tiny: ids >= 436 are special
#: (name, prompt length, gen_length, block_length, threshold tau0, window, alpha, prompt seed)
DREAM_SETTINGS = [
    ("dream_w8_a03_b8", 8, 32, 8, 0.5, 8, 0.3, 1),
    ("dream_w32_a03_b16", 8, 64, 16, 0.9, 32, 0.3, 2),
    ("dream_w8_a04_b16", 10, 64, 16, 0.7, 8, 0.4, 3),
    ("dream_w16_a06_b8", 9, 48, 8, 0.5, 16, 0.6, 4),
    ("dream_w4_a03_b8", 12, 40, 8, 0.3, 4, 0.3, 5),
    ("dream_w96_a04_b32", 7, 64, 32, 0.6, 96, 0.4, 6),  # L - be <= window: no separate tail
    ("dream_w0_tail_only_b16", 11, 48, 16, 0.5, 0, 0.3, 7),
    ("dream_w12_a09_b16", 6, 64, 16, 0.8, 12, 0.9, 8),
    ("dream_w24_a00_b16", 10, 80, 16, 0.4, 24, 0.0, 9),
    ("dream_w32_a06_b32", 9, 96, 32, 0.2, 32, 0.6, 10),
]
DREAM_EXITS = (("dream_exit_b8_w16", 8, 64, 8, 0.5, 16, 0.3),
               ("dream_exit_b16_w8", 10, 64, 16, 0.7, 8, 0.4),
               ("dream_exit_b4_w32", 6, 48, 4, 0.3, 32, 0.6))


def load_dream(repo: Path, checkpoint: Path) -> tuple[Any, Any]:
    """``DreamModel`` of the exported ``model`` folder with the checkpoint's weights, and the
    ``generation_utils_block`` module (its mixin bound as ``Dream/eval.py`` binds it)."""
    import types

    from safetensors.torch import load_file

    for name in ("matplotlib", "matplotlib.pyplot"):  # imported, unused (see the docstring)
        sys.modules.setdefault(name, types.ModuleType(name))
    scratch = Path(tempfile.mkdtemp(prefix="streaming_dream_ref_"))
    export(repo, COMMIT, {f"Dream/model/{f}.py": f"{f}.py" for f in (
        "generation_utils_block", "generation_utils", "sampler", "modeling_dream",
        "configuration_dream")}, scratch / "model")
    sys.path.insert(0, str(scratch))
    conf = importlib.import_module("model.configuration_dream")
    mod = importlib.import_module("model.modeling_dream")
    blk = importlib.import_module("model.generation_utils_block")
    model = mod.DreamModel(conf.DreamConfig(**json.loads((checkpoint / "config.json")
                                                         .read_text())))
    missing, unexpected = model.load_state_dict(load_file(str(checkpoint / "model.safetensors")),
                                                strict=False)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    model = model.float().eval()
    model.diffusion_generate = types.MethodType(blk.DreamGenerationMixin.diffusion_generate,
                                                model)
    model._sample = types.MethodType(blk.DreamGenerationMixin._sample, model)
    return model, blk


def run_dream(model: Any, blk: Any, prompt: torch.Tensor, g: int, k: int, tau: float,
              window: int, alpha: float, noise: float = 0.0,
              seed: int = 0) -> tuple[torch.Tensor, int, dict]:
    """The authors' Dream loop once: output ids, forwards, and per step tau / commits."""
    gen = torch.Generator().manual_seed(seed)
    calls: list[dict[str, Any]] = []
    taus: list[float | None] = []
    base_forward, base_tau = type(model).forward, blk.context_aware_threshold

    def forward(x: torch.Tensor, *args: Any, **kw: Any) -> Any:
        pos = args[1] if len(args) > 1 else kw["position_ids"]
        calls.append({"canvas": x._base.clone() if x._base is not None else x.clone(),
                      "positions": pos[0].tolist(), "width": x.shape[1],
                      "cached": kw.get("past_key_values") is not None})
        taus.append(None)
        out = base_forward(model, x, *args, **kw)
        if noise:
            out.logits = out.logits + noise * torch.randn(out.logits.shape, generator=gen)
        return out

    def threshold(**kw: Any) -> float:
        out = base_tau(**kw)
        taus[-1] = out
        return out

    model.forward, blk.context_aware_threshold = forward, threshold
    try:
        out = model.diffusion_generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=g, steps=g // k,
            temperature=0.0, alg="confidence_threshold", threshold=tau, block_length=k,
            eos=DREAM_EOS, window_size=window, confidence_alpha=alpha,
            mask_token_id=DREAM_MASK, output_history=False,
            return_dict_in_generate=True).sequences
    finally:
        del model.forward
        blk.context_aware_threshold = base_tau
    p = prompt.shape[1]
    steps = []
    for i, call in enumerate(calls):
        block = sum(1 for c in calls[:i + 1] if not c["cached"]) - 1
        end = p + (block + 1) * k
        after = calls[i + 1]["canvas"][0] if i + 1 < len(calls) else out[0]
        before = call["canvas"][0]
        done = (before[:end] == DREAM_MASK) & (after[:end] != DREAM_MASK)
        steps.append({"tau": taus[i], "committed": [int(j) - p for j in torch.nonzero(done)]})
    info = {"steps": steps, "kept": [c["positions"] for c in calls if not c["cached"]],
            "widths": [c["width"] for c in calls]}
    return out, len(calls), info


def dream_case(name: str, prompt: torch.Tensor, args: tuple, result: Any) -> dict[str, Any]:
    g, k, tau, window, alpha = args
    out = case(name, prompt, args, result)
    out.update({
        "reference_path": "Dream/model/generation_utils_block.py",
        "reference_function": "DreamGenerationMixin.diffusion_generate (_sample, "
                              "alg=confidence_threshold)",
        "model_forward": "Dream/model/modeling_dream.py of the same commit (position_ids with "
                         "past_key_values), fp32, CPU",
        "args": {"gen_length": g, "block_length": k, "steps": g // k, "temperature": 0.0,
                 "alg": "confidence_threshold", "mask_token_id": DREAM_MASK, "eos": DREAM_EOS,
                 "threshold": tau, "window_size": window, "confidence_alpha": alpha},
    })
    return out


def record_dream(repo: Path, checkpoint: Path, out_path: Path) -> None:
    model, blk = load_dream(repo, checkpoint)
    cases = []
    with torch.no_grad():
        for name, p, g, k, tau, window, alpha, seed in DREAM_SETTINGS:
            prompt = torch.randint(0, DREAM_EOS, (1, p),
                                   generator=torch.Generator().manual_seed(seed))
            ok, result = stable(model, blk, prompt, (g, k, tau, window, alpha), run_dream)
            print(f"{name}: nfe {result[1]}, blocks entered {len(result[2]['kept'])}, "
                  f"noise-stable {ok}")
            if ok:
                cases.append(dream_case(name, prompt, (g, k, tau, window, alpha), result))
        for name, p, g, k, tau, window, alpha in DREAM_EXITS:
            for seed in EXIT_SEEDS:
                prompt = torch.randint(0, DREAM_EOS, (1, p),
                                       generator=torch.Generator().manual_seed(seed))
                result = run_dream(model, blk, prompt, g, k, tau, window, alpha)
                if not _exited(result[0], p, g, k, result[2]):
                    continue
                ok, result = stable(model, blk, prompt, (g, k, tau, window, alpha), run_dream)
                print(f"{name} (seed {seed}): nfe {result[1]}, blocks entered "
                      f"{len(result[2]['kept'])} of {g // k}, noise-stable {ok}")
                if ok:
                    cases.append(dream_case(name, prompt, (g, k, tau, window, alpha), result))
                    break
    meta = {
        "reference": f"{REPO} @ {COMMIT}, Dream/model/generation_utils_block.py "
                     "DreamGenerationMixin._sample (alg=confidence_threshold, as Dream/eval.py "
                     "with use_cache=true)",
        "checkpoint": "../shared/conformance/dream-tiny (mask 440, EOS 436, vocabulary 448)",
        "command": "OMP_NUM_THREADS=1 python benchmarks/conformance/record_streaming_dllm.py "
                   "--family dream --repo <Streaming-dLLM snapshot> --checkpoint "
                   "../shared/conformance/dream-tiny --out "
                   "tests/fixtures/methods2026/streaming_dllm_dream.json",
        "patched": "no line of the authors' code: matplotlib (imported, unused) is an empty "
                   "stub module; Dream/model/__init__.py is not exported (it imports the "
                   "tokenizer); context_aware_threshold and the model's forward are wrapped to "
                   "record (returning what they return; the forward adds the noise)",
        "nfe": "forwards counted (the Dream code counts none): per block one forward over "
               "[0, block end) + window + tail (it commits the block's first position alone), "
               "then one per step over block + window + tail against the [0, block start) "
               "cache",
        "steps": "per forward: tau (null at a block's first forward), the committed answer "
                 "positions",
    }
    write_fixture(out_path, meta, cases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--family", choices=("llada", "dream"), default="llada")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.family == "dream":
        record_dream(args.repo, args.checkpoint, args.out)
        return
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
