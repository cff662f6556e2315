"""``verl-ext bundle``: an offline install bundle for a machine without a package index.

Building (here, with network):

1. The target's ``pip freeze`` becomes *stand-ins*: one empty ``NAME-VERSION.dist-info`` per
   package, the only installed packages a ``python -S`` pip sees. pip then resolves verl-ext
   (its wheel, built from this source tree) with the chosen extras for the target's Python and
   platform tags (``pip install --dry-run --report``, wheels only): what the target already has
   at a version that satisfies the requirement is "already satisfied" and left out, exactly as
   pip would decide on the target itself; a package the target has at a rejected version
   (transformers 5.17 for verl's ``<5.11``) is resolved anew and bundled. Only metadata is
   fetched for this, never the target's large wheels (torch).
2. Packages with only a source distribution (antlr4-python3-runtime 4.9.3, which hydra-core
   pins) would make pip backtrack to an ancient release: a first resolution for the local
   interpreter, sdists allowed, finds them, and each is built into a wheel here if it is pure
   Python; the target resolution then finds those wheels.
3. What verl never loads on a target that has CUDA torch is left out by a documented,
   overridable list (``DEFAULT_EXCLUDES``), and some wheels lose folders verl never imports
   (``DEFAULT_STRIPS``: Ray's Java jars and RLlib), their RECORD rewritten to match. Each
   left-out package then becomes a stand-in too and pip resolves again, so that its own
   requirements stop shaping the bundle (``resolve_rounds``).
4. The wheels (compressed zips already) and a manifest go into one ``tar`` stream, cut into
   parts no larger than ``--part-size``, listed with their sha256 in ``SHA256SUMS``;
   ``install.sh`` and this file (as ``bundle_install.py``) go beside them. ``--xz PRESET``
   re-zips the wheels uncompressed and xz-compresses the stream instead: 5-15% smaller for
   vLLM's CUDA kernels, but slow. ``--preinstall`` installs the wheels into a tree here (pip
   ``--target`` for the target's platform) and packs the tree with xz: the GPU bundle with
   vLLM (700 MiB of wheels) became 440 MiB of parts (1632 MiB of files, xz -4), and the
   target needs no pip.

Installing (on the target, stdlib only: this module imports nothing outside the standard
library at module level, so the bundle ships it as its own installer): ``bash install.sh
--target DIR`` (or ``--venv DIR``) checks every part's sha256, streams the parts through tar
(and xz), installs the wheels with the target's pip (``--no-index --no-deps``) or moves the
preinstalled tree into place and, for ``--target``, writes ``DIR/env.sh`` with the
``PYTHONPATH`` (including the folders that the ``.pth`` files name, which Python does not read
from ``PYTHONPATH``) and ``PATH``; ``pip check`` lines about bundled packages are printed.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.util
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

PROJECT = "verl-ext"
ARCHIVE = "bundle.tar"  # + ".xz" with --xz
CHECKSUMS = "SHA256SUMS"
MANIFEST = "manifest.json"
INSTALLER = "bundle_install.py"
STACK_MODULE = "megatron_stack.py"  # shipped beside the installer: it compiles what has no wheel
EXTRAS = ("vllm", "gui", "judge", "megatron", "mcp")
_CHUNK = 1 << 20
PRESENT = "the target has"  # how a left-out reason starts when the target has the package


class BundleError(Exception):
    """A bundle cannot be built or installed; the message names the option and the fix."""


def _log(message: str) -> None:
    print(f"[bundle] {message}", flush=True)


def canonical_name(name: str) -> str:
    """PEP 503 normalised project name (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ------------------------------------------------------------------------------------------
# Pure pieces: freeze files, sizes, platform tags, what to leave out.
# ------------------------------------------------------------------------------------------

_FREEZE_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*===?\s*([^\s;#]+)")
_FREEZE_URL = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*@\s*\S+")
_FREEZE_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)$")


def parse_freeze(text: str, source: str = "--freeze") -> dict[str, str | None]:
    """Installed packages of a ``pip freeze`` (or hand-written) list: canonical name -> version.

    ``NAME==VERSION`` (and ``===``) gives the version; ``NAME @ URL`` (a direct-URL install) and
    a bare ``NAME`` (a hand-written list) give ``None``: present at an unknown version, trusted
    to satisfy whatever needs it. Comments, blank lines and option lines (``-e ...``,
    ``--index-url ...``) are skipped: an editable install is the user's own checkout.
    """
    packages: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        for pattern in (_FREEZE_PIN, _FREEZE_URL, _FREEZE_NAME):
            match = pattern.match(line)
            if match:
                groups = match.groups()
                packages[canonical_name(groups[0])] = groups[1] if len(groups) > 1 else None
                break
        else:
            raise BundleError(
                f"{source} line {number}: {raw.strip()!r} is not NAME==VERSION, NAME @ URL or NAME; "
                "write the target's packages with `python3 -m pip freeze > FILE` on the target"
            )
    return packages


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str, option: str = "--part-size") -> int:
    """Bytes in ``60M``, ``1.5G``, ``500k`` or ``1048576`` (K, M, G are powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise BundleError(f"{option} {text!r}: write a size such as 60M, 1G or 500K (powers of 1024)")
    size = int(float(match.group(1)) * 1024 ** "_kmg".index(match.group(2).lower() or "_"))
    if size < 1024:
        raise BundleError(f"{option} {text!r} is under 1 KiB: give a part size such as 60M")
    return size


_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def expand_platform_tags(tags: Iterable[str]) -> list[str]:
    """The tags a pip on that platform accepts: ``manylinux_2_N_ARCH`` brings every older glibc
    (``manylinux_2_M_ARCH`` for M <= N and the legacy ``manylinux1/2010/2014`` aliases), since
    ``pip --platform`` matches each tag exactly while the target's pip accepts them all."""
    expanded: list[str] = []
    for tag in tags:
        expanded.append(tag)
        match = _MANYLINUX.match(tag)
        if not match:
            continue
        major, minor, arch = int(match.group(1)), int(match.group(2)), match.group(3)
        expanded += [f"manylinux_{major}_{m}_{arch}" for m in range(minor - 1, 4, -1)]
        expanded += [
            f"{alias}_{arch}" for alias, glibc in _LEGACY_MANYLINUX.items() if glibc <= (major, minor)
        ]
    return list(dict.fromkeys(expanded))


def local_platform_tags() -> list[str]:
    """This interpreter's platform tags, newest first (what ``pip`` accepts here)."""
    from packaging import tags

    return list(dict.fromkeys(tag.platform for tag in tags.sys_tags() if tag.platform != "any"))


@dataclass(frozen=True)
class Exclude:
    """Leave packages whose canonical name matches ``pattern`` out of the bundle.

    ``when_present``: only when the target has that package (the CUDA libraries come with a
    CUDA torch; a target without torch gets them bundled)."""

    pattern: str
    reason: str
    when_present: str | None = None


@dataclass(frozen=True)
class Strip:
    """Drop the files under ``prefix`` from ``package``'s wheel (its RECORD is rewritten)."""

    package: str
    prefix: str
    reason: str


# Not nvidia-cudnn-frontend (the `cudnn` Python API flashinfer uses), nor nvidia-cutlass-dsl*.
_CUDA_LIBS = (
    "nvidia-cublas*", "nvidia-cuda-cupti*", "nvidia-cuda-nvrtc*", "nvidia-cuda-runtime*",
    "nvidia-cudnn-cu*", "nvidia-cufft*", "nvidia-cufile*", "nvidia-curand*", "nvidia-cusolver*",
    "nvidia-cusparse*", "nvidia-nccl*", "nvidia-nvjitlink*", "nvidia-nvshmem*", "nvidia-nvtx*",
)  # fmt: skip

DEFAULT_EXCLUDES: tuple[Exclude, ...] = (
    *(Exclude(p, "CUDA runtime library that CUDA torch brings; the target has CUDA torch", "torch")
      for p in _CUDA_LIBS),
    Exclude("flashinfer-cubin", "flashinfer's precompiled kernels (447 MB); flashinfer compiles what vLLM "
            "uses on the target instead (vLLM 0.24 sync and async runs on an H100 without it)"),
    *(Exclude(p, "CUDA compiler toolchain (170 MB) that cuda-tile's `tileiras` extra brings: only compiling "
              "cuTile kernels needs it (flashinfer's all-gather-matmul, which verl never runs); flashinfer's "
              "own JIT uses the target's nvcc", "torch")
      for p in ("nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl")),
    Exclude("tilelang", "DeepSeek-only kernels of vLLM; verl's FSDP/vLLM path never imports them"),
    Exclude("z3-solver", "constraint solver for tilelang (DeepSeek-only kernels)"),
    Exclude("tokenspeed-*", "DeepSeek-only kernels of vLLM; verl's FSDP/vLLM path never imports them"),
)  # fmt: skip

DEFAULT_STRIPS: tuple[Strip, ...] = (
    Strip("ray", "ray/jars/", "Ray's Java worker (32 MB); verl starts Python workers only"),
    Strip("ray", "ray/rllib/", "RLlib; verl does not import it"),
)


@dataclass(frozen=True)
class Resolved:
    """One package of pip's resolution for the target."""

    name: str  # canonical
    version: str
    url: str


def versions_match(wanted: str, present: str) -> bool:
    """``2.11.0`` names the same release as ``2.11.0+cu130`` (a local label is a build of it)."""
    from packaging.version import Version

    return Version(wanted).public == Version(present).public


def select(
    resolved: Iterable[Resolved], present: dict[str, str | None], excludes: Iterable[Exclude]
) -> tuple[list[Resolved], list[tuple[Resolved, str]]]:
    """Split pip's resolution into (bundled, [(left out, why)]).

    Left out: what the target has at the same release (pip reports it only when the stand-ins
    say otherwise, so this is a guard), what it has at an unknown version (a bare name in the
    freeze), and what an ``Exclude`` matches. verl-ext itself is always bundled."""
    excludes = list(excludes)
    kept: list[Resolved] = []
    dropped: list[tuple[Resolved, str]] = []
    for item in resolved:
        reason = None
        if item.name != PROJECT and item.name in present:
            have = present[item.name]
            if have is None:
                reason = f"{PRESENT} it (version not given in the freeze)"
            elif versions_match(item.version, have):
                reason = f"{PRESENT} {have}"
        if reason is None:
            for rule in excludes:
                if fnmatch.fnmatchcase(item.name, rule.pattern) and (
                    rule.when_present is None or rule.when_present in present
                ):
                    reason = f"{rule.reason} [exclude {rule.pattern}]"
                    break
        if reason is None:
            kept.append(item)
        else:
            dropped.append((item, reason))
    return kept, dropped


def choose_excludes(
    extra: Iterable[str], include: Iterable[str], use_defaults: bool = True
) -> list[Exclude]:
    """The default list (unless ``use_defaults`` is off) plus ``--exclude`` patterns, minus the
    default rules that match a ``--include`` name (that package is bundled after all)."""
    include = [canonical_name(name) for name in include]
    rules = [
        rule
        for rule in (DEFAULT_EXCLUDES if use_defaults else ())
        if not any(fnmatch.fnmatchcase(name, rule.pattern) for name in include)
    ]
    return rules + [Exclude(canonical_name(p), "given with --exclude") for p in extra]


def wheel_name_version(filename: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel file name."""
    parts = Path(filename).name.split("-")
    if len(parts) < 5 or not filename.endswith(".whl"):
        raise BundleError(f"{filename!r} is not a wheel file name (NAME-VERSION-...-TAG.whl)")
    return canonical_name(parts[0]), parts[1]


def is_pure_wheel(filename: str) -> bool:
    """True for a wheel that runs on any platform (``...-none-any.whl``)."""
    return Path(filename).name.endswith("-none-any.whl")


# ------------------------------------------------------------------------------------------
# Wheels, parts and checksums.
# ------------------------------------------------------------------------------------------


def repack_wheel(src: Path, dst: Path, strip_prefixes: Iterable[str] = (), stored: bool = False) -> list[str]:
    """Copy a wheel leaving out the files under ``strip_prefixes`` and their RECORD lines;
    ``stored``: uncompressed (ZIP_STORED), so that xz compresses across all wheels. Returns the
    stripped prefixes that matched something."""
    prefixes = tuple(strip_prefixes)
    matched: set[str] = set()
    compression = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            hit = next((p for p in prefixes if info.filename.startswith(p)), None)
            if hit:
                matched.add(hit)
                continue
            out_info = zipfile.ZipInfo(info.filename, info.date_time)
            out_info.external_attr = info.external_attr
            out_info.compress_type = compression
            if info.filename.endswith(".dist-info/RECORD") and prefixes:
                lines = zin.read(info).decode().splitlines(keepends=True)
                zout.writestr(out_info, "".join(ln for ln in lines if not ln.startswith(prefixes)))
                continue
            with zin.open(info) as fin, zout.open(out_info, "w", force_zip64=True) as fout:
                shutil.copyfileobj(fin, fout, _CHUNK)
    return sorted(matched)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class _PartWriter(io.RawIOBase):
    """A write-only stream that (with an xz ``preset``) compresses what it is given and cuts the
    bytes into ``bundle.tar[.xz].000``, ``.001``, ... of at most ``part_size`` bytes each.

    xz runs as the ``xz`` program on every core (``-T0``) where there is one, else through
    Python's single-threaded ``lzma``; both write the same format."""

    def __init__(self, out_dir: Path, part_size: int, preset: int | None) -> None:
        self.out_dir, self.part_size = out_dir, part_size
        self.parts: list[Path] = []
        self._fh: io.BufferedWriter | None = None
        self._left = 0
        self._name = ARCHIVE + ("" if preset is None else ".xz")
        self._xz = self._proc = self._pump = None
        self._error: OSError | None = None
        if preset is not None and shutil.which("xz"):
            self._proc = subprocess.Popen(["xz", f"-{preset}", "-T0", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._pump = threading.Thread(target=self._drain, daemon=True)
            self._pump.start()
        elif preset is not None:
            self._xz = lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=preset)

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self._proc is not None:
            self._proc.stdin.write(data)  # type: ignore[union-attr]
        else:
            self._emit(bytes(data) if self._xz is None else self._xz.compress(data))
        return len(data)

    def _drain(self) -> None:
        try:
            for block in iter(lambda: self._proc.stdout.read(_CHUNK), b""):  # type: ignore[union-attr]
                self._emit(block)
        except OSError as exc:  # a full disk: stop xz so that write() fails instead of blocking
            self._error = exc
            self._proc.kill()  # type: ignore[union-attr]

    def _emit(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._left == 0:
                self._next_part()
            chunk = view[: self._left]
            self._fh.write(chunk)  # type: ignore[union-attr]
            self._left -= len(chunk)
            view = view[len(chunk) :]

    def _next_part(self) -> None:
        if self._fh is not None:
            self._fh.close()
            _log(f"part {self.parts[-1].name} written ({self.part_size / 2**20:.1f} MiB)")
        self.parts.append(self.out_dir / f"{self._name}.{len(self.parts):03d}")
        self._fh = open(self.parts[-1], "wb")
        self._left = self.part_size

    def close(self) -> None:
        if not self.closed:
            if self._proc is not None:
                self._proc.stdin.close()  # type: ignore[union-attr]
                self._pump.join()  # type: ignore[union-attr]
                if self._error is not None:
                    raise BundleError(f"writing the parts failed: {self._error}; free disk space under --out")
                if self._proc.wait() != 0:
                    raise BundleError(f"xz exited with {self._proc.returncode}: rerun without --xz, or check the disk")
            if self._xz is not None:
                self._emit(self._xz.flush())
            if self._fh is not None:
                self._fh.close()
        super().close()


def pack(files: list[tuple[Path, str]], out_dir: Path, part_size: int, preset: int | None = None) -> list[Path]:
    """Write ``files`` ((path, name in the archive)) as one tar stream (xz-compressed with a
    ``preset``) cut into parts, plus ``SHA256SUMS`` (sha256sum's format) for the parts.
    Returns the parts."""
    total = sum(path.stat().st_size for path, _ in files)
    writer = _PartWriter(out_dir, part_size, preset)
    done, started = 0, time.monotonic()
    last = started
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, arcname in files:
            tar.add(path, arcname=arcname, recursive=False)
            done += path.stat().st_size
            if time.monotonic() - last >= 10:  # progress every 10 s on long packs
                last = time.monotonic()
                _log(f"packed {done / 2**20:.0f} of {total / 2**20:.0f} MiB ({last - started:.0f} s)")
    writer.close()
    (out_dir / CHECKSUMS).write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in writer.parts))
    return writer.parts


def verify_parts(bundle_dir: Path) -> list[Path]:
    """The parts listed in ``SHA256SUMS``, in order, after checking each one's sha256.

    Raises ``BundleError`` naming the first missing or damaged part."""
    sums = bundle_dir / CHECKSUMS
    if not sums.is_file():
        raise BundleError(f"{sums} is missing: copy the whole bundle folder (parts, {CHECKSUMS}, install.sh)")
    parts = []
    for line in sums.read_text().splitlines():
        if not line.strip():
            continue
        expected, name = line.split(maxsplit=1)
        part = bundle_dir / name.lstrip("*")
        if not part.is_file():
            raise BundleError(f"part {part.name} is missing from {bundle_dir}: copy every part that {CHECKSUMS} lists")
        actual = sha256_file(part)
        if actual != expected:
            raise BundleError(
                f"part {part.name} is damaged (sha256 {actual}, {CHECKSUMS} says {expected}): copy it again"
            )
        parts.append(part)
    if not parts:
        raise BundleError(f"{sums} lists no parts: rebuild the bundle with `verl-ext bundle`")
    return parts


class _ConcatReader(io.RawIOBase):
    """The parts read back to back as one stream."""

    def __init__(self, parts: list[Path]) -> None:
        self._parts = iter(parts)
        self._fh = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        while True:
            if self._fh is None:
                part = next(self._parts, None)
                if part is None:
                    return 0
                self._fh = open(part, "rb")
            count = self._fh.readinto(buffer)
            if count:
                return count
            self._fh.close()
            self._fh = None


def unpack(bundle_dir: Path, dest: Path) -> dict:
    """Check and unpack the parts into ``dest``; returns the manifest."""
    parts = verify_parts(bundle_dir)
    _log(f"{len(parts)} part(s) verified; unpacking into {dest}")
    stream = io.BufferedReader(_ConcatReader(parts), _CHUNK)
    with tarfile.open(fileobj=stream, mode="r|xz" if ".tar.xz." in parts[0].name else "r|") as tar:
        for member in tar:
            if not (member.isfile() or member.isdir()) or member.name.startswith(("/", "..")) or "/../" in member.name:
                raise BundleError(f"unexpected archive member {member.name!r}: rebuild the bundle with `verl-ext bundle`")
            tar.extract(member, dest)
    return json.loads((dest / MANIFEST).read_text())


# ------------------------------------------------------------------------------------------
# Installing (runs on the target as bundle_install.py).
# ------------------------------------------------------------------------------------------


def pth_paths(site_dir: Path) -> list[Path]:
    """The folders the ``.pth`` files in ``site_dir`` add to ``sys.path`` (``import`` lines
    skipped). Python reads ``.pth`` files only in site folders, never in ``PYTHONPATH``."""
    paths = []
    for pth in sorted(site_dir.glob("*.pth")):
        for line in pth.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            path = (site_dir / line).resolve()
            if path.is_dir():
                paths.append(path)
    return list(dict.fromkeys(paths))


def target_pythonpath(target: Path) -> list[str]:
    """What ``PYTHONPATH`` needs for a ``--target`` folder: the folder and its ``.pth`` folders."""
    return [str(target.resolve())] + [str(p) for p in pth_paths(target)]


def write_env_file(target: Path) -> Path:
    """``TARGET/env.sh``: ``PYTHONPATH`` (``target_pythonpath``) and ``PATH`` (the folder's
    console scripts), for ``source``."""
    entries = target_pythonpath(target)
    lines = [
        "# written by verl-ext's bundle installer: source it before running verl / verl-ext",
        f'export PYTHONPATH="{":".join(entries)}${{PYTHONPATH:+:$PYTHONPATH}}"',
    ]
    if (target / "bin").is_dir():
        lines.append(f'export PATH="{(target / "bin").resolve()}:$PATH"')
    env = target / "env.sh"
    env.write_text("\n".join(lines) + "\n")
    return env


def install(
    bundle_dir: Path,
    target: Path | None = None,
    venv: Path | None = None,
    system_site_packages: bool = False,
    work_dir: Path | None = None,
) -> None:
    """Verify, unpack and pip-install a bundle into ``target`` (pip ``--target``) or ``venv``."""
    if (target is None) == (venv is None):
        raise BundleError("give exactly one of --target DIR (a folder for PYTHONPATH) or --venv DIR")
    target = target.resolve() if target is not None else None
    outside = bundle_dir / MANIFEST
    want = json.loads(outside.read_text()).get("python_version") if outside.is_file() else None
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if want and want != have:
        raise BundleError(
            f"this bundle was built for Python {want} but {sys.executable} is {have}: run install.sh with "
            f"PYTHON=python{want}, or rebuild with `verl-ext bundle --python-version {have}`"
        )
    if target is None and want and json.loads(outside.read_text()).get("layout") == "site":
        raise BundleError("this bundle was built with --preinstall (an installed tree): install it with --target DIR")
    with tempfile.TemporaryDirectory(prefix="verl-ext-bundle-", dir=work_dir) as tmp:
        manifest = unpack(bundle_dir, Path(tmp))
        if manifest.get("layout") == "site":
            _log(f"moving the preinstalled tree into {target}")
            merge_tree(Path(tmp) / "site", target)  # type: ignore[arg-type]
            build_sources(bundle_dir, Path(tmp), manifest, target, sys.executable)
            return _finish_target(target, manifest)  # type: ignore[arg-type]
        wheels = sorted(str(p) for p in (Path(tmp) / "wheels").glob("*.whl"))
        pip_args = ["install", "--no-index", "--no-deps", "--disable-pip-version-check", "--no-warn-script-location"]
        if venv is not None:
            python = venv / "bin" / "python"
            if not python.exists():
                _log(f"creating the venv {venv}")
                flags = ["--system-site-packages"] if system_site_packages else []
                _run([sys.executable, "-m", "venv", *flags, str(venv)],
                     "python3 -m venv failed (Debian/Ubuntu: apt install python3-venv), or install with --target DIR")  # fmt: skip
            # --force-reinstall: a resent verl-ext keeps its version number but not its code.
            command = [str(python), "-m", "pip", *pip_args, "--force-reinstall", *wheels]
        else:
            target.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            # --upgrade: a second bundle (a newer verl-ext) replaces what an earlier one put there.
            command = [sys.executable, "-m", "pip", *pip_args, "--upgrade", "--target", str(target), *wheels]
        _log(f"installing {len(wheels)} wheel(s) with pip")
        _run(command, "pip could not install the wheels: see its message above")
        build_sources(bundle_dir, Path(tmp), manifest, target, command[0])
    if target is not None:
        return _finish_target(target, manifest)
    _report_conflicts([str(venv / "bin" / "python")], None, manifest)  # type: ignore[operator]
    _log(f"done: {venv}/bin/python has verl-ext ({venv}/bin/verl-ext doctor checks it)")


def _finish_target(target: Path, manifest: dict) -> None:
    env_file = write_env_file(target)
    pythonpath = os.pathsep.join(target_pythonpath(target))
    _report_conflicts([sys.executable], {**os.environ, "PYTHONPATH": pythonpath}, manifest)
    _log(f"done. Before running verl / verl-ext:  source {env_file}")
    print(env_file.read_text().splitlines()[1], flush=True)


def merge_tree(src: Path, dest: Path) -> None:
    """Move ``src``'s entries into ``dest``, replacing entries of the same name (a later bundle,
    e.g. a resent verl-ext, wins over an earlier one)."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        there = dest / entry.name
        shared = not (entry / "__init__.py").exists() and not entry.name.endswith((".dist-info", ".data"))
        if entry.is_dir() and there.is_dir() and shared:  # bin/, namespace packages (hydra_plugins/)
            merge_tree(entry, there)
            continue
        if there.is_dir() and not there.is_symlink():
            shutil.rmtree(there)
        elif there.exists() or there.is_symlink():
            there.unlink()
        shutil.move(str(entry), there)


def _stack_module(bundle_dir: Path):  # noqa: ANN202 - a module
    """``megatron_stack``: the copy in the bundle (this file runs there as its installer), else the package's."""
    shipped = bundle_dir / STACK_MODULE
    if not shipped.is_file():
        from verl_ext_bundle import megatron_stack

        return megatron_stack
    spec = importlib.util.spec_from_file_location("bundle_megatron_stack", shipped)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def build_sources(bundle_dir: Path, unpacked: Path, manifest: dict, target: Path | None, python: str) -> None:
    """Compile the source packages the manifest lists under ``builds`` (transformer_engine_torch for
    the megatron extra) against this machine's torch and CUDA, reporting each build's time."""
    for item in manifest.get("builds", []):
        _log(f"compiling {item['name']} {item['version']} here against this machine's torch and CUDA "
             f"({item['why']}); this takes a minute or two on 16 cores")  # fmt: skip
        try:
            seconds = _stack_module(bundle_dir).build_te_torch(unpacked / item["sdist"], target, python)
        except RuntimeError as exc:
            raise BundleError(f"{item['name']}: {exc}") from exc
        _log(f"built and installed {item['name']} {item['version']} in {seconds:.0f} s")


def megatron_plan(
    pip: _Pip, kept: list[Resolved], requirements: list[str], present: dict[str, str | None], work: Path
) -> tuple[list[Resolved], list[tuple[Path, str]], list[dict]]:
    """The megatron extra: Megatron wheels and the TransformerEngine release that loads with the
    target's cuBLAS (``megatron_stack.te_version_for_cublas``), without their requirements; what
    verl's engine imports through Megatron-Bridge (``MEGATRON_RUNTIME``), with theirs; and
    transformer_engine_torch's source package, which the installer compiles on the target.
    The runtime imports are resolved together with verl-ext's own ``requirements`` (so hydra's
    omegaconf pin holds) and only what those do not already bring is added: a ``--no-deps``
    add-on bundle then installs over the base bundle without replacing any of its packages.
    Returns (packages to bundle, source files for the archive, the manifest's ``builds``)."""
    stack = _stack_module(Path(__file__).parent)
    flavour, cublas = stack.target_cublas(present)
    te_version, why = stack.te_version_for_cublas(cublas)
    _log(f"megatron: TransformerEngine {te_version} ({flavour}): {why}")
    wanted = [*stack.MEGATRON_WHEELS, *stack.te_requirements(flavour, te_version)]
    extra = pip.resolve(["--no-deps", *wanted], work / "report-megatron.json", True)
    def resolve(wanted: list[str], name: str) -> list[Resolved]:
        return select(pip.resolve(wanted, work / name, True), present, pip.opts.excludes)[0]

    base = kept if not pip.opts.no_deps else resolve(requirements, "report-megatron-base.json")
    have = {item.name for item in base + extra}
    runtime = resolve([*requirements, *stack.MEGATRON_RUNTIME], "report-megatron-runtime.json")
    extra += [item for item in runtime if item.name not in have]
    names = {item.name for item in extra}
    try:
        sdist = stack.fetch_sdist(stack.TE_TORCH, te_version, work / "sources")
    except (OSError, RuntimeError) as exc:
        raise BundleError(f"fetching {stack.TE_TORCH} {te_version}'s source package failed: {exc}") from exc
    build = {"name": stack.TE_TORCH, "version": te_version, "sdist": f"sources/{sdist.name}", "why": why}
    return [i for i in kept if i.name not in names] + extra, [(sdist, build["sdist"])], [build]


_PIP_CHECK = re.compile(r"^(\S+) \S+ (?:requires|has requirement) ([A-Za-z0-9][A-Za-z0-9._-]*)")


def bundle_conflicts(pip_check_output: str, bundled: Iterable[str], left_out: Iterable[str] = ()) -> list[str]:
    """The lines of ``pip check`` about the bundle's own packages (``NAME VERSION requires X`` /
    ``has requirement X...``), minus those about a package the bundle left out on purpose; the
    rest is the machine's own business."""
    names = {canonical_name(name) for name in bundled}
    skip = {canonical_name(name) for name in left_out}
    problems = []
    for line in pip_check_output.splitlines():
        match = _PIP_CHECK.match(line.strip())
        if match and canonical_name(match.group(1)) in names and canonical_name(match.group(2)) not in skip:
            problems.append(line.strip())
    return problems


def _report_conflicts(python: list[str], env: dict[str, str] | None, manifest: dict) -> None:
    """Warn about requirements of bundled packages the target does not meet (a package the
    freeze listed without a version, a package the bundle left out on purpose)."""
    try:
        result = subprocess.run([*python, "-m", "pip", "check"], env=env, capture_output=True, text=True)
    except OSError:
        return  # no pip on the target: the check is informational
    # Packages left out by an exclude rule are expected to be missing or at another version;
    # those the freeze said the target has are reported: the freeze may be wrong.
    on_purpose = [p["name"] for p in manifest.get("left_out", []) if not p["why"].startswith(PRESENT)]
    problems = bundle_conflicts(result.stdout, [p["name"] for p in manifest["packages"]], on_purpose)
    if problems:
        _log(f"pip check: {len(problems)} requirement(s) of bundled packages not met here (informational; "
             "packages left out by an exclude rule, listed in manifest.json, are not reported):")  # fmt: skip
        for line in problems:
            print(f"    {line}", flush=True)


def _run(command: list[str], fix: str) -> None:
    result = subprocess.run(command)
    if result.returncode != 0:
        raise BundleError(f"`{' '.join(command[:6])} ...` exited with {result.returncode}: {fix}")


# ------------------------------------------------------------------------------------------
# Building (here, with an index).
# ------------------------------------------------------------------------------------------


@dataclass
class BuildOptions:
    out: Path
    freeze: Path | None
    python_version: str
    platforms: list[str]
    extras: list[str]
    requires: list[str]
    excludes: list[Exclude]
    strips: list[Strip]
    part_size: int
    project: Path | None
    wheel: Path | None
    find_links: list[Path]
    no_deps: bool
    xz_preset: int | None
    force: bool
    preinstall: bool = False


# pip's `install --dry-run --report` takes --platform/--python-version only from 23.3 on (pip #12215);
# older pips stop with "Can not use any platform or abi specific options unless installing via '--target'".
MIN_PIP = (23, 3)


def pip_version_problem(version: str, python: str = sys.executable) -> str | None:
    """Why pip ``version`` (in ``python``) cannot build a bundle, with the upgrade command; None if it can."""
    if tuple(int(part) for part in re.findall(r"\d+", version)[:2]) >= MIN_PIP:
        return None
    wanted = ".".join(map(str, MIN_PIP))
    return (f"building a bundle needs pip >= {wanted} (an older pip refuses to resolve for another platform with "
            f"`pip install --dry-run --report --platform`); {python} has pip {version}. "
            f"Fix: {python} -m pip install --upgrade 'pip>={wanted}'")  # fmt: skip


def check_pip() -> None:
    """Raise ``BundleError`` unless this Python has a pip that can resolve for the target."""
    try:
        import pip
    except ImportError as exc:
        raise BundleError("building a bundle needs pip in this Python: python -m ensurepip") from exc
    problem = pip_version_problem(pip.__version__)
    if problem:
        raise BundleError(problem)


def resolve_failure(lines: list[str], requirements: list[str], python_version: str, platforms: list[str]) -> str:
    """The summary of a failed ``pip install --dry-run``: the cause in pip's own words (its ERROR lines
    and the conflict it lists), and the fix when the cause is that no set of versions fits."""
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    conflict = next((i for i, line in enumerate(lines) if "conflict is caused by" in line), None)
    if conflict is not None:
        errors += [line.strip() for line in lines[conflict + 1:conflict + 5] if line.startswith(" ")]
    message = (f"pip could not resolve {' '.join(requirements)} for Python {python_version} on "
               f"{', '.join(platforms[:3])}... with the target's packages (--freeze) held")  # fmt: skip
    message += (": " + " | ".join(errors[:6])) if errors else " (pip's output is above)"
    if conflict is not None or any("No matching distribution" in e for e in errors):
        message += (". Fix: pin a version with --require 'NAME==VERSION' (it overrides the freeze), give wheels "
                    "with --find-links DIR, or add the target's newest --platform tag (e.g. manylinux_2_35_x86_64)")
    return message


class _Pip:
    """pip run so that it sees only the target's stand-ins as installed packages (``check_pip`` first)."""

    def __init__(self, work: Path, opts: BuildOptions) -> None:
        import pip

        self.opts = opts
        piponly, self.standins = work / "pip-only", work / "standins"
        piponly.mkdir()
        self.standins.mkdir()
        (piponly / "pip").symlink_to(Path(pip.__file__).parent, target_is_directory=True)
        self.env = {**os.environ, "PYTHONPATH": f"{piponly}{os.pathsep}{self.standins}", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        self.links = [arg for d in opts.find_links for arg in ("--find-links", str(d))]
        self.target_flags = [
            "--only-binary=:all:", "--implementation", "cp", "--python-version", opts.python_version,
            *[arg for tag in opts.platforms for arg in ("--platform", tag)],
        ]  # fmt: skip

    def run(self, args: list[str], what: str) -> tuple[int, list[str]]:
        """Run ``python -S -m pip ARGS``, echoing its output as progress; (exit code, lines)."""
        _log(f"{what} (pip; this fetches from the index and can take minutes)")
        proc = subprocess.Popen(
            [sys.executable, "-S", "-m", "pip", *args, *self.links],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line.rstrip())
            if not line.startswith("Would install"):
                print(f"    {line.rstrip()}", flush=True)
        return proc.wait(), lines

    def resolve(self, requirements: list[str], report: Path, for_target: bool) -> list[Resolved]:
        args = ["install", "--dry-run", "--report", str(report), *requirements]
        code, lines = self.run(args + (self.target_flags if for_target else []),
                               "resolving for the target" if for_target else "looking for sdist-only packages")  # fmt: skip
        if code != 0:
            raise BundleError(resolve_failure(lines, requirements, self.opts.python_version, self.opts.platforms))
        items = json.loads(report.read_text())["install"]
        return [
            Resolved(canonical_name(i["metadata"]["name"]), i["metadata"]["version"], i["download_info"]["url"])
            for i in items
        ]

    def add_standins(self, packages: dict[str, str]) -> None:
        """Make pip see ``packages`` (name -> version) as installed, replacing earlier stand-ins."""
        for name, version in packages.items():
            stem = name.replace("-", "_")
            for old in self.standins.glob(f"{stem}-*.dist-info"):
                shutil.rmtree(old)
            info = self.standins / f"{stem}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _project_root(opts: BuildOptions) -> Path:
    root = opts.project or Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file() or not (root / "verl_ext").is_dir():
        raise BundleError(
            f"{root} is not verl-ext's source tree (no pyproject.toml + verl_ext/): pass --project DIR "
            "(a checkout of verl-ext) or --wheel PATH (a verl-ext wheel)"
        )
    return root


def build_project_wheel(opts: BuildOptions, dest: Path) -> Path:
    """verl-ext's wheel: ``--wheel`` as given, else built from a copy of the source tree (so
    that no build/ or egg-info folder lands in the checkout)."""
    if opts.wheel is not None:
        if not opts.wheel.is_file() or wheel_name_version(opts.wheel.name)[0] != PROJECT:
            raise BundleError(f"--wheel {opts.wheel}: not a verl-ext wheel file")
        return Path(shutil.copy2(opts.wheel, dest))
    root = _project_root(opts)
    src = dest.parent / "verl-ext-src"
    skip = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "outputs", "runs", "tests", "docs")
    shutil.copytree(root, src, ignore=skip)
    _log(f"building the verl-ext wheel from {root}")
    # This Python's setuptools builds it offline; without one pip fetches it into an isolated build.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(dest), str(src)],
        capture_output=True, text=True,
    )  # fmt: skip
    shutil.rmtree(src)
    wheels = list(dest.glob("verl_ext-*.whl"))
    if result.returncode != 0 or not wheels:
        raise BundleError(
            f"building verl-ext's wheel failed:\n{result.stdout}{result.stderr}\n"
            "Fix: pip install setuptools wheel in this Python, or pass --wheel PATH"
        )
    return wheels[0]


def build_sdist_wheels(pip: _Pip, sdists: list[Resolved], dest: Path) -> None:
    """Build the pure-Python sdists into wheels in ``dest`` (a --find-links folder). A package
    whose sdist builds a platform wheel cannot be built here for the target: its wheel is left
    out, so the target resolution must find a binary wheel or fail."""
    for item in sdists:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            code, lines = pip.run(
                ["wheel", "--no-deps", "-w", tmp, f"{item.name}=={item.version}"], f"building {item.name} {item.version} from its sdist"
            )  # fmt: skip
            built = list(Path(tmp).glob("*.whl"))
            if code != 0 or not built:
                raise BundleError(f"{item.name} {item.version} has no wheel and its sdist failed to build (above): "
                                  f"give a wheel with --find-links DIR or pin another version with --require")  # fmt: skip
            if is_pure_wheel(built[0].name):
                shutil.move(str(built[0]), dest / built[0].name)
            else:
                _log(f"{built[0].name} is not pure Python: it cannot be built here for the target; not used")


def _download(pip: _Pip, items: list[Resolved], dest: Path) -> list[Path]:
    """The wheels of ``items``: local files copied, the rest fetched with ``pip download``."""
    remote = []
    for item in items:
        if item.url.startswith("file://"):
            shutil.copy2(unquote(urlparse(item.url).path), dest)
        else:
            remote.append(f"{item.name}=={item.version}")
    if remote:
        args = ["download", "--no-deps", "-d", str(dest), *pip.target_flags, *remote]
        code, _ = pip.run(args, f"downloading {len(remote)} wheels")
        if code != 0:
            raise BundleError("pip download failed (above): check the network/index, or give wheels with --find-links DIR")
    found = {wheel_name_version(p.name): p for p in dest.glob("*.whl")}
    wheels = []
    for item in items:
        match = next((p for (n, v), p in found.items() if n == item.name and versions_match(item.version, v)), None)
        if match is None:
            raise BundleError(f"no wheel of {item.name} {item.version} arrived in {dest}: rerun; if it persists, "
                              "give it with --find-links DIR")  # fmt: skip
        wheels.append(match)
    return wheels


def preinstall_tree(wheels: list[Path], tree: Path, target_flags: list[str]) -> list[tuple[Path, str]]:
    """Install ``wheels`` into ``tree`` here (pip ``--target`` for the target's Python and
    platform, no byte-code) and return its files as (path, name in the archive under ``site/``).
    Console scripts get ``#!/usr/bin/env python3``: pip wrote this interpreter's path."""
    _log(f"installing {len(wheels)} wheels into a tree for the target (--preinstall)")
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--no-warn-script-location", "--target", str(tree),
               *target_flags, *map(str, wheels)]  # fmt: skip
    _run(command, "pip could not install the wheels into the --preinstall tree (above): rebuild without --preinstall")
    for script in (tree / "bin").glob("*") if (tree / "bin").is_dir() else ():
        lines = script.read_bytes().split(b"\n", 1)
        if lines[0].startswith(b"#!") and b"python" in lines[0]:
            script.write_bytes(b"#!/usr/bin/env python3\n" + (lines[1] if len(lines) > 1 else b""))
    files = []
    for path in sorted(tree.rglob("*")):
        if path.is_symlink():
            raise BundleError(f"{path.relative_to(tree)} is a symbolic link: rebuild without --preinstall")
        if path.is_file():
            files.append((path, f"site/{path.relative_to(tree).as_posix()}"))
    return files


