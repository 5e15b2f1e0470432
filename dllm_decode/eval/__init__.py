"""Evaluation: ParallelBench tasks and graders, sweep runner, metrics, analysis, lm-eval glue.

Heavy modules (runner, analyze, lm_eval) are imported lazily by the CLI.
"""

from dllm_decode.eval.cli import add_eval_subcommands

__all__ = ["add_eval_subcommands"]
