"""Run the public reference decoding loops and time them (runs in the *reference* Python).

This script is started by ``benchmarks/overhead_reference.py`` with ``$DLLM_REF_PYTHON`` (a
Python with torch and transformers 4.46.2, nothing of this library) and imports the reference
code at run time from ``$DLLM_REF_SRC``; none of that code is part of this repository.
Expected layout of ``$DLLM_REF_SRC`` (see benchmarks/README.md, "Reference loops"):

* ``LLaDA/generate.py``: ML-GSAI/LLaDA ``generate.py`` (``generate``);
* ``Fast-dLLM/llada/generate.py`` and ``Fast-dLLM/llada/model/*.py``: NVlabs/Fast-dLLM
  ``llada/`` (``generate``, ``generate_with_prefix_cache``, ``generate_with_dual_cache`` and
  the LLaDA modeling with K/V caches, which every LLaDA loop here runs on);
* ``Dream/{modeling_dream,configuration_dream,generation_utils}.py``: the Dream Hugging Face
  model code (``DreamModel.diffusion_generate``).

Protocol: one JSON request per line on stdin, one JSON reply per line on stdout (anything the
reference code prints goes to stderr). A request::

    {"id": "...", "reference": "llada.generate" | "fastdllm.generate"
        | "fastdllm.generate_with_prefix_cache" | "fastdllm.generate_with_dual_cache"
        | "dream.diffusion_generate",
     "checkpoint": "<dir with config.json + model.safetensors>", "prompt_ids": [[...]],
     "args": {<keyword arguments of the reference function>}, "seed": 0,
     "repeats": 1, "warmup": 0}

and its reply: ``{"id", "output_ids", "nfe", "nfe_reported", "runs": [{"total_s", "model_s",
"core_s", "forwards"}, ...], "versions": {...}}`` (or ``{"id", "error"}``). ``total_s`` is the
thread CPU time of the whole reference call, ``model_s`` the part spent inside the model's
``forward`` (wrapped on the loaded instance), ``core_s`` the part spent inside the network's
core modules (token embedding, each transformer block, final norm, LM head; forward hooks), the
same modules our side times (``dllm_decode.overhead.CoreClock``), so that RoPE tables, masks and
any other set-up inside the reference ``forward`` count as loop work, as they do on our side;
``forwards`` the number of ``forward`` calls (NFE).
Each timed run is preceded by ``torch.manual_seed(seed)``. Torch runs on one thread, float32,
with TorchDynamo disabled (Fast-dLLM's modeling wraps its SDPA call in ``torch.compile``),
as when the conformance fixtures were recorded.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # before torch is imported

import contextlib  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

#: request ``reference`` -> (model family, module key, function name)
REFERENCES: dict[str, tuple[str, str, str]] = {
    "llada.generate": ("llada", "llada", "generate"),
    "fastdllm.generate": ("llada", "fastdllm", "generate"),
    "fastdllm.generate_with_prefix_cache": ("llada", "fastdllm", "generate_with_prefix_cache"),
    "fastdllm.generate_with_dual_cache": ("llada", "fastdllm", "generate_with_dual_cache"),
    "dream.diffusion_generate": ("dream", "dream", "diffusion_generate"),
}


def _load_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class References:
    """The reference modules and models, imported / loaded on first use."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self._modules: dict[str, ModuleType] = {}
        self._models: dict[tuple[str, str], Any] = {}

    def module(self, key: str) -> ModuleType:
        if key not in self._modules:
            if key == "llada":
                mod = _load_file(self.src / "LLaDA" / "generate.py", "ref_llada_generate")
            elif key == "fastdllm":
                sys.path.insert(0, str(self.src / "Fast-dLLM" / "llada"))  # its ``model`` pkg
                mod = _load_file(self.src / "Fast-dLLM" / "llada" / "generate.py",
                                 "ref_fastdllm_generate")
            elif key == "llada_model":
                self.module("fastdllm")
                mod = importlib.import_module("model.modeling_llada")
            elif key == "dream":
                sys.path.insert(0, str(self.src))  # ``Dream`` as a namespace package
                mod = importlib.import_module("Dream.modeling_dream")
            else:
                raise KeyError(key)
            self._modules[key] = mod
        return self._modules[key]

    def model(self, family: str, checkpoint: str) -> Any:
        key = (family, checkpoint)
        if key not in self._models:
            cls = (self.module("llada_model").LLaDAModelLM if family == "llada"
                   else self.module("dream").DreamModel)
            with contextlib.redirect_stdout(sys.stderr):
                model = cls.from_pretrained(checkpoint, torch_dtype=torch.float32)
            self._models[key] = model.eval()
        return self._models[key]


