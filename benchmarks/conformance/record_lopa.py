"""Record LoPA conformance cases from the authors' decoder on a scripted model or a real
tiny checkpoint.

Reference: zhijie-group/LoPA ``scale_dream_d2f/scale_dream_d2f.py``
``DreamLoRA._generate_enhanced_speculative`` (with ``evaluate_branch_confidence``,
``_generate_additional_branches``, ``sample_tokens``, ``_shift_logits``) at the commit below,
with ``block_add_threshold = 1`` (one block at a time: the library's blocks; D2F's pipeline
needs a D2F-trained model). The model is ``tests/block_table_lm.BlockTable`` behind the Dream
forward the decoder calls (``model(ids, attention_mask=, past_key_values=, use_cache=,
update_kvcache=)``, a ``DynamicCache`` of token ids): its logits depend on token ids only and
block-causally, so the reference's prefix caching and stored last logit are exact and the
library can decode the same canvas without a cache. The module's imports that only serve
lm-eval / accelerate / PEFT are stubbed; nothing in the decoding path is. Run in a separate
environment (torch 2.13 CPU, transformers 4.49.0)::

    OMP_NUM_THREADS=1 python benchmarks/conformance/record_lopa.py --repo /path/to/LoPA \
        --out tests/fixtures/methods2026/lopa.json

A case is kept if it is unchanged under N(0, 1e-6) logit noise (three draws) and a rerun.

Real mode (``--checkpoint``, ``tests/fixtures/methods2026/lopa_real.json``): the decoder drives
the authors' own ``model_cache/dream/model_dream.py`` ``DreamModel`` (the forward it needs:
``update_kvcache``, a 4-D additive mask honoured by its SDPA attention, a ``DynamicCache``,
logits shifted by one) loaded strictly with the weights of ``../shared/conformance/
fastdllm2-tiny`` (Fast-dLLM v2 keeps Dream's Qwen2 tensor names; its mask id 310 is not in its
config), with ``use_full_attention=False``: the authors' block-causal mask (the prompt one
block, then blocks of ``block_size``), the checkpoint's own attention when the prompt is
exactly one ``bd_size`` block, and then the reference's prefix cache and stored last logit are
exact. Its default ``use_full_attention=True`` on a bidirectional checkpoint (dream-tiny)
decodes with stale K/V and a stale first-position logit over a canvas without the future
blocks, which no library cache plan reproduces (on dream-tiny that cache alone changes 3 to 13
of 8 to 24 answer tokens against an exact recomputation under the same decoder). A real case
is kept if unchanged under relative noise (N(0, (1e-6 x max |logit| of the row)^2),
three draws) and a rerun; robustness at 1e-5 is recorded per case::

    OMP_NUM_THREADS=1 python benchmarks/conformance/record_lopa.py --repo /path/to/LoPA \
        --checkpoint ../shared/conformance/fastdllm2-tiny \
        --out tests/fixtures/methods2026/lopa_real.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import tempfile
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from reference_tools import export, write_fixture  # noqa: E402

from tests.block_table_lm import BlockTable  # noqa: E402

REPO = "zhijie-group/LoPA"
COMMIT = "433177a608dee8901bae0e7c02f9b6f341a6f6d0"
VOCAB, MASK_ID, EOT = 24, 23, 22  # EOT is never predicted (see ``table``)
#: ``../shared/conformance/README.md``, "Newer families": fastdllm2-tiny's mask id
FASTDLLM2_TINY_MASK_ID = 310

#: (name, prompt length, gen, block, threshold, branching_factor, strategy, branch_topp,
#:  selection_conf_alpha, force_base, table seed, prompt seed)
SETTINGS = [
    ("base_only", 6, 16, 8, 0.9, 0, "neg_entropy", 1.0, 0.0, False, 1, 1),
    ("one_lookahead", 6, 16, 8, 0.9, 1, "neg_entropy", 1.0, 0.0, False, 1, 1),
    ("paper_defaults_k2", 7, 24, 8, 0.9, 2, "neg_entropy", 1.0, 0.0, False, 2, 2),
    ("k3_low_threshold", 5, 24, 8, 0.6, 3, "neg_entropy", 1.0, 0.0, False, 3, 3),
    ("k4_prob", 8, 32, 16, 0.8, 4, "default", 1.0, 0.0, False, 4, 4),
    ("k2_margin", 6, 24, 12, 0.7, 2, "margin", 1.0, 0.0, False, 5, 5),
    ("k3_bottom_half", 9, 24, 8, 0.9, 3, "neg_entropy", 0.5, 0.0, False, 6, 6),
    ("k2_alpha", 5, 16, 8, 0.7, 2, "neg_entropy", 1.0, 0.5, False, 7, 7),
    ("k3_force_base", 7, 24, 8, 0.8, 3, "neg_entropy", 1.0, 0.0, True, 8, 8),
    ("k7_long_block", 4, 32, 32, 0.9, 7, "neg_entropy", 1.0, 0.0, False, 9, 9),
    ("k5_math_block", 6, 32, 16, 0.9, 5, "neg_entropy", 1.0, 0.0, False, 10, 10),
    ("k2_strict", 8, 24, 8, 0.95, 2, "neg_entropy", 1.0, 0.0, False, 11, 11),
    ("k3_prob_strict", 6, 24, 8, 0.9, 3, "default", 1.0, 0.0, False, 12, 12),
    ("k2_margin_low", 7, 32, 8, 0.5, 2, "margin", 1.0, 0.0, False, 13, 13),
    ("k4_alpha_quarter", 5, 24, 12, 0.85, 4, "neg_entropy", 1.0, 0.25, False, 14, 14),
    ("k6_gsm8k_like", 9, 32, 16, 0.9, 6, "neg_entropy", 1.0, 0.0, False, 15, 15),
]


def table(p: int, block: int, seed: int) -> BlockTable:
    """The case's model; EOT is never predicted, so no run stops early."""
    return BlockTable(VOCAB, MASK_ID, p, block, seed=seed, banned=(EOT,))


