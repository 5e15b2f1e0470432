"""Learn2PD filter: the 2-layer MLP, its model fingerprint, safetensors save/load, and the
block features it reads (``filter_window``, ``block_features``).

Bao, Chen, Xu, Shang, arXiv 2509.25188. A filter is tied to a (model, block length, feature)
triple; loading checks the fingerprint and the block length and names every mismatch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dllm_decode.policies.rows import as_rows, per_row
from dllm_decode.types import StepState

#: feature names: LLaDA (prob at every block position) and Dream (neg-entropy, masked only)
FEATURES: Final = ("llada_prob_all", "dream_negent_masked")
#: the acceptance threshold of every evaluation script of the paper
DEFAULT_ACCEPT_THRES: Final = 0.96
#: sidecar format tag
FORMAT: Final = "dllm-decode/learn2pd-filter/v1"
#: activations the filter may use (the paper does not state which one it uses)
ACTIVATIONS: Final = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}
#: LM-head rows hashed into the model fingerprint (evenly spaced over the vocabulary)
HASH_ROWS: Final = 256
#: bundled checkpoints live here (read as files; policies never import the models package)
ASSETS: Final = Path(__file__).resolve().parent.parent / "models" / "assets"


class FilterMismatchError(ValueError):
    """A filter used with a model or block length it was not trained for."""


class L2PFilter(nn.Module):
    """``Linear(K, K) -> activation -> Linear(K, K)``: 2,112 parameters for K = 32.

    Args:
        block_length: K, input and output width.
        activation: one of ``ACTIVATIONS`` (default ``relu``; unconfirmed in the paper).
    """

    def __init__(self, block_length: int = 32, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, "
                             f"got {activation!r}")
        self.block_length = block_length
        self.activation = activation
        self.inp = nn.Linear(block_length, block_length)
        self.act = ACTIVATIONS[activation]()
        self.out = nn.Linear(block_length, block_length)

    def forward(self, features: Tensor) -> Tensor:
        """``[..., K]`` float features -> ``[..., K]`` acceptance logits."""
        return self.out(self.act(self.inp(features)))


@dataclass(frozen=True)
class ModelFingerprint:
    """What a filter must match: architecture numbers and a hash of the LM head.

    ``lm_head_sha256`` hashes ``HASH_ROWS`` evenly spaced rows of the output projection rounded
    to bfloat16, so the same weights loaded in float32 or bfloat16 match.
    """

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    lm_head_sha256: str
    mask_token_id: int
    eos_token_ids: tuple[int, ...]

    @classmethod
    def of(cls, model: Any) -> ModelFingerprint:
        """Fingerprint of any ``DiffusionLM`` (duck-typed; one host copy of the hashed rows)."""
        spec = getattr(model, "spec", None)
        config = getattr(model, "config", None)

        def number(*names: str) -> int:
            for src in (spec, config, model):
                for name in names:
                    value = getattr(src, name, None)
                    if isinstance(value, int):
                        return value
            return -1

        head = getattr(model, "head", None)
        if head is None and hasattr(model, "get_output_embeddings"):
            head = model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        digest = "none"
        if isinstance(weight, Tensor):
            w = weight.detach()
            rows = torch.linspace(0, w.shape[0] - 1, min(HASH_ROWS, w.shape[0]),
                                  device=w.device).round().long()
            sample = w[rows].to(torch.bfloat16).contiguous().view(torch.int16).cpu()
            h = hashlib.sha256(str(tuple(w.shape)).encode())
            h.update(sample.numpy().tobytes())
            digest = h.hexdigest()
        return cls(family=str(getattr(model, "family", type(model).__name__)),
                   vocab_size=number("vocab_size"),
                   hidden_size=number("hidden_size", "d_model"),
                   num_layers=number("num_layers", "num_hidden_layers", "n_layers"),
                   lm_head_sha256=digest, mask_token_id=int(model.mask_token_id),
                   eos_token_ids=tuple(int(e) for e in model.eos_token_ids))

    def differences(self, other: ModelFingerprint) -> list[str]:
        """Human-readable ``"field (filter X, model Y)"`` for every field that differs."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{k} (filter {mine[k]!r}, model {theirs[k]!r})" for k in mine
                if mine[k] != theirs[k]]


