"""The docs point at what exists: every link and every repository path they name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"`((?:src|projections|tests|scripts|examples|docs|\.ci)/[\w./-]*\w)`")
LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_repository_path_a_doc_names_exists(doc: Path) -> None:
    named = PATH.findall(doc.read_text(encoding="utf-8"))
    missing = [p for p in named if not (ROOT / p).exists() and not (doc.parent / p).exists()]
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    links = [link for link in LINK.findall(doc.read_text(encoding="utf-8")) if "://" not in link]
    dangling = [link for link in links if not (doc.parent / link).exists()]
    assert not dangling, f"{doc.name} links to nothing: {dangling}"


def test_the_architecture_notes_explain_their_terms() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "the seed" not in text.lower()
    assert "once the transport" not in text
