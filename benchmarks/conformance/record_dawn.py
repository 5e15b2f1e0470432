"""Record DAWN conformance cases from the authors' LLaDA ``generate(..., dawn=True)`` on
llada-tiny, and (``--family dream``) from their Dream ``diffusion_generate(alg='dawn')`` on
dream-tiny.

Reference: lizhuo-luo/DAWN ``llada/generate.py`` (``generate``, ``get_transfer_index_dawn``),
``llada/gdllm_utils.py`` (``select_parallel_tokens_conflict_mis``, ``detect_attn_sinks_``) and
the repository's own ``llada/model/modeling_llada.py`` (its forward returns ``(output,
head-and-layer-averaged attention)``), at the commit below, run unmodified except for two
runtime patches recorded in the fixture's meta:

* the attention cut-off: the modeling collects attention from layers with index ``>= 28``
  (LLaDA-8B's last 4 of 32; literals in ``LLaDABlock._scaled_dot_product_attention`` and
  ``LLaDAModel.forward``). llada-tiny has 2 layers, so ``28 - (2 - k)`` identity blocks (they
  return their input, no cache, no attention) are put in front of the real blocks and the real
  blocks' ``layer_id`` set to their new index: the last ``k`` real layers are captured, the
  library's ``attention_layers=k`` convention; the computation is otherwise unchanged;
* ``gdllm_utils.py`` imports matplotlib and seaborn (plotting helpers, unused here): stub
  modules are registered under those names.

Run in a separate environment (torch 2.13 CPU, transformers 4.49.0) with a local snapshot of
the repository (never committed)::

    OMP_NUM_THREADS=1 /tmp/refvenv/bin/python benchmarks/conformance/record_dawn.py \\
        --repo /path/to/DAWN --checkpoint ../shared/conformance/llada-tiny \\
        --out tests/fixtures/methods2026/dawn.json

The Dream path: ``dream/model/generation_utils.py`` (``DreamGenerationMixin._sample_block``,
its ``alg == 'dawn'`` branch), ``dream/model/gdllm_utils.py`` and the repository's
``dream/model/modeling_dream.py`` (``DreamModel``; its forward returns ``(output, averaged
attention)`` with ``return_attn_scores``), at the same commit, unmodified except for the same
cut-off patch: the modeling collects attention from layers with index ``>= 24`` (Dream-7B's last
4 of 28; ``DreamBaseModel.forward``, two literals) and dream-tiny has 2 layers, so ``24 - (2 -
k)`` identity layers are put in front of the real ones (the layer index is the enumeration's).
It runs under transformers 4.49.0 as well (the checkpoint's 4.46.2 is not needed: the authors'
forward reproduces ``dream-tiny/logits.json`` to 1e-6). ``diffusion_generate`` is called with
the arguments of the authors' ``dream/eval.py`` (an all-ones ``attention_mask``, ``top_p=None``,
``top_k=None``): a call that leaves ``top_k`` out inherits the model config's legacy
``top_k=50``, which filters the softmax behind DAWN's confidences (one case records that call,
``args.top_k``; the library needs ``top_k=50`` passed to match it)::

    OMP_NUM_THREADS=1 /tmp/refvenv/bin/python benchmarks/conformance/record_dawn.py \\
        --family dream --repo /path/to/DAWN --checkpoint ../shared/conformance/dream-tiny \\
        --out tests/fixtures/methods2026/dawn_dream.json

Each step's sets are read off ``_sample_block``'s locals through its own
``generation_tokens_hook_func`` (called after each step's commit).

Each case keeps the prompt, the reference's final ``x`` (prompt included: the position-0 quirk
can overwrite it), its NFE and, per step, the committed canvas positions split as the
reference's own locals have them: ``high`` (``transfer_index_conf``), ``induced``
(``transfer_index_a``), ``free`` (``transfer_index_c`` at masked positions), ``fallback``
(the forced argmax) and ``overwrite`` (``transfer_index_c`` at position 0: the quirk). A case
is kept only if a rerun is identical and three draws of relative noise ``1e-6 (1 + |z|) U(-1,
1)`` on every logit, and ``1e-6 a U(-1, 1)`` on every averaged attention entry, leave the
tokens, the NFE and the per-step sets unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tools import export, write_fixture  # noqa: E402

REPO = "lizhuo-luo/DAWN"
COMMIT = "ab428980e325e85b04b100e1dd27ed1ad4ddb005"
MASK_ID = 500
SPECIAL = 499  # ids >= this are special in llada-tiny (EOS 499, mask 500)
CUTOFF = 28  # the modeling's hard-coded first captured layer
NOISE, NOISE_SEEDS = 1e-6, (1, 2, 3)
DREAM_MASK_ID = 440
DREAM_SPECIAL = 436  # ids >= this are special in dream-tiny (bos = eos = pad 436, mask 440)
DREAM_CUTOFF = 24  # the Dream modeling's hard-coded first captured layer

#: (name, prompt length, gen_length, block_length, tau_sink, tau_edge, tau_induce, tau_low,
#: captured layers, prompt seed)
SETTINGS = [
    ("dawn_defaults", 72, 128, 32, 0.01, 0.07, 0.7, 0.7, 2, 0),
    ("dawn_defaults_last_layer", 72, 128, 32, 0.01, 0.07, 0.7, 0.7, 1, 1),
    ("dawn_gsm8k_script", 64, 192, 32, 0.01, 0.07, 0.7, 0.75, 2, 3),
    ("dawn_humaneval_script", 88, 160, 32, 0.01, 0.07, 0.7, 0.8, 2, 4),
    ("dawn_block64", 72, 128, 64, 0.01, 0.07, 0.7, 0.7, 2, 5),
    ("dawn_quirk_edge03", 72, 128, 32, 0.01, 0.03, 0.7, 0.7, 2, 0),
    ("dawn_quirk_last_layer", 60, 160, 32, 0.01, 0.03, 0.7, 0.7, 1, 2),
    ("dawn_loose_induce", 72, 128, 32, 0.01, 0.05, 0.5, 0.6, 2, 7),
    ("dawn_few_sinks", 80, 128, 32, 0.02, 0.02, 0.7, 0.7, 2, 8),
    ("dawn_many_sinks", 72, 128, 16, 0.005, 0.05, 0.7, 0.7, 2, 6),
    ("dawn_short_scaled", 40, 96, 16, 0.015, 0.1, 0.7, 0.7, 2, 9),
    ("dawn_low_floor", 72, 128, 32, 0.01, 0.04, 0.6, 0.4, 2, 10),
]

#: Dream cases (same fields): the Dream scripts' taus (Instruct; Base tau_edge 0.05), the Dream
#: code's defaults (tau_induce 0.9), the LLaDA defaults, the quirk, sinks, blocks, one layer
DREAM_SETTINGS = [
    ("dream_script", 72, 128, 32, 0.03, 0.10, 0.75, 0.8, 2, 0),
    ("dream_base_script", 72, 128, 32, 0.03, 0.05, 0.75, 0.8, 2, 1),
    ("dream_code_defaults", 64, 192, 32, 0.01, 0.07, 0.9, 0.7, 2, 2),
    ("dream_llada_defaults", 72, 128, 32, 0.01, 0.07, 0.7, 0.7, 2, 3),
    ("dream_last_layer", 72, 128, 32, 0.01, 0.07, 0.7, 0.7, 1, 4),
    ("dream_block64", 72, 128, 64, 0.01, 0.07, 0.7, 0.7, 2, 5),
    ("dream_many_sinks", 72, 128, 16, 0.005, 0.05, 0.7, 0.7, 2, 6),
    ("dream_quirk_edge03", 72, 128, 32, 0.01, 0.03, 0.7, 0.7, 2, 7),
    ("dream_quirk_last_layer", 60, 160, 32, 0.01, 0.03, 0.7, 0.7, 1, 8),
    ("dream_loose_induce", 72, 128, 32, 0.01, 0.05, 0.5, 0.6, 2, 9),
    ("dream_few_sinks", 80, 128, 32, 0.02, 0.02, 0.7, 0.7, 2, 10),
    ("dream_low_floor", 72, 128, 32, 0.01, 0.04, 0.6, 0.4, 2, 11),
    ("dream_short_scaled", 40, 96, 16, 0.015, 0.1, 0.7, 0.7, 2, 12),
    # diffusion_generate's own default when eval.py's top_k=None is not passed (module doc)
    ("dream_edge03_top_k50", 72, 128, 32, 0.01, 0.03, 0.7, 0.7, 2, 7, 50),
]


class Identity(torch.nn.Module):
    """A stand-in block: returns its input, no cache, no attention."""

    def forward(self, x: torch.Tensor, **_: Any) -> tuple[torch.Tensor, None, None]:
        return x, None, None


def load(checkpoint: Path, code: Path, layers: int) -> Any:
    """``LLaDAModelLM`` of the exported modeling (fp32, eval), with the cut-off patch for
    ``layers`` captured layers (module docstring)."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(code))
    modeling = importlib.import_module("model.modeling_llada")
    config = importlib.import_module("model.configuration_llada")
    cfg = config.LLaDAConfig(**json.loads((checkpoint / "config.json").read_text()))
    cfg.init_device = "cpu"
    model = modeling.LLaDAModelLM(cfg, init_params=False)
    missing, unexpected = model.load_state_dict(load_file(str(checkpoint / "model.safetensors")),
                                                strict=False)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    model = model.float().eval()
    blocks = list(model.model.transformer.blocks)
    pad = CUTOFF - (len(blocks) - layers)
    for i, block in enumerate(blocks):
        block.layer_id = pad + i
    model.model.transformer.blocks = torch.nn.ModuleList([Identity() for _ in range(pad)]
                                                         + blocks)
    return model


