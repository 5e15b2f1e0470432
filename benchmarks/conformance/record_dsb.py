"""Record DSB / DSB Cache conformance cases from the authors' code on llada-tiny (not a test).

Reference: lizhuo-luo/DSB @ 114c121, ``llada/generate.py`` (``generate_dsb``,
``generate_dsb_cache``, ``get_transfer_index``) and the repo's ``llada/model/modeling_llada.py``
(Fast-dLLM's ``replace_position`` dual cache), run unmodified: ``mask_id`` is an argument
(500 here); nothing is patched. Their ``print(f'nfe: ...')`` goes to stdout.

Every forward and every selection is observed from outside: a wrapper around the model records
each call (a full forward, or the slice that ``replace_position`` marks), and a wrapper around
the module's ``get_transfer_index`` records the eligible positions it is handed and the ones it
commits (canvas positions: slice offsets plus the slice start). Per step the case stores the
window as the code sees it (first and last eligible position), the eligible and committed
positions, the fed span, and the NFE.

Run in a separate environment (torch 2.13 CPU, transformers 4.49.0)::

    OMP_NUM_THREADS=1 python benchmarks/conformance/record_dsb.py \
        --repo /path/to/DSB --checkpoint ../shared/conformance/llada-tiny \
        --out tests/fixtures/methods2026/dsb.json

A case is kept only if its tokens, NFE and per-step records are unchanged with
``1e-6 * (1 + |logit|) * U(-1, 1)`` logit noise (three seeds) and on a rerun.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tools import export, write_fixture  # noqa: E402

REPO = "lizhuo-luo/DSB"
COMMIT = "114c12182c8c158b23d5efa07fbc2b691e155677"
MASK_ID, SPECIAL = 500, 499
NOISE, NOISE_SEEDS = 1e-6, (1, 2, 3)

#: (name, prompt length, gen, block B, const, cache, threshold, prefix window, suffix window,
#: prompt seed); const: max_block_length = B, else -1 (greedy)
SETTINGS = [
    ("greedy_tau09", 8, 48, 16, False, False, 0.9, 24, 0, 1),
    ("greedy_tau05", 10, 48, 8, False, False, 0.5, 24, 0, 2),
    ("greedy_tau03", 6, 64, 16, False, False, 0.3, 24, 0, 3),
    ("greedy_b32", 12, 64, 32, False, False, 0.7, 24, 0, 4),
    ("const_tau09", 8, 48, 16, True, False, 0.9, 24, 0, 5),
    ("const_tau05", 10, 48, 8, True, False, 0.5, 24, 0, 6),
    ("const_tau03", 6, 64, 16, True, False, 0.3, 24, 0, 7),
    ("const_b32", 12, 64, 32, True, False, 0.7, 24, 0, 8),
    ("cache_greedy_tau09", 8, 48, 16, False, True, 0.9, 24, 0, 9),
    ("cache_greedy_tau05", 10, 48, 8, False, True, 0.5, 24, 0, 10),
    ("cache_greedy_pw4", 20, 64, 16, False, True, 0.5, 4, 0, 11),
    ("cache_greedy_b32", 12, 64, 32, False, True, 0.7, 24, 0, 12),
    ("cache_const_tau09", 8, 48, 16, True, True, 0.9, 24, 0, 13),
    ("cache_const_tau05", 10, 48, 8, True, True, 0.5, 24, 0, 14),
    ("cache_const_pw4", 20, 64, 16, True, True, 0.5, 4, 0, 15),
    ("cache_const_b32", 12, 64, 32, True, True, 0.7, 24, 0, 16),
    ("cache_greedy_suffix4", 24, 64, 8, False, True, 0.5, 2, 4, 17),
    ("cache_const_suffix4", 24, 64, 8, True, True, 0.5, 2, 4, 18),
]


class Observed(torch.nn.Module):
    """The model with optional logit noise; records each call's fed span ``(start, end)``."""

    def __init__(self, model: torch.nn.Module, scale: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.model, self.scale = model, scale
        self.gen = torch.Generator().manual_seed(seed)
        self.spans: list[tuple[int, int]] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, x: torch.Tensor, **kwargs: Any) -> Any:
        rp = kwargs.get("replace_position")
        if rp is None:
            self.spans.append((0, x.shape[1]))
        else:
            idx = rp[0].nonzero()[:, 0]
            self.spans.append((int(idx[0]), int(idx[-1]) + 1))
        out = self.model(x, **kwargs)
        if self.scale:
            u = torch.rand(out.logits.shape, generator=self.gen, dtype=torch.float64) * 2 - 1
            noise = (self.scale * (1 + out.logits.double().abs()) * u).to(out.logits.dtype)
            out = types.SimpleNamespace(logits=out.logits + noise,
                                        past_key_values=getattr(out, "past_key_values", None))
        return out


def spy_transfer(gen_mod: Any, log: list[tuple[list[int], list[int]]]) -> None:
    """Record (eligible, committed) offsets at every ``get_transfer_index`` call."""
    original = gen_mod.get_transfer_index

    def spy(logits, temperature, remasking, mask_index, x, *args, **kwargs):
        out = original(logits, temperature, remasking, mask_index, x, *args, **kwargs)
        log.append((mask_index[0].nonzero()[:, 0].tolist(), out[1][0].nonzero()[:, 0].tolist()))
        return out

    gen_mod.get_transfer_index = spy


