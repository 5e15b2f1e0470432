"""Our decode loop vs the public reference loops, on identical weights, identical tokens asserted.

The references (ML-GSAI/LLaDA ``generate``; NVlabs/Fast-dLLM ``generate``,
``generate_with_prefix_cache``, ``generate_with_dual_cache``; Dream ``diffusion_generate``) run
in a separate Python, ``$DLLM_REF_PYTHON`` (torch + transformers 4.46.2), through
``benchmarks/reference_loops.py``, which imports their code from ``$DLLM_REF_SRC`` at run time
(the code is never part of this repository; benchmarks/README.md gives the set-up). The runner
stays up as a subprocess answering JSON requests, so reference and library runs interleave:
per configuration one warm-up each, then ``repeats`` x (reference run, our run), keeping each
side's fastest run. Both sides time with ``time.thread_time`` on one torch thread the whole
call and two splits of it per step (every loop here runs one forward per step): like for like
(reported), "model" = the network's core modules (token embedding, every block, final norm,
LM head; ``reference_loops.core_modules`` / ``overhead.CoreClock`` hooks), so RoPE tables and
masks a reference ``forward`` builds are loop work as our plan's are; forward call
(``model_ms_step_*`` / ``nonmodel_ms_step_*``), "model" = the whole model call.

Reference arguments map onto ``DiffusionSampler`` settings through the conformance harness
(``tests/conformance.py``: ``llada_settings`` / ``dream_settings``), the mapping the recorded
fixtures are checked with. Tokens must be identical; a difference is reported and fails the
run (exit status 1) after the CSV is written.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).with_name("reference_loops.py")
CONFORMANCE = ROOT.parent / "shared" / "conformance"
#: files the runner imports, relative to ``$DLLM_REF_SRC``
REF_FILES = (
    "LLaDA/generate.py", "Fast-dLLM/llada/generate.py", "Fast-dLLM/llada/model/__init__.py",
    "Fast-dLLM/llada/model/configuration_llada.py", "Fast-dLLM/llada/model/modeling_llada.py",
    "Dream/modeling_dream.py", "Dream/configuration_dream.py", "Dream/generation_utils.py",
)
TRANSFORMERS = "4.46."
#: Dream twin of ``BENCH_CONFIG`` (4 layers, d=256, GQA 2:1)
DREAM_BENCH: dict[str, Any] = {
    "model_type": "Dream", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 768, "vocab_size": 4096,
    "mask_token_id": 4095, "eos_token_id": 4094, "pad_token_id": 4094,
    "max_position_embeddings": 4096, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
}


def reference_env(environ: Any = None, probe: bool = True) -> tuple[bool, str]:
    """Whether the reference loops can run here, and if not, why (a sentence)."""
    env = os.environ if environ is None else environ
    py, src = env.get("DLLM_REF_PYTHON"), env.get("DLLM_REF_SRC")
    if not py or not src:
        return False, ("DLLM_REF_PYTHON / DLLM_REF_SRC not set (a Python with torch and "
                       "transformers 4.46.2, and a directory with the ML-GSAI/LLaDA, "
                       "NVlabs/Fast-dLLM and Dream reference files; see benchmarks/README.md)")
    if not Path(py).is_file() or not os.access(py, os.X_OK):
        return False, f"DLLM_REF_PYTHON={py} is not an executable file"
    missing = [f for f in REF_FILES if not (Path(src) / f).is_file()]
    if missing:
        return False, f"DLLM_REF_SRC={src} lacks {', '.join(missing)}"
    if probe:
        code = ("from importlib.metadata import version as v;"
                "print(v('torch'), v('transformers'), v('einops'))")
        try:
            res = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60,
                                 check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"DLLM_REF_PYTHON={py} does not run: {exc}"
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["?"])[-1]
            return False, (f"DLLM_REF_PYTHON={py} lacks a package (torch, transformers, "
                           f"einops): {last}")
        _, tf, _ = res.stdout.split()
        if not tf.startswith(TRANSFORMERS):
            return False, (f"DLLM_REF_PYTHON has transformers {tf}; Dream's code needs "
                           f"{TRANSFORMERS}x")
    return True, f"reference loops from {src} run with {py}"


@dataclass(frozen=True)
class RefConfig:
    """One reference call: ``reference`` (runner key), our cache mode, the reference args."""

    name: str
    family: str  # "llada" | "dream"
    reference: str
    cache: str
    args: dict[str, Any]


def configs(family: str, gen: int, block: int, mask_id: int) -> list[RefConfig]:
    """The compared configurations of a model family, for gen length / block length."""
    if family == "dream":
        return [RefConfig("entropy", "dream", "dream.diffusion_generate", "none", dict(
            max_new_tokens=gen, steps=gen, eps=1e-3, temperature=0.0, top_p=None, top_k=None,
            alg="entropy", alg_temp=None, mask_token_id=mask_id))]
    base = dict(gen_length=gen, block_length=block, temperature=0.0,
                remasking="low_confidence", mask_id=mask_id)
    thr = dict(base, steps=gen // block, threshold=0.9)
    return [
        RefConfig("low_confidence", "llada", "llada.generate", "none", dict(base, steps=gen)),
        RefConfig("threshold0.9", "llada", "fastdllm.generate", "none", thr),
        RefConfig("threshold0.9", "llada", "fastdllm.generate_with_prefix_cache", "prefix", thr),
        RefConfig("threshold0.9", "llada", "fastdllm.generate_with_dual_cache", "dual", thr),
        RefConfig("low_confidence", "llada", "fastdllm.generate_with_dual_cache", "dual",
                  dict(base, steps=gen)),
    ]


def as_case(cfg: RefConfig, prompt: list[list[int]], seed: int) -> dict[str, Any]:
    """``cfg`` as a conformance case (the schema of ``../shared/conformance/*/cases.json``)."""
    case: dict[str, Any] = {"name": f"{cfg.reference}:{cfg.name}", "prompt_ids": prompt,
                            "attention_mask": None, "seed": seed, "args": dict(cfg.args)}
    if cfg.family == "dream":
        case["effective_generation_config"] = dict(
            cfg.args, max_length=len(prompt[0]) + cfg.args["max_new_tokens"])
    else:
        case["settings"] = dict(cfg.args, cfg_scale=0.0, seed=seed, batch_size=len(prompt),
                                cache=cfg.cache, factor=None)
    return case


def sampler_settings(case: dict[str, Any], model: Any) -> tuple[str, dict[str, Any]]:
    """(policy, ``DiffusionSampler`` kwargs) for a case, via ``tests/conformance.py``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.conformance import dream_settings, llada_settings

    return (dream_settings if "effective_generation_config" in case else llada_settings)(
        case, model)


class ReferenceRunner:
    """``reference_loops.py`` in ``$DLLM_REF_PYTHON``, kept running; one request at a time."""

    def __init__(self, python: str, src: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(DLLM_REF_SRC=src, OMP_NUM_THREADS="1", TORCHDYNAMO_DISABLE="1")
        self.proc = subprocess.Popen([python, str(RUNNER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"reference runner exited (status {self.proc.wait()})")
        return parse_reply(line, request)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def parse_reply(line: str, request: dict[str, Any]) -> dict[str, Any]:
    """A runner reply, checked: raises on a runner error or a reply to another request."""
    reply = json.loads(line)
    if reply.get("id") != request.get("id"):
        raise RuntimeError(f"reply to {reply.get('id')!r} for request {request.get('id')!r}")
    if "error" in reply:
        raise RuntimeError(f"reference {request.get('reference')} failed: {reply['error']}\n"
                           f"{reply.get('traceback', '')}")
    for key in ("output_ids", "nfe", "runs"):
        if key not in reply:
            raise RuntimeError(f"reference reply lacks {key!r}")
    return reply


@dataclass
class Run:
    """One timed decode: thread CPU seconds in all / in the model, forwards, tokens."""

    total_s: float
    model_s: float
    forwards: int
    tokens: list[list[int]]
    versions: dict[str, str] = field(default_factory=dict)  # the reference side's
    core_s: float | None = None  # inside the core modules (like-for-like "model")


def our_runner(model: Any, policy: str, params: dict[str, Any],
               prompt: torch.Tensor) -> Any:
    """A function running our sampler once (timed like the reference) -> ``Run``."""
    from dllm_decode.overhead import CoreClock, ForwardClock, TimedModel, core_modules
    from dllm_decode.samplers.sampler import DiffusionSampler

    timed = TimedModel(model, label=None)
    core = CoreClock(core_modules(model))  # stays attached: the model is the benchmark's own
    sampler = DiffusionSampler(timed, policy, **params)

    def run() -> Run:
        timed.__dict__["clock"] = ForwardClock()
        core.reset()
        t0 = time.thread_time()
        out = sampler.generate(prompt)
        total = time.thread_time() - t0
        return Run(total, timed.clock.total, int(out.forwards), out.tokens.tolist(),
                   core_s=core.seconds)

    return run


def reference_run(runner: ReferenceRunner, request: dict[str, Any]) -> Run:
    reply = runner.run(dict(request, repeats=1, warmup=0))
    r = reply["runs"][0]
    return Run(r["total_s"], r["model_s"], int(r["forwards"]), reply["output_ids"],
               reply.get("versions", {}), r.get("core_s"))


def summarize(ref: Run, ours: Run, repeats: int) -> dict[str, Any]:
    """The per-config numbers of one comparison (fastest run of each side): the forward-call
    split (``model_ms_step_*`` / ``nonmodel_ms_step_*``) and, when both runs timed their core
    modules, the like-for-like one (``core_ms_step_*`` / ``loop_ms_step_*``)."""
    def per_step(run: Run, model_s: float) -> tuple[float, float]:
        n = max(run.forwards, 1)
        return 1e3 * model_s / n, 1e3 * (run.total_s - model_s) / n

    ref_model, ref_loop = per_step(ref, ref.model_s)
    our_model, our_loop = per_step(ours, ours.model_s)
    split: dict[str, Any] = {}
    if ref.core_s is not None and ours.core_s is not None:
        ref_core, ref_rest = per_step(ref, ref.core_s)
        our_core, our_rest = per_step(ours, ours.core_s)
        split = dict(core_ms_step_ref=ref_core, core_ms_step_ours=our_core,
                     loop_ms_step_ref=ref_rest, loop_ms_step_ours=our_rest,
                     loop_ratio=our_rest / ref_rest if ref_rest > 0 else float("nan"))
    a, b = torch.tensor(ref.tokens), torch.tensor(ours.tokens)
    same = a.shape == b.shape and torch.equal(a, b)
    diff = int((a != b).sum()) if a.shape == b.shape else max(a.numel(), b.numel())
    return dict(nfe_ref=ref.forwards, nfe_ours=ours.forwards, tokens_identical=same,
                positions_differing=diff, total_ms_ref=1e3 * ref.total_s,
                total_ms_ours=1e3 * ours.total_s, cpu_ratio=ours.total_s / ref.total_s,
                model_ms_step_ref=ref_model, model_ms_step_ours=our_model,
                nonmodel_ms_step_ref=ref_loop, nonmodel_ms_step_ours=our_loop,
                nonmodel_ratio=our_loop / ref_loop if ref_loop > 0 else float("nan"),
                **split, repeats=repeats)


def compare(runner: ReferenceRunner, model: Any, checkpoint: str, cfg: RefConfig,
            prompt: torch.Tensor, repeats: int, seed: int = 0) -> dict[str, Any]:
    """Interleaved timing of one configuration on both sides; see the module docstring."""
    case = as_case(cfg, prompt.tolist(), seed)
    policy, params = sampler_settings(case, model)
    request = {"id": case["name"], "reference": cfg.reference, "checkpoint": checkpoint,
               "prompt_ids": case["prompt_ids"], "args": cfg.args, "seed": seed}
    ours = our_runner(model, policy, params, prompt)
    reference_run(runner, request), ours()  # warm-up
    best_ref = best_ours = None
    for _ in range(repeats):
        r, o = reference_run(runner, request), ours()
        best_ref = r if best_ref is None or r.total_s < best_ref.total_s else best_ref
        best_ours = o if best_ours is None or o.total_s < best_ours.total_s else best_ours
    assert best_ref is not None and best_ours is not None
    row = dict(config=cfg.name, reference=cfg.reference, cache=cfg.cache, policy=policy,
               **{k: params[k] for k in ("gen_length", "steps") if k in params},
               block_length=params.get("block_length", ""))
    row.update(summarize(best_ref, best_ours, repeats))
    row.update(ref_torch=best_ref.versions.get("torch", ""),
               ref_transformers=best_ref.versions.get("transformers", ""))
    return row


def checkpoints(names: list[str], workdir: Path) -> list[tuple[str, str, str]]:
    """``(label, family, directory)`` per requested model set (conformance, tiny, bench4)."""
    from dllm_decode.bench import BENCH_CONFIG
    from dllm_decode.models.loading import ASSETS, build_model, save_model

    out = []
    for name in names:
        if name == "conformance":
            out += [("conf-llada-tiny", "llada", str(CONFORMANCE / "llada-tiny")),
                    ("conf-dream-tiny", "dream", str(CONFORMANCE / "dream-tiny"))]
        elif name == "tiny":
            out += [("tiny-llada", "llada", str(ASSETS / "tiny-llada")),
                    ("tiny-dream", "dream",
                     str(with_generation_config(ASSETS / "tiny-dream", workdir / "tiny-dream")))]
        elif name == "bench4":
            for family, config in (("llada", BENCH_CONFIG), ("dream", DREAM_BENCH)):
                # N(0, 0.3^2) keeps confidences spread (the 0.02 default ties them)
                path = save_model(build_model(config, seed=0, init_std=0.3),
                                  workdir / f"4L-d256-{family}")
                if family == "dream":
                    with_generation_config(path, path)
                out.append((f"4L-d256-{family}", family, str(path)))
        else:
            raise SystemExit(f"unknown model set {name!r} (conformance, tiny, bench4)")
    return out


def with_generation_config(src: Path, dst: Path) -> Path:
    """``dst``: the Dream checkpoint ``src`` plus the ``generation_config.json`` the Dream
    release ships (its modeling's ``from_pretrained`` requires one); weights are linked."""
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    if src.resolve() != dst.resolve():
        for f in src.iterdir():
            link = dst / f.name
            if f.suffix not in (".json", ".safetensors"):
                continue
            if link.is_symlink() and link.resolve() != f.resolve():
                link.unlink()  # left by an earlier run against another checkout
            if not link.exists():
                link.symlink_to(f.resolve())
    gen = {"_from_model_config": True, "alg": "origin", "alg_temp": None, "eps": 0.001,
           "steps": 512, "temperature": 0.0, "top_k": None, "top_p": None,
           "mask_token_id": None, "output_history": False, "transformers_version": "4.46.2",
           **{k: config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}}
    (dst / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return dst


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README table of ``rows`` (like-for-like split first, where the rows have it)."""
    lines = ["| model | reference loop | config | NFE ref / ours | tokens identical | "
             "CPU time ours/ref | non-model ms/step ours vs ref (ratio) | model ms/step ours vs "
             "ref | forward-call split: non-model ours vs ref |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        l4l = "loop_ms_step_ours" in r
        loop = ("loop_ms_step_", "core_ms_step_", "loop_ratio") if l4l else (
            "nonmodel_ms_step_", "model_ms_step_", "nonmodel_ratio")
        lines.append(
            f"| {r['model']} | `{r['reference']}` | {r['config']}, cache {r['cache']} | "
            f"{r['nfe_ref']} / {r['nfe_ours']} | {'yes' if r['tokens_identical'] else 'NO'} | "
            f"{r['cpu_ratio']:.2f} | {r[loop[0] + 'ours']:.2f} vs {r[loop[0] + 'ref']:.2f} "
            f"({r[loop[2]]:.2f}) | {r[loop[1] + 'ours']:.2f} vs {r[loop[1] + 'ref']:.2f} | "
            f"{r['nonmodel_ms_step_ours']:.2f} vs {r['nonmodel_ms_step_ref']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Per configuration: model and non-model ms/step, reference vs ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']} {r['reference'].replace('generate_with_', '')} {r['config']}"
              for r in rows]
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.5 * len(rows) + 1)))
    for i, (side, color) in enumerate((("ref", "tab:gray"), ("ours", "tab:blue"))):
        y = [2.4 * k + i for k in range(len(rows))]
        l4l = all("loop_ms_step_ours" in r for r in rows)
        model = [r[f"core_ms_step_{side}" if l4l else f"model_ms_step_{side}"] for r in rows]
        loop = [r[f"loop_ms_step_{side}" if l4l else f"nonmodel_ms_step_{side}"] for r in rows]
        ax.barh(y, model, color=color, alpha=0.45, label=f"{side}: model forward")
        ax.barh(y, loop, left=model, color=color, label=f"{side}: non-model (loop)")
    ax.set_yticks([2.4 * k + 0.5 for k in range(len(rows))], labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("thread CPU ms per step (fastest of the interleaved runs; model = embedding, "
                  "blocks, final norm, LM head)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def draw_prompt(model: Any, length: int, seed: int = 0) -> torch.Tensor:
    """``[1, length]`` random ids, none of them a special (mask / EOS / pad) id."""
    special = {model.mask_token_id, *(getattr(model, "eos_token_ids", ()) or ()),
               getattr(getattr(model, "spec", None), "pad_token_id", None)}
    allowed = torch.tensor([i for i in range(model.vocab_size) if i not in special])
    gen = torch.Generator().manual_seed(seed)
    return allowed[torch.randint(0, len(allowed), (1, length), generator=gen)]


def run_comparison(model_sets: list[str], gen: int, block: int, prompt_len: int,
                   repeats: int, out: Path, workdir: Path) -> int:
    """Compare every configuration on every model; write CSV + plot; 1 if tokens differ."""
    from dllm_decode.bench import environment
    from dllm_decode.models.loading import load_model

    torch.set_num_threads(1)
    env = environment()
    runner = ReferenceRunner(os.environ["DLLM_REF_PYTHON"], os.environ["DLLM_REF_SRC"])
    rows: list[dict[str, Any]] = []
    try:
        for label, family, path in checkpoints(model_sets, workdir):
            model = load_model(path)
            prompt = draw_prompt(model, prompt_len)
            for cfg in configs(family, gen, block, model.mask_token_id):
                row = dict(model=label, **compare(runner, model, path, cfg, prompt, repeats),
                           P=prompt_len, device=env.device, torch=env.torch,
                           commit=env.commit, timestamp=env.timestamp)
                rows.append(row)
                print(markdown([row]).splitlines()[-1], flush=True)
    finally:
        runner.close()
    write_rows(rows, out)
    plot(rows, out.with_suffix(".png"))
    print(markdown(rows))
    bad = [f"{r['model']} {r['reference']} {r['config']}: {r['positions_differing']} positions"
           for r in rows if not r["tokens_identical"]]
    if bad:
        print("TOKENS DIFFER from the reference:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    return 0
