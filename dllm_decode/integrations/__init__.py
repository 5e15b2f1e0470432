"""Adapters that run the library's decoding policies inside serving engines.

``integrations.sglang``: any policy as SGLang's ``--dllm-algorithm DllmDecode``. This layer sits
on top of the policies and the decode step; nothing in the core imports it.
"""
