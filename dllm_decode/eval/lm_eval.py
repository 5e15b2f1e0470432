"""lm-evaluation-harness adapter: the ``dllm_decode`` model and a launcher.

Usage (the launcher registers the model and adds the ParallelBench task pack)::

    python -m dllm_decode.eval.lm_eval --model dllm_decode --tasks gsm8k --num_fewshot 5 \\
        --model_args pretrained=GSAI-ML/LLaDA-8B-Instruct,policy=threshold,tau=0.9 \\
        --gen_kwargs block_length=32
    python -m dllm_decode.eval.lm_eval --model dllm_decode --tasks gsm8k \
        --model_args pretrained=inclusionAI/LLaDA2.0-mini,dtype=bfloat16   # family default: llada2

Decoding knobs come from ``--model_args`` and, per request, from ``--gen_kwargs`` / the task's
``generation_kwargs`` (those win): ``policy``, ``cache``, ``block_length``, ``steps`` or
``tokens_per_step`` (steps = gen_length / k), ``temperature``, ``seed``, ``stopper`` /
``truncator`` (composition, as on the CLI) and any policy parameter (``tau``, ``factor``,
``stopper.tau_low``, ...). Without ``policy`` (or with ``policy=default``) the model
family's default preset, parameters and cache are used (``policies.defaults``: ``llada2`` on
LLaDA2, ``fastdllm_v2`` on Fast-dLLM v2, ``gemma_renoise`` on DiffusionGemma, ...).
``max_gen_toks`` sets gen_length: exactly, on block-diffusion models (decoded in their own
block size unless ``block_length`` is given) and uniform-noise models (canvases of their own
length); rounded up to a multiple of block_length on LLaDA / Dream. ``until`` strings
truncate the decoded text; answers end at the model's EOS, ``generation_config.json``'s and
the tokenizer's EOS / end-of-turn (``text.stop_token_ids``).

Prompts are rendered with the tokenizer's chat template by default (``chat``: ``auto``, as
``text.encode_prompts``), as lm-eval's ``--apply_chat_template`` would render them: the doc's
own turns when it has ``messages`` (the task pack: demonstrations as user / assistant turns),
else the context as one user turn, with the generation prompt. A context lm-eval already
rendered (``--apply_chat_template`` calls ``apply_chat_template`` below) is used as it is.
``chat=false`` in ``--model_args`` feeds the flat context (lm-eval's rendering without the
flag); a tokenizer without a chat template always gets the flat context.

``loglikelihood`` is the Monte-Carlo masked ELBO of LLaDA-style evaluation: per draw, mask
``l`` of the ``L`` continuation tokens (``l`` stratified over the draws of a batch), and
average ``sum_masked CE / (l / L)``; ``mc_num`` draws in batches of ``mc_batch_size``.

Importing this module registers the model (after importing ``lm_eval.models`` so the built-in
models stay visible) and raises ``ImportError`` when lm-eval is not installed.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

# Built-in models first: registering into an empty registry hides them (lm-eval 0.4.13).
import lm_eval.models  # noqa: F401
import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

#: The ParallelBench task pack shipped with the package.
TASK_PACK: Final[Path] = Path(__file__).parent / "parallelbench" / "lm_eval_tasks"
#: Decoding knobs that are not policy parameters.
_DECODE_KEYS: Final[frozenset[str]] = frozenset(
    {"policy", "cache", "block_length", "steps", "tokens_per_step", "temperature", "seed"}
)
#: lm-eval generation kwargs that are not decoding knobs.
_HARNESS_KEYS: Final[frozenset[str]] = frozenset({"until", "max_gen_toks", "do_sample"})
DEFAULT_GEN_TOKS: Final[int] = 256


def _typed(value: Any) -> Any:
    """``"0.9"`` -> 0.9, ``"4"`` -> 4, ``"none"`` -> None (model_args arrive as strings)."""
    if not isinstance(value, str):
        return value
    if value.lower() in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _chat_setting(chat: bool | str, tokenizer: Any) -> bool:
    """``chat`` (``auto`` / true / false, as a model_args string or a bool) -> whether
    contexts are rendered through ``tokenizer``'s chat template."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    value = str(chat).lower()
    if value == "auto":
        return has_template
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"chat must be auto, true or false, got {chat!r}")
    if value in ("true", "1", "yes") and not has_template:
        raise ValueError("chat=true needs a tokenizer with a chat template; this one has none: "
                         "pass chat=false (or auto) in --model_args")
    return value in ("true", "1", "yes")


