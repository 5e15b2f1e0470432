"""No file the user did not name as code runs code (README "What runs code").

A payload checkpoint (a pickle whose unpickling would create a marker file) is refused on every
load path and never executed; training states are safetensors + JSON and resume exactly.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from dllm_decode.cli import main as cli_main
from dllm_decode.train.distill import (
    DistillConfig,
    _grow_weights,
    distill,
    export_checkpoint,
    export_weights,
)
from dllm_decode.train.state import (
    LegacyCheckpointError,
    StateFormatError,
    convert_legacy,
    load_state,
    save_state,
)
from dllm_decode.train.trainer import train_tiny_main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--hidden", "32", "--layers", "1", "--heads", "2", "--intermediate", "64",
        "--batch-size", "4", "--tasks", "waiting_line/copy", "--min-items", "2",
        "--max-items", "3", "--gen-length", "16", "--warmup", "1", "--log-every", "1",
        "--ckpt-every", "2", "--eval-every", "0", "--eval-size", "1", "--threads", "1"]
TESTBED = dict(family="llada", hidden=32, layers=1, heads=2, intermediate=64, batch_size=4,
               log_every=2, ckpt_every=2, eval_every=0, eval_size=1)


class _Payload:
    """Unpickling this calls ``Path.touch(marker)``: the stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - pickle protocol
        return (Path.touch, (self.marker,))


