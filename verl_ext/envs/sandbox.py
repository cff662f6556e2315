"""A per-episode sandbox folder: the only place on disk that tools may touch.

Every path a tool receives is resolved against the sandbox root and rejected unless it stays
inside it (``..``, absolute paths, symlinks pointing out, NUL bytes, drive letters). There is no
shell anywhere on this path.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath

from verl_ext.envs.core import ActionError


class Sandbox:
    """A fresh temporary folder per episode; ``close`` removes it."""

    def __init__(self, prefix: str = "verl_ext_sandbox_"):
        self.root = Path(tempfile.mkdtemp(prefix=prefix)).resolve()

    def resolve(self, relative: str) -> Path:
        """The absolute path for ``relative`` inside the sandbox, or :class:`ActionError`."""
        if not isinstance(relative, str) or not relative.strip() or "\x00" in relative or "\\" in relative:
            raise ActionError(f"invalid path {relative!r}")
        pure = PurePosixPath(relative.strip())
        if pure.is_absolute() or ".." in pure.parts or ":" in pure.parts[0]:
            raise ActionError(f"path {relative!r} leaves the sandbox (use a relative path such as Folder/name)")
        target = (self.root / pure).resolve()  # follows symlinks, so a link pointing out is caught below
        if target != self.root and self.root not in target.parents:
            raise ActionError(f"path {relative!r} leaves the sandbox")
        return target

    def relative(self, relative: str) -> str:
        """The normalised sandbox-relative form of a checked path (``Folder/name``)."""
        return self.resolve(relative).relative_to(self.root).as_posix()

    def mirror(self, folders: list[str], files: list[dict[str, str]]) -> None:
        """Make the folder hold exactly these folders and text files (the page's file system)."""
        for child in self.root.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        for folder in folders:
            self.resolve(folder).mkdir(parents=True, exist_ok=True)
        for item in files:
            path = self.resolve(item["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(item["content"], encoding="utf-8")

    def read_text(self, relative: str, max_chars: int = 20000) -> str:
        path = self.resolve(relative)
        if not path.is_file():
            raise ActionError(f"no file {relative!r}")
        return path.read_text(encoding="utf-8", errors="replace")[:max_chars]

    def listing(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