class DreamLike(torch.nn.Module):
    """``BlockTable`` behind the Dream forward LoPA calls; the cache holds token ids."""

    def __init__(self, t: BlockTable, noise: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.t, self.noise = t, noise
        self.gen = torch.Generator().manual_seed(seed)
        self.calls: list[int] = []

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=True,
                update_kvcache=0):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache() if past_key_values is None else past_key_values
        c = cache.get_seq_length()
        seen = input_ids
        if c:
            seen = torch.cat([cache.key_cache[0][0, 0, :, 0].long()[None], input_ids], 1)
        pos = torch.arange(seen.shape[1])[None]
        logits = self.t.raw(seen, pos)[:, c:]
        if self.noise:
            logits = logits + self.noise * torch.randn(logits.shape, generator=self.gen)
        if update_kvcache:
            ids = input_ids[:, :update_kvcache].double()[:, None, :, None]
            cache.update(ids, ids, 0)
        self.calls.append(input_ids.shape[1])
        return types.SimpleNamespace(logits=logits, past_key_values=cache)


def stub_modules() -> None:
    """Stand-ins for the lm-eval / accelerate / PEFT / datasets names the module imports."""
    class _Any:
        def __init__(self, *a, **k) -> None: ...

    mods = {
        "accelerate": {"Accelerator": _Any, "InitProcessGroupKwargs": _Any},
        "datasets": {"Dataset": _Any},
        "peft": {"PeftConfig": _Any, "PeftModel": _Any},
        "lm_eval": {"utils": types.SimpleNamespace()},
        "lm_eval.api": {}, "lm_eval.api.instance": {"Instance": _Any},
        "lm_eval.api.model": {"TemplateLM": object},
        "lm_eval.api.registry": {"register_model": lambda *a, **k: (lambda cls: cls)},
        "lm_eval.models": {}, "lm_eval.models.utils": {"get_dtype": lambda d: d},
        "lm_eval.__main__": {"cli_evaluate": None},
    }
    for name, attrs in mods.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


