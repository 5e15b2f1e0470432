"""Explicit, preallocated K/V cache and the per-mode compute plans."""

from dllm_decode.cache.kv import BlockKVCache

__all__ = ["BlockKVCache"]