def resolve_rounds(
    pip: _Pip, requirements: list[str], present: dict[str, str | None], excludes: list[Exclude], report: Path
) -> tuple[list[Resolved], list[tuple[Resolved, str]]]:
    """Resolve for the target until nothing more is left out: each left-out package becomes a
    stand-in at the version pip chose and pip resolves again, so that the requirements of what
    is not shipped stop shaping the bundle (vLLM pins numba 0.65, whose numpy cap would
    otherwise bundle an older numpy although the target keeps its numba 0.68 and numpy 2.5)."""
    left_out: dict[str, tuple[Resolved, str]] = {}
    for round_ in range(1, 6):
        kept, dropped = select(pip.resolve(requirements, report, for_target=True), present, excludes)
        if not dropped:
            return kept, list(left_out.values())
        left_out.update({item.name: (item, why) for item, why in dropped})
        _log(f"round {round_}: {len(dropped)} package(s) left out ({', '.join(i.name for i, _ in dropped[:8])}"
             f"{', ...' if len(dropped) > 8 else ''}); resolving again with them as installed")  # fmt: skip
        pip.add_standins({item.name: item.version for item, _ in dropped})
    raise BundleError(
        "the resolution did not settle in 5 rounds (left-out packages keep changing version): "
        "pin the packages named above with --require NAME==VERSION"
    )


