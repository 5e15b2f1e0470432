"""Mixture-of-experts feed-forward blocks: routers, a readable per-expert reference and a
grouped path.

Three router conventions are implemented, each as its reference does it (router logits from
the fp32-cast hidden state and gate weight, or in the model dtype for Qwen3-MoE; scores in
fp32):

* ``sigmoid`` with group-limited top-k (LLaDA2 / Ling-2.0 ``BailingMoeV2``, after
  DeepSeek-V3): scores ``sigmoid(logits)``; ``expert_bias`` is added **for selection only**;
  experts are split into ``n_group`` groups, a group scores the sum of its top-2 biased
  scores, the top ``topk_group`` groups stay, top-k experts among them; combine weights are the
  un-biased scores of the chosen experts ``/ (sum + 1e-20)`` (``norm_topk_prob``) times
  ``routed_scaling_factor``.
* ``softmax`` without renormalisation (LLaDA-MoE, OLMoE): softmax over all experts, top-k, the
  chosen probabilities are the combine weights as they are.
* ``softmax`` with renormalisation (Qwen3-MoE / SDAR-MoE, ``norm_topk_prob``): the chosen
  probabilities divided by their sum.

Experts are stored stacked: ``gate_proj``, ``up_proj`` ``[E, I, H]`` and ``down_proj``
``[E, H, I]`` (the checkpoints store them per expert; the loader fills one slice per tensor).
``impl="reference"`` loops over experts (the oracle, readable); ``impl="grouped"`` sorts the
token-expert assignments by expert and runs three grouped GEMMs (``torch._grouped_mm``) that
read only the selected experts' weights: a fixed number of kernels per layer, whatever the
number of experts or tokens, and no host synchronisation. Where ``torch._grouped_mm`` cannot
run (older torch, float64, sizes whose rows are not 16-byte aligned) the grouped path gathers
each assignment's expert weights and runs batched GEMMs instead (still only selected experts,
still a bounded number of kernels, but memory ``3 * A * I * H`` for ``A`` token-expert
assignments: meant for small models and short spans). The two paths agree to float
rounding (``tests/test_moe.py``: atol 1e-5 in fp32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MoEImpl = Literal["reference", "grouped"]


@dataclass(frozen=True)
class MoESpec:
    """Routing and expert sizes of one family's sparse MLP (read from its config.json)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    score: Literal["sigmoid", "softmax"]
    norm_topk_prob: bool
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    expert_bias: bool = False
    shared_intermediate_size: int | None = None
    #: router logits from the fp32-cast input and gate weight (LLaDA2, LLaDA-MoE); False: in
    #: the model's dtype, then scored in fp32 (Qwen3-MoE / SDAR-MoE)
    fp32_logits: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.top_k} must be in [1, num_experts "
                             f"{self.num_experts}]")
        if self.score not in ("sigmoid", "softmax"):
            raise ValueError(f"router score function {self.score!r}: 'sigmoid' or 'softmax'")
        if self.n_group < 1 or self.num_experts % self.n_group:
            raise ValueError(f"num_experts {self.num_experts} must split into n_group "
                             f"{self.n_group} equal groups")
        per_group = self.num_experts // self.n_group
        if self.n_group > 1 and (per_group < 2 or not 1 <= self.topk_group <= self.n_group
                                 or self.top_k > self.topk_group * per_group):
            raise ValueError(f"group-limited routing needs >= 2 experts per group and top_k "
                             f"{self.top_k} <= topk_group {self.topk_group} x {per_group}")


