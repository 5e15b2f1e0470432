"""Record WINO conformance cases from the authors' ``decoding_wino`` on llada-tiny.

Reference: Feng-Hong/WINO-DLLM ``LLaDA/decoding.py`` ``decoding_wino`` with the repository's
own ``LLaDA/modeling_llada.py`` (it takes the 4-D boolean attention mask and ``position_ids``
the shadow block needs), at the commit below. Run in a separate environment (torch 2.13 CPU,
transformers 4.49.0) with a local snapshot of the repository::

    OMP_NUM_THREADS=1 python benchmarks/conformance/record_wino.py \
        --repo /path/to/WINO-DLLM --checkpoint ../shared/conformance/llada-tiny \
        --out tests/fixtures/methods2026/wino.json

Each case keeps the reference's output ids, its step count (``nfe``: one forward per step in
the reference), and per step the positions it committed and re-masked (read off the canvas
the reference fed to the model). A case is kept only if it is unchanged when N(0, 1e-6) noise
is added to every logit (three draws) and when the reference is rerun.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tools import export, load_llada, write_fixture  # noqa: E402

REPO = "Feng-Hong/WINO-DLLM"
COMMIT = "9549a1d0c3cbd9dc9b8f7cd09be8a7aac322d6fb"
MASK_ID = 500
SPECIAL = 499  # ids >= this are special in llada-tiny (EOS 499, mask 500)

#: (name, prompt length, gen_length, block_length, threshold, threshold_back, prompt seed)
SETTINGS = [
    ("wino_one_block", 8, 16, 16, 0.6, 0.9, 1),
    ("wino_two_blocks", 10, 32, 16, 0.6, 0.9, 2),
    ("wino_low_tau", 9, 32, 16, 0.3, 0.9, 3),
    ("wino_math500", 12, 24, 8, 0.7, 0.9, 4),
    ("wino_loose_back", 7, 32, 32, 0.5, 0.95, 5),
    ("wino_mbpp", 11, 32, 16, 0.8, 0.9, 6),
    ("wino_tight_back", 6, 16, 8, 0.4, 0.8, 7),
    ("wino_wide", 10, 48, 16, 0.2, 0.9, 8),
    ("wino_long_block", 5, 64, 64, 0.5, 0.9, 9),
    ("wino_arc", 8, 40, 8, 0.5, 0.9, 10),
]


class Recorder(torch.nn.Module):
    """The model, recording every canvas it is fed, optionally adding noise to its logits."""

    def __init__(self, model: torch.nn.Module, noise: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.model, self.noise = model, noise
        self.gen = torch.Generator().manual_seed(seed)
        self.inputs: list[torch.Tensor] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, x: torch.Tensor, **kwargs):
        self.inputs.append(x.clone())
        out = self.model(x, **kwargs)
        if self.noise:
            logits = out.logits + self.noise * torch.randn(out.logits.shape, generator=self.gen)
            out = type(out)(logits=logits, **{k: v for k, v in out.items() if k != "logits"}) \
                if hasattr(out, "items") else out._replace(logits=logits)
        return out


def run(wino, model, prompt, g, k, tau, back, noise=0.0, seed=0):
    rec = Recorder(model, noise, seed)
    with torch.no_grad():
        out, steps = wino(rec, prompt, gen_length=g, block_length=k, temperature=0.0,
                          mask_id=MASK_ID, threshold=tau, threshold_back=back)
    return out, int(steps), rec.inputs


def trace(inputs: list[torch.Tensor], final: torch.Tensor, p: int, g: int) -> list[dict]:
    """Per step: generated positions (0-based in the answer) committed and re-masked."""
    canvases = [x[0, p:p + g] for x in inputs] + [final[0, p:p + g]]
    out = []
    for before, after in zip(canvases[:-1], canvases[1:], strict=True):
        was, now = before == MASK_ID, after == MASK_ID
        out.append({"committed": torch.nonzero(was & ~now).flatten().tolist(),
                    "remasked": torch.nonzero(~was & now).flatten().tolist()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="wino_ref_"))
    code = export(args.repo, COMMIT, {"LLaDA/decoding.py": "decoding.py",
                                       "LLaDA/modeling_llada.py": "modeling_llada.py",
                                       "LLaDA/configuration_llada.py": "configuration_llada.py"},
                  scratch / "code")
    model = load_llada(args.checkpoint, code, scratch)
    sys.path.insert(0, str(code))
    from decoding import decoding_wino  # noqa: PLC0415 (the authors' code, exported above)

    cases = []
    for name, p, g, k, tau, back, seed in SETTINGS:
        prompt = torch.randint(0, SPECIAL, (1, p), generator=torch.Generator().manual_seed(seed))
        out, steps, inputs = run(decoding_wino, model, prompt, g, k, tau, back)
        again, steps2, _ = run(decoding_wino, model, prompt, g, k, tau, back)
        stable = torch.equal(out, again) and steps == steps2
        for draw in range(3):
            noisy, steps3, _ = run(decoding_wino, model, prompt, g, k, tau, back, 1e-6, draw)
            stable = stable and torch.equal(out, noisy) and steps == steps3
        steps_trace = trace(inputs, out, p, g)
        remasks = sum(len(s["remasked"]) for s in steps_trace)
        multi = sum(len(s["committed"]) > 1 for s in steps_trace)
        print(f"{name}: steps {steps}, remasked {remasks}, multi-commit steps {multi}, "
              f"noise-stable {stable}")
        if not stable:
            continue
        cases.append({
            "name": name,
            "reference_repo": REPO, "reference_commit": COMMIT,
            "reference_path": "LLaDA/decoding.py", "reference_function": "decoding_wino",
            "model_forward": "LLaDA/modeling_llada.py of the same commit (4-D bool mask, "
                             "position_ids), fp32, CPU",
            "prompt_ids": prompt.tolist(),
            "args": {"gen_length": g, "block_length": k, "temperature": 0.0,
                     "mask_id": MASK_ID, "threshold": tau, "threshold_back": back},
            "output_ids": out.tolist(), "nfe": steps, "steps": steps_trace,
            "checks": {"rerun_identical": True, "unchanged_under_logit_noise_std": 1e-6,
                       "noise_draws": 3},
        })
    meta = {
        "reference": f"{REPO} @ {COMMIT}, LLaDA/decoding.py decoding_wino",
        "checkpoint": "../shared/conformance/llada-tiny (mask 500, vocabulary 512)",
        "command": "OMP_NUM_THREADS=1 python benchmarks/conformance/record_wino.py --repo "
                   "<WINO-DLLM snapshot> --checkpoint ../shared/conformance/llada-tiny --out "
                   "tests/fixtures/methods2026/wino.json",
        "nfe": "the reference's step count (one forward of prompt + answer + shadow block "
               "per step)",
    }
    write_fixture(args.out, meta, cases)


if __name__ == "__main__":
    main()
