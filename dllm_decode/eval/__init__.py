"""Evaluation: ParallelBench tasks and graders, sweep runner, metrics, analysis, lm-eval glue."""