def build(opts: BuildOptions) -> Path:
    """Build the bundle described by ``opts`` into ``opts.out``; returns the folder."""
    started = time.monotonic()
    check_pip()
    out = opts.out = opts.out.resolve()
    if out.exists() and any(out.iterdir()):
        if not opts.force:
            raise BundleError(f"--out {out} is not empty: give an empty or new folder, or --force to replace a bundle there")
        if not (out / CHECKSUMS).exists():
            raise BundleError(f"--force: {out} holds no bundle ({CHECKSUMS} missing); refusing to delete it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    present: dict[str, str | None] = {}
    if opts.freeze is not None:
        if not opts.freeze.is_file():
            raise BundleError(f"--freeze {opts.freeze}: no such file (write it with `python3 -m pip freeze` on the target)")
        present = parse_freeze(opts.freeze.read_text(), f"--freeze {opts.freeze}")
        present.pop(PROJECT, None)
        unknown = sorted(n for n, v in present.items() if v is None)
        if unknown:
            _log(f"trusting {len(unknown)} package(s) of the freeze with no version to be what their users need "
                 f"({', '.join(unknown[:6])}{', ...' if len(unknown) > 6 else ''})")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bundle-work-", dir=out.parent) as tmp:
        work = Path(tmp)
        local = work / "local-wheels"
        local.mkdir()
        opts.find_links = [local, *opts.find_links]
        project_wheel = build_project_wheel(opts, local)
        pip = _Pip(work, opts)
        pip.add_standins({name: version for name, version in present.items() if version is not None})
        # The megatron extra is not resolved by pip: megatron_plan brings its wheels without their requirements.
        pip_extras = [extra for extra in opts.extras if extra != "megatron"]
        requirements = [str(project_wheel) + (f"[{','.join(pip_extras)}]" if pip_extras else ""), *opts.requires]
        if opts.no_deps:
            kept = [Resolved(PROJECT, wheel_name_version(project_wheel.name)[1], project_wheel.as_uri())]
            kept += pip.resolve(["--no-deps", *opts.requires], work / "report.json", True) if opts.requires else []
            dropped = []
        else:
            local_plan = pip.resolve(requirements, work / "report-local.json", for_target=False)
            sdists = [i for i in local_plan if not i.url.endswith(".whl")]
            if sdists:
                build_sdist_wheels(pip, sdists, local)
            kept, dropped = resolve_rounds(pip, requirements, present, opts.excludes, work / "report.json")
        sources: list[tuple[Path, str]] = []
        builds: list[dict] = []
        if "megatron" in opts.extras:
            kept, sources, builds = megatron_plan(pip, kept, requirements, present, work)
        _log(f"{len(kept)} packages bundled, {len(dropped)} left out")
        downloaded = work / "downloaded"
        downloaded.mkdir()
        wheels = _download(pip, kept, downloaded)
        stored = work / "wheels"
        stored.mkdir()
        packages = []
        # Uncompressed wheels only where xz compresses the wheels themselves (not the --preinstall tree).
        rezip = opts.xz_preset is not None and not opts.preinstall
        for item, wheel in zip(kept, wheels):
            prefixes = [s.prefix for s in opts.strips if s.package == item.name]
            if prefixes or rezip:
                stripped = repack_wheel(wheel, stored / wheel.name, prefixes, stored=rezip)
            else:
                stripped = []
                os.link(wheel, stored / wheel.name)
            packages.append({"name": item.name, "version": item.version, "wheel": wheel.name,
                             "bytes": wheel.stat().st_size, "stripped": stripped})  # fmt: skip
        files = [(p, f"wheels/{p.name}") for p in sorted(stored.iterdir())]
        if opts.preinstall:
            files = preinstall_tree(sorted(stored.iterdir()), work / "site", pip.target_flags)
        manifest = {
            "layout": "site" if opts.preinstall else "wheels",
            "verl_ext_version": wheel_name_version(project_wheel.name)[1],
            "python_version": opts.python_version,
            "platforms": opts.platforms,
            "extras": opts.extras,
            "requires": opts.requires,
            "packages": packages,
            "left_out": [{"name": i.name, "version": i.version, "why": why} for i, why in dropped],
            "strips": [vars(s) for s in opts.strips],
            "builds": builds,
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1))
        parts = pack([(work / MANIFEST, MANIFEST), *files, *sources], out, opts.part_size, opts.xz_preset)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.copy2(__file__, out / INSTALLER)
    shutil.copy2(Path(__file__).with_name(STACK_MODULE), out / STACK_MODULE)
    (out / "install.sh").write_text(INSTALL_SH)
    (out / "install.sh").chmod(0o755)
    sizes = ", ".join(f"{p.stat().st_size / 2**20:.1f}" for p in parts)
    _log(f"bundle ready in {out} after {time.monotonic() - started:.0f} s: {len(packages)} wheels, "
         f"{len(parts)} part(s) of {sizes} MiB; install with: bash {out}/install.sh --target DIR")  # fmt: skip
    return out


