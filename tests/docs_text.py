"""The user-facing docs as tests read them: README.md plus every page under ``docs/``.

The README keeps the set-up commands and quick starts; the rest lives in ``docs/*.md``
(issue 54). Tests that check what the docs say find it through these helpers, wherever the
text sits, so moving a section between pages does not blind them.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def doc_files() -> list[Path]:
    """README.md, then every ``docs/**/*.md`` in path order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def docs_text() -> str:
    """The text of every file of :func:`doc_files`, joined by blank lines."""
    return "\n\n".join(path.read_text() for path in doc_files())


def doc_section(heading: str) -> str:
    """The body of the one ``## heading...`` section (a prefix of the heading line is enough),
    up to the next ``## `` heading of its file.

    Raises ``AssertionError`` when no file or more than one has such a section.
    """
    prefix = heading if heading.startswith("## ") else f"## {heading}"
    found = []
    for path in doc_files():
        text = "\n" + path.read_text()
        for part in text.split("\n## ")[1:]:
            if f"## {part}".startswith(prefix):
                found.append((path, part.split("\n", 1)[1] if "\n" in part else ""))
    where = [p.relative_to(ROOT).as_posix() for p, _ in found]
    assert len(found) == 1, f"expected one section {prefix!r} in README.md and docs/, found {where}"
    return found[0][1]
