"""Docs output of the benchmarks: one flag convention, one section writer, one markdown table renderer."""

from __future__ import annotations

import argparse
import os
import platform
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from verl_ext import doc_sections

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results.md"


def script_parser(module_doc: str, doc: Path | None = RESULTS, context: bool = False) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first line as the description; the one convention of every script,
    the section is printed and ``--write`` also writes it into ``--doc`` (the script's own page by default);
    with ``context``, ``--context`` (how the runs were made: machine, other load), printed with the section."""
    parser = argparse.ArgumentParser(description=module_doc.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the section into --doc (default: print only)")
    parser.add_argument("--doc", type=Path, default=doc, help="the page --write updates")
    if context:
        parser.add_argument("--context", default="", help="how the runs were made (machine, other load), "
                            "printed with the section")
    return parser


def target(args: argparse.Namespace) -> Path | None:
    """Where ``publish`` writes for parsed ``script_parser`` arguments: the doc with ``--write``, else nowhere."""
    return args.doc if args.write else None


def publish(doc: Path | None, heading: str, section: str, until: str = "\n## ") -> None:
    """Print ``section``; with a ``doc``, also replace its section under ``heading`` there (``write_section``)."""
    print(section)
    if doc is not None:
        write_section(doc, heading, section, until)
        print(f"wrote {doc} ({heading!r})")


def write_section(doc: Path, heading: str, section: str, until: str = "\n## ") -> None:
    """``verl_ext.doc_sections.write_section`` as the benchmarks write: one blank line after the section,
    and a missing ``doc`` starts as an empty results page."""
    if not doc.exists():
        doc.write_text("# Results\n")
    doc_sections.write_section(doc, heading.rstrip("\n"), section.rstrip("\n") + "\n\n", until)


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A markdown table as the docs write them (``|---|---:|``); ``align`` holds one character a
    column, ``r`` for right-aligned, anything else (or nothing) left."""
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align.ljust(len(header))) + "|"
    body = ["| " + " | ".join(str(c) for c in row) + " |" for row in [header, *rows]]
    return "\n".join([body[0], rule, *body[1:]])


def cpu_machine() -> str:
    """This machine's CPU for a report's header: ``<model name>, <n> cores visible, Python <version>``."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text()).group(1).strip()
    except (OSError, AttributeError):
        pass
    return f"{cpu}, {os.cpu_count()} cores visible, Python {platform.python_version()}"


def pct(x: float, digits: int = 2) -> str:
    """A share as a percentage cell; ``—`` for NaN."""
    return "—" if x != x else f"{x:.{digits}%}"


def gib(n: float, unit: float, digits: int = 2) -> str:
    """A byte count as ``GiB (multiple of unit)``; ``0`` for none."""
    return f"{n / 2**30:.2f} GiB ({n / unit:.{digits}f}x)" if n else "0"


@contextmanager
def figure(path: Path, rows: int, cols: int, size: tuple[float, float], dpi: int, title: str = "",
           title_size: float | None = None, **subplots: Any) -> Iterator[Any]:
    """The ``rows x cols`` axes (a 2-D array) of a headless matplotlib figure, saved to ``path`` (its
    folder made) under ``title`` when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, **subplots)
    yield axes
    if title:
        fig.suptitle(title, fontsize=title_size)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
