"""A decoding policy in twenty lines (the README's "Write your own policy" example).

    python examples/my_policy.py            # decode one prompt, compose, check, plot
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


def main() -> None:
    from dllm_decode import DiffusionSampler, Policy, check_policy, load_model
    from dllm_decode.cli import encode_prompt
    from dllm_decode.policies import EoTP, SchED
    from dllm_decode.tokenizer import load_tokenizer

    model, tok = load_model("tiny-llada"), load_tokenizer()
    prompt = torch.tensor([encode_prompt(tok, PROMPT)])
    out = DiffusionSampler(model, ConfidentRuns(tau=0.7)).generate(prompt, gen_length=32)
    print(tok.decode(out.answer[0].tolist()), "NFE", out.nfe.tolist())
    composed = Policy(ConfidentRuns(), stopper=SchED(), truncator=EoTP())
    out = DiffusionSampler(model, composed, cache="dual").generate(prompt, gen_length=32,
                                                                   block_length=8)
    print("composed: NFE", out.nfe.tolist(), "length", out.lengths.tolist())
    print(check_policy(ConfidentRuns(), model, prompt.repeat(2, 1), gen_length=32))
    try:
        from dllm_decode import plot_decoding

        plot_decoding(out, "confident_runs.png", decode=tok.decode)
        print("wrote confident_runs.png")
    except ImportError:
        print("pip install 'dllm-decode[eval]' for the picture")


if __name__ == "__main__":
    main()
