"""Helpers of the conformance recorders in this folder (run in a separate environment, never
imported by the library): export an author's files at a commit, load a LLaDA-format checkpoint
with an author's ``modeling_llada.py``, write a fixture with its metadata.

The authors' code is read from a local snapshot of their repository (``git show`` at the pinned
commit into a scratch folder): nothing fetched is kept in this repository.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def export(repo: Path, commit: str, files: dict[str, str], into: Path) -> Path:
    """``git show commit:path`` of each ``files`` entry (repo path -> file name) into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for path, name in files.items():
        text = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"],
                              check=True, capture_output=True, text=True).stdout
        (into / name).write_text(text)
    return into


def load_llada(checkpoint: Path, code: Path, scratch: Path) -> Any:
    """``LLaDAModelLM`` from the authors' ``modeling_llada.py`` / ``configuration_llada.py`` in
    ``code``, with the weights of ``checkpoint`` (fp32, eval mode)."""
    import torch
    from safetensors.torch import load_file

    model_dir = scratch / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in ("modeling_llada.py", "configuration_llada.py"):
        shutil.copy(code / name, model_dir / name)
    shutil.copy(checkpoint / "config.json", model_dir / "config.json")
    sys.path.insert(0, str(model_dir))
    conf_mod = importlib.import_module("configuration_llada")
    model_mod = importlib.import_module("modeling_llada")
    cfg = conf_mod.LLaDAConfig(**json.loads((checkpoint / "config.json").read_text()))
    cfg.init_device = "cpu"
    model = model_mod.LLaDAModelLM(cfg, init_params=False)
    state = load_file(str(checkpoint / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    return model.float().eval().to(torch.device("cpu"))


def write_fixture(out: Path, meta: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    """``{"meta": meta + the environment, "cases": cases}`` as JSON at ``out``."""
    import torch
    import transformers

    meta = {**meta, "environment": f"torch {torch.__version__} (CPU), transformers "
                                   f"{transformers.__version__}, python "
                                   f"{sys.version.split()[0]}"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")
    print(f"{len(cases)} cases -> {out}")
