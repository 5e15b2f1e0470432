"""``dllm-decode train tiny ...``, ``train testbed ...`` and ``train learn2pd ...``."""

from __future__ import annotations

import argparse
from typing import Any


def run_train(kind: str, argv: list[str]) -> int:
    """Dispatch ``train <kind> ARGS`` (ARGS, including ``--help``, go to the trainer)."""
    if kind == "tiny":
        from dllm_decode.train.trainer import train_tiny_main

        return int(train_tiny_main(argv) or 0)
    if kind == "learn2pd":
        from dllm_decode.train.learn2pd_cli import train_learn2pd_main

        return int(train_learn2pd_main(argv) or 0)
    if kind == "testbed":
        from dllm_decode.train.distill import distill_main

        return int(distill_main(argv) or 0)
    raise ValueError(f"unknown training kind {kind!r}; valid: tiny, testbed, learn2pd")


def _tiny(args: argparse.Namespace) -> int:
    return run_train("tiny", args.rest)


def _learn2pd(args: argparse.Namespace) -> int:
    return run_train("learn2pd", args.rest)


def _testbed(args: argparse.Namespace) -> int:
    return run_train("testbed", args.rest)


def add_train_subcommands(sub: Any) -> None:
    """Add ``train {tiny, testbed, learn2pd}``; each passes the rest to its trainer."""
    train = sub.add_parser("train", help="train a tiny checkpoint or a Learn2PD filter")
    kinds = train.add_subparsers(dest="train_kind", required=True)
    for name, func, text in (
        ("tiny", _tiny, "masked-diffusion training of a tiny LLaDA / Dream / SDAR model"),
        ("testbed", _testbed, "distil the exact Waiting Line oracle into a word-level model"),
        ("learn2pd", _learn2pd, "EGP trajectories + Learn2PD filter training"),
    ):
        p = kinds.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=func)
