"""Record SAID conformance cases from the authors' code on llada-tiny (not a test).

References: ``TH-AI-Lab-PKU/SAID`` @ a2d7f60, ``SAID-v1/my_generate_said.py::generate`` (the
README's SAID) and ``SAID-block/generate_said.py::generate_said`` (the block variant), both run
unmodified. The repository ships no LLaDA modeling (its scripts load ``GSAI-ML`` checkpoints
through ``AutoModel``): the forward is Fast-dLLM++'s ``v1/llada/model/modeling_llada.py`` @
29fd034, as in ``tests/fixtures/methods2026/record_cases.py``. Run in a separate environment
(torch 2.13 CPU, transformers 4.49.0) with local snapshots of both repositories::

    TORCHDYNAMO_DISABLE=1 OMP_NUM_THREADS=1 python benchmarks/conformance/record_said.py \
        --said /path/to/SAID --fastdllmpp /path/to/FastdLLM_plusplus \
        --checkpoint ../shared/conformance/llada-tiny --out tests/fixtures/methods2026/said.json

The one runtime patch: the code indexes the logits at the literal ids 126081 (EOS) and 126348
(EoT) of LLaDA's 126464-token vocabulary; llada-tiny has 512 tokens (EOS 499, mask 500, no
EoT). ``WideVocab`` hands the code logits over 126464 ids: llada-tiny's at their ids, its EOS
logit at 126081 (-inf at 499), -inf everywhere else (126348 included: no EoT), and maps 126081
back to 499 in the canvas the model reads and in the output. Softmax, argmax and the in-place
zeroing then act on the code's literals exactly as on LLaDA-8B; the mask id is the functions'
``mask_id`` argument (500).

Each case keeps the output ids, the NFE (model calls, the probe forward included: the code
returns no count) and the answer positions each forward's step committed. A case is kept only
if it is unchanged under ``1e-6 * (1 + |logit|) * U(-1, 1)`` logit noise (three seeds) and
leaves no mask in the answer.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tools import export, write_fixture  # noqa: E402

SAID_REPO, SAID_COMMIT = "TH-AI-Lab-PKU/SAID", "a2d7f60dca8b5c1fb4d9defa9e5a9c296485cf5a"
FPP_REPO, FPP_COMMIT = "Ringo-Star/FastdLLM_plusplus", "29fd03401acced3cc3ba89d7f2e2e371058d1b54"
MASK_ID, EOS, SPECIAL = 500, 499, 499  # ids >= 499 are special in llada-tiny
LLADA_VOCAB, LLADA_EOS = 126464, 126081
NOISE, NOISE_SEEDS = 1e-6, (1, 2, 3)

#: v1: (name, prompt length, gen_length, steps, confidence_eos_eot_inf, logits_eos_inf, seed)
V1 = [
    ("v1_even_prompt", 8, 16, 8, True, False, 1),
    ("v1_odd_prompt", 7, 16, 8, True, False, 2),
    ("v1_few_steps", 6, 24, 4, True, False, 3),
    ("v1_idle_scaffold", 9, 12, 8, True, False, 4),
    ("v1_plain_confidence", 5, 20, 10, False, False, 5),
    ("v1_eos_inf", 10, 16, 8, True, True, 6),
    ("v1_long", 12, 40, 20, True, False, 7),
    ("v1_gpqa_like", 11, 32, 4, True, False, 8),
    ("v1_one_step", 4, 16, 1, True, False, 9),
    ("v1_odd_long", 13, 32, 16, True, False, 10),
    ("v1_small_hard", 4, 16, 8, True, False, 30),
    ("v1_one_hard", 5, 16, 8, True, False, 28),
    ("v1_short", 6, 12, 6, True, False, 24),
]
#: block: (name, prompt length, gen_length, block_length, steps, num_stages, rec_steps,
#: confidence_eos_eot_inf, logits_eos_inf, seed)
BLOCK = [
    ("block_t4", 8, 32, 16, 8, 3, 2, True, False, 11),
    ("block_t8_idle", 7, 32, 16, 16, 3, 2, True, False, 12),
    ("block_one_block", 6, 32, 32, 16, 3, 2, True, False, 13),
    ("block_k2", 9, 16, 8, 8, 2, 1, True, False, 14),
    ("block_k4", 5, 32, 32, 12, 4, 2, True, False, 15),
    ("block_plain_confidence", 10, 24, 8, 12, 3, 2, False, False, 16),
    ("block_eos_inf", 6, 32, 16, 8, 3, 2, True, True, 17),
    ("block_k1_llada", 6, 16, 16, 8, 1, 2, True, False, 18),
    ("block_rec1", 8, 48, 16, 12, 3, 1, True, False, 19),
    ("block_gsm8k_like", 12, 64, 16, 16, 3, 2, True, False, 20),
]


class WideVocab:
    """llada-tiny seen through LLaDA's vocabulary (see the module docstring), optionally with
    ``scale * (1 + |logit|) * U(-1, 1)`` noise on its logits; records every canvas it reads."""

    def __init__(self, model: Any, scale: float = 0.0, seed: int = 0) -> None:
        self.model, self.scale = model, scale
        self.gen = torch.Generator().manual_seed(seed)
        self.inputs: list[torch.Tensor] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def __call__(self, x: torch.Tensor, attention_mask: Any = None) -> Any:
        x = torch.where(x == LLADA_EOS, EOS, x)
        self.inputs.append(x.clone())
        logits = self.model(x, attention_mask=attention_mask).logits
        if self.scale:
            u = torch.rand(logits.shape, generator=self.gen, dtype=torch.float64) * 2 - 1
            logits = logits + (self.scale * (1 + logits.double().abs()) * u).to(logits.dtype)
        wide = torch.full((*logits.shape[:2], LLADA_VOCAB), -torch.inf, dtype=logits.dtype)
        wide[..., :logits.shape[-1]] = logits
        wide[..., LLADA_EOS] = logits[..., EOS]
        wide[..., EOS] = -torch.inf
        return type("Out", (), {"logits": wide})()


def run(fn: Any, net: Any, prompt: torch.Tensor, kwargs: dict[str, Any], scale: float = 0.0,
        seed: int = 0) -> tuple[list, int, list[list[int]]]:
    """``(output ids, NFE, answer positions committed after each forward)``."""
    model = WideVocab(net, scale, seed)
    with torch.no_grad():
        out = fn(model, prompt, mask_id=MASK_ID, **kwargs)
    out = torch.where(out == LLADA_EOS, EOS, out)
    p = prompt.shape[1]
    canvases = [x[0, p:] for x in model.inputs] + [out[0, p:]]
    commits = [torch.nonzero((a == MASK_ID) & (b != MASK_ID)).flatten().tolist()
               for a, b in zip(canvases[:-1], canvases[1:], strict=True)]
    return out.tolist(), len(model.inputs), commits


def unit_vectors(mod: Any) -> dict[str, list]:
    """The code's pure schedule functions on a grid: ``said_stage_partition(length, K)`` and
    ``compute_stage_steps(K, steps, rec)`` (no model)."""
    lengths = [*range(1, 18), 24, 31, 32, 33, 64, 128]
    totals = [*range(1, 41), 64, 86, 128, 256]
    return {
        "said_stage_partition": [[n, k, [list(s) for s in mod.said_stage_partition(n, k)]]
                                 for n in lengths for k in range(1, 6)],
        "compute_stage_steps": [[k, t, r, [int(s) for s in mod.compute_stage_steps(k, t, r)]]
                                for k in range(1, 6) for t in totals for r in (1, 2, 3)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--said", type=Path, required=True, help="SAID repository snapshot")
    ap.add_argument("--fastdllmpp", type=Path, required=True,
                    help="FastdLLM_plusplus repository snapshot")
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="said_ref_"))
    export(args.said, SAID_COMMIT, {"SAID-v1/my_generate_said.py": "my_generate_said.py",
                                    "SAID-block/generate_said.py": "generate_said.py"}, scratch)
    export(args.fastdllmpp, FPP_COMMIT,
           {f"v1/llada/model/{n}": n for n in ("__init__.py", "modeling_llada.py",
                                                "configuration_llada.py")}, scratch / "model")
    sys.path.insert(0, str(scratch))
    v1 = importlib.import_module("my_generate_said").generate
    said_block = importlib.import_module("generate_said")
    block = said_block.generate_said
    from model.modeling_llada import LLaDAModelLM  # noqa: PLC0415 (exported above)

    net = LLaDAModelLM.from_pretrained(str(args.checkpoint), torch_dtype=torch.float32).eval()
    jobs = []
    for name, p, g, steps, conf, eos_inf, seed in V1:
        jobs.append((name, "generate", "SAID-v1/my_generate_said.py", v1, p, seed,
                     dict(steps=steps, gen_length=g, temperature=0.0, cfg_scale=0.0,
                          remasking="low_confidence", logits_eos_inf=eos_inf,
                          confidence_eos_eot_inf=conf)))
    for name, p, g, k, steps, stages, rec, conf, eos_inf, seed in BLOCK:
        jobs.append((name, "generate_said", "SAID-block/generate_said.py", block, p, seed,
                     dict(steps=steps, gen_length=g, block_length=k, temperature=0.0,
                          cfg_scale=0.0, remasking="low_confidence", logits_eos_inf=eos_inf,
                          confidence_eos_eot_inf=conf, num_stages=stages, rec_steps=rec)))
    cases = []
    for name, function, path, fn, p, seed, kwargs in jobs:
        prompt = torch.randint(0, SPECIAL, (1, p), generator=torch.Generator().manual_seed(seed))
        out, nfe, commits = run(fn, net, prompt, kwargs)
        stable = run(fn, net, prompt, kwargs)[:2] == (out, nfe)
        for s in NOISE_SEEDS:
            stable = stable and run(fn, net, prompt, kwargs, NOISE, s)[:2] == (out, nfe)
        masks = MASK_ID in out[0][p:]
        idle = sum(not c for c in commits)
        print(f"{name}: nfe {nfe}, idle forwards {idle}, commits "
              f"{[len(c) for c in commits]}, noise-stable {stable}, masks left {masks}")
        if not stable or masks:
            continue
        cases.append({
            "name": name, "reference_repo": SAID_REPO, "reference_commit": SAID_COMMIT,
            "reference_path": path, "reference_function": function,
            "model_forward": f"{FPP_REPO} @ {FPP_COMMIT[:7]} v1/llada/model/modeling_llada.py "
                             "(LLaDAModelLM, fp32, CPU) seen through WideVocab (126464 ids)",
            "prompt_ids": prompt.tolist(), "args": {**kwargs, "mask_id": MASK_ID},
            "output_ids": out, "nfe": nfe, "commits_per_step": commits,
            "checks": {"rerun_identical": True, "noise": f"{NOISE} * (1 + |logit|) * U(-1, 1)",
                       "noise_seeds": list(NOISE_SEEDS), "no_mask_left": True},
        })
    meta = {
        "unit_vectors": unit_vectors(said_block),
        "reference": f"{SAID_REPO} @ {SAID_COMMIT}: SAID-v1/my_generate_said.py generate, "
                     "SAID-block/generate_said.py generate_said (unmodified)",
        "checkpoint": "../shared/conformance/llada-tiny (mask 500, EOS 499, vocabulary 512)",
        "patched": "the code's literal EOS / EoT ids 126081 / 126348 do not exist in "
                   "llada-tiny's 512-token vocabulary: the model is wrapped (WideVocab) to "
                   "give logits over 126464 ids with llada-tiny's EOS logit at 126081 (-inf at "
                   "499), -inf at 126348 (no EoT) and at every id >= 512, and 126081 is read "
                   "back as 499; the code itself is unmodified",
        "command": "TORCHDYNAMO_DISABLE=1 OMP_NUM_THREADS=1 python "
                   "benchmarks/conformance/record_said.py --said <SAID snapshot> --fastdllmpp "
                   "<FastdLLM_plusplus snapshot> --checkpoint ../shared/conformance/llada-tiny "
                   "--out tests/fixtures/methods2026/said.json",
        "nfe": "model calls (the code counts none): v1's probe forward and every forward "
               "that commits nothing (a stage with fewer positions than steps) included",
    }
    write_fixture(args.out, meta, cases)


if __name__ == "__main__":
    main()
