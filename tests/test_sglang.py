"""``--dllm-algorithm DllmDecode``: every policy inside SGLang's real dLLM loop, on a CPU.

SGLang's own dLLM unit tests run the real algorithm classes with a scripted model runner; so do
these (``tests/sglang_serving.py``): a real ``ForwardBatch`` in dLLM mode through the real
``DllmAlgorithm.run``, synchronous and first-done-first-out, prompt tails included, rows
reordered and requests joining between rounds. What they check:

* the entry point makes ``DllmDecode`` resolvable in a *spawned* process (as SGLang's scheduler
  and tensor-parallel workers are), and SGLang's server-args resolution takes it with the
  plugin and rejects it without;
* token-for-token parity with SGLang's built-ins where the rules agree: ``llada2`` at
  ``LowConfidence``'s settings, ``llada21`` at ``JointThreshold``'s (synthetic logits whose
  confidences sit far from the thresholds, the mask token never a candidate);
* our loop vs SGLang's loop: the bundled ``tiny-sdar`` as the scripted runner's logits source
  gives every request the same blocks, step by step, and the same tokens through SGLang's
  ``run`` as through ``DiffusionSampler(cache="block_causal")``;
* bad YAML and what cannot run inside SGLang are one-line errors; sampling is seeded per
  request.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import re
from types import SimpleNamespace

import pytest
import torch

if os.environ.get("CI") == "true":  # CI installs requirements/sglang-cpu.txt: never skip
    import sglang  # noqa: F401
sglang = pytest.importorskip("sglang", reason="install requirements/sglang-cpu.txt (README)")

from sglang.srt.dllm.algorithm.joint_threshold import JointThreshold  # noqa: E402
from sglang.srt.dllm.algorithm.low_confidence import LowConfidence  # noqa: E402
from sglang.srt.dllm.config import DllmConfig  # noqa: E402

from dllm_decode import load_model, load_tokenizer  # noqa: E402
from dllm_decode.integrations.sglang import register, unsupported_message  # noqa: E402
from dllm_decode.integrations.sglang.algorithm import DllmDecodeAlgorithm  # noqa: E402
from dllm_decode.integrations.sglang.spec import ServedModel, serving_spec  # noqa: E402
from dllm_decode.models.loading import ASSETS  # noqa: E402
from dllm_decode.policies.capabilities import Capabilities  # noqa: E402
from dllm_decode.samplers.build import build_sampler  # noqa: E402
from dllm_decode.text import encode_prompts  # noqa: E402
from tests.sglang_serving import (  # noqa: E402
    LibraryBlockLogits,
    Req,
    ScriptedRunner,
    serve,
    synthetic_logits,
)

pytestmark = pytest.mark.usefixtures("one_thread")
K, MASK, VOCAB, EOS = 4, 2, 40, 1
SDAR_CONFIG = SimpleNamespace(architectures=["SDARForCausalLM"], eos_token_id=EOS,
                              vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1)


def dllm_config(name: str, algorithm_config: dict, *, fdfo: bool, block: int = K,
                mask: int = MASK) -> DllmConfig:
    return DllmConfig(algorithm=name, algorithm_config=algorithm_config, block_size=block,
                      mask_id=mask, max_running_requests=32, first_done_first_out_mode=fdfo)


def requests(prompts: dict[str, list[int]], max_new: int) -> list[Req]:
    return [Req(rid, list(p), max_new) for rid, p in prompts.items()]


def shuffled(seed: int):
    """A row order per round: a fresh permutation each round (FDFO reorders rows)."""
    def order(live: list[Req], rnd: int) -> list[Req]:
        out = list(live)
        random.Random(seed * 1000 + rnd).shuffle(out)
        return out
    return order


# ---- the entry point and server-args resolution ---------------------------------------------
def sdar_checkpoint(folder) -> str:
    """A checkpoint folder SGLang's server args resolve: the bundled ``tiny-sdar``'s config
    (``SDARForCausalLM``), its ``model_type`` spelled ``qwen3`` (SDAR's base), which
    transformers parses without the remote code real SDAR checkpoints ship."""
    config = json.loads((ASSETS / "tiny-sdar" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    return str(folder)


def resolve_server_args(model_path: str, config_path: str) -> str:
    """SGLang's server-args resolution of ``--dllm-algorithm DllmDecode`` (on the CPU):
    ``"ok"`` or the error."""
    from sglang.srt.server_args import ServerArgs

    try:
        ServerArgs(model_path=model_path, dllm_algorithm="DllmDecode",
                   dllm_algorithm_config=config_path, device="cpu").resolve_once()
    except (RuntimeError, ValueError) as err:
        return f"error: {err}"
    return "ok"


def _spawned_child(model_path: str, good: str, bad: str) -> tuple[str, str, str]:
    """In a spawned process, as SGLang starts its scheduler and TP workers: load the plugins
    the way every SGLang process does, then resolve the name and the server args."""
    from sglang.srt.dllm.algorithm import get_algorithm_cls
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return (get_algorithm_cls("DllmDecode").__name__, resolve_server_args(model_path, good),
            resolve_server_args(model_path, bad))


def test_entry_point_is_in_sglangs_plugin_group() -> None:
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert found.get("dllm_decode") == "dllm_decode.integrations.sglang:register"


def test_spawned_process_resolves_dllm_decode_and_its_server_args(tmp_path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("policy: eb\nparams: {gamma: 0.01}\n")
    bad.write_text("policy: eb\nparams: {gama: 0.01}\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        name, accepted, refused = pool.apply(_spawned_child, (sdar_checkpoint(ckpt), str(good),
                                                              str(bad)))
    assert (name, accepted) == ("DllmDecodeAlgorithm", "ok")
    assert refused.startswith(f"error: --dllm-algorithm-config {bad}: unknown keyword(s) "
                              "['gama']") and "\n" not in refused


def test_server_args_reject_dllm_decode_without_the_plugin(tmp_path, monkeypatch) -> None:
    from sglang.srt.dllm import algorithm as registry

    monkeypatch.delitem(registry.algo_name_to_cls, "DllmDecode", raising=False)
    config = tmp_path / "policy.yaml"
    config.write_text("policy: eb\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    got = resolve_server_args(sdar_checkpoint(ckpt), str(config))
    assert got == "error: Unknown diffusion LLM algorithm: DllmDecode"


def test_untested_sglang_version_is_refused_with_the_reason(monkeypatch) -> None:
    from sglang.srt.dllm import algorithm as registry

    monkeypatch.setattr(sglang, "__version__", "0.4.0")
    monkeypatch.setitem(registry.algo_name_to_cls, "DllmDecode", None)
    register()
    stand_in = registry.algo_name_to_cls["DllmDecode"]
    with pytest.raises(RuntimeError) as err:
        stand_in.configure_server_args(SimpleNamespace())
    assert str(err.value) == unsupported_message("0.4.0")
    assert "0.4.0" in str(err.value) and "sglang==0.5.23" in str(err.value)
    monkeypatch.setattr(sglang, "__version__", "0.5.23")
    register()
    assert registry.algo_name_to_cls["DllmDecode"] is DllmDecodeAlgorithm


# ---- the YAML: resolved as the CLI does, refused in one line ---------------------------------
SERVED = ServedModel.from_config(SDAR_CONFIG, MASK, K)


class Remasker:
    """A user rule that declares re-masking (WINO's narrow-out without its extra forward)."""

    capabilities = Capabilities(budgeted=False, edits=True, remasks=True)

    def select(self, state):
        return state.eligible


@pytest.mark.parametrize(("config", "needle"), [
    ({"policy": "thresold"}, "unknown policy 'thresold' (did you mean 'threshold'?)"),
    ({"policy": "eb", "params": {"gama": 0.1}}, "'gama' -> did you mean 'gamma'?"),
    ({"policy": "eb", "params": {"gamma": "high"}}, "gamma"),
    ({"policy": "threshold", "stopper": "shed"}, "unknown stopper 'shed'"),
    ({"policy": "threshold", "plicy": 1}, "unknown DllmDecode config key(s) ['plicy']"),
    ({"policy": "threshold", "params": [1]}, "params must be a mapping"),
    ({"policy": "missing_module:Rule"}, "cannot import 'missing_module'"),
    ({"policy": "s2d2"}, "extra model forwards"),
    ({"policy": "wino"}, "serve its drafting rule alone (policy: wide_in"),
    ({"policy": "lopa"}, "serve its anchor alone (params: {branches: 0})"),
    ({"policy": "tests.test_sglang:Remasker"}, "re-masks committed tokens"),
    ({"policy": "window"}, "cache='window'"),
    ({"policy": "gemma_renoise"}, "Gemma4Renoise"),
    ({"policy": "origin"}, "origin"),
    ({"policy": "ete", "params": {"cross_block": True}}, "cross_block"),
    ({"policy": "threshold", "params": {"gen_length": 64}}, "max_new_tokens"),
    ({"policy": "threshold", "params": {"cache": "dual"}}, "cache='block_causal'"),
    ({"policy": "threshold", "params": {"cfg_scale": 1.0}}, "unconditional forward"),
    ({"policy": "threshold", "params": {"seed": [1, 2]}}, "seed must be one int"),
])
def test_bad_config_is_one_line(config, needle) -> None:
    with pytest.raises(ValueError) as err:
        serving_spec(config, SERVED)
    message = str(err.value)
    assert needle in message and "\n" not in message


@pytest.mark.parametrize(("policy", "params", "stopper"), [
    ("thresold", {}, None), ("eb", {"gama": 0.1}, None), ("eb", {"gamma": "high"}, None),
    ("threshold", {}, "shed"), ("threshold", {"stopper.tau_low": 1.0}, None),
    (["eb"], {}, None), ("threshold", {}, 3)])
def test_yaml_errors_are_diffusion_samplers(tiny_sdar, policy, params, stopper) -> None:
    """The YAML goes through ``DiffusionSampler``'s resolution: the same message, one line."""
    with pytest.raises((TypeError, ValueError)) as sampler:
        build_sampler(tiny_sdar[0], policy, stopper=stopper, params=params)
    with pytest.raises(ValueError) as served:
        serving_spec({"policy": policy, "params": params, "stopper": stopper}, SERVED)
    assert str(served.value) == " ".join(str(sampler.value).split())


def test_configs_that_serve() -> None:
    for config in ({"policy": "eb", "params": {"gamma": 0.01}},
                   {"policy": "default"},  # the family's default (SDAR: dynamic threshold)
                   {"policy": "threshold", "stopper": "sched", "params": {"tau": 0.8,
                                                                         "stopper.tau_low": 1.0}},
                   {"policy": "llada21", "params": {"mode": "speed", "block_eos_stop": True}},
                   {"policy": "ete"},  # in-block on block-diffusion models
                   {"policy": "threshold", "params": {"cache": "block_causal", "steps": 4}},
                   {"policy": "learn2pd", "block_size": 4}):
        spec = serving_spec(config, SERVED)
        assert spec.cfg.gen_length == K
    assert serving_spec({"policy": "default"}, SERVED).policy.name == "low_confidence_dynamic"


def test_user_policy_file_serves(tmp_path) -> None:
    rule = tmp_path / "my_rule.py"
    rule.write_text("from dataclasses import dataclass\n"
                    "from dllm_decode.policies.base import top1_mask\n"
                    "@dataclass(frozen=True)\n"
                    "class Best:\n"
                    "    def select(self, state):\n"
                    "        return top1_mask(state.proposal.prob, state.eligible)\n")
    spec = serving_spec({"policy": f"{rule}:Best"}, SERVED)
    assert spec.policy.name.endswith(":Best")


def test_server_start_refuses_in_one_line(tmp_path, monkeypatch) -> None:
    from sglang.srt.dllm import algorithm as registry

    monkeypatch.setitem(registry.algo_name_to_cls, "DllmDecode", DllmDecodeAlgorithm)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    model_path, bad = sdar_checkpoint(ckpt), tmp_path / "policy.yaml"
    for text, message in (("policy: s2d2\n", "policy 's2d2' cannot run inside SGLang: it runs "
                                              "extra model forwards"),
                          ("policy: [eb\n", "not valid YAML (line 2)"),
                          ("- eb\n", "must be a YAML mapping")):
        bad.write_text(text)
        got = resolve_server_args(model_path, str(bad))
        assert got.startswith(f"error: --dllm-algorithm-config {bad}: {message}"), got
        assert "\n" not in got


# ---- parity with SGLang's built-in algorithms --------------------------------------------------
PROMPTS = {"a": [5, 6, 7], "b": [8, 9, 10, 11, 12, 13], "c": [14] * 9, "d": [15, 16, 17, 18]}


def serve_both(ours: dict, builtin: tuple[str, type, dict], *, fdfo: bool,
               prompt_mask: bool = False) -> tuple[dict, dict]:
    """The same requests through DllmDecode and a built-in, scripted identically; per request
    its output, forwards and the blocks it was fed."""
    out = {}
    for name, make in (("ours", lambda: DllmDecodeAlgorithm(dllm_config("DllmDecode", ours,
                                                                         fdfo=fdfo))),
                       ("builtin", lambda: builtin[1](dllm_config(builtin[0], builtin[2],
                                                                   fdfo=fdfo)))):
        literal = {"f": [5, 6, 7, 8, 9, MASK]} if prompt_mask else {}  # a mask id in the prompt
        reqs = requests(PROMPTS | literal, max_new=10)
        late = requests({"e": [19, 20, 21, 22, 23]}, max_new=6)
        runner = ScriptedRunner(synthetic_logits(VOCAB, MASK), SDAR_CONFIG)
        serve(make(), runner, reqs, k=K, mask_id=MASK, stop_ids=(EOS,), fdfo=fdfo,
              order=shuffled(3) if fdfo else None, arrivals={2: late}, prompt_mask=prompt_mask)
        out[name] = {r.rid: (r.output, runner.forwards[r.rid], runner.fed[r.rid])
                     for r in reqs + late}
    return out["ours"], out["builtin"]


@pytest.mark.parametrize("fdfo", [False, True], ids=["sync", "fdfo"])
@pytest.mark.parametrize("prompt_mask", [False, True], ids=["ids", "prompt_mask"])
def test_llada2_equals_low_confidence(fdfo, prompt_mask) -> None:
    ours, builtin = serve_both({"policy": "llada2", "params": {"threshold": 0.95}},
                               ("LowConfidence", LowConfidence, {"threshold": 0.95}),
                               fdfo=fdfo, prompt_mask=prompt_mask)
    assert ours == builtin
    steps = sum(f for _, f, _ in ours.values())
    tokens = sum(len(o) for o, _, _ in ours.values())
    assert steps < tokens + 2 * len(ours) * 3  # parallel commits happened (not one per step)


@pytest.mark.parametrize("fdfo", [False, True], ids=["sync", "fdfo"])
@pytest.mark.parametrize(("threshold", "editing", "post"), [(0.5, 0.9, 3), (0.95, 0.0, 2)])
def test_llada21_equals_joint_threshold(fdfo, threshold, editing, post) -> None:
    ours, builtin = serve_both(
        {"policy": "llada21", "params": {"threshold": threshold, "editing_threshold": editing,
                                         "max_post_steps": post}},
        ("JointThreshold", JointThreshold, {"threshold": threshold, "edit_threshold": editing,
                                            "max_post_edit_steps": post}), fdfo=fdfo)
    assert ours == builtin
    assert any(edits(fed) for _, _, fed in ours.values())  # the editing path ran


def edits(fed: list[tuple[int, list[int]]]) -> int:
    """Committed tokens rewritten between consecutive forwards of the same block."""
    return sum(a != b and MASK not in (a, b) for (s0, x), (s1, y) in zip(fed, fed[1:], strict=False)
               if s0 == s1 for a, b in zip(x, y, strict=True))


# ---- our loop vs SGLang's loop on the same model ---------------------------------------------
@pytest.fixture(scope="module")
def tiny_sdar():
    model = load_model("tiny-sdar")
    config = json.loads((ASSETS / "tiny-sdar" / "config.json").read_text())
    tok = load_tokenizer("tiny-sdar")
    prompts = {}
    for i, names in enumerate((["Maya Doyle", "Ivan Bennett"], ["Pedro Lindqvist"],
                               ["Ana Silva", "Tom Berg", "Lea Moss"])):
        text = ("You are managing a waiting line at a customer service desk.\n"
                "You need to record the following people in the order they arrived:\n"
                f"{json.dumps(names)}\nPlease copy the list exactly and provide only the "
                "final list.\n")
        prompts[f"r{i}"] = encode_prompts(tok, [text])[0][0].tolist()
    return model, SimpleNamespace(**config), prompts


def reference_run(model, prompt: list[int], gen_length: int, policy: str, params: dict,
                  stopper: str | None, truncator: str | None) -> tuple[list[int], list]:
    """``DiffusionSampler`` (``build_sampler``, as the CLI) with the block-causal cache: the
    generated tokens and, per block, the canvases its steps were fed plus its final block."""
    k = model.block_size
    sampler = build_sampler(model, policy, stopper=stopper, truncator=truncator,
                            cache="block_causal", params=params)
    fed = []

    def record(state, commit) -> None:
        start = state.block_start // k * k
        fed.append((start, state.canvas[0, start:start + k].tolist()))

    gen = sampler.generate(torch.tensor([prompt]), gen_length=gen_length, on_step=record)
    tokens = gen.tokens[0].tolist()
    expected = []
    for i, (start, row) in enumerate(fed):
        expected.append((start, row))
        if i + 1 == len(fed) or fed[i + 1][0] != start:  # the forward that sees it done
            expected.append((start, tokens[start:start + k]))
    # an editing block ends at a post step that changed nothing: that forward saw it done
    return tokens[len(prompt):], distinct(expected)


LOOP_CASES = [  # policy, params, stopper, truncator, blocks
    ("threshold", {"tau": 0.7}, None, None, 4),
    ("eb", {"gamma": 0.3}, None, None, 4),
    ("klass", {"conf_threshold": 0.6, "kl_threshold": 0.05}, None, None, 4),
    ("learn2pd", {}, None, None, 4),
    ("threshold", {"tau": 0.8}, None, "eotp", 4),  # composed: a selector and a truncator
    ("sched", {"base": "entropy", "tau_high": 6.0, "tau_low": 1.0}, None, None, 1),
    ("eb", {"gamma": 0.1, "stopper.tau_high": 5.0}, "sched", None, 1),
    ("llada21", {"mode": "speed", "max_post_steps": 2}, None, None, 4),
    ("frechet", {}, None, None, 4),
    ("dus", {}, None, None, 4),       # reads the block's start (a cut first block)
    ("credit", {}, None, None, 4),    # fuses the logits before the proposal
    ("wide_in", {"threshold": 0.5}, None, None, 4),
    ("lopa", {"branches": 0}, None, None, 4),
    ("llada2", {}, None, None, 4),    # the minimum schedule by block step (per row)
]


@pytest.mark.parametrize("fdfo", [False, True], ids=["sync", "fdfo"])
@pytest.mark.parametrize(("policy", "params", "stopper", "truncator", "blocks"), LOOP_CASES,
                         ids=[f"{c[0]}{'+' + (c[2] or c[3]) if c[2] or c[3] else ''}"
                              for c in LOOP_CASES])
def test_our_loop_equals_sglangs_loop(tiny_sdar, fdfo, policy, params, stopper, truncator,
                                      blocks) -> None:
    model, config, prompts = tiny_sdar
    k = model.block_size
    gens = {rid: blocks * k - len(p) % k for rid, p in prompts.items()}  # whole blocks
    params = {**params, "block_eos_stop": True}  # what SGLang does at a stop token
    runs = {rid: reference_run(model, p, gens[rid], policy, params, stopper, truncator)
            for rid, p in prompts.items()}
    yaml_config = {"policy": policy, "params": params, "stopper": stopper,
                   "truncator": truncator}
    algorithm = DllmDecodeAlgorithm(dllm_config("DllmDecode", yaml_config, fdfo=fdfo,
                                                mask=model.mask_token_id))
    runner = ScriptedRunner(LibraryBlockLogits(model, prompts, max(gens.values())), config,
                            model)
    reqs = [Req(rid, p, gens[rid]) for rid, p in prompts.items()]
    serve(algorithm, runner, reqs, k=k, mask_id=model.mask_token_id,
          stop_ids=tuple(model.eos_token_ids), fdfo=fdfo, order=shuffled(7) if fdfo else None)
    for r in reqs:
        tokens, expected = runs[r.rid]
        assert r.output == tokens[:len(r.output)], r.rid
        assert all(t == model.eos_token_ids[0] for t in tokens[len(r.output):]), r.rid
        assert distinct(runner.fed[r.rid]) == expected, r.rid  # the same blocks, step by step
    if policy in ("threshold", "eb") and stopper is None:  # parallel commits happened
        forwards = sum(len(distinct(fed)) for fed in runner.fed.values())
        assert forwards < sum(len(r.output) for r in reqs)


def distinct(fed: list) -> list:
    """``fed`` without consecutive repeats: a synchronous run feeds a row whose block is done
    until the whole batch is done (its block unchanged)."""
    return [x for i, x in enumerate(fed) if i == 0 or fed[i - 1] != x]


def test_sampling_is_seeded_per_request() -> None:
    """Sampled tokens depend on the request (its id, the config's seed, the block), not on its
    batch or row order, so every tensor-parallel rank draws the same."""
    def run(rids: list[str], order, seed: int, temperature: float = 1.0) -> dict:
        config = {"policy": "threshold", "params": {"tau": 0.9, "temperature": temperature,
                                                    "seed": seed}}
        algorithm = DllmDecodeAlgorithm(dllm_config("DllmDecode", config, fdfo=True))
        reqs = requests({rid: PROMPTS[rid] for rid in rids}, max_new=10)
        runner = ScriptedRunner(synthetic_logits(VOCAB, MASK), SDAR_CONFIG)
        serve(algorithm, runner, reqs, k=K, mask_id=MASK, stop_ids=(EOS,), fdfo=True,
              order=order)
        return {r.rid: r.output for r in reqs}

    alone = run(["b"], None, seed=5)
    batched = run(list(PROMPTS), shuffled(1), seed=5)
    assert batched == run(list(PROMPTS)[::-1], shuffled(2), seed=5)
    assert alone["b"] == batched["b"]
    assert run(["b"], None, seed=6) != alone != run(["b"], None, seed=5, temperature=0.0)


# ---- the README's table of what runs inside SGLang --------------------------------------------
def readme_table() -> dict[str, str]:
    """``policy -> "runs" | "refused"`` from the docs' "Serving with SGLang"
    (``docs/serving.md``)."""
    from tests.docs_text import doc_section

    section = doc_section("## Serving with SGLang")
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[1].split(":")[0] in ("runs", "refused"):
            for name in re.findall(r"`([a-z0-9_]+)`", cells[0]):
                out[name] = cells[1].split(":")[0]
    return out


def test_readme_table_lists_every_preset() -> None:
    from dllm_decode.policies.resolve import PRESETS

    assert set(readme_table()) == set(PRESETS)


@pytest.mark.filterwarnings("ignore:learn2pd. no trained filter")
@pytest.mark.parametrize(("name", "status"), sorted(readme_table().items()))
def test_readme_table_is_true(name, status) -> None:
    """Every "runs" row serves requests through the real ``run`` (first-done-first-out, rows
    reordered) to the end, nothing masked left; every "refused" row is refused at the YAML."""
    config = {"policy": name}
    if status == "refused":
        with pytest.raises(ValueError, match=f"policy '{name}' cannot run inside SGLang"):
            serving_spec(config, SERVED)
        return
    algorithm = DllmDecodeAlgorithm(dllm_config("DllmDecode", config, fdfo=True))
    reqs = requests({rid: PROMPTS[rid] for rid in "abd"}, max_new=9)
    runner = ScriptedRunner(synthetic_logits(VOCAB, MASK), SDAR_CONFIG)
    serve(algorithm, runner, reqs, k=K, mask_id=MASK, stop_ids=(EOS,), fdfo=True,
          order=shuffled(5))
    for r in reqs:
        assert r.finished and MASK not in r.output and len(r.output) >= 1


class ReadsStep:
    """A user rule without ``row_steps`` that reads the block step (host int expected)."""

    def select(self, state):
        from dllm_decode.policies.base import top1_mask

        first = state.block_step == 0  # a host bool: this rule cannot take per-row tensors
        return top1_mask(state.proposal.prob, state.eligible) if first else state.eligible


class Draws:
    """A user rule without ``row_steps`` that draws from ``state.generator``."""

    def select(self, state):
        from dllm_decode.policies.base import top1_mask

        noise = torch.rand(state.eligible.shape, generator=state.generator)
        return top1_mask(noise, state.eligible)


class Best:
    """A user rule without ``row_steps`` that reads no step value."""

    def select(self, state):
        from dllm_decode.policies.base import top1_mask

        return top1_mask(state.proposal.prob, state.eligible)


@pytest.mark.parametrize(("policy", "split"), [
    ("threshold", "rows"),   # every built-in part takes per-row step values: one call
    ("llada2", "rows"),      # reads the block step: a [B] tensor
    ("random", "rows"),      # draws from per-request streams (state.row_seeds)
    ("klass", "rows"),       # per-request memory, gathered from the pool by slot
    (f"{__name__}:Best", "merge"),       # a user rule that reads nothing per row
    (f"{__name__}:ReadsStep", "key"),    # ... that reads a step value: one call per value
    (f"{__name__}:Draws", "row"),        # ... that draws from state.generator: per request
])
def test_rows_share_a_call_unless_the_policy_reads_what_differs(policy, split) -> None:
    algorithm = DllmDecodeAlgorithm(dllm_config("DllmDecode", {"policy": policy}, fdfo=True))
    reqs = requests(PROMPTS, max_new=10)
    serve(algorithm, ScriptedRunner(synthetic_logits(VOCAB, MASK), SDAR_CONFIG), reqs, k=K,
          mask_id=MASK, stop_ids=(EOS,), fdfo=True, order=shuffled(4))
    assert algorithm.decoder.split == split
    assert all(r.finished and MASK not in r.output for r in reqs)
