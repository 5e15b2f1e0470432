"""On-policy rows for the DiffusionGemma student: canvases its own re-noising sampler visits.

I.i.d. uniform corruption (``train/uniform_objective.py``) shows the student canvases whose
every non-noise position holds the clean answer. The re-noising sampler (``gemma_renoise``,
``samplers/uniform.py``) feeds it something else: the positions it accepted hold the
student's own *samples*, drawn position by position, so two slots can hold the same name (a
collision no clean answer and almost no noise draw makes), and every other position is fresh
uniform noise. These rows put such canvases into training (an option, off by default).

Measured on the test bed (``train/README.md``, "The bundled ``testbed-gemma``"): they are
not what the student was missing. A branch with half of its rows on-policy and a branch
without, both 3,750 steps from the same step-1,000 state, decode the random tasks alike (50
held-out prompts, two draws), and the branch without them already fits its own sampler's
canvases better than i.i.d. ones (KL 0.03 against 0.05-0.07). The bundled ``testbed-gemma`` was
trained with them.

``Rollouts`` replaces ``--onpolicy-frac`` of each batch's rows by canvases read off the
student's own ``gemma_renoise`` decode (``16 / --onpolicy-k`` denoising steps, no early stop)
of training prompts; the targets are the exact posterior of the clean answer given that canvas
(``noisy_posterior``, the corruption level unknown), what the exact ``UniformOracle`` answers on
the same canvas, so the student learns the oracle's answer where its own decode goes (DAgger:
S. Ross, G. Gordon, D. Bagnell, "A Reduction of Imitation Learning and Structured Prediction to
No-Regret Online Learning", AISTATS 2011).

A rollout costs ``16 / k`` decoder forwards, so one rollout of ``--batch-size`` prompts serves
``--rollout-every`` steps (25): every step draws its rows from the canvases of the last rollout
(made at the last step that is a multiple of ``--rollout-every``, by the model of that step).
Rollout prompts, sampler seeds and the draws are functions of ``(seed, step)``, and
``--ckpt-every`` must be a multiple of ``--rollout-every``, so a resumed run continues exactly.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import Tensor

from dllm_decode.models.oracle import WaitingLineOracle
from dllm_decode.train.distill_config import DistillConfig
from dllm_decode.train.onpolicy import eval_mode
from dllm_decode.train.testbed import TESTBED_GEN_LENGTH, draw_training_examples

#: added to the seed: rollout prompts and sampler seeds are independent of the batch's draws
ROLLOUT_SALT = 0x0B0C


class Rollouts:
    """The canvases of the student's last rollout, and draws from them (see the module)."""

    def __init__(self) -> None:
        self.step = -1
        self.prompts: list[list[int]] = []
        self.tables: list[Tensor] = []
        self.canvases = torch.zeros(0, 0, TESTBED_GEN_LENGTH, dtype=torch.long)  # [S, B, G]

    def refresh(self, model: Any, cfg: DistillConfig, oracle: WaitingLineOracle,
                step: int) -> None:
        """Roll out the student if ``step`` starts a new rollout period (else nothing)."""
        at = step - step % cfg.rollout_every
        if at == self.step:
            return
        from dllm_decode.eval.runner import left_pad
        from dllm_decode.samplers.sampler import DiffusionSampler

        g = TESTBED_GEN_LENGTH
        examples = draw_training_examples(cfg.seed + ROLLOUT_SALT, at, cfg.batch_size,
                                          cfg.task_weights())
        self.prompts = [oracle.encode_prompt(task, rec) for task, rec in examples]
        self.tables = [oracle.answer_table(p, g) for p in self.prompts]
        ids, attn = left_pad(self.prompts, oracle.pad_token_id)
        seen: list[Tensor] = []
        sampler = DiffusionSampler(model, "gemma_renoise", gen_length=g,
                                   steps=max(1, g // cfg.onpolicy_k), early_stop=False)
        with eval_mode(model):
            sampler.generate(ids, attn, seed=(cfg.seed << 32) + at + ROLLOUT_SALT,
                             on_step=lambda state, _: seen.append(state.canvas[:, -g:]))
        # clone outside inference mode: the canvases are training inputs
        self.canvases = torch.stack([c.clone() for c in seen])  # [S, B, G]
        self.step = at

    def draw(self, n: int, cfg: DistillConfig, step: int
             ) -> tuple[list[list[int]], list[Tensor], Tensor]:
        """``n`` rollout states (a row and one of its steps each, without repeats):
        ``(prompts, answer tables [n_i, G], canvases [n, G])``."""
        s, b, _ = self.canvases.shape
        rng = random.Random(f"{cfg.seed}:{step}:onpolicy")
        picks = rng.sample(range(s * b), min(n, s * b))  # step-major: pick = step * B + row
        rows = [p % b for p in picks]
        canvases = self.canvases.flatten(0, 1)[picks]
        return [self.prompts[r] for r in rows], [self.tables[r] for r in rows], canvases