@dataclass(frozen=True)
class FilterCard:
    """The JSON sidecar of a saved filter."""

    block_length: int
    feature: str
    fingerprint: ModelFingerprint
    accept_threshold: float = DEFAULT_ACCEPT_THRES
    activation: str = "relu"
    model_name: str | None = None
    training: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> str:
        data = {"format": FORMAT, "paper": "arXiv 2509.25188", **asdict(self)}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> FilterCard:
        data = json.loads(text)
        if data.pop("format", None) != FORMAT:
            raise ValueError(f"not a Learn2PD filter sidecar (expected format {FORMAT!r})")
        data.pop("paper", None)
        fp = data.pop("fingerprint")
        fp["eos_token_ids"] = tuple(fp["eos_token_ids"])
        return cls(fingerprint=ModelFingerprint(**fp), **data)


class LoadedFilter(NamedTuple):
    module: L2PFilter
    card: FilterCard


def filter_filename(block_length: int) -> str:
    """Default file name of a filter for block length K (``learn2pd_k32.safetensors``)."""
    return f"learn2pd_k{block_length}.safetensors"


def save_filter(module: L2PFilter, card: FilterCard, path: str | Path) -> Path:
    """Write ``path`` (safetensors; a directory gets ``filter_filename(K)``) and its ``.json``."""
    path = Path(path)
    if path.suffix != ".safetensors":
        path = path / filter_filename(card.block_length)
    if module.block_length != card.block_length:
        raise ValueError(f"filter width {module.block_length} != card block_length "
                         f"{card.block_length}")
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})
    path.with_suffix(".json").write_text(card.to_json())
    return path


def load_filter(path: str | Path, *, model: Any = None,
                block_length: int | None = None) -> LoadedFilter:
    """Load a filter (``.safetensors``, its ``.json``, or a directory holding one).

    With ``model`` the fingerprint is checked, with ``block_length`` the width; a mismatch
    raises ``FilterMismatchError`` naming every differing field.
    """
    path = Path(path)
    if path.is_dir():
        names = ([filter_filename(block_length)] if block_length else
                 sorted(p.name for p in path.glob("learn2pd_k*.safetensors")))
        if not names or not (path / names[0]).is_file():
            raise FileNotFoundError(f"no Learn2PD filter ({names[0] if names else 'learn2pd_k*'}"
                                    f".safetensors) in {path}")
        path = path / names[0]
    card = FilterCard.from_json(path.with_suffix(".json").read_text())
    weights = load_file(str(path.with_suffix(".safetensors")))  # sized by the file itself
    k = card.block_length
    want = {"inp.weight": (k, k), "inp.bias": (k,), "out.weight": (k, k), "out.bias": (k,)}
    got = {name: tuple(t.shape) for name, t in weights.items()}
    if got != want:  # checked before the card's sizes allocate anything
        raise FilterMismatchError(f"{path}: the card's block_length {k} does not match the "
                                  f"weights {got}; the filter files are corrupt or mixed up")
    module = L2PFilter(card.block_length, card.activation)
    module.load_state_dict(weights)
    if block_length is not None and block_length != card.block_length:
        raise FilterMismatchError(f"block length {block_length} != the filter's "
                                  f"{card.block_length} ({path})")
    if model is not None:
        check_fingerprint(card, model, source=str(path))
    return LoadedFilter(module.eval(), card)


def check_fingerprint(card: FilterCard, model: Any, source: str = "filter") -> None:
    """Raise ``FilterMismatchError`` unless ``model`` matches the card's fingerprint."""
    diff = card.fingerprint.differences(ModelFingerprint.of(model))
    if diff:
        raise FilterMismatchError(
            f"{source} was trained for another model; mismatch in: {'; '.join(diff)}. Train one "
            f"for this model: dllm-decode train learn2pd --model DIR --block-length "
            f"{card.block_length}")


