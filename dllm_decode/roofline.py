"""Roofline projection of per-forward cost on a GPU (an *estimate*, never a measurement).

Model (kernels.md §2.4): each forward costs the max of weight streaming and GEMM compute for
the linear layers, the same for the LM head over the scored rows, the K/V read and attention
FLOPs, a per-token activation term, and an fp32 vocabulary epilogue over the scored rows.
Efficiencies: 80% of HBM bandwidth, 70% of dense bf16 peak for GEMMs, 50% for attention.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @property
    def linear_params(self) -> float:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return float(self.layers * (attn + 3 * self.hidden * self.intermediate))

    @property
    def head_params(self) -> float:
        return float(self.hidden * self.vocab)

    @property
    def kv_bytes_per_token(self) -> float:
        return float(self.layers * 2 * self.kv_heads * self.head_dim * 2)  # bf16


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float  # bytes/s
    peak: float  # dense bf16 FLOP/s
    bw_eff: float = 0.8
    gemm_eff: float = 0.7
    attn_eff: float = 0.5
    act_s_per_token: float = 2.93e-6  # activations/norms/RoPE per query token (kernels.md fit)


LLADA_8B = Arch("LLaDA-8B", 32, 4096, 32, 32, 128, 12288, 126464)
DREAM_7B = Arch("Dream-7B", 28, 3584, 28, 4, 128, 18944, 152064)
H100_SXM = Hardware("H100-SXM", 3.35e12, 989e12)


def forward_seconds(arch: Arch, hw: Hardware, batch: int, q_len: int, k_len: int,
                    logit_rows: int) -> dict[str, float]:
    """Projected seconds of one forward: ``q_len`` query rows per sequence attending to
    ``k_len`` keys, logits for ``logit_rows`` rows per sequence."""
    bw = hw.bandwidth * hw.bw_eff
    tokens = batch * q_len
    rows = batch * logit_rows
    linear = max(2 * arch.linear_params / bw, 2 * arch.linear_params * tokens /
                 (hw.peak * hw.gemm_eff))
    head = max(2 * arch.head_params / bw, 2 * arch.head_params * rows / (hw.peak * hw.gemm_eff))
    attn_flops = 4.0 * batch * q_len * k_len * arch.heads * arch.head_dim * arch.layers
    attn = max(batch * k_len * arch.kv_bytes_per_token / bw, attn_flops / (hw.peak * hw.attn_eff))
    act = tokens * hw.act_s_per_token
    epilogue = rows * arch.vocab * 4 * 3 / bw
    parts = dict(linear=linear, head=head, attention=attn, activations=act, epilogue=epilogue)
    parts["total"] = sum(parts.values())
    return parts


def generation_seconds(arch: Arch, hw: Hardware, *, batch: int, prompt: int, gen: int,
                       block: int, steps_per_block: int, cache: str) -> float:
    """Projected seconds for a whole generation with a fixed step count per block."""
    total = prompt + gen
    seconds = 0.0
    for b in range(gen // block):
        start = prompt + b * block
        for step in range(steps_per_block):
            if cache == "none" or step == 0:
                q, rows = total, block
            elif cache == "prefix":
                q, rows = total - start, block
            elif cache == "dual":
                q, rows = block, block
            else:
                raise ValueError(f"cache must be none/prefix/dual, got {cache!r}")
            seconds += forward_seconds(arch, hw, batch, q, total, rows)["total"]
    return seconds