def decoder(cls, setting: tuple, model: torch.nn.Module, *, eos: int = EOT,
            mask_id: int = MASK_ID, full_attention: bool = True):
    """A ``DreamLoRA`` with the case's settings (its ``__init__`` loads checkpoints and
    starts accelerate: the attributes the decoding path reads are set directly).
    ``full_attention=False``: the authors' block-causal mask (``use_full_attention``)."""
    _, p, g, block, tau, k, strategy, topp, alpha, force, _, _ = setting
    obj = object.__new__(cls)
    obj.__dict__.update(
        model=model, _device=torch.device("cpu"), tokenizer=types.SimpleNamespace(
            eos_token_id=eos), max_new_tokens=g, max_length=p + g + block, block_size=block,
        block_add_threshold=1.0, decoded_token_threshold=0.95, skip_threshold=tau,
        mask_token_id=mask_id, temperature=0.0, top_p=None, top_k=None,
        sampling_strategy=strategy, use_uncertainty_logic=True, max_branches_kept=1,
        branching_factor=k, branch_confidence_decay=0.8, branch_verification_mode=True,
        base_branch_competition=True, verification_force_base_winner=force,
        branch_topp=topp, selection_conf_alpha=alpha, use_full_attention=full_attention,
        target_dtype=torch.float32, shared_past_key_values=None, shared_last_logits=None,
        debug_print=False)
    return obj


#: real mode: (name, gen, threshold, branching_factor, strategy, branch_topp,
#:  selection_conf_alpha, force_base, prompt seed); prompt length = block = the checkpoint's
#:  ``bd_size`` (see ``record_real``)
REAL_SETTINGS = [
    ("real_base_only", 16, 0.9, 0, "neg_entropy", 1.0, 0.0, False, 101),
    ("real_one_lookahead", 16, 0.9, 1, "neg_entropy", 1.0, 0.0, False, 102),
    ("real_k2_paper", 24, 0.9, 2, "neg_entropy", 1.0, 0.0, False, 103),
    ("real_k3", 24, 0.9, 3, "neg_entropy", 1.0, 0.0, False, 104),
    ("real_k4_low_threshold", 24, 0.6, 4, "neg_entropy", 1.0, 0.0, False, 105),
    ("real_k7_gsm8k_like", 32, 0.9, 7, "neg_entropy", 1.0, 0.0, False, 106),
    ("real_k14_gsm8k_table5", 24, 0.9, 14, "neg_entropy", 1.0, 0.0, False, 107),
    ("real_k3_prob", 24, 0.8, 3, "default", 1.0, 0.0, False, 108),
    ("real_k2_margin", 24, 0.7, 2, "margin", 1.0, 0.0, False, 109),
    ("real_k3_bottom_half", 24, 0.9, 3, "neg_entropy", 0.5, 0.0, False, 110),
    ("real_k2_alpha_half", 16, 0.7, 2, "neg_entropy", 1.0, 0.5, False, 111),
    ("real_k4_alpha_quarter", 24, 0.85, 4, "neg_entropy", 1.0, 0.25, False, 112),
    ("real_k3_force_base", 24, 0.8, 3, "neg_entropy", 1.0, 0.0, True, 113),
    ("real_k7_strict", 24, 0.95, 7, "neg_entropy", 1.0, 0.0, False, 114),
    ("real_k5_prob_strict", 32, 0.95, 5, "default", 1.0, 0.0, False, 115),
    ("real_k2_margin_low", 32, 0.5, 2, "margin", 1.0, 0.0, False, 116),
    ("real_k6_topp_quarter", 32, 0.9, 6, "neg_entropy", 0.25, 0.0, False, 117),
    ("real_k3_prob_alpha", 16, 0.9, 3, "default", 1.0, 0.5, False, 118),
    ("real_k2_one_block", 8, 0.9, 2, "neg_entropy", 1.0, 0.0, False, 119),
    ("real_k4_one_block_low", 8, 0.5, 4, "neg_entropy", 1.0, 0.0, False, 120),
]
#: real mode: relative logit noise of the robustness check (std = this x the row's max |logit|)
REAL_NOISE = (1e-6, 1e-5)


