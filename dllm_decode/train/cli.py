"""``dllm-decode train tiny ...``, ``train testbed ...``, ``train learn2pd ...`` and
``train convert CHECKPOINT`` (a trusted pickle ``checkpoint.pt`` -> ``checkpoint.safetensors``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def run_train(kind: str, argv: list[str]) -> int:
    """Dispatch ``train <kind> ARGS`` (ARGS, including ``--help``, go to the trainer); a bad
    checkpoint or run directory is one ``dllm-decode: error:`` line and exit code 2."""
    from dllm_decode.train.state import LegacyCheckpointError, StateFormatError

    try:
        return _dispatch(kind, argv)
    except (LegacyCheckpointError, StateFormatError, FileExistsError, FileNotFoundError) as err:
        print(f"dllm-decode: error: {err}", file=sys.stderr)
        return 2


def _dispatch(kind: str, argv: list[str]) -> int:
    if kind == "tiny":
        from dllm_decode.train.trainer import train_tiny_main

        return int(train_tiny_main(argv) or 0)
    if kind == "learn2pd":
        from dllm_decode.train.learn2pd_cli import train_learn2pd_main

        return int(train_learn2pd_main(argv) or 0)
    if kind == "testbed":
        from dllm_decode.train.distill import distill_main

        return int(distill_main(argv) or 0)
    if kind == "testbed-long":
        from dllm_decode.train.testbed_long import train_long_main

        return int(train_long_main(argv) or 0)
    if kind == "convert":
        return convert_main(argv)
    raise ValueError(f"unknown training kind {kind!r}; valid: tiny, testbed, testbed-long, "
                     "learn2pd, convert")


def convert_main(argv: list[str]) -> int:
    """``dllm-decode train convert CHECKPOINT [--out PATH]``: rewrite a trusted pickle
    checkpoint of an older version as a training state (``train.state.convert_legacy``)."""
    from dllm_decode.train.state import convert_legacy

    parser = argparse.ArgumentParser(
        prog="dllm-decode train convert",
        description="Rewrite a checkpoint.pt (torch.save pickle) that you trust as "
                    "checkpoint.safetensors, the format --resume and --grow-from read. The file "
                    "is read with torch.load(weights_only=True): tensors and plain values only.")
    parser.add_argument("checkpoint", help="the .pt file (e.g. runs/x/checkpoint.pt)")
    parser.add_argument("--out", default=None,
                        help="output path (default: checkpoint.safetensors beside it, or the "
                             "same name with .safetensors)")
    args = parser.parse_args(argv)
    out = convert_legacy(args.checkpoint, args.out)
    print(f"wrote {out}")
    return 0


def _tiny(args: argparse.Namespace) -> int:
    return run_train("tiny", args.rest)


def _learn2pd(args: argparse.Namespace) -> int:
    return run_train("learn2pd", args.rest)


def _testbed(args: argparse.Namespace) -> int:
    return run_train("testbed", args.rest)


def _convert(args: argparse.Namespace) -> int:
    return run_train("convert", args.rest)


def add_train_subcommands(sub: Any) -> None:
    """Add ``train {tiny, testbed, learn2pd, convert}``; each passes the rest on."""
    train = sub.add_parser("train", help="train a tiny checkpoint or a Learn2PD filter")
    kinds = train.add_subparsers(dest="train_kind", required=True)
    for name, func, text in (
        ("tiny", _tiny, "masked-diffusion training of a tiny LLaDA / Dream / SDAR model"),
        ("testbed", _testbed, "distil the exact Waiting Line oracle into a word-level model"),
        ("learn2pd", _learn2pd, "EGP trajectories + Learn2PD filter training"),
        ("convert", _convert, "rewrite a trusted old checkpoint.pt as checkpoint.safetensors"),
    ):
        p = kinds.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=func)
