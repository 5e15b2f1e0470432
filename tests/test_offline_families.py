"""Every family runs offline on a CPU from the command line: the README's "Without the Hub"
commands (``--token-ids``, ``--mask-token-id``) on the reference-format tiny checkpoints, and
the bundled test-bed model of LLaDA2.x on a test-bed prompt."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from dllm_decode import cli
from tests.conformance import CONFORMANCE, require_shared
from tests.docs_text import doc_section, docs_text

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The ``dllm-decode generate`` lines of the docs' "Without the Hub" section
    (``docs/models.md``)."""
    section = doc_section("## Without the Hub")
    return re.findall(r"^(dllm-decode generate .*)$", section, flags=re.M)


def test_the_section_covers_every_family_with_a_checkpoint_there() -> None:
    commands = " ".join(readme_commands())
    for name in ("llada-tiny", "dream-tiny", "llada2-tiny", "llada-moe-tiny", "fastdllm2-tiny",
                 "diffusiongemma-tiny"):
        assert f"../shared/conformance/{name}" in commands, name
    assert "--policy llada21" in commands
    assert "--model testbed-llada2" in commands and "--model testbed-gemma" in commands
    assert "`--model tiny-sdar`" in docs_text()


@pytest.mark.parametrize("command", readme_commands())
def test_readme_offline_command_runs(command, monkeypatch, capfd) -> None:
    argv = shlex.split(command)[1:]
    if any("../shared/" in a for a in argv):
        require_shared(CONFORMANCE)
    monkeypatch.chdir(ROOT)  # the README's commands run from the repository root
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(argv) == 0, capfd.readouterr().err
    out, err = capfd.readouterr()
    assert "tokens/forward=" in err
    if "--token-ids" not in argv:  # a bundled test-bed model: its tokenizer, the list format
        assert out.splitlines()[0] == '["Carl Bell", "Bruno Adler", "Amelia Abbott"]', out
        return
    ids = out.split()
    assert ids and all(i.isdigit() for i in ids) and len(ids) <= 16, out
    assert "(token ids)" in err


def test_a_checkpoint_without_a_usable_mask_id_names_the_flags(monkeypatch, capsys) -> None:
    model = str(require_shared(CONFORMANCE / "llada2-tiny"))
    assert cli.main(["generate", "1 2 3", "--token-ids", "--model", model]) == 2
    err = capsys.readouterr().err
    assert "mask_token_id 156895 is outside the vocabulary" in err
    assert "--mask-token-id ID" in err and "--token-ids" in err
    assert cli.main(["generate", "1 x 3", "--token-ids", "--model", model,
                     "--mask-token-id", "379"]) == 2
    assert "--token-ids: the prompt must be token ids" in capsys.readouterr().err