INSTALL_SH = """#!/usr/bin/env bash
# Install this verl-ext offline bundle (checks every part's sha256, then pip-installs the wheels).
#   bash install.sh --target DIR    # a folder for PYTHONPATH; then: source DIR/env.sh
#   bash install.sh --venv DIR      # a venv (created if missing; --system-site-packages to see
#                                   # the machine's torch)
# PYTHON=python3.12 bash install.sh ... picks the interpreter (default: python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "${PYTHON:-python3}" "$here/bundle_install.py" install --bundle "$here" "$@"
"""


# ------------------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-ext bundle",
        description="Build an offline install bundle of verl-ext and its dependencies for another machine "
        "(`verl-ext bundle install ...` installs one; the bundle's install.sh calls that).",
    )
    parser.add_argument("--out", type=Path, help="folder for the bundle (new or empty)")
    parser.add_argument("--freeze", type=Path, help="the target's `python3 -m pip freeze` (what it already has)")
    parser.add_argument("--python-version", default=f"{sys.version_info[0]}.{sys.version_info[1]}",
                        help="the target's Python, e.g. 3.12 (default: this one)")  # fmt: skip
    parser.add_argument("--platform", action="append", default=[],
                        help="a target platform tag, repeatable; manylinux_2_N_x86_64 brings the older ones "
                        "(default: this machine's)")  # fmt: skip
    parser.add_argument("--extras", default="", help=f"comma-separated verl-ext extras: {', '.join(EXTRAS)}")
    parser.add_argument("--require", action="append", default=[],
                        help="another requirement, e.g. 'transformers==5.10.4' (overrides the freeze); repeatable")  # fmt: skip
    parser.add_argument("--exclude", action="append", default=[], help="leave out packages matching this name pattern")
    parser.add_argument("--include", action="append", default=[], help="bundle this package although a default exclude matches it")
    parser.add_argument("--no-default-excludes", action="store_true", help="bundle what DEFAULT_EXCLUDES would leave out")
    parser.add_argument("--no-strip", action="store_true", help="keep Ray's jars and RLlib (DEFAULT_STRIPS)")
    parser.add_argument("--list-excludes", action="store_true", help="print the default excludes and strips, then exit")
    parser.add_argument("--part-size", default="60M", help="largest part, e.g. 60M (default)")
    parser.add_argument("--preinstall", action="store_true",
                        help="install the wheels into a tree here and pack the tree xz-compressed (--xz 4 unless "
                        "given): about a third of the wheels' size for vLLM; the target needs no pip, --target only")  # fmt: skip
    parser.add_argument("--xz", type=int, metavar="PRESET", choices=range(10),
                        help="re-zip the wheels uncompressed and xz the whole stream at this preset (0-9): "
                        "5-15%% smaller parts than the wheels' own compression, but slow (minutes per GB)")  # fmt: skip
    parser.add_argument("--project", type=Path, help="verl-ext source tree to build the wheel from (default: this one)")
    parser.add_argument("--wheel", type=Path, help="use this verl-ext wheel instead of building one")
    parser.add_argument("--find-links", action="append", type=Path, default=[], help="a folder of extra wheels")
    parser.add_argument("--no-deps", action="store_true", help="bundle only the verl-ext wheel (and --require items)")
    parser.add_argument("--force", action="store_true", help="replace a bundle already in --out")
    return parser


