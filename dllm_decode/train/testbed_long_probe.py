"""What a long-answer student has learned of shuffle (Test bed III), on held-out prompts.

Shuffle's exact posterior at an open name slot is uniform over the prompt's names that the
answer has not written yet. A student learns it in two parts, the second far later (measured
in ``docs/testbeds.md``, Test bed III): which names the prompt holds, then which of them the
answer already holds. ``shuffle_probe`` measures both on the canvases the decoder meets
(semi-autoregressive: earlier blocks written, the current block partly written, later blocks
masked, so the bidirectional and the block-causal student see the same thing):

* ``open_mass``: mass on the names still open (exact: 1);
* ``written_mass``: mass on names the answer has already written (exact: 0);
* ``argmax_open``: share of open name slots whose most likely token is an open name;
* ``uniform_written_mass``: what ``written_mass`` would be if the mass were uniform over
  the prompt's names, written or not (the no-exclusion reference).

Averages are over open name slots. ``python -m dllm_decode.train.testbed_long_probe RUN``
prints them for a run's current state (or an exported checkpoint directory) as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from dllm_decode.eval.parallelbench.testbed_long import long_records
from dllm_decode.models.base import DecoderLM
from dllm_decode.models.long_answer import MASK, LongCodec, long_codec_for


@torch.no_grad()
def shuffle_probe(model: DecoderLM, codec: LongCodec, *, lists: tuple[int, int] = (4, 5),
                  n: int = 64, seed: int = 0, block_size: int = 32, cut_down: bool = False
                  ) -> dict[str, float]:
    """The shuffle metrics above over ``n`` held-out prompts of ``lists`` names.

    Each prompt gets a seeded random permutation as its answer, a block (one holding names)
    and a mask rate ``t ~ U(0, 1)`` for that block's positions; one batched forward.
    ``cut_down`` feeds only the columns holding content, at their true positions, as the
    trainer's curriculum and ``shuffle_focus`` steps do (``train.testbed_long.columns``).
    """
    rng = random.Random(f"long-probe:{seed}")
    gen = torch.Generator().manual_seed(seed)
    records = long_records("shuffle", n, seed, length=lists, gen_length=codec.gen_length)
    mask_id = codec.token_id[MASK]
    g = codec.gen_length
    prompts, canvases, targets = [], [], []
    for record in records:
        items = list(record["items"])
        rng.shuffle(items)
        answer = torch.tensor(codec.reference_answer({"task": "shuffle", "items": items}))
        content = 2 * len(items) - 1
        b0 = block_size * rng.randrange((content + block_size - 1) // block_size)
        col = torch.arange(g)
        own = (col >= b0) & (col < b0 + block_size)
        masked = (col >= b0 + block_size) | (own & (torch.rand(g, generator=gen) < rng.random()))
        canvas = answer.masked_fill(masked, mask_id)
        prompts.append(codec.encode_prompt(record))
        canvases.append(canvas)
        targets.append(codec.conditionals("shuffle", record["items"], canvas[None])[0].float())
    tokens = torch.cat([torch.tensor(prompts), torch.stack(canvases)], dim=1)
    p = codec.prompt_length
    cols = torch.arange(p + g)
    if cut_down:
        from dllm_decode.train.testbed_long import columns

        cols = columns(codec, 2 * lists[1] + 1)
    answer_cols = cols[cols >= p] - p
    tokens = tokens[:, cols]
    probs = model(tokens, cols.expand_as(tokens), hidden_rows=torch.arange(
        len(cols) - len(answer_cols), len(cols))).float().softmax(-1)
    target = torch.stack(targets)[:, answer_cols]  # [n, G', V]
    canvas = torch.stack(canvases)[:, answer_cols]
    g = len(answer_cols)
    names = torch.zeros(codec.vocab_size, dtype=torch.bool)
    names[codec.first_name:] = True
    written = torch.zeros(len(records), codec.vocab_size)
    written.scatter_(1, torch.where(canvas >= codec.first_name, canvas, 0), 1.0)
    written[:, ~names] = 0
    open_slot = (canvas == mask_id) & ((target * names).sum(-1) > 0.5)  # [n, G]
    if not open_slot.any():
        raise ValueError("no open name slot in the probe's canvases; raise n")
    support = target > 0
    k = torch.tensor([[len(record["items"])] for record in records])  # [n, 1]
    share_written = written.sum(-1, keepdim=True) / k  # written names are the prompt's
    top = probs.argmax(-1, keepdim=True)
    stats = {
        "open_mass": (probs * support).sum(-1),
        "written_mass": (probs * written[:, None]).sum(-1),
        "argmax_open": support.gather(-1, top)[..., 0].float(),
        "uniform_written_mass": share_written.expand(-1, g),
    }
    return {key: round(float(v[open_slot].mean()), 4) for key, v in stats.items()} | {
        "open_slots": int(open_slot.sum())}


def load_student(run_or_checkpoint: str | Path) -> tuple[DecoderLM, LongCodec, int | None]:
    """A run directory's current state (via ``export_student`` to a temporary directory) or a
    checkpoint directory, as ``(model, codec, step)`` (fp32, eval mode)."""
    import tempfile

    from dllm_decode.models.loading import load_model
    from dllm_decode.train.testbed_long import STATE_FILE, export_student

    path = Path(run_or_checkpoint)
    step = None
    with tempfile.TemporaryDirectory() as tmp:
        if (path / STATE_FILE).is_file():
            path = export_student(path, Path(tmp) / "student")
        codec = long_codec_for(path)
        if codec is None:
            raise ValueError(f"{run_or_checkpoint} is neither a testbed-long run directory nor a "
                             "long-answer checkpoint (no long_answer_vocab.json)")
        run = path / "run.json"
        if run.is_file():
            step = json.loads(run.read_text()).get("steps_done")
        model = load_model(str(path), dtype=torch.float32).eval()
    return model, codec, step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dllm_decode.train.testbed_long_probe",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a testbed-long run directory or checkpoint directory")
    parser.add_argument("--lists", default="4:5", help="list lengths LO:HI (default 4:5)")
    parser.add_argument("--n", type=int, default=64, help="held-out prompts (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=32, help="semi-AR block (default 32)")
    parser.add_argument("--cut-down", action="store_true",
                        help="feed only the content columns (the trainer's cut-down canvases)")
    args = parser.parse_args(argv)
    try:
        lo, hi = (int(x) for x in args.lists.split(":"))
    except ValueError:
        parser.error(f"--lists must be LO:HI, got {args.lists!r}")
    torch.set_num_threads(1)
    model, codec, step = load_student(args.run)
    out = shuffle_probe(model, codec, lists=(lo, hi), n=args.n, seed=args.seed,
                        block_size=args.block_size, cut_down=args.cut_down)
    print(json.dumps({"run": args.run, "step": step, "lists": [lo, hi],
                      "cut_down": args.cut_down} | out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["load_student", "shuffle_probe"]
