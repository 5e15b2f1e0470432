"""The documentation site builds with ``mkdocs build --strict`` (issue 54).

``--strict`` makes every warning an error: a link to a page or an anchor that does not exist, a
``nav`` page that is missing, an API page (``docs/api/``) whose object mkdocstrings cannot find.
The API pages are read from the source by griffe, statically: the build imports neither torch,
Triton nor SGLang. Every public name of ``dllm_decode`` must have an entry in the API reference.

Needs the ``docs`` extra (``pip install -e ".[docs]"``, in the README's test command). Without it
the tests skip, except under CI (``CI=true``), where a missing extra is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dllm_decode

ROOT = Path(__file__).resolve().parents[1]
#: a build takes ~5 s here; this bounds a hung one
BUILD_TIMEOUT_S = 120


def _require_mkdocs() -> None:
    if importlib.util.find_spec("mkdocs") is not None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail('mkdocs is not installed under CI: install the docs extra (".[docs]")')
    pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``config`` into ``site``; one intra-op thread. Not
    ``--quiet``: it hides the warnings from ``--strict``, which then passes a broken link."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(config), "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)


def _nav_pages(nav: list) -> list[str]:
    """The page paths of a mkdocs ``nav`` (nested sections flattened)."""
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    _require_mkdocs()
    out = tmp_path_factory.mktemp("site")
    result = _build(ROOT / "mkdocs.yml", out)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return out


def test_site_builds_strict_with_every_nav_page(site) -> None:
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    for page in nav:
        assert (ROOT / "docs" / page).is_file(), f"mkdocs.yml nav names a missing docs/{page}"
        built = site / ("" if page == "index.md" else page.removesuffix(".md").removesuffix(
            "/index")) / "index.html"
        assert built.is_file(), f"docs/{page} was not built ({built})"
    assert "architecture.md" in nav and any(p.startswith("api/") for p in nav)


def test_every_public_name_has_an_api_entry(site) -> None:
    html = "".join(p.read_text() for p in (site / "api").rglob("index.html"))
    where = dllm_decode._WHERE  # public name -> defining module (the package's lazy table)
    missing = [name for name in dllm_decode.__all__ if name != "__version__"
               and f'id="dllm_decode.{where[name]}.{name}"' not in html]
    assert not missing, f"no API entry (::: dllm_decode.MODULE.NAME in docs/api/) for {missing}"
    for module in ("dllm_decode.policies", "dllm_decode.kernels", "dllm_decode.integrations"):
        assert f'id="{module}' in html, f"the API reference has nothing of {module}"


def test_strict_build_fails_on_a_broken_link(tmp_path) -> None:
    """The same configuration on a copy of docs/ with one link to a page that does not exist."""
    _require_mkdocs()
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    with (docs / "index.md").open("a") as f:
        f.write("\nSee [a page that is not there](no-such-page.md).\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    config["plugins"] = ["search"]  # the link check is mkdocs' own: skip the API pages' reading
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0, "a broken link did not fail the strict build"
    assert "no-such-page.md" in result.stderr