class DllmDecodeLM(LM):
    """Any ``dllm_decode`` model under lm-eval.

    Args:
        pretrained: checkpoint directory or bundled name (ignored when ``model`` is given).
        tokenizer: tokenizer path or object (default: the checkpoint directory).
        model: an already-built model object (Python API / tests).
        device, dtype: where and how to load the model.
        batch_size: requests decoded together (same decoding config only).
        mc_num, mc_batch_size: Monte-Carlo draws for ``loglikelihood`` and their batch size.
        chat: render contexts through the tokenizer's chat template: ``"auto"`` (default:
            when the tokenizer has one), ``true`` (an error without one) or ``false`` (the
            flat context). Contexts lm-eval rendered (``--apply_chat_template``) are kept.
        doc_messages: with the chat template, render ``doc["messages"]`` (a JSON list of chat
            turns, as the task pack provides) when the doc has it (default); ``false``: the
            context as one user turn.
        speed_log: JSONL path for per-request speed records keyed by (task, doc_id).
        **knobs: default decoding knobs (see the module docstring).
    """

    def __init__(
        self,
        pretrained: str = "tiny-llada",
        tokenizer: Any = None,
        model: Any = None,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int | str = 1,
        mc_num: int = 128,
        mc_batch_size: int = 32,
        chat: bool | str = "auto",
        doc_messages: bool | str = True,
        speed_log: str | None = None,
        **knobs: Any,
    ) -> None:
        super().__init__()
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "cuda" if torch.cuda.is_available() else "cpu"  # lm-eval defaults to cuda
        if model is None:
            from dllm_decode.models.loading import load_model

            model = load_model(pretrained, dtype=getattr(torch, dtype), device=device)
        if tokenizer is None or isinstance(tokenizer, str):
            from dllm_decode.eval.runner import _tokenizer_source
            from dllm_decode.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(_tokenizer_source(pretrained, tokenizer))
        self.model, self.tokenizer = model, tokenizer
        self.device_name = device
        self.batch_size = int(_typed(batch_size)) if str(batch_size) != "auto" else 1
        self.mc_num, self.mc_batch_size = int(mc_num), int(mc_batch_size)
        if self.mc_num % self.mc_batch_size:
            raise ValueError(
                f"mc_num ({mc_num}) must be a multiple of mc_batch_size ({mc_batch_size})"
            )
        self.doc_messages = str(doc_messages).lower() in ("1", "true", "yes")
        self.chat = _chat_setting(chat, tokenizer)
        #: contexts lm-eval rendered through ``apply_chat_template`` (kept as they are)
        self._rendered: set[str] = set()
        self.speed_log = Path(speed_log) if speed_log else None
        # lm-eval's --trust_remote_code lands here too (it is meant for dataset scripts): the
        # model and tokenizer above never run repository code, whatever it says
        remote = str(knobs.pop("trust_remote_code", False)).lower() in ("1", "true", "yes")
        if remote:
            warnings.warn("trust_remote_code=True is ignored by the dllm_decode model: it loads "
                          "safetensors with its own model code and the tokenizer with "
                          "trust_remote_code=False (README: What runs code)", stacklevel=2)
        knobs = {k: _typed(v) for k, v in knobs.items() if k not in ("max_batch_size",)}
        # policy / cache None: the family's default (``policies.defaults.apply_family_default``)
        self.knobs: dict[str, Any] = {"policy": None, "cache": None, **knobs}
        from dllm_decode.text import stop_token_ids

        self.eos_ids = stop_token_ids(tokenizer, model)
        self._samplers: dict[tuple[Any, ...], Any] = {}

    # ------------------------------------------------------------ helpers

    def _encode(self, text: str, special: bool = True) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def _context_ids(self, request: Any) -> list[int]:
        """Token ids of a request's context: rendered through the chat template (``chat``),
        the doc's own turns when it has them (``doc_messages``), else the context as one user
        turn; a context lm-eval already rendered, or ``chat`` off: the context as it is."""
        context = request.args[0]
        if context in self._rendered:  # lm-eval's --apply_chat_template rendered it
            return self._encode(context, special=False)
        if not self.chat:
            return self._encode(context)
        doc = getattr(request, "doc", None)
        if self.doc_messages and isinstance(doc, dict) and "messages" in doc:
            turns = json.loads(doc["messages"])
        else:
            turns = [{"role": "user", "content": context}]
        return self._encode(self._render(turns), special=False)

    def _render(self, turns: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            turns, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def decode_settings(self, gen_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict]:
        """``(sampler_kwargs, generate_kwargs)`` for one request (gen_kwargs win)."""
        merged = {**self.knobs, **{k: _typed(v) for k, v in gen_kwargs.items()}}
        requested = int(merged.get("max_gen_toks") or DEFAULT_GEN_TOKS)
        block = merged.get("block_length")
        if getattr(self.model, "noise_kind", "mask") == "uniform":
            gen_length = requested  # canvases of the model's own length, cut to the request
        elif self.model.attention == "block_causal":
            # their own block size unless told otherwise; any length (whole blocks decoded)
            block, gen_length = block or self.model.block_size, requested
        else:
            block = block or requested
            gen_length = math.ceil(requested / block) * block
        steps = merged.get("steps")
        if merged.get("tokens_per_step"):
            steps = max(1, gen_length // int(merged["tokens_per_step"]))
        if merged.get("do_sample") is False:
            merged["temperature"] = 0.0
        params = {
            k: v for k, v in merged.items() if k not in _DECODE_KEYS and k not in _HARNESS_KEYS
        }
        sampler = {"policy": merged["policy"], "cache": merged["cache"], **params}
        generate = {
            "gen_length": gen_length, "block_length": block, "steps": steps,
            "temperature": float(merged.get("temperature") or 0.0),
            "seed": int(merged.get("seed") or 0),
        }  # fmt: skip
        return sampler, generate

    def _sampler(self, settings: dict[str, Any]) -> Any:
        """The sampler for ``settings``: ``policy``, ``cache``, optional ``stopper`` /
        ``truncator`` (composition, as on the CLI) and flat parameters (``stopper.NAME``...)."""
        from dllm_decode.policies.defaults import apply_family_default
        from dllm_decode.samplers.build import build_sampler

        key = tuple(sorted((k, str(v)) for k, v in settings.items()))
        if key not in self._samplers:
            rest = dict(settings)
            policy, cache = rest.pop("policy"), rest.pop("cache")
            stopper, truncator = rest.pop("stopper", None), rest.pop("truncator", None)
            policy, rest, cache = apply_family_default(self.model, policy, rest, cache)
            self._samplers[key] = build_sampler(self.model, policy, stopper=stopper,
                                                truncator=truncator, cache=cache, params=rest)
        return self._samplers[key]

    @staticmethod
    def truncate(text: str, until: Sequence[str]) -> str:
        """Cut ``text`` at the earliest occurrence of any non-empty stop string."""
        cuts = [text.find(stop) for stop in until if stop and stop in text]
        return text[: min(cuts)] if cuts else text

    # ------------------------------------------------------------ lm-eval API

    @property
    def tokenizer_name(self) -> str:
        """Fingerprint for lm-eval's request cache and ``--apply_chat_template``."""
        return str(getattr(self.tokenizer, "name_or_path", "dllm_decode")).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokenizer's chat template (``None`` when it has none)."""
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render lm-eval's chat history with the tokenizer's chat template (lm-eval calls
        it under ``--apply_chat_template``; the context it returns is not rendered again)."""
        text = self._render(chat_history, add_generation_prompt)
        self._rendered.add(text)
        return text

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Diffusion decoding per request; see the module docstring for the knobs."""
        from dllm_decode.eval.parallelbench.codec import useful_length
        from dllm_decode.eval.runner import left_pad

        groups: dict[str, list[int]] = {}
        settings = []
        for i, request in enumerate(requests):
            gen_kwargs = dict(request.args[1]) if len(request.args) > 1 else {}
            sampler_kw, generate_kw = self.decode_settings(gen_kwargs)
            settings.append((sampler_kw, generate_kw, gen_kwargs.get("until") or []))
            groups.setdefault(json.dumps([sampler_kw, generate_kw], sort_keys=True), []).append(i)
        outputs: list[str] = [""] * len(requests)
        pad = self.tokenizer.pad_token_id
        pad = self.eos_ids[0] if pad is None else pad
        for members in groups.values():
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                sampler_kw, generate_kw, _ = settings[chunk[0]]
                prompts = [self._context_ids(requests[i]) for i in chunk]
                ids, mask = left_pad(prompts, pad)
                sampler = self._sampler(sampler_kw)
                # the speed log names what ran (the family's preset for policy None)
                logged = {**sampler_kw, "policy": sampler.policy.name,
                          "cache": sampler.config.cache.value}
                began = time.perf_counter()
                generation = sampler.generate(
                    ids.to(self.device_name), mask.to(self.device_name), **generate_kw
                )
                seconds = (time.perf_counter() - began) / len(chunk)
                for row, i in enumerate(chunk):
                    answer = generation.answer[row].tolist()
                    useful = useful_length(answer, self.eos_ids)
                    text = self.tokenizer.decode(answer[:useful], skip_special_tokens=True)
                    outputs[i] = self.truncate(text, settings[i][2])
                    self._log_speed(requests[i], generation.nfe[row], useful, generate_kw,
                                    logged, seconds, len(prompts[row]))  # fmt: skip
        return outputs

    def _log_speed(self, request: Any, nfe: Any, useful: int, generate_kw: dict,
                   sampler_kw: dict, seconds: float, prompt_tokens: int) -> None:  # fmt: skip
        if self.speed_log is None:
            return
        record = {
            "task": getattr(request, "task_name", None),
            "doc_id": getattr(request, "doc_id", None),
            "nfe": int(nfe), "gen_tokens_useful": useful,
            "gen_tokens_budget": generate_kw["gen_length"], "wall_time_s": seconds,
            "prompt_tokens": prompt_tokens, "config": {**sampler_kw, **generate_kw},
        }  # fmt: skip
        self.speed_log.parent.mkdir(parents=True, exist_ok=True)
        with self.speed_log.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def _masked_nll(
        self, context: list[int], target: list[int], generator: torch.Generator
    ) -> float:
        """Monte-Carlo ELBO estimate of ``-log p(target | context)`` (nats)."""
        length = len(target)
        sequence = torch.tensor(context + target, dtype=torch.long, device=self.device_name)
        positions = self.model.rope_positions(torch.ones_like(sequence, dtype=torch.bool)[None])
        total = 0.0
        for _ in range(self.mc_num // self.mc_batch_size):
            b = self.mc_batch_size
            # Stratified mask counts: a random offset plus b evenly spaced counts in 1..L.
            offset = torch.randint(length, (1,), generator=generator).item()
            counts = (offset + torch.arange(b) * length // b) % length + 1
            scores = torch.rand(b, length, generator=generator)
            ranks = scores.argsort(dim=1).argsort(dim=1)
            masked = ranks < counts[:, None]  # [b, L]: exactly counts[j] masked positions
            batch = sequence.expand(b, -1).clone()
            batch[:, len(context) :][masked.to(batch.device)] = self.model.mask_token_id
            with torch.no_grad():
                logits = self.model.forward(batch, positions.expand(b, -1))
            target_logits = logits[:, len(context) :].float()
            loss = F.cross_entropy(
                target_logits.reshape(-1, target_logits.shape[-1]),
                sequence[len(context) :].expand(b, -1).reshape(-1), reduction="none",
            ).view(b, length).cpu()  # fmt: skip
            weight = length / counts.float()  # 1 / (l / L)
            total += float((loss * masked).sum(dim=1).mul(weight).sum())
        return total / self.mc_num

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple]:
        """``(log p, is_greedy)`` per request; ``is_greedy`` is not computed (always False)."""
        if getattr(self.model, "noise_kind", "mask") != "mask":
            raise NotImplementedError(
                "loglikelihood is the masked ELBO of mask-token models; this uniform-noise "
                "model has no mask token: evaluate it with generate_until tasks")
        generator = torch.Generator().manual_seed(int(self.knobs.get("seed") or 0))
        out = []
        for request in requests:
            context, continuation = request.args
            target = self._encode(continuation, special=False)
            if not target:
                out.append((0.0, True))
                continue
            nll = self._masked_nll(self._context_ids(request), target, generator)
            out.append((-nll, False))
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list:
        raise NotImplementedError("dllm_decode does not estimate rolling (perplexity) likelihoods")


if __name__ != "__main__":  # under ``python -m`` the canonical module registers (see below)
    register_model("dllm_decode")(DllmDecodeLM)


def main(argv: Sequence[str] | None = None) -> int:
    """Launcher: run lm-eval's CLI with this model registered and the task pack included."""
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    if "--include_path" not in args:
        args += ["--include_path", str(TASK_PACK)]
    saved = sys.argv
    sys.argv = ["lm_eval", *args]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    from dllm_decode.eval.lm_eval import main as registered_main

    raise SystemExit(registered_main())