class Noisy(torch.nn.Module):
    """The model with relative noise on its logits and attention (``scale`` 0: unchanged)."""

    def __init__(self, model: Any, scale: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.model, self.scale = model, scale
        self.gen = torch.Generator().manual_seed(seed)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, x: torch.Tensor, **kwargs: Any) -> Any:
        out, attn = self.model(x, **kwargs)
        if self.scale:
            z = out.logits
            u = torch.rand(z.shape, generator=self.gen, dtype=torch.float64) * 2 - 1
            out.logits = z + (self.scale * (1 + z.double().abs()) * u).to(z.dtype)
            u = torch.rand(attn.shape, generator=self.gen, dtype=torch.float64) * 2 - 1
            attn = attn + (self.scale * attn.double() * u).to(attn.dtype)
        return out, attn


def _positions(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask[0]).flatten().tolist()


def run(gen: Any, model: Any, prompt: torch.Tensor, setting: tuple, noise: float = 0.0,
        seed: int = 0) -> tuple[list[list[int]], int, list[dict]]:
    """The reference's ``(x, nfe)`` and per step the split of its commit set, read off the
    locals of ``get_transfer_index_dawn`` when it returns."""
    _, p, g, k, t_sink, t_edge, t_induce, t_low, _, _ = setting
    steps: list[dict] = []
    code = gen.get_transfer_index_dawn.__code__

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is code:
            steps.append(_split(frame.f_locals))

    sys.setprofile(profile)
    try:
        with torch.no_grad():
            x, nfe = gen.generate(Noisy(model, noise, seed), prompt, steps=g // k,
                                  gen_length=g, block_length=k, temperature=0.0,
                                  mask_id=MASK_ID, dawn=True, tau_sink=t_sink, tau_edge=t_edge,
                                  tau_induce=t_induce, tau_low=t_low)
    finally:
        sys.setprofile(None)
    return x.tolist(), int(nfe), steps


