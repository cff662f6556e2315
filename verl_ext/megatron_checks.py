"""Is this machine ready for verl's Megatron engine? The start-up check and ``verl-ext doctor``'s report.

Without this, a Megatron config on a machine lacking TransformerEngine (or with a core library
that cannot load) fails minutes in, inside a Ray worker, when Megatron-Bridge is first imported.
Here the import of ``transformer_engine.pytorch`` is tried in a child process (a failed load
leaves half-imported CUDA libraries behind) and its error is turned into one sentence: the
package, the cause (missing module, library or symbol) and the command that fixes it
(``verl-ext bundle --extras megatron``, whose TransformerEngine pairs with the machine's cuBLAS:
``verl_ext_bundle.megatron_stack.te_version_for_cublas``, the rule the bundle follows).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from typing import Any

from verl_ext.gpu_checks import installed_version, select
from verl_ext_bundle.megatron_stack import MEGATRON_WHEELS, TE_TORCH, te_version_for_cublas

TE_IMPORT = "transformer_engine.pytorch"
# an add-on to the GPU machine's base bundle (README "Offline install bundle"), with its extras so
# that what the add-on brings agrees with what the base brought (docs/howto/megatron.md)
BUNDLE_COMMAND = (
    "verl-ext bundle --out megatron-bundle --no-deps --extras vllm,gui,judge,megatron --freeze target-freeze.txt "
    "--python-version 3.12 --platform manylinux_2_35_x86_64 --preinstall  (here, with an index; "
    "target-freeze.txt = `python3 -m pip freeze` of the target), then on the target: "
    "bash megatron-bundle/install.sh --target SITE (it compiles transformer_engine_torch there); with an "
    "index: pip install 'verl-ext[megatron]' && pip install --no-deps megatron-bridge==0.6.2"
)
_UNDEFINED_SYMBOL = re.compile(r"(\S+\.so[.\d]*): undefined symbol: (\S+?)(?:, version (\S+))?$", re.MULTILINE)
_MISSING_LIBRARY = re.compile(r"(\S+\.so[.\d]*): cannot open shared object file", re.MULTILINE)
_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def cublas_version() -> str | None:
    """The installed nvidia-cublas (CUDA 13 wheel name, else CUDA 12's)."""
    return installed_version("nvidia-cublas") or installed_version("nvidia-cublas-cu12")


def explain_te_failure(error: str, cublas: str | None, te_core: str | None) -> str:
    """One sentence for the output of a failed ``import transformer_engine.pytorch``: which
    package, why (the missing module, library or symbol) and the fix."""
    wanted, _ = te_version_for_cublas(cublas)
    pair = f"TransformerEngine {wanted} (transformer-engine, transformer-engine-cu13 or -cu12, {TE_TORCH})"
    symbol = _UNDEFINED_SYMBOL.search(error)
    if symbol:
        library, name, version = symbol.groups()
        where = f"{name}" + (f" (version {version})" if version else "")
        return (
            f"TransformerEngine's core library (transformer-engine-cu* {te_core or '?'}) cannot load: {library} needs "
            f"the symbol {where}, which this machine's libraries lack (nvidia-cublas {cublas or 'not installed'}). "
            f"Install {pair}, whose core loads with this cuBLAS: {BUNDLE_COMMAND}"
        )
    library = _MISSING_LIBRARY.search(error)
    if library:
        return (
            f"TransformerEngine cannot load: the shared library {library.group(1)} is missing (a CUDA library "
            f"that torch's CUDA wheels or the CUDA toolkit provide). Run on a GPU machine with CUDA torch, then "
            f"install {pair}: {BUNDLE_COMMAND}"
        )
    module = _MISSING_MODULE.search(error)
    if module:
        package = {"transformer_engine": "transformer-engine", "transformer_engine_torch": TE_TORCH}.get(
            module.group(1).split(".")[0], module.group(1))
        return (
            f"{package} is not installed (import {TE_IMPORT}: No module named {module.group(1)!r}); install {pair}: "
            f"{BUNDLE_COMMAND}"
        )
    if "shared object file for Transformer Engine torch" in error or "transformer_engine_torch" in error:
        return (
            f"{TE_TORCH}, TransformerEngine's compiled PyTorch extension, is missing or does not match "
            f"(it has no wheel: it is compiled on the target). {BUNDLE_COMMAND}"
        )
    last = error.strip().splitlines()[-1] if error.strip() else "no output"
    return f"import {TE_IMPORT} failed: {last}. Install {pair}: {BUNDLE_COMMAND}"


def te_import_error(python: str = sys.executable, timeout: float = 300.0) -> str | None:
    """The output of a failed ``import transformer_engine.pytorch`` in a child process; None when it imports."""
    if python == sys.executable and importlib.util.find_spec("transformer_engine") is None:
        return "ModuleNotFoundError: No module named 'transformer_engine'"  # no child process needed
    try:
        proc = subprocess.run([python, "-c", f"import {TE_IMPORT}"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"import {TE_IMPORT} did not finish in {timeout:.0f} s"
    return None if proc.returncode == 0 else (proc.stderr or proc.stdout)


def megatron_stack_problems(te_error: str | None = None) -> list[str]:
    """What keeps verl's Megatron engine from starting here: megatron-core / megatron-bridge /
    mbridge at the versions that import together, and TransformerEngine's PyTorch layer loading
    (``te_error``: the import's failure output, tried in a child process when not given). Other
    versions than the ones that ran are reported by ``verl-ext doctor``, not refused."""
    missing = [pin for pin in MEGATRON_WHEELS if installed_version(pin.split("==")[0]) is None]
    problems = [f"{', '.join(m.split('==')[0] for m in missing)} not installed (verl's Megatron engine ran with "
                f"{', '.join(missing)}): {BUNDLE_COMMAND}"] if missing else []
    error = te_error if te_error is not None else te_import_error()
    if error:
        te_core = installed_version("transformer-engine-cu13") or installed_version("transformer-engine-cu12")
        problems.append(explain_te_failure(error, cublas_version(), te_core))
    return problems


def uses_megatron(config: Any) -> bool:
    """Whether the config trains (or scores) with verl's Megatron engine."""
    return any(str(select(config, f"{role}.strategy", "")) == "megatron"
               for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"))  # fmt: skip


def megatron_problems(config: Any, te_error: str | None = None) -> list[str]:
    """The start-up check: for a Megatron config, every :func:`megatron_stack_problems` entry,
    prefixed with the key that selects Megatron."""
    if not uses_megatron(config):
        return []
    return [f"actor_rollout_ref.actor.strategy=megatron: {p}" for p in megatron_stack_problems(te_error)]


def megatron_report() -> tuple[list[str], bool]:
    """``verl-ext doctor``'s Megatron section: versions, whether TransformerEngine loads, the fix."""
    te_core = installed_version("transformer-engine-cu13") or installed_version("transformer-engine-cu12")
    wanted, why = te_version_for_cublas(cublas_version())
    lines = [f"{name}: {installed_version(name) or 'not installed'}" for name in
             ("megatron-core", "megatron-bridge", "mbridge", "transformer-engine", TE_TORCH)]  # fmt: skip
    lines.append(f"transformer-engine core: {te_core or 'not installed'}; nvidia-cublas {cublas_version() or 'not installed'} "
                 f"pairs with TransformerEngine {wanted} ({why})")  # fmt: skip
    problems = megatron_stack_problems()
    lines += [f"-- {p}" for p in problems] or [f"{TE_IMPORT} imports (ok): verl's Megatron engine can start"]
    return lines, not problems
