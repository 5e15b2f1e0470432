"""A decoding policy in twenty lines (the README's "Write your own policy" example).

    python examples/my_policy.py            # decode, compose, check, plot to runs/
    dllm-decode generate PROMPT --policy examples/my_policy.py:ConfidentRuns --param tau=0.7
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_decode import Capabilities, StepState


@dataclass(frozen=True)
class ConfidentRuns:
    """Decode left to right in runs: commit the leftmost eligible position and every
    confident one (prob >= tau) after it, up to the first masked position that is not."""

    tau: float = 0.7
    capabilities = Capabilities(budgeted=False)  # adaptive: the number per step varies

    def select(self, state: StepState) -> torch.Tensor:
        eligible, prob = state.eligible, state.proposal.prob  # [B, L] each
        first = eligible & (eligible.long().cumsum(1) == 1)  # leftmost eligible position
        sure = first | (eligible & (prob >= self.tau))
        hole = (state.masked & ~sure).long().cumsum(1) > 0  # a masked gap at or before
        return first | (sure & ~hole)


PROMPT = (
    "You are managing a waiting line at a customer service desk.\n"
    "You need to record the following people in the order they arrived:\n"
    '["Maya Doyle", "Ivan Bennett", "Pedro Lindqvist"]\n'
    "Please copy the list exactly and provide only the final list.\n"
)


def main(out_dir: str = "runs") -> None:
    """Decode, compose, check and draw (the picture goes to ``out_dir``, default ``runs/``:
    git ignores it at the repository root)."""
    from dllm_decode import (
        DiffusionSampler,
        Policy,
        check_policy,
        generate_text,
        load_model,
        load_tokenizer,
    )
    from dllm_decode.policies import EoTP, SchED

    model, tok = load_model("tiny-llada"), load_tokenizer("tiny-llada")
    out = generate_text(DiffusionSampler(model, ConfidentRuns(tau=0.7), gen_length=32), tok,
                        PROMPT)
    print(out.texts[0], "NFE", int(out.generation.nfe[0]))
    composed = Policy(ConfidentRuns(), stopper=SchED(), truncator=EoTP())
    sampler = DiffusionSampler(model, composed, cache="dual", gen_length=32, block_length=8)
    both = generate_text(sampler, tok, PROMPT)
    print(both.texts[0], "NFE", int(both.generation.nfe[0]), "length",
          int(both.generation.lengths[0]))
    print(check_policy(ConfidentRuns(), model, out.prompt_ids.repeat(2, 1), gen_length=32))
    try:
        from dllm_decode import plot_decoding
    except ImportError:
        print("pip install 'dllm-decode[eval]' for the picture")
        return
    from pathlib import Path

    path = Path(out_dir) / "confident_runs.png"
    plot_decoding(both.generation, path, decode=tok.decode)
    print(f"wrote {path}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs", help="folder for the picture (default: runs)")
    main(parser.parse_args().out)