class DreamIdentity(torch.nn.Module):
    """A stand-in Dream decoder layer: returns its input, no cache, no attention."""

    def forward(self, x: torch.Tensor, **_: Any) -> tuple[tuple[torch.Tensor], None]:
        return (x,), None


def load_dream(checkpoint: Path, code: Path, layers: int) -> Any:
    """``DreamModel`` of the exported ``model`` package (fp32, eval), with the cut-off patch
    for ``layers`` captured layers (module docstring)."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(code))
    package = importlib.import_module("model")
    cfg = package.DreamConfig(**json.loads((checkpoint / "config.json").read_text()))
    model = package.DreamModel(cfg)
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")))  # strict
    model = model.float().eval()
    stack = list(model.model.layers)
    pad = DREAM_CUTOFF - (len(stack) - layers)
    model.model.layers = torch.nn.ModuleList([DreamIdentity() for _ in range(pad)] + stack)
    return model


def _split(loc: dict) -> dict:
    """One step's sets from the reference's locals (both paths name them alike)."""
    high, induced = loc["transfer_index_conf"], loc["transfer_index_a"]
    free, commit, masked = loc["transfer_index_c"], loc["transfer_index"], loc["mask_index"]
    return {"high": _positions(high), "induced": _positions(induced),
            "free": _positions(free & masked),
            "fallback": _positions(commit & ~(high | induced | free)),
            "overwrite": bool(free[0, 0] and not masked[0, 0])}


def run_dream(model: Any, prompt: torch.Tensor, setting: tuple, noise: float = 0.0,
              seed: int = 0) -> tuple[list[list[int]], int, list[dict]]:
    """``diffusion_generate(alg='dawn')``'s ``(x, nfe)`` and per step its sets, read off
    ``_sample_block``'s locals by its ``generation_tokens_hook_func`` (after each commit).
    ``noise``: relative noise on the raw logits and the averaged attention (a forward hook)."""
    _, p, g, k, t_sink, t_edge, t_induce, t_low, _, _ = setting[:10]
    top_k = setting[10] if len(setting) > 10 else None
    steps: list[dict] = []
    gen = torch.Generator().manual_seed(seed)

    def tokens_hook(step: Any, x: torch.Tensor, logits: Any) -> torch.Tensor:
        if step is not None:
            steps.append(_split(sys._getframe(1).f_locals))
        return x

    def perturb(_: Any, __: Any, output: Any) -> Any:
        out, attn = output
        z = out.logits
        u = torch.rand(z.shape, generator=gen, dtype=torch.float64) * 2 - 1
        out.logits = z + (noise * (1 + z.double().abs()) * u).to(z.dtype)
        u = torch.rand(attn.shape, generator=gen, dtype=torch.float64) * 2 - 1
        return out, attn + (noise * attn.double() * u).to(attn.dtype)

    handle = model.register_forward_hook(perturb) if noise else None
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):  # it prints nfe, time
            x, nfe = model.diffusion_generate(  # the arguments of the authors' eval.py
                prompt, attention_mask=torch.ones_like(prompt, dtype=torch.bool),
                max_new_tokens=g, output_history=False, return_dict_in_generate=False,
                steps=g // k, temperature=0.0, top_p=None, top_k=top_k, alg="dawn",
                block_length=k, mask_token_id=DREAM_MASK_ID, tau_sink=t_sink, tau_edge=t_edge,
                tau_induce=t_induce, conf_threshold=t_low, generation_tokens_hook_func=tokens_hook)
    finally:
        if handle is not None:
            handle.remove()
    return x.tolist(), int(nfe), steps


def record(settings: list[tuple], runner: Any, special: int, mask_id: int,
           reference: dict) -> list[dict]:
    """The stable cases of ``settings`` (``runner(setting, prompt, noise, seed)``)."""
    cases = []
    for setting in settings:
        name, p, g, k, t_sink, t_edge, t_induce, t_low, layers, seed = setting[:10]
        prompt = torch.randint(0, special, (1, p), generator=torch.Generator().manual_seed(seed))
        out, nfe, steps = runner(setting, prompt)
        stable = runner(setting, prompt) == (out, nfe, steps)
        for draw in NOISE_SEEDS:
            stable = stable and runner(setting, prompt, NOISE, draw) == (out, nfe, steps)
        count = {key: sum(bool(s[key]) for s in steps)
                 for key in ("high", "induced", "free", "fallback", "overwrite")}
        print(f"{name}: nfe {nfe}, steps with {count}, x[0] overwritten "
              f"{out[0][0] != prompt[0, 0].item()}, stable {stable}")
        if not stable:
            continue
        cases.append({
            "name": name, **reference, "prompt_ids": prompt.tolist(),
            "args": {"gen_length": g, "block_length": k, "steps": g // k, "temperature": 0.0,
                     "mask_id": mask_id, "tau_sink": t_sink,
                     "tau_edge": t_edge, "tau_induce": t_induce, "tau_low": t_low,
                     "attention_layers": layers, **({"top_k": setting[10]} if len(setting) > 10
                                                    else {})},
            "output_ids": out, "nfe": nfe, "steps": steps,
            "checks": {"rerun_identical": True, "relative_noise": NOISE,
                       "noise_on": "logits and averaged attention", "noise_draws": 3},
        })
    return cases


def record_dream(args: argparse.Namespace) -> None:
    """The Dream cases (``--family dream``) into ``args.out``."""
    scratch = Path(tempfile.mkdtemp(prefix="dawn_ref_dream_"))
    (scratch / "code" / "model").mkdir(parents=True)
    files = ("__init__.py", "configuration_dream.py", "modeling_dream.py",
             "generation_utils.py", "gdllm_utils.py")
    export(args.repo, COMMIT, {f"dream/model/{f}": f"model/{f}" for f in files},
           scratch / "code")
    models = {layers: load_dream(args.checkpoint, scratch / "code", layers) for layers in (1, 2)}
    reference = {"reference_repo": REPO, "reference_commit": COMMIT,
                 "reference_path": "dream/model/generation_utils.py",
                 "reference_function": "diffusion_generate(alg='dawn') -> _sample_block"}
    cases = record(DREAM_SETTINGS, lambda setting, prompt, noise=0.0, seed=0: run_dream(
        models[setting[8]], prompt, setting, noise, seed), DREAM_SPECIAL, DREAM_MASK_ID,
                   reference)
    meta = {
        "reference": f"{REPO} @ {COMMIT}, dream/model/generation_utils.py "
                     "DreamGenerationMixin.diffusion_generate(alg='dawn') (_sample_block) with "
                     "dream/model/gdllm_utils.py and dream/model/modeling_dream.py DreamModel",
        "checkpoint": "../shared/conformance/dream-tiny (2 layers, mask 440, bos = eos = pad "
                      "436, vocabulary 448, shifted logits), fp32, CPU, batch 1, an all-ones "
                      "attention mask (the reference then runs attention_mask 'full', tok_idx "
                      "None)",
        "patched": [
            "attention cut-off 'layer_idx >= 24' (modeling_dream.py DreamBaseModel.forward, two "
            "literals): 24 - (2 - k) identity layers put in front of the 2 real layers, so the "
            "last k real layers are captured (args.attention_layers = k); dream-tiny has 2 "
            "layers and the literal would capture none",
        ],
        "call": "diffusion_generate(prompt, attention_mask=ones, max_new_tokens=gen_length, "
                "output_history=False, return_dict_in_generate=False, steps=gen_length // "
                "block_length, temperature=0.0, top_p=None, top_k=args.top_k or None, "
                "alg='dawn', block_length, mask_token_id=440, tau_sink, tau_edge, tau_induce, "
                "conf_threshold=tau_low): the arguments of the authors' dream/eval.py",
        "command": "OMP_NUM_THREADS=1 /tmp/refvenv/bin/python benchmarks/conformance/"
                   "record_dawn.py --family dream --repo <DAWN snapshot> --checkpoint "
                   "../shared/conformance/dream-tiny --out "
                   "tests/fixtures/methods2026/dawn_dream.json",
        "steps": "per forward, canvas positions (prompt included) of _sample_block's locals "
                 "transfer_index_conf (high), transfer_index_a (induced), transfer_index_c at "
                 "masked positions (free), the forced argmax (fallback); overwrite: "
                 "transfer_index_c holds position 0 (the greedy loop's quirk: x[0] takes the "
                 "argmax of the shifted logits there, the raw output of position 0)",
        "nfe": "the reference's nfe: one forward per step",
    }
    write_fixture(args.out, meta, cases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=("llada", "dream"), default="llada")
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.family == "dream":
        record_dream(args)
        return
    scratch = Path(tempfile.mkdtemp(prefix="dawn_ref_"))
    (scratch / "code" / "model").mkdir(parents=True)
    code = export(args.repo, COMMIT, {"llada/generate.py": "generate.py",
                                       "llada/gdllm_utils.py": "gdllm_utils.py",
                                       "llada/model/modeling_llada.py": "model/modeling_llada.py",
                                       "llada/model/configuration_llada.py":
                                       "model/configuration_llada.py"}, scratch / "code")
    for name in ("matplotlib", "matplotlib.pyplot", "seaborn"):  # unused plotting imports
        sys.modules.setdefault(name, types.ModuleType(name))
    models = {layers: load(args.checkpoint, code, layers) for layers in (1, 2)}
    gen = importlib.import_module("generate")

    reference = {"reference_repo": REPO, "reference_commit": COMMIT,
                 "reference_path": "llada/generate.py",
                 "reference_function": "generate(dawn=True)"}
    cases = record(SETTINGS, lambda setting, prompt, noise=0.0, seed=0: run(
        gen, models[setting[8]], prompt, setting, noise, seed), SPECIAL, MASK_ID, reference)
    meta = {
        "reference": f"{REPO} @ {COMMIT}, llada/generate.py generate(dawn=True) with "
                     "llada/gdllm_utils.py and llada/model/modeling_llada.py",
        "checkpoint": "../shared/conformance/llada-tiny (2 layers, mask 500, vocabulary 512), "
                      "fp32, CPU, batch 1",
        "patched": [
            "attention cut-off 'layer >= 28' (modeling_llada.py, two literals): 28 - (2 - k) "
            "identity blocks put in front of the 2 real blocks, whose layer_id is set to their "
            "new index, so the last k real layers are captured (args.attention_layers = k); "
            "llada-tiny has 2 layers and the literal would capture none",
            "matplotlib / seaborn (imported by gdllm_utils.py, unused) replaced by empty "
            "stub modules",
        ],
        "command": "OMP_NUM_THREADS=1 /tmp/refvenv/bin/python benchmarks/conformance/"
                   "record_dawn.py --repo <DAWN snapshot> --checkpoint "
                   "../shared/conformance/llada-tiny --out tests/fixtures/methods2026/dawn.json",
        "steps": "per forward, canvas positions (prompt included) of the reference's "
                 "transfer_index_conf (high), transfer_index_a (induced), transfer_index_c at "
                 "masked positions (free), the forced argmax (fallback); overwrite: "
                 "transfer_index_c holds position 0 (the greedy loop's quirk)",
        "nfe": "the reference's nfe: one forward per step",
    }
    write_fixture(args.out, meta, cases)


if __name__ == "__main__":
    main()
