"""What differs between the SGLang versions ``DllmDecode`` supports: one small module each.

``compat.VERSIONS`` maps a supported ``sglang.__version__`` to its module here (``v0_5_23``).
A version module is the whole of what the adapter reads from SGLang besides the
``DllmAlgorithm`` base class and ``DllmConfig`` (whose names every supported version shares),
as three functions:

* ``step_logits(logits) -> Tensor``: the ``[B * K, V]`` float logits from what
  ``DllmAlgorithm.step`` receives (0.5.23 passes the tensor ``full_logits``; SGLang's main
  branch passes the ``LogitsProcessorOutput``, whose ``full_logits`` it is);
* ``server_model() -> compat.ServerModel | None``: what this process serves, read from
  SGLang's runtime context when the algorithm is built (in a tensor-parallel worker, right
  after its model runner: ``TpModelWorker._init_dllm_algorithm``); ``None`` when nothing is
  published in this process (an algorithm built by hand, as the tests do);
* ``tp_size() -> int``: the tensor-parallel width of this process (1 when nothing is
  published).

Supporting a new SGLang version is one module with these three functions and its line in
``compat.VERSIONS``. Nothing here imports SGLang at import time.
"""
