"""``dllm-decode``: generate | serve-check | eval | bench | train | doctor."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from dllm_decode.policies.resolve import PRESETS, STOPPERS, TRUNCATORS
from dllm_decode.samplers.contract import DecodeContractError
from dllm_decode.types import CacheMode

#: the bundled default checkpoint (LLaDA-like); a seeded random model stands in if absent
DEFAULT_MODEL = "tiny-llada"


class ByteTokenizer:
    """Fallback for models shipped without a tokenizer: UTF-8 bytes are ids 0..255."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 256:
            raise ValueError("ByteTokenizer needs a vocabulary of at least 256 ids")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class IdTokenizer:
    """``--token-ids``: the prompt is token ids (``"165 20 93"``, ``"165,20,93"`` or
    ``"[165, 20, 93]"``) and the answer is printed as ids: checkpoints without a tokenizer,
    such as the reference-format conformance checkpoints."""

    separator = " "  # between pieces of the live view (``--show``)

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        parts = text.replace(",", " ").strip().strip("[]").split()
        if not parts or not all(p.isdigit() for p in parts):
            raise ValueError(f"--token-ids: the prompt must be token ids separated by spaces or "
                             f"commas (e.g. '165 20 93'), got {text!r}")
        ids = [int(p) for p in parts]
        bad = [i for i in ids if i >= self.vocab_size]
        if bad:
            raise ValueError(f"--token-ids: ids {bad[:5]} are outside the vocabulary "
                             f"[0, {self.vocab_size})")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)