def load_authors_dream(model_mod, checkpoint: Path, mask_id: int) -> torch.nn.Module:
    """The authors' ``model_cache/dream/model_dream.py`` ``DreamModel`` (the class the LoPA
    decoder drives: ``update_kvcache``, a 4-D additive mask, a ``DynamicCache``) built from a
    Qwen2-layout checkpoint's ``config.json`` and loaded with its weights, strictly (fp32)."""
    from safetensors.torch import load_file

    cfg = json.loads((checkpoint / "config.json").read_text())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "hidden_act", "max_position_embeddings",
            "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
            "attention_dropout", "pad_token_id", "bos_token_id", "eos_token_id")
    conf = model_mod.DreamConfig(**{k: cfg[k] for k in keys if k in cfg},
                                 mask_token_id=mask_id, attn_implementation="sdpa")
    model = model_mod.DreamModel(conf)
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")), strict=True)
    return model.float().eval()


def forward_deviation(model: torch.nn.Module, checkpoint: Path) -> float:
    """Largest |logit| difference between the authors' forward (a block-causal additive mask,
    no cache) and the checkpoint's recorded reference logits (``logits.json``)."""
    worst = 0.0
    for inp in json.loads((checkpoint / "logits.json").read_text())["inputs"]:
        ids = torch.tensor([inp["input_ids"]])
        pos = torch.arange(ids.shape[1])
        seen = pos[:, None] // inp["block_size"] >= pos[None, :] // inp["block_size"]
        mask = torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))[None, None]
        with torch.no_grad():
            out = model(ids, attention_mask=mask, use_cache=True, update_kvcache=ids.shape[1])
        worst = max(worst, (out.logits[0] - torch.tensor(inp["logits"])).abs().max().item())
    return worst


class Noisy(torch.nn.Module):
    """The authors' model with N(0, (rel x max |logit| of the row)^2) on every logit; counts
    the calls."""

    def __init__(self, model: torch.nn.Module, rel: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.model, self.rel = model, rel
        self.gen = torch.Generator().manual_seed(seed)
        self.calls: list[int] = []

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=True,
                update_kvcache=0):
        out = self.model(input_ids, attention_mask=attention_mask,
                         past_key_values=past_key_values, use_cache=use_cache,
                         update_kvcache=update_kvcache)
        logits = out.logits
        if self.rel:
            scale = self.rel * logits.abs().amax(-1, keepdim=True)
            logits = logits + scale * torch.randn(logits.shape, generator=self.gen)
        self.calls.append(input_ids.shape[1])
        return types.SimpleNamespace(logits=logits, past_key_values=out.past_key_values)