def route(logits: Tensor, spec: MoESpec, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Router logits ``[T, E]`` (fp32) -> expert ids ``[T, k]`` (long) and fp32 combine
    weights ``[T, k]``, following ``spec`` (see the module docstring)."""
    logits = logits.float()
    if spec.score == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        scores = torch.softmax(logits, dim=-1)
    choice = scores if bias is None else scores + bias.float()
    if spec.n_group > 1:
        t = choice.shape[0]
        groups = choice.view(t, spec.n_group, -1)
        group_score = groups.topk(2, dim=-1).values.sum(-1)  # [T, G]
        keep = group_score.topk(spec.topk_group, dim=-1, sorted=False).indices
        group_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
        expert_mask = group_mask[:, :, None].expand_as(groups).reshape(t, -1)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    idx = choice.topk(spec.top_k, dim=-1).indices
    weight = scores.gather(1, idx)
    if spec.norm_topk_prob and spec.top_k > 1:
        weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
    return idx, weight * spec.routed_scaling_factor


class DenseMLP(nn.Module):
    """Gated MLP ``down(act(gate(x)) * up(x))``: SwiGLU (``act = silu``, dense layers and
    shared experts) unless ``act`` says otherwise (DiffusionGemma's GeGLU). ``x [..., H]``."""

    def __init__(self, hidden: int, intermediate: int,
                 act: Callable[[Tensor], Tensor] = F.silu) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """``E`` SwiGLU experts, weights stacked: gate/up ``[E, I, H]``, down ``[E, H, I]``."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate, hidden))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def reference(self, x: Tensor, idx: Tensor, weight: Tensor) -> Tensor:
        """The oracle: a Python loop over experts. x ``[T, H]``, idx / weight ``[T, k]``
        -> ``[T, H]``: ``sum_j weight[t, j] * expert_{idx[t, j]}(x[t])``."""
        out = torch.zeros_like(x)
        for e in range(self.gate_proj.shape[0]):
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            h = x[rows]
            y = F.linear(F.silu(F.linear(h, self.gate_proj[e])) * F.linear(h, self.up_proj[e]),
                         self.down_proj[e])
            out.index_add_(0, rows, y * weight[rows, slot, None].to(y.dtype))
        return out

    def grouped(self, x: Tensor, idx: Tensor, weight: Tensor) -> Tensor:
        """Same result as ``reference`` with a bounded number of kernels (see the module
        docstring). x ``[T, H]``, idx / weight ``[T, k]`` -> ``[T, H]``."""
        t, k = idx.shape
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)  # assignments grouped by expert
        expert = flat[order]
        token = order // k
        h = x.index_select(0, token)  # [A, H]
        if _grouped_mm_ok(x, self.gate_proj):
            offs = expert_offsets(flat, self.gate_proj.shape[0])
            gate = torch._grouped_mm(h, self.gate_proj.transpose(1, 2), offs=offs)
            up = torch._grouped_mm(h, self.up_proj.transpose(1, 2), offs=offs)
            y = torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(1, 2), offs=offs)
        else:
            hb = h[:, None, :]
            gate = torch.bmm(hb, self.gate_proj.index_select(0, expert).transpose(1, 2))
            up = torch.bmm(hb, self.up_proj.index_select(0, expert).transpose(1, 2))
            y = torch.bmm(F.silu(gate) * up, self.down_proj.index_select(0, expert)
                          .transpose(1, 2))[:, 0]
        w = weight.reshape(-1).index_select(0, order).to(y.dtype)
        return torch.zeros_like(x).index_add_(0, token, y * w[:, None])

    def forward(self, x: Tensor, idx: Tensor, weight: Tensor,
                impl: MoEImpl = "grouped") -> Tensor:
        if impl == "reference":
            return self.reference(x, idx, weight)
        if impl == "grouped":
            return self.grouped(x, idx, weight)
        raise ValueError(f"moe impl {impl!r}: use 'grouped' or 'reference'")


def expert_offsets(ids: Tensor, num_experts: int) -> Tensor:
    """``ids [A]`` expert ids -> ``[num_experts]`` int32 end offsets of each expert's group in
    the ids sorted by expert (the ``offs`` of ``grouped_mm``). Counted with ``scatter_add_``,
    not ``bincount`` (which syncs with the host on CUDA to size its output): no host sync."""
    counts = torch.zeros(num_experts, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
    return counts.cumsum(0, dtype=torch.int32)


def _grouped_mm_ok(x: Tensor, w: Tensor) -> bool:
    """``torch._grouped_mm`` exists and takes these operands: fp32 / bf16 / fp16 on CPU or CUDA
    (bf16 only under ``torch.compile``), 16-byte aligned rows. (On CUDA torch runs its CUTLASS
    kernel for bf16 on compute capability >= 9 and its own per-group fallback elsewhere.)"""
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype:
        return False
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if torch.compiler.is_compiling() and x.dtype is not torch.bfloat16:
        return False  # its meta (fake-tensor) kernel accepts bf16 only
    if any(s * x.element_size() % 16 for s in w.shape[1:]):
        return False
    return x.device.type in ("cpu", "cuda")


class Router(nn.Module):
    """The gate: ``weight [E, H]`` and, if the family has it, ``expert_bias [E]`` (an fp32
    buffer, used for selection only)."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.num_experts, hidden))
        if spec.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(spec.num_experts))
        else:
            self.expert_bias = None

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Router:
        """``.to(dtype)`` / ``.half()`` leave the expert bias in fp32 (it is added to fp32
        scores; a bf16 bias would reorder near-tied experts)."""
        super()._apply(fn, recurse)
        if self.expert_bias is not None and self.expert_bias.dtype != torch.float32:
            self.expert_bias = self.expert_bias.float()
        return self

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x ``[T, H]`` -> (ids ``[T, k]``, fp32 weights ``[T, k]``); logits in fp32."""
        if self.spec.fp32_logits:
            logits = F.linear(x.float(), self.weight.float())
        else:
            logits = F.linear(x, self.weight)
        return route(logits, self.spec, self.expert_bias)


class SparseMoE(nn.Module):
    """Router + experts (+ a shared expert on the same input, added)."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.gate = Router(hidden, spec)
        self.experts = Experts(spec.num_experts, hidden, spec.intermediate_size)
        self.shared = (DenseMLP(hidden, spec.shared_intermediate_size)
                       if spec.shared_intermediate_size else None)

    def forward(self, x: Tensor, impl: MoEImpl = "grouped") -> Tensor:
        """x ``[B, N, H]`` -> ``[B, N, H]``."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        idx, weight = self.gate(flat)
        y = self.experts(flat, idx, weight, impl).reshape(shape)
        if self.shared is not None:
            y = y + self.shared(x)
        return y
