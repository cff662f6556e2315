"""verl-ext's checkpoint state on disk: written atomically, listed in a manifest, verified on load.

verl marks a checkpoint complete by writing ``latest_checkpointed_iteration.txt`` last; verl-ext
writes its own state (the old-logit providers' worker state, the rollout side's store) into the
same ``global_step_<n>`` folder *before* verl's save, so a checkpoint verl calls complete always
holds complete verl-ext state, and a run killed earlier resumes from the checkpoint before. Each
file goes to a temporary name and is renamed into place once flushed to disk; the sha256 of its
bytes is computed while it is written. ``manifest.json``, written last (also atomically), names
every file with its sha256 and the step. Loading checks the manifest and each file's bytes against
it: a folder with files but no manifest (a save that was cut short), a manifest of another step,
or a file whose bytes differ is refused with ``TornStateError``, never loaded half-written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import IO, Any, BinaryIO

import torch

MANIFEST = "manifest.json"
_CHUNK = 1 << 24


class TornStateError(RuntimeError):
    """verl-ext's checkpoint state is incomplete or does not match its manifest."""


class _HashingWriter:
    """A write-only file object that hashes what passes through it (``torch.save`` writes its
    archive sequentially)."""

    def __init__(self, file: BinaryIO):
        self.file, self.sha256, self.size = file, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


@contextlib.contextmanager
def _atomic(path: str, mode: str) -> Iterator[IO]:
    """A file opened under a temporary name next to ``path``; on a clean exit flushed to disk and
    renamed into place (the rename itself made durable), so ``path`` holds either the old or the new
    bytes, never part of them."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, mode) as file:
        yield file
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def save_file(obj: Any, path: str) -> dict[str, Any]:
    """``torch.save(obj)`` to ``path`` atomically; returns its manifest record (name, sha256, bytes)."""
    with _atomic(path, "wb") as file:
        writer = _HashingWriter(file)
        torch.save(obj, writer)
    return {"file": os.path.basename(path), "sha256": writer.sha256.hexdigest(), "bytes": writer.size}


def write_manifest(folder: str, step: int, records: Sequence[dict[str, Any]]) -> None:
    """Write ``manifest.json`` (atomically) once every file of ``records`` is in place."""
    manifest = {"step": int(step), "files": {r["file"]: {"sha256": r["sha256"], "bytes": r["bytes"]} for r in records}}
    with _atomic(os.path.join(folder, MANIFEST), "w") as file:
        json.dump(manifest, file, indent=1, sort_keys=True)


def read_manifest(folder: str, step: int) -> dict[str, Any] | None:
    """The manifest of the state saved in ``folder`` at ``step``; None when nothing was saved there.
    Raises ``TornStateError`` for state files without a manifest, or a manifest of another step."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        leftovers = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        if leftovers:
            raise TornStateError(
                f"verl-ext: {folder} holds {leftovers} but no {MANIFEST}: its save was cut short (or written by a "
                f"verl-ext without manifests). Resume from the checkpoint before it (set "
                f"{os.path.dirname(os.path.dirname(folder))}/latest_checkpointed_iteration.txt to an earlier step), "
                f"or delete the folder to resume without verl-ext's state"
            )
        return None
    with open(path) as file:
        manifest = json.load(file)
    if manifest.get("step") != int(step):
        raise TornStateError(f"verl-ext: {path} is of step {manifest.get('step')}, but verl resumes step {step}")
    return manifest


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def load_file(folder: str, name: str, manifest: dict[str, Any]) -> tuple[Any, str]:
    """Load ``folder/name`` after checking its bytes against ``manifest``; returns (object, sha256)."""
    expected = manifest["files"].get(name)
    path = os.path.join(folder, name)
    if expected is None:
        raise TornStateError(
            f"verl-ext: {os.path.join(folder, MANIFEST)} lists {sorted(manifest['files'])}, not {name}: the state was "
            f"saved by another number of ranks or another old-logit provider; resume with the same settings"
        )
    if not os.path.exists(path):
        raise TornStateError(f"verl-ext: {path} is listed in {MANIFEST} but missing")
    found = sha256_of(path)
    if found != expected["sha256"]:
        raise TornStateError(f"verl-ext: {path} does not match {MANIFEST} (sha256 {found[:12]}, "
                             f"expected {expected['sha256'][:12]}): the file was changed or torn after its save")
    return torch.load(path, weights_only=False), found