def _payload_files(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A marker path and payload files: torch.save zip and bare pickle, under .pt and under
    the new names (a renamed pickle must be refused too)."""
    marker = tmp_path / "PWNED"
    state = {"model": {}, "step": 0, "config": {}, "x": _Payload(marker)}
    files = []
    for sub, name in (("zip", "checkpoint.pt"), ("zip2", "checkpoint.safetensors"),
                      ("raw", "checkpoint.pt"), ("raw2", "checkpoint.safetensors")):
        path = tmp_path / sub / name
        path.parent.mkdir()
        if sub.startswith("zip"):
            torch.save(state, path)
        else:
            path.write_bytes(pickle.dumps(state))
        files.append(path)
    assert not marker.exists()
    return marker, files


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_payload_checkpoint_is_refused_and_never_run_on_every_load_path(tmp_path, capsys):
    marker, files = _payload_files(tmp_path)
    refused = (LegacyCheckpointError, StateFormatError)
    for path in files:
        run = path.parent
        with pytest.raises(LegacyCheckpointError, match="train convert"):
            load_state(path)
        # train tiny --resume (library call and CLI: one error line, exit code 2)
        with pytest.raises(refused):
            train_tiny_main([*TINY, "--out", str(run), "--resume"])
        assert cli_main(["train", "tiny", *TINY, "--out", str(run), "--resume"]) == 2
        assert "dllm-decode train convert" in capsys.readouterr().err
        # train testbed --resume, --grow-from, and the export helpers
        with pytest.raises(refused):
            distill(DistillConfig(out=str(run), steps=2, resume=True, **TESTBED))
        with pytest.raises(refused):
            _grow_weights(DistillConfig(grow_from=str(path), **TESTBED))
        with pytest.raises(refused):
            export_checkpoint(run, tmp_path / "exported")
        with pytest.raises(refused):
            export_weights(run, tmp_path / "weights.safetensors")
        # even the conversion a user runs knowingly reads tensors and plain values only
        with pytest.raises(StateFormatError, match="restricted loader refused"):
            convert_legacy(path, tmp_path / f"converted-{run.name}.safetensors")
        assert cli_main(["train", "convert", str(path), "--out",
                         str(tmp_path / "c.safetensors")]) == 2
        assert not marker.exists(), f"payload ran via {path}"
    with pytest.raises(LegacyCheckpointError, match="train convert"):
        DistillConfig(grow_from=str(files[0]), **TESTBED)  # refused before the run starts
    # a fresh run never writes into a directory holding an old checkpoint
    with pytest.raises(FileExistsError, match="--resume"):
        train_tiny_main([*TINY, "--out", str(files[0].parent)])
    assert not marker.exists()


def test_model_and_filter_loads_never_unpickle(tmp_path):
    from dllm_decode import load_model
    from dllm_decode.models.loading import ASSETS
    from dllm_decode.models.weights import CheckpointError
    from dllm_decode.policies.learn2pd_filter import load_filter

    marker = tmp_path / "PWNED"
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((ASSETS / "tiny-llada/config.json").read_text())
    torch.save({"w": _Payload(marker)}, model_dir / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(model_dir)  # a .bin is never read
    torch.save({"w": _Payload(marker)}, model_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        load_model(model_dir)
    bundled = next(ASSETS.glob("*/learn2pd_k*.json"))
    (tmp_path / "f.json").write_text(bundled.read_text())
    torch.save({"w": _Payload(marker)}, tmp_path / "f.safetensors")
    with pytest.raises(Exception) as err:  # noqa: PT011 - whatever safetensors raises
        load_filter(tmp_path / "f.safetensors")
    assert "Payload" not in str(err.value)
    assert not marker.exists()


def test_training_state_round_trips_exactly_and_converts_trusted_files(tmp_path):
    import random

    model = torch.nn.Linear(3, 4)
    opt = torch.optim.AdamW(model.parameters(), betas=(0.9, 0.95))
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    tied = torch.randn(5, 2)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7,
             "wall_s": 0.1 + 0.2, "rng": {"torch": torch.get_rng_state(),
                                          "python": random.getstate()},
             "config": {"family": "llada", "$odd": [1, None, True]},
             "ema": None, "tied": {"a": tied, "b": tied}}
    back = load_state(save_state(tmp_path / "s.safetensors", state))
    assert back["step"] == 7 and back["wall_s"] == 0.1 + 0.2 and back["ema"] is None
    assert back["config"] == state["config"]
    assert back["rng"]["python"] == random.getstate()  # tuples stay tuples (setstate needs)
    random.setstate(back["rng"]["python"])
    assert torch.equal(back["rng"]["torch"], torch.get_rng_state())
    assert back["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]
    assert set(back["optimizer"]["state"]) == {0, 1}  # int keys survive JSON
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(back["optimizer"]["state"][0][k], v), k
    assert torch.equal(back["tied"]["a"], back["tied"]["b"])
    with pytest.raises(TypeError, match="only tensors"):
        save_state(tmp_path / "bad.safetensors", {"x": object()})
    # a trusted old checkpoint converts (torch.load(weights_only=True)) to the same state
    torch.save(state, tmp_path / "checkpoint.pt")
    out = convert_legacy(tmp_path / "checkpoint.pt")
    assert out == tmp_path / "checkpoint.safetensors"
    again = load_state(out)
    assert again["step"] == 7 and again["rng"]["python"] == state["rng"]["python"]
    assert torch.equal(again["model"]["weight"], state["model"]["weight"])
    with pytest.raises(FileExistsError):
        convert_legacy(tmp_path / "checkpoint.pt")
    # a model checkpoint is not a training state, and says so
    from dllm_decode.models.loading import ASSETS

    with pytest.raises(StateFormatError, match="not a dllm-decode training state"):
        load_state(ASSETS / "tiny-llada/model.safetensors")


def test_grow_from_a_model_directory_starts_from_its_exported_weights(tmp_path):
    from dllm_decode import load_model

    run = distill(DistillConfig(out=str(tmp_path / "a"), steps=2, **TESTBED))
    assert run["steps_done"] == 2
    start = _grow_weights(DistillConfig(grow_from=str(tmp_path / "a/model"), **TESTBED))
    exported = load_model(tmp_path / "a/model", dtype=torch.float32).state_dict()
    assert set(start) == set(exported)
    assert all(torch.equal(start[k], exported[k]) for k in start)
    with pytest.raises(ValueError, match="drop --grow-average"):
        DistillConfig(grow_from=str(tmp_path / "a/model"), grow_average=True, **TESTBED)
    # a grown run's recorded source is history: exporting it later works when it is gone
    source = tmp_path / "a/checkpoint.safetensors"
    distill(DistillConfig(out=str(tmp_path / "b"), steps=2, grow_from=str(source), **TESTBED))
    source.unlink()
    assert "--grow-from" in export_checkpoint(tmp_path / "b", tmp_path / "b-export")["command"]


# ------------------------------------------------------------------ "What runs code" is complete

ROOT = Path(__file__).resolve().parents[1]
#: names whose every use in the package must be listed (modules and keyword)
_NAMES = {"importlib", "__import__", "runpy", "pickle", "cPickle", "dill", "cloudpickle",
          "marshal", "shelve", "joblib", "subprocess", "trust_remote_code"}
#: builtins that run code from a string (method calls such as ``model.eval()`` do not count)
_BUILTINS = {"exec", "eval", "compile"}
_YAML_UNSAFE = {"load", "load_all", "unsafe_load", "full_load", "Loader", "UnsafeLoader",
                "FullLoader"}


def code_uses(source: str) -> set[str]:
    """The code-running uses in ``source``, from its tokens (comments and docstrings do not
    count; a string literal equal to a listed name, e.g. a ``"trust_remote_code"`` key, does)."""
    import ast
    import io
    import tokenize

    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in skip]
    found: set[str] = set()
    for i, t in enumerate(toks):
        prev = toks[i - 1].string if i else ""
        before = toks[i - 2].string if i > 1 else ""
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        if t.type == tokenize.NAME:
            if t.string in _NAMES:
                found.add(t.string)
            elif t.string in _BUILTINS and prev not in (".", "def") and nxt == "(":
                found.add(t.string + "(")
            elif prev == "." and before == "torch" and t.string == "load":
                found.add("torch.load")
            elif prev == "." and before == "yaml" and t.string in _YAML_UNSAFE:
                found.add("yaml.load")
        elif t.type == tokenize.STRING:
            try:
                value = ast.literal_eval(t.string)
            except (ValueError, SyntaxError):
                continue
            if value in _NAMES:
                found.add(value)
    return found


def readme_listing() -> dict[str, set[str]]:
    """``{file: uses}`` from the table of the docs' "What runs code" section
    (``docs/contracts.md``)."""
    import re

    from tests.docs_text import doc_section

    section = doc_section("## What runs code")
    listed: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`dllm_decode/"):
            listed[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[1]))
    return listed


def test_scanner_finds_what_it_looks_for() -> None:
    src = ('import importlib\nx = torch.load(p)\nexec(code)\nmodel.eval()\n'
           'f(**{"trust_remote_code": True})\nyaml.load(s)\nyaml.safe_load(s)\n'
           '"""pickle in a docstring"""\n# eval( in a comment\nast.literal_eval(s)\n')
    assert code_uses(src) == {"importlib", "torch.load", "exec(", "trust_remote_code",
                              "yaml.load"}


def test_readme_lists_every_place_that_can_run_code() -> None:
    listed = readme_listing()
    assert listed, "docs section 'What runs code' has no table"
    found = {}
    for path in sorted((ROOT / "dllm_decode").rglob("*.py")):
        uses = code_uses(path.read_text())
        if uses:
            found[path.relative_to(ROOT).as_posix()] = uses
    unlisted = {f: sorted(u - listed.get(f, set())) for f, u in found.items()
                if u - listed.get(f, set())}
    assert not unlisted, (f"code-running uses not listed in docs 'What runs code': {unlisted}; "
                          "list them there (what runs and who names it), or remove them")
    stale = {f: sorted(u - found.get(f, set())) for f, u in listed.items()
             if u - found.get(f, set())}
    assert not stale, f"docs 'What runs code' lists uses the code no longer has: {stale}"
    assert "yaml.load" not in set().union(*found.values()), "use yaml.safe_load"


def test_a_checkpoint_naming_its_own_code_is_refused_not_imported(tmp_path, monkeypatch):
    """``auto_map`` / an unknown ``model_type`` / a tokenizer class of its own: refused, and
    the module beside the files is never imported."""
    import json

    from dllm_decode import load_model
    from dllm_decode.models.loading import ASSETS
    from dllm_decode.models.weights import CheckpointError
    from dllm_decode.tokenizer import load_tokenizer

    marker = tmp_path / "PWNED"
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n")
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.chdir(d)
    cfg = json.loads((ASSETS / "tiny-llada/config.json").read_text())
    (d / "model.safetensors").write_bytes((ASSETS / "tiny-llada/model.safetensors").read_bytes())
    auto = {"AutoConfig": "evil.Evil", "AutoModel": "evil.Evil"}
    for model_type in ("evil", "evil.py:Evil", "evil:Evil"):
        (d / "config.json").write_text(json.dumps(cfg | {"model_type": model_type,
                                                         "auto_map": auto}))
        with pytest.raises(CheckpointError, match="unknown model_type"):
            load_model(d)
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "Evil", "auto_map": {"AutoTokenizer": ["evil.Evil", None]}}))
    with pytest.raises((ValueError, OSError)):
        load_tokenizer(d)
    assert not marker.exists()


def test_lm_eval_trust_remote_code_never_reaches_the_model() -> None:
    pytest.importorskip("lm_eval")
    from dllm_decode.eval.lm_eval import DllmDecodeLM

    with pytest.warns(UserWarning, match="trust_remote_code=True is ignored"):
        lm = DllmDecodeLM(pretrained="tiny-llada", trust_remote_code="True")
    assert "trust_remote_code" not in lm.knobs
    assert "trust_remote_code" not in DllmDecodeLM(pretrained="tiny-llada",
                                                   trust_remote_code=False).knobs


def test_a_converted_old_checkpoint_resumes_exactly(tmp_path):
    """An old run (``checkpoint.pt``, as ``torch.save`` wrote it) converted with ``train
    convert`` continues bit for bit like an uninterrupted run."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    flags = [*TINY, "--steps", "4"]
    train_tiny_main([*flags, "--out", str(straight)])
    train_tiny_main([*TINY, "--steps", "2", "--out", str(split)])
    new = split / "checkpoint.safetensors"
    torch.save(load_state(new), split / "checkpoint.pt")  # what older versions wrote
    new.unlink()
    assert cli_main(["train", "tiny", *flags, "--out", str(split), "--resume"]) == 2  # refused
    assert cli_main(["train", "convert", str(split / "checkpoint.pt")]) == 0
    (split / "checkpoint.pt").unlink()
    train_tiny_main([*flags, "--out", str(split), "--resume"])
    a, b = load_state(straight / "checkpoint.safetensors"), load_state(new)
    assert a["step"] == b["step"] == 4 and a["window"] == b["window"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for i, moments in a["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(value, b["optimizer"]["state"][i][key]), (i, key)


def test_a_malformed_state_is_a_clear_error(tmp_path):
    import json

    from safetensors.torch import save_file

    from dllm_decode.train.state import FORMAT

    for tree in ({"$dict": [[[1], 2]]}, {"$tensor": "absent"}, {"$eval": "x"}, [1, 2]):
        path = tmp_path / "s.safetensors"
        save_file({"t": torch.zeros(1)}, str(path),
                  metadata={"format": FORMAT, "dllm_decode.state": json.dumps(tree)})
        with pytest.raises(StateFormatError):
            load_state(path)


def test_a_deeply_nested_state_is_a_clear_error(tmp_path):
    """JSON nested past Python's recursion limit: a ``StateFormatError``, not a
    ``RecursionError`` traceback (from ``json.loads`` or from decoding the tree)."""
    from safetensors.torch import save_file

    from dllm_decode.train.state import FORMAT

    path = tmp_path / "s.safetensors"
    text = '{"a": ' + "[" * 10**5 + "]" * 10**5 + "}"
    save_file({"t": torch.zeros(1)}, str(path),
              metadata={"format": FORMAT, "dllm_decode.state": text})
    with pytest.raises(StateFormatError, match="nested deeper"):
        load_state(path)
