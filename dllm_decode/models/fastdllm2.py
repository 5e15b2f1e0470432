"""Fast-dLLM v2 (NVlabs ``Efficient-Large-Model/Fast_dLLM_v2_7B``; ``Fast_dLLM_QwenForCausalLM``).

Wu et al., "Fast-dLLM v2: Efficient Block-Diffusion LLM", arXiv 2509.26328. Qwen2.5 turned
into a block-diffusion model: the Qwen2 layout and tensor names (q/k/v biases, GQA, SwiGLU,
untied head), attention **block-causal over the whole canvas, the prompt included**
(``q // bd_size >= k // bd_size`` on absolute positions; reference: the Hugging Face
``modeling.py``), and Dream-style **shifted prediction**: the output at position ``i - 1``
predicts token ``i``, undone here (``logit_shift = 1``) so ``logits[:, i]`` predicts
``tokens[:, i]``. ``block_size`` = the config's ``bd_size`` (32 released).

``tie_word_embeddings`` (a tied Qwen2.5 base, e.g. the 1.5B) is supported: the checkpoint has no
``lm_head.weight`` and the head is the embedding.

Mask id: the config's ``mask_token_id`` if it has one, else the released tokenizer's
``|<MASK>|`` 151665 (the reference decoder's default). Stop token: the config's
``eos_token_id`` (``<|im_end|>`` 151645 released).
"""

from __future__ import annotations

from typing import Any

from dllm_decode.models.base import ModelSpec
from dllm_decode.models.block import BlockDiffusionModel
from dllm_decode.models.dream import qwen_config, qwen_spec
from dllm_decode.models.moe_decoder import token_ids

#: the mask id of the released Fast-dLLM v2 tokenizer (``generation_functions.py`` default)
RELEASED_MASK_ID = 151665
#: the released ``bd_size``
DEFAULT_BLOCK = 32


class FastDLLMv2Model(BlockDiffusionModel):
    """Qwen2 names, block-causal attention, shifted logits (see the module docstring)."""


def fastdllm2_spec(cfg: dict[str, Any]) -> ModelSpec:
    """ModelSpec from a Fast-dLLM v2 ``config.json`` dict (release field names)."""
    if cfg.get("use_sliding_window"):
        raise ValueError("Fast-dLLM v2 use_sliding_window=true is not supported")
    if cfg.get("rope_scaling"):
        raise ValueError(f"Fast-dLLM v2 rope_scaling {cfg['rope_scaling']!r} is not supported")
    ids = token_ids(cfg, "Fast-dLLM v2", RELEASED_MASK_ID)
    tied = bool(cfg.get("tie_word_embeddings"))
    return qwen_spec({**cfg, "mask_token_id": ids["mask_token_id"], "tie_word_embeddings": False},
                     "fast_dllm_qwen", qkv_bias=True, attention="block_causal",
                     block_size=int(cfg.get("bd_size") or DEFAULT_BLOCK), logit_shift=1,
                     extra={"tie_word_embeddings": True} if tied else {})


def fastdllm2_config(spec: ModelSpec) -> dict[str, Any]:
    """A release-style Fast-dLLM v2 ``config.json`` dict for ``spec``."""
    cfg = qwen_config(spec, "Fast_dLLM_Qwen", "Fast_dLLM_QwenForCausalLM")
    cfg.update(bd_size=spec.block_size, use_sliding_window=False, rope_scaling=None,
               layer_types=["full_attention"] * spec.num_layers,
               tie_word_embeddings=bool(spec.extra.get("tie_word_embeddings")))
    return cfg