def _install_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bundle install", description="Verify and install a verl-ext bundle.")
    parser.add_argument("--bundle", type=Path, default=Path(__file__).resolve().parent, help="the bundle folder")
    parser.add_argument("--target", type=Path, help="install into this folder (pip --target); writes DIR/env.sh")
    parser.add_argument("--venv", type=Path, help="install into this venv (created if missing)")
    parser.add_argument("--system-site-packages", action="store_true", help="a created venv sees the system's packages")
    parser.add_argument("--work-dir", type=Path, help="where to unpack (default: the temp folder)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``verl-ext bundle [options]`` builds; ``verl-ext bundle install [options]`` installs."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["install"]:
            args = _install_parser().parse_args(argv[1:])
            install(args.bundle, args.target, args.venv, args.system_site_packages, args.work_dir)
            return 0
        args = _build_parser().parse_args(argv)
        if args.list_excludes:
            for rule in DEFAULT_EXCLUDES:
                print(f"exclude {rule.pattern:<22} {rule.reason}" + (f" (if the target has {rule.when_present})" if rule.when_present else ""))
            for strip in DEFAULT_STRIPS:
                print(f"strip   {strip.package}:{strip.prefix:<16} {strip.reason}")
            return 0
        if args.out is None:
            raise BundleError("--out DIR is needed: the folder the bundle is written to")
        extras = [e.strip() for e in args.extras.split(",") if e.strip()]
        unknown = sorted(set(extras) - set(EXTRAS))
        if unknown:
            raise BundleError(f"--extras: unknown {', '.join(unknown)}; choose from {', '.join(EXTRAS)}")
        if not re.fullmatch(r"3\.\d+", args.python_version):
            raise BundleError(f"--python-version {args.python_version!r}: write MAJOR.MINOR, e.g. 3.12")
        if args.freeze is None and not args.no_deps:
            raise BundleError("--freeze FILE is needed (the target's `python3 -m pip freeze`), or --no-deps")
        opts = BuildOptions(
            out=args.out, freeze=args.freeze, python_version=args.python_version,
            platforms=expand_platform_tags(args.platform or local_platform_tags()), extras=extras,
            requires=args.require, excludes=choose_excludes(args.exclude, args.include, not args.no_default_excludes),
            strips=[] if args.no_strip else list(DEFAULT_STRIPS), part_size=parse_size(args.part_size),
            project=args.project, wheel=args.wheel, find_links=args.find_links, no_deps=args.no_deps,
            xz_preset=4 if args.preinstall and args.xz is None else args.xz, force=args.force,
            preinstall=args.preinstall,
        )  # fmt: skip
        build(opts)
        return 0
    except BundleError as exc:
        print(f"verl-ext bundle: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
