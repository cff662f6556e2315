"""What verl's Megatron engine needs on a machine, and how an offline bundle brings it there.

verl 0.9.1's Megatron engine builds its model through Megatron-Bridge, which imports
TransformerEngine's PyTorch layer (``transformer_engine.pytorch``) as it is imported. That layer
has three parts, and each fails differently on a GPU machine without an index:

- ``transformer_engine`` (Python, a wheel) and the core library ``transformer_engine_cu12|cu13``
  (``libtransformer_engine.so``, a 190 MB wheel). The core library links the machine's cuBLASLt:
  TransformerEngine 2.13 and later call ``cublasLtGroupedMatrixLayoutInit_internal``, which
  nvidia-cublas ships only from 13.2 on. On an H200 with torch 2.11.0+cu130 and nvidia-cublas
  13.1.0.3, TE 2.16.1's core stops at load with ``undefined symbol:
  cublasLtGroupedMatrixLayoutInit_internal, version libcublasLt.so.13``; the cores of 2.11.0 and
  2.12.0 need no cuBLASLt symbol that 13.1.0.3 lacks (read from the wheels with objdump).
  :func:`te_version_for_cublas` keeps that rule.
- ``transformer_engine_torch``, the compiled extension, has no wheel on the index: only a
  source package (0.3 MB), which must be compiled against the target's own torch and CUDA.
  ``pip download`` of it fails on a machine without CUDA (pip builds its metadata, and its
  ``setup.py`` needs CUDA), so :func:`fetch_sdist` takes the file straight from the index's
  simple page, and :func:`build_te_torch` compiles it on the target (89 s on 16 cores).

verl's own ``megatron`` extra pins ``megatron-bridge==0.5.2``, which the index does not have;
:data:`MEGATRON_WHEELS` are the versions that import together (megatron-bridge 0.6.2 needs
megatron-core 0.19). Megatron-Bridge declares ~30 requirements (diffusers, mlflow, comet-ml, a
second flashinfer pin, ...) that the text models verl trains never import, so these wheels come
without their requirements; what verl's engine does import through them (:data:`MEGATRON_RUNTIME`)
is resolved with its requirements against the target.

Only the standard library is imported at module level: the bundle ships this file beside its
installer, which runs on the target before anything else is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

MEGATRON_WHEELS = ("megatron-core==0.19.2", "megatron-bridge==0.6.2", "mbridge==0.15.1")
# What verl's Megatron engine reaches in Megatron-Bridge imports, resolved with their requirements
# against the target: its training config imports megatron.energon; every checkpoint's HF export
# imports modelopt (seen on the H200: ModuleNotFoundError in the worker at model build / save).
MEGATRON_RUNTIME = ("megatron-energon==7.4.1", "nvidia-modelopt==0.47.0")

# (first nvidia-cublas version with cublasLtGroupedMatrixLayoutInit_internal, TE needing it)
GROUPED_LAYOUT_CUBLAS = (13, 2)
TE_NEEDS_GROUPED_LAYOUT = "2.16.1"  # newest TE measured (its extension builds on the H200 in 89 s)
TE_WITHOUT_GROUPED_LAYOUT = "2.12.0"  # newest TE whose core loads with cuBLAS < 13.2

TE_TORCH = "transformer-engine-torch"
SIMPLE_INDEX = "https://pypi.org/simple"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def te_version_for_cublas(cublas_version: str | None) -> tuple[str, str]:
    """The TransformerEngine release whose core library loads with this nvidia-cublas, and why.

    ``None`` (the version is not known) gives the release that loads with every cuBLAS 12 and 13
    measured. Returns ``(te_version, reason)``.
    """
    if cublas_version is None:
        return TE_WITHOUT_GROUPED_LAYOUT, (
            "the target's nvidia-cublas version is unknown: TransformerEngine "
            f"{TE_WITHOUT_GROUPED_LAYOUT}, whose core needs no cuBLASLt symbol newer than 13.1"
        )
    if _release(cublas_version)[:2] >= GROUPED_LAYOUT_CUBLAS:
        return TE_NEEDS_GROUPED_LAYOUT, (
            f"nvidia-cublas {cublas_version} has cublasLtGroupedMatrixLayoutInit_internal (13.2 and later)"
        )
    return TE_WITHOUT_GROUPED_LAYOUT, (
        f"nvidia-cublas {cublas_version} lacks cublasLtGroupedMatrixLayoutInit_internal, which "
        f"TransformerEngine 2.13 and later need (first in 13.2): {TE_WITHOUT_GROUPED_LAYOUT} is the newest "
        "release whose core library loads with it"
    )


def target_cublas(present: dict[str, str | None]) -> tuple[str, str | None]:
    """``(cuda flavour, nvidia-cublas version)`` from the target's packages (canonical names):
    CUDA 13's cuBLAS is ``nvidia-cublas``, CUDA 12's ``nvidia-cublas-cu12``."""
    if "nvidia-cublas-cu12" in present:
        return "cu12", present["nvidia-cublas-cu12"]
    torch_version = present.get("torch") or ""
    if "nvidia-cublas" in present or "+cu13" in torch_version:
        return "cu13", present.get("nvidia-cublas")
    if "+cu12" in torch_version:
        return "cu12", None
    return "cu13", None


def te_requirements(flavour: str, te_version: str) -> list[str]:
    """The TransformerEngine wheels for one release: the Python package and its core library."""
    return [f"transformer-engine=={te_version}", f"transformer-engine-{flavour}=={te_version}"]


def fetch_sdist(name: str, version: str, dest: Path, index: str = SIMPLE_INDEX) -> Path:
    """Download ``name``'s source package of ``version`` from the index's simple page (PEP 691
    JSON) into ``dest``, checking its sha256; nothing of it is built here."""
    import hashlib

    request = urllib.request.Request(f"{index.rstrip('/')}/{name}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    stem = f"{name.replace('-', '_')}-{version}.tar.gz"
    found = [f for f in files if f["filename"].lower() == stem.lower()]
    if not found:
        raise RuntimeError(f"{index}/{name}/ lists no {stem}: pick a release that has a source package")
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / found[0]["filename"]
    with urllib.request.urlopen(found[0]["url"], timeout=300) as response:
        path.write_bytes(response.read())
    want = found[0].get("hashes", {}).get("sha256")
    if want and hashlib.sha256(path.read_bytes()).hexdigest() != want:
        path.unlink()
        raise RuntimeError(f"{stem}: sha256 does not match the index's; download it again")
    return path


# ------------------------------------------------------------------------------------------
# On the target: compile transformer_engine_torch against the target's torch and CUDA.
# ------------------------------------------------------------------------------------------

_PROBE = "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__))); print(torch.version.cuda)"


def cuda_include_dirs(site_dir: Path) -> list[str]:
    """The header folders of the CUDA wheels beside torch (cudnn.h, nccl.h, cublas_v2.h, ...):
    ``nvidia/*/include`` and ``nvidia/cu13/*/include``-style layouts."""
    found = sorted(site_dir.glob("nvidia/*/include")) + sorted(site_dir.glob("nvidia/*/*/include"))
    return [str(path) for path in found if path.is_dir()]


def build_te_torch(sdist: Path, target: Path | None, python: str = sys.executable, jobs: int | None = None) -> float:
    """Compile ``transformer_engine_torch`` from ``sdist`` with ``python``'s torch and install the
    wheel into ``target`` (pip ``--target``; ``None``: into ``python``'s environment); returns the
    build's seconds.

    Needs ``nvcc`` and a C++ compiler; the CUDA headers come from the CUDA wheels beside torch
    (``CPATH``). ``NVTE_WITH_NCCL_EP=0``: the expert-parallel NCCL path needs a newer NCCL than
    torch's wheel brings, and dense models never use it.
    """
    paths = [str(target) if target is not None else None, os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    probe = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"building {TE_TORCH} needs torch in {python}: {probe.stderr.strip()[-300:]}")
    site_dir, torch_cuda = probe.stdout.split()
    if torch_cuda == "None":
        raise RuntimeError(f"building {TE_TORCH} needs a CUDA build of torch; {python}'s torch has no CUDA")
    includes = cuda_include_dirs(Path(site_dir))
    env.update(
        NVTE_PYTORCH_FORCE_BUILD="TRUE", NVTE_WITH_NCCL_EP="0", NVTE_FRAMEWORK="pytorch",
        MAX_JOBS=str(jobs or os.cpu_count() or 4),
        CPATH=os.pathsep.join(includes + [p for p in [os.environ.get("CPATH")] if p]),
    )  # fmt: skip
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="te-torch-build-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        source = next(Path(tmp).iterdir())
        wheels = Path(tmp) / "wheels"
        build = subprocess.run(
            [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", str(wheels), "."],
            cwd=source, env=env, capture_output=True, text=True,
        )  # fmt: skip
        built = sorted(wheels.glob("*.whl"))
        if build.returncode != 0 or not built:
            raise RuntimeError(
                f"compiling {sdist.name} failed ({time.monotonic() - started:.0f} s); its last output:\n"
                f"{(build.stdout + build.stderr)[-4000:]}\nIt needs nvcc (CUDA toolkit {torch_cuda}), g++ and the "
                f"CUDA headers beside torch (CPATH={env['CPATH'] or 'none found'})"
            )
        seconds = time.monotonic() - started
        # pip --target --upgrade replaces whole top-level folders: the wheel's transformer_engine/
        # would replace the core's. Install beside, then merge file by file.
        staging = Path(tmp) / "staging"
        install = subprocess.run(
            [python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-warn-script-location",
             "--disable-pip-version-check", *(["--target", str(staging)] if target is not None else []), str(built[0])],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        if install.returncode != 0:
            raise RuntimeError(f"installing {built[0].name} into {target} failed: {install.stderr[-2000:]}")
        if target is not None:
            shutil.copytree(staging, target, dirs_exist_ok=True)
    return seconds
