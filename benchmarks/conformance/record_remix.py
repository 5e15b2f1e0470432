"""Record ReMix conformance cases from the authors' ``decoding_remix`` on llada-tiny (not a test).

Reference: ``Serpientw/ReMix-DLLM`` @ aea1fd9, ``LLaDA/model/decoding.py::decoding_remix``, run
unmodified with the repository's own ``LLaDA/model/modeling_llada.py`` (its ``inputs_embeds``
path; the code reads ``model.model.transformer.wte.weight``). The code takes ``mask_id`` as an
argument (500 here) and has no other literal id; the model is loaded in float32 (the code
computes its softmax, soft embeddings and confidences in the embedding's dtype: bf16 with the
released weights; no bf16 case is recorded, the CPU bf16 forwards of the two implementations
round differently). Run in a separate environment (torch 2.13 CPU, transformers 4.49.0) with
a local snapshot of the repository::

    OMP_NUM_THREADS=1 python benchmarks/conformance/record_remix.py \
        --repo /path/to/ReMix-DLLM --checkpoint ../shared/conformance/llada-tiny \
        --out tests/fixtures/methods2026/remix.json

Each case keeps the output ids, the step count the code returns (= forwards), per forward the
answer positions committed (``store=True``'s per-step canvases) and per forward the answer
positions fed a *mixed* embedding (an input row that differs from the mask embedding at a
masked position: read off the ``inputs_embeds`` the code passes; a masked position of the
block fed the pure mask embedding while others are mixed was rejected). A case is kept only
if it is unchanged under ``1e-6 * (1 + |logit|) * U(-1, 1)`` logit noise (three seeds) and on
a rerun.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tools import export, write_fixture  # noqa: E402

REPO, COMMIT = "Serpientw/ReMix-DLLM", "aea1fd91a90d9de8487ea01529359aa4ce118a14"
MASK_ID, SPECIAL = 500, 499  # ids >= 499 are special in llada-tiny (EOS 499, mask 500)
NOISE, NOISE_SEEDS = 1e-6, (1, 2, 3)

#: (name, prompt length, gen_length, block_length, threshold, js_threshold, beta_mix, seed)
SETTINGS = [
    ("gsm8k_two_blocks", 8, 32, 16, 0.9, 0.3, 0.5, 1),
    ("gsm8k_one_block", 10, 32, 32, 0.9, 0.3, 0.5, 2),
    ("math500_three_blocks", 9, 48, 16, 0.8, 0.3, 0.5, 3),
    ("countdown_beta06", 7, 32, 16, 0.8, 0.3, 0.6, 4),
    ("readme_js02", 12, 32, 16, 0.8, 0.2, 0.5, 5),
    ("low_js_rejects", 6, 32, 16, 0.9, 0.05, 0.5, 6),
    ("tiny_js_rejects", 11, 48, 16, 0.8, 0.01, 0.5, 7),
    ("low_tau_cap", 8, 64, 32, 0.5, 0.3, 0.5, 8),
    ("strong_mix", 9, 32, 16, 0.9, 0.3, 0.9, 9),
    ("long_block", 5, 64, 64, 0.9, 0.1, 0.5, 10),
    ("short_blocks", 10, 24, 8, 0.9, 0.3, 0.5, 11),
    ("high_tau", 7, 32, 16, 0.95, 0.2, 0.5, 12),
]


class Recorder:
    """The authors' ``LLaDAModelLM`` as ``decoding_remix`` calls it (``model(None,
    inputs_embeds=...)``, ``model.model.transformer.wte``, ``model.device``), optionally with
    ``scale * (1 + |logit|) * U(-1, 1)`` noise on its logits; keeps every input it is fed."""

    def __init__(self, net: Any, scale: float = 0.0, seed: int = 0) -> None:
        self.net, self.model, self.scale = net, net.model, scale
        self.gen = torch.Generator().manual_seed(seed)
        self.inputs: list[torch.Tensor] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def __call__(self, input_ids: Any = None, inputs_embeds: Any = None) -> Any:
        self.inputs.append(inputs_embeds.detach().clone())
        logits = self.net(input_ids, inputs_embeds=inputs_embeds).logits
        if self.scale:
            u = torch.rand(logits.shape, generator=self.gen, dtype=torch.float64) * 2 - 1
            logits = logits + (self.scale * (1 + logits.double().abs()) * u).to(logits.dtype)
        return type("Out", (), {"logits": logits})()


def run(fn: Any, net: Any, prompt: torch.Tensor, kwargs: dict[str, Any], scale: float = 0.0,
        seed: int = 0) -> tuple[list, int, list[list[int]], list[list[int]]]:
    """``(output ids, steps, answer positions committed per forward, answer positions fed a
    mixed embedding per forward)``."""
    model = Recorder(net, scale, seed)
    with torch.no_grad():
        x, steps, history = fn(model, prompt, mask_id=MASK_ID, store=True, **kwargs)
    p = prompt.shape[1]
    canvases = [torch.cat([prompt[0], torch.full((x.shape[1] - p,), MASK_ID)])[p:]]
    canvases += [h[0, p:] for h in history]
    commits = [torch.nonzero((a == MASK_ID) & (b != MASK_ID)).flatten().tolist()
               for a, b in zip(canvases[:-1], canvases[1:], strict=True)]
    e_mask = net.model.transformer.wte.weight[MASK_ID]
    mixed = [torch.nonzero((c == MASK_ID) & (e[0, p:] != e_mask).any(-1)).flatten().tolist()
             for c, e in zip(canvases[:-1], model.inputs, strict=True)]
    return x.tolist(), int(steps), commits, mixed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="ReMix-DLLM repository snapshot")
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="remix_ref_"))
    export(args.repo, COMMIT, {f"LLaDA/model/{n}": n for n in (
        "__init__.py", "decoding.py", "modeling_llada.py", "configuration_llada.py")},
        scratch / "model")
    sys.path.insert(0, str(scratch))
    from model import LLaDAModelLM, decoding_remix  # noqa: PLC0415 (exported above)

    net = LLaDAModelLM.from_pretrained(str(args.checkpoint), torch_dtype=torch.float32).eval()
    cases = []
    for name, p, g, b, tau, js, beta, seed in SETTINGS:
        kwargs = dict(gen_length=g, block_length=b, temperature=0.0, threshold=tau,
                      js_threshold=js, beta_mix=beta)
        prompt = torch.randint(0, SPECIAL, (1, p), generator=torch.Generator().manual_seed(seed))
        out = run(decoding_remix, net, prompt, kwargs)
        stable = run(decoding_remix, net, prompt, kwargs) == out
        for s in NOISE_SEEDS:
            stable = stable and run(decoding_remix, net, prompt, kwargs, NOISE, s) == out
        ids, steps, commits, mixed = out
        print(f"{name}: steps {steps}, commits {[len(c) for c in commits]}, mixed "
              f"{[len(m) for m in mixed]}, noise-stable {stable}")
        if not stable or MASK_ID in ids[0][p:]:
            continue
        cases.append({
            "name": name, "reference_repo": REPO, "reference_commit": COMMIT,
            "reference_path": "LLaDA/model/decoding.py", "reference_function": "decoding_remix",
            "model_forward": f"{REPO} @ {COMMIT[:7]} LLaDA/model/modeling_llada.py "
                             "(LLaDAModelLM, inputs_embeds, fp32, CPU)",
            "prompt_ids": prompt.tolist(), "args": {**kwargs, "mask_id": MASK_ID},
            "output_ids": ids, "nfe": steps, "commits_per_step": commits,
            "mixed_per_step": mixed,
            "checks": {"rerun_identical": True, "noise": f"{NOISE} * (1 + |logit|) * U(-1, 1)",
                       "noise_seeds": list(NOISE_SEEDS), "no_mask_left": True},
        })
    meta = {
        "reference": f"{REPO} @ {COMMIT}: LLaDA/model/decoding.py decoding_remix with "
                     "LLaDA/model/modeling_llada.py (unmodified)",
        "checkpoint": "../shared/conformance/llada-tiny (mask 500, EOS 499, vocabulary 512), "
                      "float32",
        "patched": "nothing: mask_id is an argument of decoding_remix (500); the model is "
                   "loaded in float32 (the code follows the embedding's dtype)",
        "command": "OMP_NUM_THREADS=1 python benchmarks/conformance/record_remix.py --repo "
                   "<ReMix-DLLM snapshot> --checkpoint ../shared/conformance/llada-tiny "
                   "--out tests/fixtures/methods2026/remix.json",
        "nfe": "the code's returned step count (one forward per step)",
        "mixed_per_step": "answer positions still masked whose fed embedding differs from the "
                          "mask embedding (the mixing state); a masked position of the block "
                          "left out while others are mixed was rejected (a zeroed history row)",
    }
    write_fixture(args.out, meta, cases)


if __name__ == "__main__":
    main()
