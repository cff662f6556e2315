"""The suite's collection rules (tests/conftest.py), run by a real pytest in a subprocess over a
scratch tree holding a copy of that conftest: a missing Chromium or optional extra skips the tests
that need it locally, with the reason, and fails them under CI=true (also when a test finds out
while it runs); tests/gpu is not collected on a machine without CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Hides selenium (so verl_ext.envs.browser.chromium_missing_reason() names it as missing) and mcp.
WITHOUT_SELENIUM = ("import sys; sys.modules['selenium'] = sys.modules['mcp'] = None; import pytest; "
                    "sys.exit(pytest.main(sys.argv[1:]))")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    tests = tmp_path / "tests"
    (tests / "gpu").mkdir(parents=True)
    shutil.copy(TESTS / "conftest.py", tests / "conftest.py")
    (tests / "test_browser.py").write_text(
        "import pytest\n\n@pytest.mark.browser\ndef test_needs_chromium():\n    pass\n\n"
        "def test_plain():\n    pass\n"
    )
    (tests / "test_extras.py").write_text(
        "import pytest\nfrom conftest import cannot_run_here\n\n"
        "@pytest.mark.needs_extra('mcp')\ndef test_needs_mcp():\n    pass\n\n"
        "def test_finds_out_while_running():\n    cannot_run_here('this recipe needs verl-ext[gui]')\n"
    )
    (tests / "gpu" / "test_card.py").write_text("def test_on_the_card():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -rs -p no:cacheprovider\nmarkers =\n    browser: x\n    gpu: x\n"
                                         "    needs_extra: x\n")
    return tmp_path


def _pytest(root: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "VERL_EXT_GPU_TESTS")}
    return subprocess.run([sys.executable, "-c", WITHOUT_SELENIUM, "-v", "tests"], cwd=root, env={**environ, **env},
                          capture_output=True, text=True, timeout=300)


def test_missing_chromium_or_extra_skips_locally_with_the_reason(scratch):
    proc = _pytest(scratch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 3 skipped" in proc.stdout
    # -rs names each reason
    assert "browser test skipped: selenium is not installed" in proc.stdout
    assert "needs 'mcp', not installed here: pip install 'verl-ext[mcp]'" in proc.stdout
    assert "this recipe needs verl-ext[gui]" in proc.stdout


def test_missing_chromium_or_extra_fails_under_ci(scratch):
    proc = _pytest(scratch, CI="true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "CI=true and this browser test cannot run: selenium is not installed" in proc.stdout
    assert "CI=true and this test cannot run: needs 'mcp', not installed here: pip install 'verl-ext[mcp]'" in proc.stdout
    assert "CI=true and this test cannot run: this recipe needs verl-ext[gui]" in proc.stdout
    # a failure in setup (the markers) counts as an error, in the test's body as a failure; none skipped
    assert "1 failed, 1 passed, 2 errors" in proc.stdout.splitlines()[-1]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA: tests/gpu is collected")
def test_gpu_tests_are_not_collected_without_cuda(scratch):
    assert "test_on_the_card" not in _pytest(scratch).stdout
    forced = _pytest(scratch, VERL_EXT_GPU_TESTS="1")
    assert "gpu/test_card.py::test_on_the_card PASSED" in forced.stdout, forced.stdout
