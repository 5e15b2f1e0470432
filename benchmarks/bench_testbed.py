"""Decoding methods on the word-level test bed: calibrated oracle and the testbed-* checkpoints.

For every model and method config, ``--n`` held-out prompts (test split, ``--seed``) of each of
the nine test-bed Waiting Line tasks (lists of 3-5 names, gen length 16, one block, greedy)
are decoded with the library's ``DiffusionSampler``; an answer counts when it is one of the
record's valid answers (ParallelBench's rule). Per config: mean accuracy over tasks with a 95 %
bootstrap interval (prompts resampled within each task), NFE, tokens per step = gen length / NFE
(the budget per forward, EOS fill included: ParallelBench's x axis), and a paired bootstrap test
of the difference to the one-token-per-step baseline on the same prompts. Per method family (a
parameter sweep): AUP over its (tokens per step, accuracy) points, anchored at the baseline.
Writes ``results/<tag>.csv``, ``results/<tag>.md`` and ``results/<tag>_pareto.png`` (``--tag``,
default ``testbed_methods``).

Run time: about 13 minutes on 2 CPU cores for the default three models at ``--n 50`` (36
configs each); every config prints a line as it finishes, with the elapsed time and an
estimate of what is left (``--models testbed-llada --n 2``: under a minute).
``--plot-only`` redraws the plot from an existing CSV.

    python benchmarks/bench_testbed.py --models oracle-cal testbed-llada testbed-dream --n 50
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dllm_decode.eval.metrics import aup
from dllm_decode.train.testbed import TESTBED_GEN_LENGTH, TESTBED_TASKS, waiting_line_oracle
from dllm_decode.train.testbed_eval import decode_tasks

G = TESTBED_GEN_LENGTH
RESULTS = Path(__file__).parent / "results"
#: the calibrated oracle of the tables: floor 1e-6, temperature 1.5 (under-confident), small
#: seeded logit noise and name confusion, so margins and entropies are graded as in a model
CALIBRATED = {"floor": 1e-6, "temperature": 1.5, "noise": 0.25, "confusion": 0.01, "seed": 0}

#: Window-Diffusion scaled to G = 16 (the scripts' W 64 / A 16 / R 32 at G = 256, kept >= 2)
WINDOW = {"window_tokens": 8, "active_tokens": 2, "refresh_every": 4}

# (family, label, policy, sampler/policy kwargs); the first row is the baseline
CONFIGS: list[tuple[str, str, Any, dict[str, Any]]] = [
    ("low_confidence", "k=1", "low_confidence", {"steps": 16}),
    ("low_confidence", "k=2", "low_confidence", {"steps": 8}),
    ("low_confidence", "k=4", "low_confidence", {"steps": 4}),
    ("low_confidence", "k=8", "low_confidence", {"steps": 2}),
    ("random", "k=1", "random", {"steps": 16}),
    ("entropy", "k=1", "entropy", {"steps": 16}),
    ("entropy", "k=4", "entropy", {"steps": 4}),
    ("topk_margin", "k=1", "topk_margin", {"steps": 16}),
    ("topk_margin", "k=4", "topk_margin", {"steps": 4}),
    ("origin", "Dream grid, 16 steps", "origin", {"steps": 16}),
    ("threshold", "tau=0.95", "threshold", {"tau": 0.95}),
    ("threshold", "tau=0.9", "threshold", {"tau": 0.9}),
    ("threshold", "tau=0.7", "threshold", {"tau": 0.7}),
    ("threshold", "tau=0.5", "threshold", {"tau": 0.5}),
    ("factor", "f=0.5", "factor", {"factor": 0.5}),
    ("factor", "f=1", "factor", {"factor": 1.0}),
    ("factor", "f=2", "factor", {"factor": 2.0}),
    ("eb", "gamma=0.01", "eb", {"gamma": 0.01}),
    ("eb", "gamma=0.1", "eb", {"gamma": 0.1}),
    ("eb", "gamma=1", "eb", {"gamma": 1.0}),
    ("entropy_threshold", "theta=0.1", "entropy_threshold", {"theta": 0.1}),
    ("entropy_threshold", "theta=0.5", "entropy_threshold", {"theta": 0.5}),
    ("entropy_threshold", "theta=1", "entropy_threshold", {"theta": 1.0}),
    ("sched", "tau_low=5", "sched", {"base": "low_confidence", "tau_low": 5.0,
                                      "tau_high": 7.5, "steps": 16}),
    ("sched", "tau_low=2.5", "sched", {"base": "low_confidence", "tau_low": 2.5, "steps": 16}),
    ("sched", "tau_low=0", "sched", {"base": "low_confidence", "tau_low": 0.0, "steps": 16}),
    ("prophet", "default", "prophet", {"steps": 16}),
    ("klass", "default", "klass", {"steps": 16}),
    ("ccd", "default", "ccd", {"steps": 16}),
    ("ete", "default", "ete", {}),
    ("eotp", "k=1", "eotp", {"steps": 16}),
    ("learn2pd", "k=1 + filter", "learn2pd", {"steps": 16}),
    ("window", "W8/A2/R4", "window", {"steps": 16, **WINDOW}),
    ("window_dream", "W8/A2/R4", "window_dream", {"steps": 16, **WINDOW}),
    ("sched+threshold", "tau=0.9, tau_low=2.5", "sched", {"base": "threshold", "tau": 0.9}),
    ("threshold+eotp", "tau=0.9", "threshold+eotp", {"tau": 0.9}),
    # the 2026 training-free methods (methods-2026.md); add a method's rows here and run
    # ``--only FAMILY ...`` to merge them into an existing table
    ("frechet", "delta=0.02", "frechet", {"delta": 0.02}),
    ("frechet", "delta=0.1", "frechet", {"delta": 0.1}),
    ("frechet", "delta=0.25", "frechet", {"delta": 0.25}),
    ("frechet", "delta=0.5", "frechet", {"delta": 0.5}),
    ("credit", "tau=0.9", "credit", {"tau": 0.9}),
    ("credit", "tau=0.7", "credit", {"tau": 0.7}),
    ("credit+frechet", "delta=0.25", "credit", {"base": "frechet", "delta": 0.25}),
    ("credit+eb", "gamma=0.1", "credit", {"base": "eb", "gamma": 0.1}),
    ("credit+sched", "tau=0.9, tau_low=2.5", "credit+sched", {"tau": 0.9, "tau_low": 2.5}),
    ("dus", "a=2 (4 levels)", "dus", {"base": 2}),
    ("dus", "a=4 (2 levels)", "dus", {"base": 4}),
    ("dus", "a=2, skip < 0.3", "dus", {"base": 2, "threshold": 0.3}),
    ("dus", "a=2, confidence order", "dus", {"base": 2, "order": "confidence"}),
    # Streaming-dLLM (methods-2026-ii.md section 4): the preset on its suffix-pruning plan
    # (the oracle has no K/V cache: the selector and the exit alone, on cache='none'); the
    # paper's blocks of 32 and window 96 at G = 256 scaled to G = 16: blocks of 2-4, window 4-6
    ("streaming_dllm", "one block (default)", "streaming_dllm", {}),
    ("streaming_dllm", "B=4, W=4", "streaming_dllm", {"block_length": 4, "window_tokens": 4}),
    ("streaming_dllm", "B=4, W=4, alpha=0.6", "streaming_dllm",
     {"block_length": 4, "window_tokens": 4, "alpha": 0.6}),
    ("streaming_dllm", "B=2, W=6", "streaming_dllm", {"block_length": 2, "window_tokens": 6}),
    ("streaming_dllm", "cache none, B=4", "streaming_dllm:none", {"block_length": 4}),
    # DSB (methods-2026-ii.md section 2): threshold 0.9 in the sliding window; the scripts'
    # B = 32 covers the 16-token answer (= threshold 0.9), so also B = 4 and 8, greedy / const
    ("dsb", "greedy B=32 (default)", "dsb", {}),
    ("dsb", "greedy B=8", "dsb", {"block": 8}),
    ("dsb", "greedy B=4", "dsb", {"block": 4}),
    ("dsb", "const B=4", "dsb_const", {"block": 4}),
    # SAID (methods-2026-ii.md section 5): v1 (scaffold = even positions, probe at 0.8, easy
    # 1 + hard 3 forwards; the scripts' steps = G / 2 is 8 here) and the block variant (K = 3,
    # rec 2; the scripts' steps = G / 4 is 4 here), with the code's idle forwards, and v1 without
    ("said", "v1 steps=8 (scripts' G/2)", "said", {"steps": 8}),
    ("said", "v1 steps=4", "said", {"steps": 4}),
    ("said", "v1 steps=2", "said", {"steps": 2}),
    ("said", "v1 steps=4, no idle forward", "said", {"steps": 4, "idle_forwards": False}),
    ("said_block", "K=3 steps=4 (scripts' G/4)", "said_block", {"steps": 4}),
    ("said_block", "K=3 steps=6", "said_block", {"steps": 6}),
    ("said_block", "K=3 steps=8", "said_block", {"steps": 8}),
    ("said_block", "K=2 rec=1 steps=4", "said_block", {"steps": 4, "num_stages": 2,
                                                         "rec_steps": 1}),
    # DAWN (methods-2026-ii.md section 1): the authors' taus are absolute (tuned at L ~ 300+);
    # at the test bed's L ~ 30 uniform attention (1/L ~ 0.03) exceeds tau_sink 0.01, every
    # column is a sink and DAWN is "c >= 0.9, else the conflict-free c >= 0.7 set" with no
    # edges, i.e. threshold 0.7; the scaled rows put tau_sink at ~2x and tau_edge ~3x uniform
    ("dawn", "default (sink .01, edge .07)", "dawn", {}),
    ("dawn", "scaled sink .07, edge .1", "dawn", {"tau_sink": 0.07, "tau_edge": 0.1}),
    ("dawn", "scaled sink .07, edge .07", "dawn", {"tau_sink": 0.07, "tau_edge": 0.07}),
    ("dawn", "scaled, tau_low .8", "dawn", {"tau_sink": 0.07, "tau_edge": 0.1,
                                             "tau_low": 0.8}),
    # ReMix (methods-2026-ii.md section 3): soft mask / token inputs with JS rejection and
    # WINO's capped threshold (cap 11 at 16 masks); GSM8K's tau .9 (default), the other
    # tasks' .8, Countdown's beta .6, the README's js .2, the fix of the sticky rejection,
    # and beta 0 (no mixing: WINO's drafting rule, wide_in)
    ("remix", "gsm8k tau .9 (default)", "remix", {}),
    ("remix", "tau .8 (other tasks)", "remix", {"task": "math500"}),
    ("remix", "tau .8, beta .6 (countdown)", "remix", {"task": "countdown"}),
    ("remix", "tau .8, js .2 (README)", "remix", {"task": "math500", "js_threshold": 0.2}),
    ("remix", "tau .7", "remix", {"threshold": 0.7}),
    ("remix", "tau .9, sticky=False", "remix", {"sticky": False}),
    ("remix", "tau .9, beta 0 (no mixing)", "remix", {"beta_mix": 0.0}),
]


def load(name: str) -> Any:
    if name == "oracle":
        return waiting_line_oracle()
    if name == "oracle-cal":
        return waiting_line_oracle().calibrated(**CALIBRATED)
    from dllm_decode import load_model

    return load_model(name)


def policy_of(policy: str, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    if policy == "streaming_dllm:none":  # the selector and the exit without the plan
        return "streaming_dllm", {**kwargs, "cache": "none"}
    if policy == "threshold+eotp":
        from dllm_decode.policies.learn2pd import with_eotp
        from dllm_decode.policies.resolve import make_policy

        return with_eotp(make_policy("threshold", tau=kwargs["tau"])), {}
    if policy == "credit+sched":  # the fused scores under SchED's stopper
        from dllm_decode.policies.resolve import compose

        return compose("credit", stopper="sched", params={
            "tau": kwargs["tau"], "stopper.tau_low": kwargs["tau_low"]}), {}
    return policy, kwargs


def skip_reason(model: Any, policy: str) -> str | None:
    """Why ``policy`` does not apply to ``model`` (``None``: it does)."""
    if policy in ("window", "window_dream"):
        try:
            model.new_cache(1, 1)
        except (AttributeError, NotImplementedError):
            return "no K/V cache (Window-Diffusion runs on cache='window')"
    if policy == "streaming_dllm":
        try:
            model.new_cache(1, 1)
        except (AttributeError, NotImplementedError):
            return "no K/V cache (Streaming-dLLM's suffix pruning is cache='streaming')"
    if policy == "dawn" and not callable(getattr(model, "capture_attention", None)):
        return "no attention maps (DAWN reads the model's attention; the oracle has none)"
    if policy == "remix" and not callable(getattr(model, "feed_embeddings", None)):
        return "no input embeddings (ReMix feeds soft inputs; the oracle has none)"
    if policy == "learn2pd":
        from dllm_decode.policies.learn2pd_filter import find_bundled_filter

        try:
            found = find_bundled_filter(model, G)
        except (AttributeError, TypeError, ValueError):
            found = None
        if found is None:
            return f"no Learn2PD filter (learn2pd_k{G}) bundled for this model"
    return None


def stratified_means(valid: torch.Tensor, n_tasks: int, gen: torch.Generator,
                     draws: int) -> torch.Tensor:
    """``[draws]`` bootstrap means over tasks of ``valid [T * n]`` (prompts resampled per task)."""
    per = valid.view(n_tasks, -1).double()
    n = per.shape[1]
    idx = torch.randint(0, n, (draws, n_tasks, n), generator=gen)
    sample = torch.gather(per.expand(draws, -1, -1), 2, idx)
    return sample.mean(-1).mean(-1)


def summarise(rows: dict[str, list[dict[str, Any]]], base: torch.Tensor | None,
              draws: int = 2000) -> dict[str, Any]:
    valid = torch.tensor([r["valid"] for t in TESTBED_TASKS for r in rows[t]], dtype=torch.float)
    nfe = torch.tensor([r["nfe"] for t in TESTBED_TASKS for r in rows[t]], dtype=torch.float)
    t = len(TESTBED_TASKS)
    boot = stratified_means(valid, t, torch.Generator().manual_seed(0), draws)
    out = {"acc": 100 * valid.view(t, -1).mean(-1).mean().item(),
           "ci_lo": 100 * boot.quantile(0.025).item(), "ci_hi": 100 * boot.quantile(0.975).item(),
           "nfe": nfe.mean().item(), "tokens_per_step": G / nfe.mean().item(),
           "tasks": {task: 100 * sum(r["valid"] for r in rows[task]) / len(rows[task])
                     for task in TESTBED_TASKS}, "valid": valid}
    if base is not None:  # paired: the same resampled prompts for both configs
        diff = stratified_means(valid - base, t, torch.Generator().manual_seed(0), draws)
        lo, hi = diff.quantile(0.025).item(), diff.quantile(0.975).item()
        out["diff_lo"], out["diff_hi"] = 100 * lo, 100 * hi
        out["significant"] = lo > 0 or hi < 0
    return out


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def selected(only: list[str] | None) -> list[tuple[str, str, Any, dict[str, Any]]]:
    """``CONFIGS``, or the baseline (always first: the paired test needs it) and the
    families in ``only``."""
    if not only:
        return CONFIGS
    unknown = sorted(set(only) - {c[0] for c in CONFIGS})
    if unknown:
        raise SystemExit(f"--only: unknown families {unknown}; add their rows to CONFIGS")
    return [CONFIGS[0]] + [c for c in CONFIGS[1:] if c[0] in only]


def decode_config(model: Any, oracle: Any, policy: str, kwargs: dict[str, Any], n: int,
                  seed: int) -> tuple[dict[str, list[dict[str, Any]]], float]:
    """One config's ``decode_tasks`` rows (``policy_of`` resolves composed policies) and the
    thread CPU seconds it took."""
    pol, kw = policy_of(policy, kwargs)
    t0 = time.thread_time()
    rows = decode_tasks(model, oracle, n, seed=seed, policy=pol, **kw)
    return rows, time.thread_time() - t0


def result_row(name: str, family: str, label: str, kwargs: dict[str, Any], n: int, seed: int,
               s: dict[str, Any], seconds: float,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One CSV row of a config's ``summarise`` result ``s``; ``extra`` columns (a benchmark's
    own) follow ``tokens_per_step``."""
    return {"model": name, "family": family, "config": label,
            "params": json.dumps(kwargs), "n_per_task": n, "seed": seed,
            "acc": round(s["acc"], 2), "ci_lo": round(s["ci_lo"], 2),
            "ci_hi": round(s["ci_hi"], 2), "nfe": round(s["nfe"], 3),
            "tokens_per_step": round(s["tokens_per_step"], 3), **(extra or {}),
            "diff_lo": round(s.get("diff_lo", 0.0), 2),
            "diff_hi": round(s.get("diff_hi", 0.0), 2),
            "significant": s.get("significant", False),
            "cpu_s_per_prompt": round(seconds / (n * len(TESTBED_TASKS)), 5),
            **{f"acc_{t}": round(v, 1) for t, v in s["tasks"].items()},
            "device": "cpu", "torch": torch.__version__,
            "python": platform.python_version(), "commit": commit(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}


def run(models: list[str], n: int, seed: int,
        only: list[str] | None = None) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    oracle = waiting_line_oracle()  # codec (encode/decode) of every test-bed model
    out = []
    configs = selected(only)
    total, done, start = len(models) * len(configs), 0, time.perf_counter()
    for name in models:
        model = load(name)
        base = None
        for family, label, policy, kwargs in configs:
            done += 1
            reason = skip_reason(model, policy)
            if reason is not None:
                print(f"{progress(done, total, start)} {name:14s} {family:18s} {label:22s} "
                      f"skipped: {reason}", flush=True)
                continue
            rows, seconds = decode_config(model, oracle, policy, kwargs, n, seed)
            s = summarise(rows, base)
            base = s["valid"] if base is None else base
            out.append(result_row(name, family, label, kwargs, n, seed, s, seconds))
            r = out[-1]
            print(f"{progress(done, total, start)} {name:14s} {family:18s} {label:22s} "
                  f"acc {r['acc']:6.2f} "
                  f"[{r['ci_lo']:.1f}, {r['ci_hi']:.1f}] NFE {r['nfe']:6.2f} tokens/step "
                  f"{r['tokens_per_step']:5.2f}"
                  f"{' *' if r['significant'] else ''}", flush=True)
    return out


def progress(done: int, total: int, start: float) -> str:
    """``[ 7/93  1.2 min, ~14.7 min left]``: configs done, elapsed, a linear estimate."""
    elapsed = (time.perf_counter() - start) / 60
    left = elapsed / done * (total - done) if done else 0.0
    return f"[{done:{len(str(total))}d}/{total} {elapsed:5.1f} min, ~{left:4.1f} min left]"


def aup_table(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """AUP per (model, method family): the family's (tokens per step, acc) points plus the baseline
    anchor (k=1), y_max = best accuracy of any config on that model (AUP is per leaderboard)."""
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        y_max = max(r["acc"] for r in mine)
        anchor = (mine[0]["tokens_per_step"], mine[0]["acc"])
        for family in dict.fromkeys(r["family"] for r in mine):
            points = [anchor] + [(r["tokens_per_step"], r["acc"]) for r in mine
                                 if r["family"] == family]
            out[model, family] = aup(points, y_max) if y_max > 0 else 0.0
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    aups = aup_table(rows)
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += [f"### {model}", "",
                  "| method | config | accuracy % [95 % CI] | NFE | tokens/step "
                  "| vs k=1 (Δ 95 % CI) | family AUP |", "|---|---|---|---|---|---|---|"]
        seen = set()
        for r in (r for r in rows if r["model"] == model):
            mark = " **sig.**" if r["significant"] else ""
            fam_aup = "" if r["family"] in seen else f"{aups[model, r['family']]:.1f}"
            seen.add(r["family"])
            delta = ("baseline" if r is rows[0] or r["config"] == "k=1" and
                     r["family"] == "low_confidence" else
                     f"[{r['diff_lo']:+.1f}, {r['diff_hi']:+.1f}]{mark}")
            lines.append(f"| {r['family']} | {r['config']} | {r['acc']:.1f} [{r['ci_lo']:.1f},"
                         f" {r['ci_hi']:.1f}] | {r['nfe']:.2f} | {r['tokens_per_step']:.2f} | "
                         f"{delta} | {fam_aup} |")
        lines.append("")
    return "\n".join(lines)


#: markers cycled beside the colours, so methods that share a hue still differ in shape
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")


def method_styles(families: list[str]) -> dict[str, tuple[Any, str]]:
    """A distinct (colour, marker) per method family: tab20's dark hues, then its light ones,
    then tab20b (40 colours, none reused); the marker also changes between a hue's dark and
    light variant."""
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"].colors
    palette = list(tab20[::2]) + list(tab20[1::2]) + list(matplotlib.colormaps["tab20b"].colors)
    if len(families) > len(palette):
        raise ValueError(f"{len(families)} methods: at most {len(palette)} distinct colours")
    return {f: (palette[i], MARKERS[(i + i // len(MARKERS)) % len(MARKERS)])
            for i, f in enumerate(families)}


def pareto_plot(rows: list[dict[str, Any]], path: Path) -> Any:
    """One panel per model, accuracy vs tokens per step per method family with 95 % intervals; every
    family keeps its colour and marker across panels; the legend sits right of the axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    styles = method_styles(list(dict.fromkeys(r["family"] for r in rows)))
    fig = Figure(figsize=(5.5 * len(models) + 2.5, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models, strict=True):
        mine = [r for r in rows if r["model"] == model]
        for family in dict.fromkeys(r["family"] for r in mine):
            pts = sorted((r["tokens_per_step"], r["acc"], r["ci_lo"], r["ci_hi"]) for r in mine
                         if r["family"] == family)
            xs, ys, lo, hi = zip(*pts, strict=True)
            err = [[y - l for y, l in zip(ys, lo, strict=True)],
                   [h - y for y, h in zip(ys, hi, strict=True)]]
            colour, marker = styles[family]
            ax.errorbar(xs, ys, yerr=err, ms=5, capsize=2, color=colour, marker=marker,
                        label=family)
        ax.set_title(model)
        ax.set_xlabel("tokens per step (gen length / NFE)")
        ax.set_ylabel("accuracy % (mean over 9 tasks)")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    handles, labels = {}, {}
    for ax in axes:  # one entry per family, from whichever panel has it
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
            labels.setdefault(label, label)
    fig.legend(list(handles.values()), list(labels), loc="outside right upper", fontsize=7,
               title="method")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return fig


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a results CSV, with the numbers the plot reads as floats."""
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for key in ("acc", "ci_lo", "ci_hi", "tokens_per_step", "nfe", "diff_lo", "diff_hi"):
            r[key] = float(r[key])
        r["significant"] = r["significant"] in (True, "True")
    return rows


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` rows with ``new`` ones in place of the same (model, family, config), the rest
    of ``new`` appended; rows ordered by model, then as in ``CONFIGS``."""
    key = {(r["model"], r["family"], r["config"]): r for r in old}
    key |= {(r["model"], r["family"], r["config"]): r for r in new}
    order = {(c[0], c[1]): i for i, c in enumerate(CONFIGS)}
    models = list(dict.fromkeys([r["model"] for r in old] + [r["model"] for r in new]))
    return sorted(key.values(), key=lambda r: (models.index(r["model"]), order.get(
        (r["family"], r["config"]), len(order))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["oracle-cal", "testbed-llada",
                                                    "testbed-dream"])
    ap.add_argument("--n", type=int, default=50, help="held-out prompts per task")
    ap.add_argument("--seed", type=int, default=0, help="offset of the record generator seed")
    ap.add_argument("--tag", default="testbed_methods")
    ap.add_argument("--only", nargs="+", default=None, metavar="FAMILY",
                    help="run the baseline and these method families only, and merge their "
                         "rows into an existing results/<tag>.csv (replacing theirs)")
    ap.add_argument("--plot-only", action="store_true",
                    help="redraw results/<tag>_pareto.png from results/<tag>.csv (no decoding)")
    args = ap.parse_args(argv)
    if args.plot_only:
        rows = read_rows(RESULTS / f"{args.tag}.csv")
        pareto_plot(rows, RESULTS / f"{args.tag}_pareto.png")
        return 0
    rows = run(args.models, args.n, args.seed, args.only)
    RESULTS.mkdir(exist_ok=True)
    if args.only and (RESULTS / f"{args.tag}.csv").exists():
        rows = merge(read_rows(RESULTS / f"{args.tag}.csv"), rows)
    with (RESULTS / f"{args.tag}.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    command = "python benchmarks/bench_testbed.py " + " ".join(sys.argv[1:])
    md = RESULTS / f"{args.tag}.md"
    # a merge keeps the commands that made the other rows
    before = ([line for line in md.read_text().splitlines() if line.startswith("`")]
              if args.only and md.exists() else [])
    md.write_text("".join(f"{c}\n\n" for c in [*before, f"`{command}`"]) + markdown(rows))
    pareto_plot(rows, RESULTS / f"{args.tag}_pareto.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
