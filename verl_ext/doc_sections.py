"""Sections of docs pages generated from declarations in the code (``## `` heading to the next one)."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def section_of(page: str, heading: str) -> str:
    """The section of ``page`` under ``heading`` (up to the next ``## `` heading), '' where absent."""
    start = page.find(f"{heading}\n")
    if start < 0:
        return ""
    end = page.find("\n## ", start + 1)
    return page[start:] if end < 0 else page[start:end + 1]


def write_section(path: Path, heading: str, section: str) -> None:
    """Replace (or append) the section of ``path`` under ``heading`` with ``section``."""
    page = path.read_text()
    old = section_of(page, heading)
    path.write_text(page.replace(old, section) if old else page.rstrip("\n") + "\n\n" + section)
