"""Streaming (``stream_text``, ``DiffusionSampler.stream``): the joined deltas equal
``generate_text``'s text for every preset on the bundled models (mask: ``tiny-llada``,
``tiny-dream``, block diffusion: ``tiny-sdar``, LLaDA2.x editing: ``testbed-llada2``, uniform
noise: ``testbed-gemma``) over a few cache modes; finality (a block once left, editing
included; a canvas at its end), provisional canvases, no extra host sync per step, UTF-8 safe
deltas, early close, the one-row refusal and ``dllm-decode generate --stream``."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from dllm_decode import DiffusionSampler, generate_text, load_model, load_tokenizer, stream_text
from dllm_decode.policies.capabilities import capabilities_of
from dllm_decode.policies.presets import DREAM_NAMES
from dllm_decode.policies.resolve import PRESETS, make_policy
from dllm_decode.samplers.stream import StreamEvent
from dllm_decode.text import _text_events
from tests.helpers import mask_presets

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ("You are managing a waiting line at a customer service desk.\nYou need to record the "
        "following people in the order they arrived:\n[\"Maya Doyle\", \"Ivan Bennett\"]\n"
        "Please copy the list exactly and provide only the final list.\n")
TESTBED = "<reverse> [ Amelia Abbott , Bruno Adler , Carl Bell ] " + "<fill> " * 4 + "<answer>"
_LOADED: dict[str, Any] = {}


def _load(name: str) -> tuple[Any, Any]:
    if name not in _LOADED:
        tok = load_tokenizer(name if name.startswith("testbed") else None)
        _LOADED[name] = (load_model(name), tok)
    return _LOADED[name]


def _cells() -> list[tuple[str, str, str | None]]:
    """(model, preset, cache) per preset: its bundled home and a cache or two."""
    cells: list[tuple[str, str, str | None]] = []
    for name in mask_presets(PRESETS):
        if capabilities_of(make_policy(name).selector).requires_attention == "block_causal":
            cells += [("tiny-sdar", name, "none"), ("tiny-sdar", name, "block_causal")]
        elif name in DREAM_NAMES or name == "window_dream":
            cells.append(("tiny-dream", name, "none"))
        else:
            cells.append(("tiny-llada", name, "none"))
    cells += [("tiny-llada", n, c) for n in ("threshold", "low_confidence")
              for c in ("prefix", "dual")]
    cells += [("testbed-llada2", n, None) for n in ("llada2", "llada21", "edit")]
    cells += [("testbed-gemma", n, None) for n in ("gemma_renoise", "eb", "threshold")]
    return cells


def _sampler(model_name: str, preset: str, cache: str | None) -> tuple[Any, Any, dict]:
    model, tok = _load(model_name)
    testbed = model_name.startswith("testbed")
    kw: dict[str, Any] = {"gen_length": 16, "seed": 0}
    if model.attention != "block_causal" and not testbed:
        kw["block_length"] = 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # learn2pd without a filter: top-k fallback
        sampler = DiffusionSampler(model, preset, cache=cache, **kw)
    return sampler, tok, {"prompt": TESTBED if testbed else TINY}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model_name, preset, cache", _cells())
def test_joined_deltas_equal_generate_text(model_name: str, preset: str,
                                           cache: str | None) -> None:
    sampler, tok, kw = _sampler(model_name, preset, cache)
    want = generate_text(sampler, tok, kw["prompt"])
    events = list(stream_text(sampler, tok, kw["prompt"]))
    assert "".join(e.delta for e in events) == want.texts[0]
    assert events[-1].done and events[-1].stopped == want.stopped[0]
    assert torch.equal(events[-1].generation.tokens, want.generation.tokens)
    assert all(not e.done for e in events[:-1]) and all(e.provisional is None for e in events)


def _final_spans(sampler: Any, prompt: torch.Tensor, **kw: Any) -> list[StreamEvent]:
    events = list(sampler.stream(prompt, **kw))
    want = sampler.generate(prompt, **kw.get("overrides", {})).answer[0].tolist()
    assert [t for e in events for t in e.final] == want
    return [e for e in events if e.final and not e.done]


def test_editing_text_is_final_only_when_its_block_is_left() -> None:
    model, tok = _load("testbed-llada2")
    sampler = DiffusionSampler(model, "llada21", gen_length=80, seed=0)
    from dllm_decode.text import encode_prompts

    ids, _ = encode_prompts(tok, TESTBED)
    events = list(sampler.stream(ids, provisional=True))
    assert bool(events[-1].generation.edits.any())  # committed tokens were rewritten
    assert [t for e in events for t in e.final] == sampler.generate(ids).answer[0].tolist()
    for e in events[:-1]:  # per-step events carry nothing final; block events a whole block
        if e.final:
            assert (e.start, e.start + len(e.final)) == (e.block_start, e.block_end)
        else:
            assert len(e.provisional) == e.block_end - e.block_start
    steps = [e for e in events if not e.final and not e.done]
    assert len(steps) == events[-1].generation.steps  # one event per step


def test_provisional_fills_in_and_ends_as_the_final_block() -> None:
    model, tok = _load("tiny-llada")
    sampler = DiffusionSampler(model, "low_confidence", gen_length=16, block_length=8)
    prompt = torch.randint(3, 40, (1, 5), generator=torch.Generator().manual_seed(1))
    events = list(sampler.stream(prompt, provisional=True))
    block0 = [e for e in events if e.block == 0 and not e.final]
    assert len(block0) == 8 and all(len(e.provisional) == 8 for e in block0)
    first_final = next(e for e in events if e.final)
    assert block0[-1].provisional == first_final.final  # the last step's canvas is final
    assert model.mask_token_id not in block0[0].provisional  # masks show their argmax
    texts = list(stream_text(sampler, tok, TINY, provisional=True))
    assert all(isinstance(t.provisional, str) for t in texts)
    assert "".join(t.delta for t in texts) == generate_text(sampler, tok, TINY).texts[0]


def test_uniform_noise_yields_per_canvas() -> None:
    model, tok = _load("testbed-gemma")
    sampler = DiffusionSampler(model, gen_length=16, seed=0)
    from dllm_decode.text import encode_prompts

    ids, _ = encode_prompts(tok, TESTBED)
    events = list(sampler.stream(ids, provisional=True))
    finals = [e for e in events if e.final and not e.done]
    assert len(finals) == len({e.block for e in events}) >= 1
    assert all(len(e.provisional) == e.block_end - e.block_start for e in events)


def test_no_host_sync_per_step_beyond_the_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _load("tiny-llada")
    sampler = DiffusionSampler(model, "threshold", gen_length=16, block_length=8)
    prompt = torch.randint(3, 40, (1, 5), generator=torch.Generator().manual_seed(1))
    calls = [0]
    real = torch.Tensor.tolist

    def counting(self: torch.Tensor) -> Any:
        calls[0] += 1
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    sampler.generate(prompt)
    plain, calls[0] = calls[0], 0
    events = list(sampler.stream(prompt))
    blocks = len({e.block for e in events})
    assert calls[0] == plain + blocks + 1  # one read per block and the last event's rest


def test_deltas_hold_back_an_incomplete_character() -> None:
    tok = load_tokenizer()
    ids = tok.encode("caf\u00e9 \u4e2d\u6587 ok")
    events = [StreamEvent(step=i, block=i, start=i, final=(t,), block_start=i, block_end=i + 1)
              for i, t in enumerate(ids)]
    events.append(StreamEvent(len(ids), len(ids), len(ids), (), len(ids), len(ids), done=True))
    deltas = [e.delta for e in _text_events(iter(events), tok, (), None, False)]
    assert "".join(deltas) == tok.decode(ids) and not any("\ufffd" in d for d in deltas)
    assert len([d for d in deltas if d]) > 3  # it did stream


def test_closing_early_leaves_the_sampler_usable() -> None:
    model, tok = _load("tiny-llada")
    sampler = DiffusionSampler(model, "low_confidence", gen_length=16, block_length=8)
    want = generate_text(sampler, tok, TINY).texts[0]
    stream = stream_text(sampler, tok, TINY)
    next(stream)
    stream.close()
    assert generate_text(sampler, tok, TINY).texts[0] == want
    for _event in stream_text(sampler, tok, TINY):
        break
    assert "".join(e.delta for e in stream_text(sampler, tok, TINY)) == want


def test_one_row_only() -> None:
    model, tok = _load("tiny-llada")
    sampler = DiffusionSampler(model, "low_confidence", gen_length=16, block_length=8)
    with pytest.raises(ValueError, match="one prompt row, got a batch of 2"):
        sampler.stream(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="stream_text streams one prompt, got 2"):
        stream_text(sampler, tok, [TINY, TINY])


def test_cli_generate_stream(capsys: pytest.CaptureFixture) -> None:
    from dllm_decode.cli import main

    assert main(["generate", TESTBED, "--model", "testbed-llada2", "--stream"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == '["Carl Bell", "Bruno Adler", "Amelia Abbott"]'
    assert "tokens/forward" in out.err
    assert main(["generate", TESTBED, "--model", "testbed-llada2", "--stream", "--show"]) != 0
    assert "--stream prints the text as it comes" in capsys.readouterr().err