def find_bundled_filter(model: Any, block_length: int | None = None) -> LoadedFilter | None:
    """A filter shipped under ``models/assets/*/`` whose fingerprint matches ``model``."""
    if not ASSETS.is_dir():
        return None
    want = ModelFingerprint.of(model)
    pattern = f"learn2pd_k{block_length}.json" if block_length else "learn2pd_k*.json"
    for sidecar in sorted(ASSETS.glob(f"*/{pattern}")):
        card = FilterCard.from_json(sidecar.read_text())
        if card.fingerprint == want:
            return load_filter(sidecar.with_suffix(".safetensors"))
    return None


# ---- features ------------------------------------------------------------------------------
def model_device(model: Any) -> torch.device:
    """Device of the model's first parameter or buffer (CPU if it has none)."""
    for t in (*model.parameters(), *model.buffers()) if isinstance(model, nn.Module) else ():
        return t.device
    return torch.device("cpu")


def run_filter(module: Any, features: Tensor) -> Tensor:
    """Apply ``module`` on its own device/dtype; logits come back float32 on ``features``'.

    Sync-free when the module lives on the features' device (``bind`` / ``for_model`` move it).
    """
    params = getattr(module, "parameters", None)
    p = next(iter(params()), None) if params is not None else None
    if p is not None and (p.device != features.device or p.dtype != features.dtype):
        return module(features.to(p.device, p.dtype)).to(features.device, torch.float32)
    return module(features).float()


def filter_window(state: StepState, block_length: int) -> int:
    """Canvas index of the first of the K positions the filter sees (no host sync).

    The current block, or for a partial block of a block-diffusion model (first block starting
    inside the prompt, last block cut by the canvas end) its K-aligned span.
    """
    bs, be, k = state.block_start, state.block_end, block_length
    if be - bs == k:
        return bs
    if be - bs < k and bs == state.gen_start and be % k == 0:
        return be - k
    if be - bs < k and bs % k == 0 and be == state.canvas.shape[1]:
        return bs
    raise FilterMismatchError(
        f"block length {be - bs} != the Learn2PD filter's input width {k}; decode with "
        f"block_length={k} or train a filter for this block length (dllm-decode train "
        f"learn2pd --block-length {be - bs})")


def filter_windows(state: StepState, block_length: int) -> tuple[Tensor, Tensor]:
    """``filter_window`` per row, for per-row block starts (``Capabilities.row_steps``):
    ``(start [B] int64, valid [B] bool)``. A row whose block matches none of the windows
    (``filter_window`` raises there) is not valid: its filter accepts nothing. No host sync."""
    b, length = state.canvas.shape
    device = state.canvas.device
    bs = as_rows(state.block_start, b, device)
    gs = as_rows(state.gen_start, b, device)
    be, k = state.block_end, block_length
    short = (be - bs) < k
    own = bs == be - k  # the block is the window
    cut_first = short & (bs == gs) & (be % k == 0)  # a first block starting inside the prompt
    cut_last = short & (bs % k == 0) & (be == length)  # a last block cut by the canvas end
    start = torch.where(cut_first & ~own, be - k, bs)
    return start, own | cut_first | cut_last


def block_features(state: StepState, feature: str, block_length: int) -> tuple[Tensor,
                                                                                 int | Tensor]:
    """The filter input ``[B, K]`` float32 and the window start (see ``filter_window``; per-row
    block starts: ``[B]`` int64, zeros past the canvas as the shared form's padding)."""
    prop = state.proposal
    if feature == "llada_prob_all":
        full = prop.prob.float()
    elif feature == "dream_negent_masked":
        full = torch.where(state.masked, prop.neg_entropy.float(), 0.0)
    else:
        raise ValueError(f"feature must be one of {FEATURES}, got {feature!r}")
    if per_row(state.block_start) or per_row(state.gen_start):
        start = filter_windows(state, block_length)[0]
        at = start[:, None] + torch.arange(block_length, device=full.device)  # [B, K]
        inside = at < full.shape[1]
        feats = full.gather(1, at.clamp(max=full.shape[1] - 1))
        return torch.where(inside, feats, 0.0), start
    start = filter_window(state, block_length)
    pad = start + block_length - full.shape[1]
    if pad > 0:
        full = torch.nn.functional.pad(full, (0, pad))
    return full[:, start:start + block_length], start


# ---- the selector --------------------------------------------------------------------------