def decode(gen_mod: Any, model: Any, prompt: torch.Tensor, setting: tuple,
           log: list, scale: float = 0.0, seed: int = 0) -> dict[str, Any]:
    _, _, g, b, const, cached, tau, pw, sw, _ = setting
    wrapped = Observed(model, scale, seed)
    log.clear()
    kwargs = dict(steps=g, gen_length=g, block_length=b, temperature=0.0,
                  remasking="low_confidence", mask_id=MASK_ID, threshold=tau,
                  max_block_length=b if const else -1)
    with torch.no_grad():
        if cached:
            x, nfe = gen_mod.generate_dsb_cache(wrapped, prompt, prefix_window=pw,
                                                suffix_window=sw, **kwargs)
        else:
            x, nfe = gen_mod.generate_dsb(wrapped, prompt, **kwargs)
    steps = []
    for (start, end), (eligible, committed) in zip(wrapped.spans, log, strict=True):
        off = 0 if end - start == x.shape[1] else start  # slice offsets -> canvas positions
        elig = [off + i for i in eligible]
        steps.append({"fed": [start, end], "eligible": elig,
                      "committed": [off + i for i in committed],
                      "window": [elig[0], elig[-1] + 1] if elig else None})
    return {"tokens": x[0].tolist(), "nfe": nfe, "steps": steps}


def load_package_llada(checkpoint: Path) -> Any:
    """``LLaDAModelLM`` of the repo's ``model`` package (its modeling file imports its
    configuration relatively, so ``reference_tools.load_llada``'s flat copy cannot load it)
    with the checkpoint's weights (fp32, eval)."""
    import json

    from safetensors.torch import load_file

    conf_mod = importlib.import_module("model.configuration_llada")
    model_mod = importlib.import_module("model.modeling_llada")
    cfg = conf_mod.LLaDAConfig(**json.loads((checkpoint / "config.json").read_text()))
    cfg.init_device = "cpu"
    model = model_mod.LLaDAModelLM(cfg, init_params=False)
    missing, unexpected = model.load_state_dict(load_file(str(checkpoint / "model.safetensors")),
                                                strict=False)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    return model.float().eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="dsb_ref_"))
    (scratch / "code" / "model").mkdir(parents=True)
    code = export(args.repo, COMMIT, {
        "llada/generate.py": "generate.py",
        "llada/model/__init__.py": "model/__init__.py",
        "llada/model/modeling_llada.py": "model/modeling_llada.py",
        "llada/model/configuration_llada.py": "model/configuration_llada.py"}, scratch / "code")
    sys.path.insert(0, str(code))
    gen_mod = importlib.import_module("generate")
    log: list = []
    spy_transfer(gen_mod, log)
    model = load_package_llada(args.checkpoint)
    cases = []
    for setting in SETTINGS:
        name, p, g, b, const, cached, tau, pw, sw, seed = setting
        prompt = torch.randint(0, SPECIAL, (1, p), generator=torch.Generator().manual_seed(seed))
        ref = decode(gen_mod, model, prompt, setting, log)
        runs = [decode(gen_mod, model, prompt, setting, log)] + [
            decode(gen_mod, model, prompt, setting, log, NOISE, s) for s in NOISE_SEEDS]
        stable = all(r == ref for r in runs)
        left = sum(t == MASK_ID for t in ref["tokens"])
        multi = sum(len(s["committed"]) > 1 for s in ref["steps"])
        print(f"{name}: stable {stable}, nfe {ref['nfe']}, steps committing >1: {multi}, "
              f"masks left {left}")
        if not stable or left:
            continue
        cases.append({
            "name": name,
            "reference_repo": REPO, "reference_commit": COMMIT,
            "reference_function": "llada/generate.py " + (
                "generate_dsb_cache" if cached else "generate_dsb"),
            "prompt_ids": prompt.tolist(),
            "args": {"gen_length": g, "block_length": b, "steps": g, "threshold": tau,
                     "max_block_length": b if const else -1, "mask_id": MASK_ID,
                     "temperature": 0.0, "remasking": "low_confidence",
                     **({"prefix_window": pw, "suffix_window": sw} if cached else {})},
            "answer_ids": [ref["tokens"][p:]], "nfe": ref["nfe"], "steps": ref["steps"],
            "checks": {"rerun_identical": True, "unchanged_under_relative_logit_noise": NOISE,
                       "noise_seeds": list(NOISE_SEEDS), "steps_committing_several": multi},
        })
    meta = {
        "reference": f"{REPO} @ {COMMIT}: llada/generate.py generate_dsb, generate_dsb_cache",
        "model_forward": f"{REPO} @ {COMMIT} llada/model/modeling_llada.py (LLaDAModelLM, fp32)"
                         " on ../shared/conformance/llada-tiny",
        "checkpoint": "../shared/conformance/llada-tiny (mask 500, vocabulary 512)",
        "patched": "nothing: mask_id=500 is an argument of both functions; the model and "
                   "get_transfer_index are wrapped only to observe (and, for the robustness "
                   "check, to add logit noise)",
        "command": "OMP_NUM_THREADS=1 python benchmarks/conformance/record_dsb.py --repo "
                   "<DSB snapshot> --checkpoint ../shared/conformance/llada-tiny "
                   "--out tests/fixtures/methods2026/dsb.json",
        "steps": "one entry per forward: fed = [start, end) (the whole canvas, or the "
                 "replace_position slice), eligible / committed canvas positions, window = "
                 "[first, last + 1) of the eligible positions",
        "nfe": "the code's nfe (every forward, refreshes included)",
    }
    write_fixture(args.out, meta, cases)


if __name__ == "__main__":
    main()
