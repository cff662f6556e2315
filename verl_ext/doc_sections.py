"""Sections of docs pages generated from code (``## `` heading to the next one): the declarations'
tables (``python -m verl_ext.preconditions --write``) and the benchmarks' results (``scripts/bench``)."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
# Between a section's heading and this line sits the page's own prose (what does not depend on the
# generated numbers); ``write_section`` rewrites only what follows it.
GENERATED = "<!-- generated: --write rewrites from here to the next section -->"


def section_of(page: str, heading: str) -> str:
    """The section of ``page`` under ``heading`` (up to the next ``## `` heading), '' where absent."""
    start = page.find(f"{heading}\n")
    if start < 0:
        return ""
    end = page.find("\n## ", start + 1)
    return page[start:] if end < 0 else page[start:end + 1]


def write_section(path: Path, heading: str, section: str, until: str = "\n## ") -> None:
    """Replace the section of ``path`` under ``heading`` with ``section`` (written as given), up to the
    next ``until`` (a ``## `` heading, or ``"\\n#"`` to keep the subsections other writers put under it),
    or append it. Where the section holds a ``GENERATED`` line, only what follows that line is replaced."""
    text = path.read_text()
    start = text.find(heading + "\n")  # the whole heading line: one heading may begin another
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find(until, start + len(heading))
        end = len(text) if end < 0 else end + 1
        marker = text.find(GENERATED, start, end)
        if marker >= 0:  # the heading and the page's prose stay; the section's own heading line is dropped
            start = marker + len(GENERATED) + 1
            section = "\n" + section.removeprefix(heading).lstrip("\n")
        text = text[:start] + section + text[end:]
    path.write_text(text)