def record_real(cls, model_mod, args: argparse.Namespace) -> None:
    """Cases on a real block-diffusion checkpoint (``--checkpoint``): the authors'
    ``DreamModel`` with its weights, the decoder with ``use_full_attention=False`` (the
    authors' block-causal mask: the prompt one block, then blocks of ``block_size``), the
    prompt exactly one block long so the mask is the checkpoint's own absolute block-causal
    one, and the reference's prefix cache is exact."""
    ckpt = args.checkpoint
    cfg = json.loads((ckpt / "config.json").read_text())
    block, eos, vocab = int(cfg["bd_size"]), int(cfg["eos_token_id"]), int(cfg["vocab_size"])
    low = min(int(cfg["bos_token_id"]), eos, args.mask_id)  # prompts below the special ids
    base = load_authors_dream(model_mod, ckpt, args.mask_id)
    deviation = forward_deviation(base, ckpt)
    print(f"authors' forward vs {ckpt.name}/logits.json: max |diff| {deviation:.2e}")
    if deviation > 1e-4:
        raise RuntimeError(f"the authors' DreamModel does not reproduce {ckpt.name}'s logits")
    digest = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    cases = []
    for name, g, tau, k, strategy, topp, alpha, force, pseed in REAL_SETTINGS:
        setting = (name, block, g, block, tau, k, strategy, topp, alpha, force, None, pseed)
        prompt = torch.randint(0, low, (1, block), generator=torch.Generator().manual_seed(pseed))

        def run(rel: float = 0.0, draw: int = 0, _s=setting, _p=prompt):
            model = Noisy(base, rel, draw)
            ids, steps, _, stats = decoder(cls, _s, model, eos=eos, mask_id=args.mask_id,
                                           full_attention=False)._generate_enhanced_speculative(
                _p)
            return ids, steps, stats, model.calls

        ids, steps, stats, calls = run()
        robust = {rel: all(run(rel, d)[:2] == (ids, steps) for d in range(3))
                  for rel in REAL_NOISE}
        stable = robust[REAL_NOISE[0]] and run()[:2] == (ids, steps)
        print(f"{name}: rounds {stats['parallel_steps']}, branch forwards {len(calls)}, "
              f"lookahead tokens spawned {stats['total_filled_new']}, eos {eos in ids}, "
              f"robust {robust}, stable {stable}")
        if not stable or len(ids) != g:
            continue
        cases.append({
            "name": name,
            "reference_repo": REPO, "reference_commit": COMMIT,
            "reference_function": "scale_dream_d2f/scale_dream_d2f.py "
                                  "DreamLoRA._generate_enhanced_speculative",
            "model_forward": "scale_dream_d2f/model_cache/dream/model_dream.py DreamModel "
                             f"with the weights of {ckpt.name}",
            "prompt_ids": prompt.tolist(),
            "model": {"checkpoint": ckpt.name, "sha256": digest, "vocab": vocab,
                      "mask_id": args.mask_id, "eos_id": eos, "block_size": block},
            "args": {"max_new_tokens": g, "block_size": block, "block_add_threshold": 1.0,
                     "skip_threshold": tau, "branching_factor": k,
                     "sampling_strategy": strategy, "branch_topp": topp,
                     "selection_conf_alpha": alpha, "verification_force_base_winner": force,
                     "temperature": 0.0, "use_full_attention": False},
            "answer_ids": ids, "steps_reported": steps,
            "forward_rounds": stats["parallel_steps"] - 1,
            "branch_forwards": len(calls),
            "lookahead_tokens_spawned": stats["total_filled_new"],
            "checks": {"rerun_identical": True, "noise_draws": 3,
                       "unchanged_under_relative_logit_noise": [r for r in REAL_NOISE
                                                                if robust[r]]},
        })
    meta = {
        "reference": f"{REPO} @ {COMMIT}: scale_dream_d2f/scale_dream_d2f.py "
                     "DreamLoRA._generate_enhanced_speculative",
        "model": f"{ckpt.name} (../shared/conformance) loaded into the authors' "
                 "model_cache/dream/model_dream.py DreamModel (same Qwen2 tensor names, strict "
                 "load); decoder with use_full_attention=False (block-causal, prompt = block 0)",
        "command": "OMP_NUM_THREADS=1 python benchmarks/conformance/record_lopa.py --repo "
                   "<LoPA snapshot> --checkpoint ../shared/conformance/fastdllm2-tiny "
                   "--out tests/fixtures/methods2026/lopa_real.json",
        "forward_check": f"the authors' DreamModel on these weights reproduces {ckpt.name}"
                         f"/logits.json (block-causal, no cache) within {deviation:.1e}",
        "steps": "as lopa.json: forward_rounds = steps_reported - 1; branch_forwards counts "
                 "one model call per branch per round",
        "noise": "relative: N(0, (r x max |logit| of the row)^2) on every raw logit, r in "
                 f"{list(REAL_NOISE)}, three draws each; a case is kept if unchanged at "
                 f"{REAL_NOISE[0]} (and a rerun)",
    }
    write_fixture(args.out, meta, cases)



