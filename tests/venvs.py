"""Fresh virtual environments for install tests, without downloading torch and verl again.

A layered venv is a new venv whose own site-packages comes first and which sees this test venv's
packages through a ``.pth`` line (standing in for what the target machine already has). A ``.pth``
line only appends a folder, so this venv's editable verl-ext (its own ``.pth`` finder) stays
invisible: ``import verl_ext`` there finds what was installed into the new venv, or nothing.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def run_ok(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Runs ``cmd`` and fails the test with its output unless it exits 0."""
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{cmd[:4]} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def layered_venv(venv: Path, with_pip: bool = False) -> Path:
    """Creates ``venv`` on top of this interpreter's packages; returns its own site-packages."""
    run_ok([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(venv)])
    site = Path(run_ok([str(venv / "bin/python"), "-c",
                        "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "target_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return site