def core_modules(model: Any, family: str) -> list[Any]:
    """The modules whose time is "model" in the like-for-like split: token embedding, every
    transformer block, final norm, LM head (Fast-dLLM's LLaDA modeling / Dream's)."""
    if family == "llada":
        t = model.model.transformer
        if not hasattr(t, "ff_out") or not hasattr(t, "blocks"):
            raise ValueError("the like-for-like split needs an untied LM head (ff_out) and "
                             "block_group_size 1")
        return [t.wte, *t.blocks, t.ln_f, t.ff_out]
    base = model.model
    return [base.embed_tokens, *base.layers, base.norm, model.lm_head]


def _core_clock() -> Any:
    """``dllm_decode.core_clock.CoreClock``, loaded by file path (this Python has no
    ``dllm_decode``; the module needs nothing but the standard library)."""
    path = Path(__file__).resolve().parents[1] / "dllm_decode" / "core_clock.py"
    spec = importlib.util.spec_from_file_location("dllm_core_clock", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CoreClock


class ForwardTimer:
    """Wraps ``model.forward`` on the instance: thread CPU seconds and calls."""

    def __init__(self, model: Any) -> None:
        self.seconds = 0.0
        self.calls = 0
        inner: Callable[..., Any] = model.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - t0
                self.calls += 1

        self._model, self._inner = model, inner
        model.forward = forward

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def close(self) -> None:
        del self._model.forward  # back to the class attribute


def run_request(refs: References, req: dict[str, Any]) -> dict[str, Any]:
    """Run one request (see the module docstring) and return its reply."""
    family, mod_key, fn_name = REFERENCES[req["reference"]]
    model = refs.model(family, req["checkpoint"])
    prompt = torch.tensor(req["prompt_ids"], dtype=torch.long)
    args = dict(req.get("args") or {})
    seed = int(req.get("seed", 0))
    if family == "dream":
        def call() -> tuple[torch.Tensor, int | None]:
            return model.diffusion_generate(prompt, **args), None
    else:
        fn = getattr(refs.module(mod_key), fn_name)

        def call() -> tuple[torch.Tensor, int | None]:
            out = fn(model, prompt, **args)
            return (out[0], int(out[1])) if isinstance(out, tuple) else (out, None)

    timer = ForwardTimer(model)
    core = _core_clock()(core_modules(model, family))
    runs, out, reported = [], None, None
    try:
        for r in range(int(req.get("warmup", 0)) + int(req.get("repeats", 1))):
            timer.reset()
            core.reset()
            torch.manual_seed(seed)
            with contextlib.redirect_stdout(sys.stderr), torch.no_grad():
                t0 = time.thread_time()
                out, reported = call()
                total = time.thread_time() - t0
            if r >= int(req.get("warmup", 0)):
                runs.append({"total_s": total, "model_s": timer.seconds,
                             "core_s": core.seconds, "forwards": timer.calls})
    finally:
        core.close()
        timer.close()
    assert out is not None
    return {"id": req.get("id"), "output_ids": out.tolist(), "nfe": runs[-1]["forwards"],
            "nfe_reported": reported, "runs": runs, "versions": versions()}


def versions() -> dict[str, str]:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0]}


def main() -> int:
    src = os.environ.get("DLLM_REF_SRC")
    if not src:
        print("DLLM_REF_SRC is not set", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    # transformers 4.46 warns on every Dream call that temperature 0.0 goes unused
    warnings.filterwarnings("ignore", category=UserWarning, module="transformers")
    refs = References(Path(src))
    reply_to = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req: dict[str, Any] = {}
        try:
            req = json.loads(line)
            reply = run_request(refs, req)
        except Exception as exc:  # reported to the caller, which fails loudly
            reply = {"id": req.get("id"), "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()}
        reply_to.write(json.dumps(reply) + "\n")
        reply_to.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
