"""lm-evaluation-harness task pack for ParallelBench (YAML + ``utils`` loaders)."""