def load_model_and_tokenizer(name: str | None, seed: int = 0, *, dtype: str = "auto",
                             device: str | None = None, revision: str | None = None,
                             mask_token_id: int | None = None,
                             token_ids: bool = False) -> tuple[Any, Any, str]:
    """(model, tokenizer, description) for ``--model``: a directory, bundled name or Hub id.

    ``token_ids`` (``--token-ids``) gives an ``IdTokenizer``; a checkpoint without a tokenizer
    gets ``ByteTokenizer``. Without ``--model`` and without the bundled default, a seeded
    random LLaDA-like model stands in. ``mask_token_id`` (``--mask-token-id``) is
    ``load_model``'s, for checkpoints whose config does not give a usable one.
    """
    from dllm_decode.models.loading import ASSETS, build_model, load_model, resolve_path
    from dllm_decode.models.weights import MaskTokenIdError
    from dllm_decode.tokenizer import load_tokenizer

    if name is None and not (ASSETS / DEFAULT_MODEL).is_dir():
        cfg = {"model_type": "llada", "d_model": 64, "n_layers": 2, "n_heads": 4,
               "mlp_hidden_size": 128, "vocab_size": 260, "embedding_size": 260,
               "mask_token_id": 259, "eos_token_id": 258, "max_sequence_length": 1024}
        model = build_model(cfg, seed=seed, init_std=0.5)
        tok = IdTokenizer(260) if token_ids else ByteTokenizer(260)
        return model, tok, f"random LLaDA-like model (seed {seed})"
    name = name or DEFAULT_MODEL
    try:
        model = load_model(name, revision=revision, dtype=dtype, device=device,
                           mask_token_id=mask_token_id)
    except MaskTokenIdError as err:
        raise ValueError(f"{err}; on the command line: --mask-token-id ID (the mask id the "
                         f"checkpoint was made with), and --token-ids for a prompt of token "
                         f"ids when it has no tokenizer") from None
    if token_ids:
        return model, IdTokenizer(model.vocab_size), f"{name} (token ids)"
    path = resolve_path(name, revision=revision)
    if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
        return model, load_tokenizer(path), str(name)
    return model, ByteTokenizer(model.vocab_size), (f"{name} (no tokenizer: the prompt as "
                                                     "UTF-8 bytes; --token-ids for token ids)")


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Chat template when the tokenizer has one, else plain encoding."""
    from dllm_decode.text import encode_prompts

    ids, _ = encode_prompts(tokenizer, text)
    return ids[0].tolist()


def _policy_params(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"--param expects KEY=VALUE, got {pair!r} (e.g. --param tau=0.9, "
                             "--param stopper.tau_low=2.0)")
        for cast in (int, float):
            try:
                out[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            out[key] = {"true": True, "false": False, "none": None}.get(value.lower(), value)
    return out


def _reject_sampler_params(params: dict[str, Any]) -> None:
    """``--param`` keys that ``generate`` sets from its own flags are an error (with the flag);
    other ``SamplerConfig`` fields (``refresh_every``, ``causal_prefix``, ...) pass through."""
    flags = {"gen_length", "block_length", "steps", "temperature", "seed", "stop_at_eos",
             "cache"}
    clash = sorted(set(params) & flags)
    if clash:
        hints = ", ".join(f"--{k.replace('_', '-')} {params[k]}" for k in clash)
        raise ValueError(f"--param {clash} are sampler settings with their own flags, not "
                         f"policy parameters; use {hints}")


def cmd_generate(args: argparse.Namespace) -> int:
    from dllm_decode.policies.defaults import apply_family_default
    from dllm_decode.samplers.build import build_sampler
    from dllm_decode.text import generate_text, stop_token_ids, stream_text, testbed_gen_length

    if args.policy is not None:
        _check_policy_name(args.policy)
    params = _policy_params(args.param)
    _reject_sampler_params(params)
    model, tok, desc = load_model_and_tokenizer(args.model, args.seed, dtype=args.dtype,
                                                device=args.device, revision=args.revision,
                                                mask_token_id=args.mask_token_id,
                                                token_ids=args.token_ids)
    # None (not given) falls back; 0 or less goes on to SamplerConfig, which rejects it
    gen_length = (testbed_gen_length(tok) or 64) if args.gen_length is None else args.gen_length
    params.update(gen_length=gen_length, block_length=args.block_length, steps=args.steps,
                  temperature=args.temperature, seed=args.seed)
    if args.stop_at_eos:  # else the family default's (Fast-dLLM v2 stops at its EOS)
        params["stop_at_eos"] = True
    # no --policy: the model family's default preset, parameters and cache
    policy, params, cache = apply_family_default(model, args.policy, params, args.cache)
    sampler = build_sampler(model, policy, stopper=args.stopper, truncator=args.truncator,
                            cache=cache, params=params)
    on_step = None
    live = None
    if args.show:
        from dllm_decode.show import CanvasView

        live = CanvasView(tok, getattr(model, "mask_token_id", None),
                          len(encode_prompt(tok, args.prompt)))
        on_step = live.update
    start = time.perf_counter()
    if args.stream:  # deltas as they become final (text.stream_text), then the same line
        if args.show or args.plot:
            raise ValueError("--stream prints the text as it comes; use it without --show "
                             "and --plot")
        last = None
        for last in stream_text(sampler, tok, args.prompt):
            print(last.delta, end="", flush=True)
        print()
        elapsed = time.perf_counter() - start
        stops = stop_token_ids(tok, model)
        print(f"[{desc} | policy={sampler.policy.name} cache={sampler.config.cache.value}] "
              f"{speed_line(last.generation, stops, elapsed)}", file=sys.stderr)
        return 0
    with live if live is not None else _nullcontext():
        result = generate_text(sampler, tok, args.prompt, on_step=on_step)
    elapsed = time.perf_counter() - start
    out = result.generation
    print(result.texts[0])
    if args.plot:
        _plot(out, args.plot, tok, result.stop_token_ids)
    print(f"[{desc} | policy={sampler.policy.name} cache={sampler.config.cache.value}] "
          f"{speed_line(out, result.stop_token_ids, elapsed)}", file=sys.stderr)
    return 0


def cmd_serve_check(args: argparse.Namespace) -> int:
    """``serve-check``: resolve ``--dllm-algorithm-config`` as an SGLang server start does (the
    same one-line errors) and print what will run; no SGLang, no download, no weights."""
    from dllm_decode.integrations.sglang.check import plan_lines, plan_serving

    if args.block_size is not None and args.block_size < 1:
        raise ValueError(f"--block-size must be >= 1, got {args.block_size}")
    print("\n".join(plan_lines(plan_serving(args.config, args.model,
                                             block_size=args.block_size))))
    return 0


def _check_policy_name(name: str) -> None:
    if ":" not in name and name not in PRESETS and name != "default":
        close = difflib.get_close_matches(name, sorted(PRESETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown policy {name!r}{hint}; valid names: {sorted(PRESETS)}, or "
                         "an import path 'package.module:ClassName' / 'file.py:ClassName'")


def speed_line(generation: Any, stop_ids: Sequence[int], elapsed: float) -> str:
    """``NFE=.. tokens/forward=.. (..) tokens/step=.. (..) time=.. tokens/s=..`` of a one-row
    ``generation``: tokens per forward as ``dllm_decode.speed`` defines it, then the budget
    figure under its own name (it counts the EOS fill)."""
    from dllm_decode.speed import TPF_UNIT, generation_tpf, tokens_per_step

    tpf, useful = generation_tpf(generation, stop_ids)
    nfe, budget = int(generation.nfe[0]), int(generation.answer.shape[1])
    per_step = tokens_per_step([budget], [nfe])
    return (f"NFE={nfe} {TPF_UNIT}={tpf:.2f} ({useful[0]} answer tokens up to EOS / {nfe} "
            f"forward{'s' if nfe != 1 else ''}) tokens/step={per_step:.2f} (the "
            f"{budget}-token budget, EOS fill included) time={elapsed:.2f}s "
            f"tokens/s={useful[0] / max(elapsed, 1e-9):.1f}")


def _plot(generation: Any, path: str, tok: Any, stop_ids: Sequence[int]) -> None:
    try:
        from dllm_decode.plot import plot_decoding

        plot_decoding(generation, path, decode=tok.decode if hasattr(tok, "decode") else None,
                      stop_token_ids=stop_ids)
    except ImportError as err:
        raise ValueError(f"--plot needs matplotlib (pip install 'dllm-decode[eval]'): "
                         f"{err}") from None
    print(f"commit-order picture written to {path}", file=sys.stderr)


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def build_parser() -> argparse.ArgumentParser:
    # the module docstring without its RST markup (``dllm-decode`` -> dllm-decode)
    description = re.sub(r"`+([^`]*)`+", r"\1", __doc__ or "")
    parser = argparse.ArgumentParser(prog="dllm-decode", description=description)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt")
    gen.add_argument("prompt")
    gen.add_argument("--model", default=None,
                     help=f"checkpoint directory, Hub id (org/name) or bundled name "
                          f"(default: {DEFAULT_MODEL})")
    gen.add_argument("--revision", default=None, help="Hub branch, tag or commit")
    gen.add_argument("--dtype", default="auto",
                     choices=["auto", "float32", "bfloat16", "float16"],
                     help="auto: the checkpoint's torch_dtype (float32 if it has none)")
    gen.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    gen.add_argument("--mask-token-id", type=int, default=None, metavar="ID",
                     help="the mask id, for a checkpoint whose config gives none inside its "
                          "vocabulary (e.g. the reference-format tiny checkpoints)")
    gen.add_argument("--token-ids", action="store_true",
                     help="the prompt is token ids ('165 20 93') and the answer is printed as "
                          "ids up to its first EOS (checkpoints without a tokenizer)")
    gen.add_argument("--policy", default=None, metavar="NAME|MODULE:CLASS",
                     help=f"a preset ({', '.join(sorted(PRESETS))}) or a class by import "
                          "path, e.g. my_pkg.rules:TopTwo or examples/my_policy.py:ConfidentRuns "
                          "(default: the model family's preset, policies/defaults.py: "
                          "low_confidence for LLaDA, llada2 for LLaDA2, gemma_renoise for "
                          "DiffusionGemma, ...)")
    gen.add_argument("--stopper", default=None, metavar="NAME|MODULE:CLASS",
                     help=f"add a stopper: {', '.join(sorted(STOPPERS))} or an import path")
    gen.add_argument("--truncator", default=None, metavar="NAME|MODULE:CLASS",
                     help=f"add a truncator: {', '.join(sorted(TRUNCATORS))} or an import path")
    gen.add_argument("--cache", default=None,
                     choices=[m.value for m in CacheMode],
                     help="default: the family default's cache (no --policy), else the "
                          "policy's preferred cache, else none")
    gen.add_argument("--gen-length", type=int, default=None,
                     help="default: a test-bed checkpoint's answer length (16), else 64")
    gen.add_argument("--block-length", type=int, default=None)
    gen.add_argument("--steps", type=int, default=None)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--stop-at-eos", action="store_true")
    gen.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="parameter (repeatable): --param tau=0.8 for the policy (or a "
                          "SamplerConfig field), --param stopper.tau_low=2.0, "
                          "--param truncator.NAME=VALUE")
    gen.add_argument("--show", action="store_true", help="render the canvas filling in live")
    gen.add_argument("--stream", action="store_true",
                     help="print the answer as it becomes final, block by block "
                          "(stream_text)")
    gen.add_argument("--plot", default=None, metavar="PNG",
                     help="draw the commit order (positions x steps, tokens per step, cache "
                          "refreshes) to this PNG (needs matplotlib)")
    gen.set_defaults(func=cmd_generate)

    check = sub.add_parser(
        "serve-check", help="check an SGLang --dllm-algorithm-config YAML (no server)",
        description="Resolve POLICY.yaml exactly as `python -m sglang.launch_server ... "
                    "--dllm-algorithm DllmDecode --dllm-algorithm-config POLICY.yaml` does at "
                    "server start (same one-line errors, exit status 2) and print what will "
                    "run: policy, parameters, steps per block, stop tokens, per-request "
                    "memory, and what SGLang refuses per request. Runs on a CPU, with or "
                    "without SGLang; reads only the checkpoint's JSON files; never downloads.")
    check.add_argument("config", metavar="POLICY.yaml")
    check.add_argument("--model", required=True, metavar="PATH_OR_ID",
                       help="the checkpoint folder SGLang will serve (config.json, "
                            "generation_config.json, tokenizer files), a bundled name, or a "
                            "Hub id already in the local Hugging Face cache")
    check.add_argument("--block-size", type=int, default=None, metavar="K",
                       help="the dLLM block size (default: the YAML's block_size, else "
                            "SGLang's for the architecture)")
    check.set_defaults(func=cmd_serve_check)

    try:
        from dllm_decode.eval import add_eval_subcommands
    except ImportError:
        add_eval_subcommands = None
    if add_eval_subcommands is not None:
        add_eval_subcommands(sub)
    try:
        from dllm_decode.train import add_train_subcommands
    except ImportError:
        add_train_subcommands = None
    if add_train_subcommands is not None:
        add_train_subcommands(sub)
    from dllm_decode.doctor import add_doctor_subcommand

    add_doctor_subcommand(sub)
    try:
        from dllm_decode.bench import add_bench_subcommand
    except ImportError:
        add_bench_subcommand = None
    if add_bench_subcommand is not None:
        add_bench_subcommand(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(argv)
    except KeyboardInterrupt:  # commands that keep partial results say so themselves
        print("dllm-decode: interrupted", file=sys.stderr)
        return 130


def _run(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "train" and argv[1] in ("tiny", "testbed", "testbed-long",
                                                             "learn2pd", "convert"):
        from dllm_decode.train.cli import run_train  # trainer flags pass through untouched

        return run_train(argv[1], argv[2:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, DecodeContractError) as err:
        print(f"dllm-decode: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