def record_table(cls, out: Path) -> None:
    """The scripted-model cases (``tests/fixtures/methods2026/lopa.json``)."""
    cases = []
    for setting in SETTINGS:
        name, p, g, block, tau, k, strategy, topp, alpha, force, tseed, pseed = setting
        prompt = torch.randint(0, EOT, (1, p), generator=torch.Generator().manual_seed(pseed))
        t = table(p, block, tseed)

        def run(noise: float = 0.0, draw: int = 0, _s=setting, _t=t, _p=prompt):
            model = DreamLike(_t, noise, draw)
            ids, steps, n_tok, stats = decoder(cls, _s, model)._generate_enhanced_speculative(
                _p)
            return ids, steps, stats, model.calls

        ids, steps, stats, calls = run()
        stable = all(run(1e-6, d)[:2] == (ids, steps) for d in range(3)) and run()[:2] == (
            ids, steps)
        won = stats["total_filled_new"]
        print(f"{name}: rounds {stats['parallel_steps']}, reported steps {steps}, branch "
              f"forwards {len(calls)}, lookahead tokens spawned {won}, stable {stable}")
        if not stable or len(ids) != g:
            continue
        cases.append({
            "name": name,
            "reference_repo": REPO, "reference_commit": COMMIT,
            "reference_function": "scale_dream_d2f/scale_dream_d2f.py "
                                  "DreamLoRA._generate_enhanced_speculative",
            "prompt_ids": prompt.tolist(),
            "model": {"vocab": VOCAB, "mask_id": MASK_ID, "eot_id": EOT, "table_seed": tseed,
                      "banned": [EOT]},
            "args": {"max_new_tokens": g, "block_size": block, "block_add_threshold": 1.0,
                     "skip_threshold": tau, "branching_factor": k,
                     "sampling_strategy": strategy, "branch_topp": topp,
                     "selection_conf_alpha": alpha, "verification_force_base_winner": force,
                     "temperature": 0.0, "use_full_attention": True},
            "answer_ids": ids, "steps_reported": steps,
            "forward_rounds": stats["parallel_steps"] - 1,
            "branch_forwards": len(calls),
            "checks": {"rerun_identical": True, "unchanged_under_logit_noise_std": 1e-6,
                       "noise_draws": 3},
        })
    meta = {
        "reference": f"{REPO} @ {COMMIT}: scale_dream_d2f/scale_dream_d2f.py "
                     "DreamLoRA._generate_enhanced_speculative",
        "model": "tests/block_table_lm.py BlockTable (token-id logits, block-causal) behind "
                 "a Dream-style forward with a token-id DynamicCache",
        "command": "OMP_NUM_THREADS=1 python benchmarks/conformance/record_lopa.py --repo "
                   "<LoPA snapshot> --out tests/fixtures/methods2026/lopa.json",
        "steps": "steps_reported is the decoder's own count (its last round only finds every "
                 "branch finished: forward_rounds + 1); branch_forwards counts one model call "
                 "per branch per round",
    }
    write_fixture(out, meta, cases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="real mode: a Qwen2-layout block-diffusion checkpoint folder")
    ap.add_argument("--mask-id", type=int, default=FASTDLLM2_TINY_MASK_ID,
                    help="real mode: the mask id (fastdllm2-tiny's config omits it)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="lopa_ref_"))
    for d in ("model_cache/dream",):
        (scratch / d).mkdir(parents=True, exist_ok=True)
    files = {f"scale_dream_d2f/{f}": f for f in (
        "scale_dream_d2f.py", "model_cache/dream/model_dream.py",
        "model_cache/dream/configuration_dream.py", "model_cache/dream/generation_utils.py")}
    export(args.repo, COMMIT, files, scratch)
    (scratch / "model_cache" / "__init__.py").write_text("")
    (scratch / "model_cache" / "dream" / "__init__.py").write_text("")
    importlib.import_module("transformers.cache_utils")  # before the stubs (it probes them)
    stub_modules()
    sys.path.insert(0, str(scratch))
    cls = importlib.import_module("scale_dream_d2f").DreamLoRA

    if args.checkpoint is None:
        record_table(cls, args.out)
    else:
        record_real(cls, importlib.import_module("model_cache.dream.model_dream"), args)


if __name__ == "__main__":
    main()
