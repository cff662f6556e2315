"""``verl-ext bundle``: the pure pieces (freeze parsing, what is left out, wheel stripping,
parts and checksums) and one real build + install for this machine's platform."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from verl_ext_bundle import bundle
from verl_ext_bundle.bundle import BundleError, Resolved

from .conftest import cannot_run_here
from .venvs import layered_venv, run_ok

FREEZE = """\
# Editable install with no version control (verl-ext==0.1.0)
-e /home/user/verl-ext
--index-url https://example.invalid/simple
torch==2.11.0+cu130
Foo_Bar.baz===1.0
transformers==5.17.0
pkg[extra]==2.0  # trailing comment
direct @ file:///tmp/direct-1.0-py3-none-any.whl
aiohttp
"""


def test_parse_freeze_reads_pins_urls_and_bare_names():
    assert bundle.parse_freeze(FREEZE) == {
        "torch": "2.11.0+cu130",
        "foo-bar-baz": "1.0",
        "transformers": "5.17.0",
        "pkg": "2.0",
        "direct": None,
        "aiohttp": None,
    }


def test_parse_freeze_rejects_a_range_naming_the_line():
    with pytest.raises(BundleError, match=r"freeze.txt line 2: 'numpy>=2' .*pip freeze"):
        bundle.parse_freeze("torch==2.11.0\nnumpy>=2\n", "freeze.txt")


def test_parse_size():
    assert bundle.parse_size("60M") == 60 * 2**20
    assert bundle.parse_size("1.5G") == 3 * 2**29
    assert bundle.parse_size("500k") == 500 * 1024
    assert bundle.parse_size("64KiB") == 64 * 1024
    assert bundle.parse_size("4096") == 4096
    with pytest.raises(BundleError, match="--part-size '60 apples'"):
        bundle.parse_size("60 apples")
    with pytest.raises(BundleError, match="under 1 KiB"):
        bundle.parse_size("10")


def test_expand_platform_tags_brings_older_glibc_and_legacy_aliases():
    tags = bundle.expand_platform_tags(["manylinux_2_28_x86_64", "linux_x86_64"])
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux_2_5_x86_64"} <= set(tags)
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert bundle.expand_platform_tags(["manylinux_2_12_aarch64"])[-1] == "manylinux2010_aarch64"
    assert bundle.expand_platform_tags(["macosx_11_0_arm64"]) == ["macosx_11_0_arm64"]


def _resolved(*pairs: tuple[str, str]) -> list[Resolved]:
    return [Resolved(name, version, f"https://files.invalid/{name}-{version}.whl") for name, version in pairs]


def test_select_leaves_out_what_the_target_has_and_the_excludes():
    present = bundle.parse_freeze(FREEZE)
    present["verl-ext"] = "0.1.0"  # the user's own checkout: bundled all the same
    resolved = _resolved(
        ("torch", "2.11.0"),  # same release as the target's 2.11.0+cu130
        ("transformers", "5.10.4"),  # the target's 5.17.0 is too new for verl
        ("aiohttp", "3.14.5"),  # present at an unknown version: trusted
        ("nvidia-cublas", "13.1.0.3"),  # CUDA torch brings it
        ("nvidia-cutlass-dsl", "4.3.0"),  # vLLM's CuTe DSL, not a CUDA library
        ("nvidia-cudnn-frontend", "1.28.0"),  # flashinfer's cuDNN Python API, not torch's cuDNN
        ("nvidia-cudnn-cu13", "9.15.0.57"),
        ("flashinfer-cubin", "0.6.0"),
        ("numba", "0.65.0"),
        ("verl-ext", "0.1.0"),
    )
    excludes = bundle.choose_excludes(extra=["numba"], include=[])
    kept, dropped = bundle.select(resolved, present, excludes)
    assert [i.name for i in kept] == ["transformers", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend", "verl-ext"]
    why = {item.name: reason for item, reason in dropped}
    assert why["torch"] == "the target has 2.11.0+cu130"
    assert why["aiohttp"].startswith("the target has it (version not given")
    assert "[exclude nvidia-cublas*]" in why["nvidia-cublas"]
    assert "[exclude nvidia-cudnn-cu*]" in why["nvidia-cudnn-cu13"]
    assert "[exclude flashinfer-cubin]" in why["flashinfer-cubin"]
    assert why["numba"] == "given with --exclude [exclude numba]"

    # A target without torch needs the CUDA libraries; --include and --no-default-excludes keep them.
    no_torch = {k: v for k, v in present.items() if k != "torch"}
    kept, _ = bundle.select(resolved, no_torch, excludes)
    assert "nvidia-cublas" in [i.name for i in kept]
    kept, _ = bundle.select(resolved, present, bundle.choose_excludes([], include=["flashinfer_cubin"]))
    assert "flashinfer-cubin" in [i.name for i in kept]
    kept, _ = bundle.select(resolved, present, bundle.choose_excludes([], [], use_defaults=False))
    assert {"nvidia-cublas", "flashinfer-cubin", "numba"} <= {i.name for i in kept}


def test_repack_wheel_strips_folders_and_their_record_lines(tmp_path: Path):
    src, dst = tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", tmp_path / "out.whl"
    files = {
        "ray/__init__.py": "x = 1\n",
        "ray/jars/ray_dist.jar": "jar" * 100,
        "ray/rllib/algo.py": "pass\n",
        "ray/rllib_contrib.py": "kept: not under ray/rllib/\n",
    }
    record = "".join(f"{name},sha256=abc,{len(body)}\n" for name, body in files.items())
    record += "ray-2.60.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, body in files.items():
            zf.writestr(name, body)
        zf.writestr("ray-2.60.0.dist-info/RECORD", record)

    matched = bundle.repack_wheel(src, dst, ["ray/jars/", "ray/rllib/", "ray/absent/"], stored=True)
    assert matched == ["ray/jars/", "ray/rllib/"]
    with zipfile.ZipFile(dst) as zf:
        assert sorted(zf.namelist()) == ["ray-2.60.0.dist-info/RECORD", "ray/__init__.py", "ray/rllib_contrib.py"]
        assert {info.compress_type for info in zf.infolist()} == {zipfile.ZIP_STORED}
        assert zf.read("ray/rllib_contrib.py") == files["ray/rllib_contrib.py"].encode()
        kept_record = zf.read("ray-2.60.0.dist-info/RECORD").decode().splitlines()
    assert [line.split(",")[0] for line in kept_record] == [
        "ray/__init__.py",
        "ray/rllib_contrib.py",
        "ray-2.60.0.dist-info/RECORD",
    ]


@pytest.mark.parametrize("preset,xz_program", [(None, False), (0, True), (0, False)])
def test_parts_round_trip_and_a_damaged_or_missing_part_fails_clearly(
    tmp_path: Path, monkeypatch, preset: int | None, xz_program: bool
):
    if xz_program and not shutil.which("xz"):
        pytest.skip("no xz program here: Python's lzma (the other case) packs instead")
    if not xz_program:
        monkeypatch.setattr(bundle.shutil, "which", lambda name: None)  # Python's lzma
    src = tmp_path / "src"
    src.mkdir()
    (src / "manifest.json").write_text('{"python_version": "3.12"}')
    (src / "random.bin").write_bytes(os.urandom(200_000))  # incompressible: several parts
    out = tmp_path / "bundle"
    out.mkdir()
    files = [(src / "manifest.json", "manifest.json"), (src / "random.bin", "wheels/random.bin")]
    parts = bundle.pack(files, out, 64 * 1024, preset)
    assert len(parts) == 4 and all(p.stat().st_size <= 64 * 1024 for p in parts)
    assert parts[0].name == ("bundle.tar.000" if preset is None else "bundle.tar.xz.000")
    assert bundle.verify_parts(out) == parts

    dest = tmp_path / "dest"
    assert bundle.unpack(out, dest) == {"python_version": "3.12"}
    assert (dest / "wheels/random.bin").read_bytes() == (src / "random.bin").read_bytes()

    data = bytearray(parts[1].read_bytes())
    data[100] ^= 0xFF
    parts[1].write_bytes(bytes(data))
    with pytest.raises(BundleError, match=rf"part {parts[1].name} is damaged \(sha256 .*\): copy it again"):
        bundle.verify_parts(out)
    parts[2].unlink()
    parts[1].unlink()
    with pytest.raises(BundleError, match=f"part {parts[1].name} is missing"):
        bundle.unpack(out, dest)


def test_env_file_puts_pth_folders_on_pythonpath(tmp_path: Path):
    site = tmp_path / "site"
    (site / "nvidia_cutlass_dsl/python_packages").mkdir(parents=True)
    (site / "bin").mkdir()
    (site / "nvidia_cutlass_dsl.pth").write_text("nvidia_cutlass_dsl/python_packages\n")
    (site / "distutils-precedence.pth").write_text("import os; var = 'x'\n")
    (site / "stale.pth").write_text("folder_that_is_gone\n")
    lines = bundle.write_env_file(site).read_text().splitlines()
    assert lines[1] == (
        f'export PYTHONPATH="{site}:{site}/nvidia_cutlass_dsl/python_packages${{PYTHONPATH:+:$PYTHONPATH}}"'
    )
    assert lines[2] == f'export PATH="{site}/bin:$PATH"'


def test_bundle_conflicts_keeps_only_the_bundles_packages():
    report = (
        "vllm 0.24.0 has requirement numba==0.65.0, but you have numba 0.68.0.\n"
        "vllm 0.24.0 requires pydantic, which is not installed.\n"
        "jax 0.11.2 requires ml_dtypes, which is not installed.\n"
        "Ray 2.60.0 has requirement aiohttp>=3.7, but you have aiohttp 3.6.0.\n"
    )
    assert bundle.bundle_conflicts(report, ["vllm", "ray", "verl-ext"], left_out=["numba"]) == [
        "vllm 0.24.0 requires pydantic, which is not installed.",
        "Ray 2.60.0 has requirement aiohttp>=3.7, but you have aiohttp 3.6.0.",
    ]


def test_cli_errors_name_the_option(tmp_path: Path, capsys):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0\n")
    assert bundle.main(["--out", str(tmp_path / "b"), "--freeze", str(freeze), "--extras", "vllm,cuda"]) == 1
    assert "--extras: unknown cuda; choose from vllm" in capsys.readouterr().err
    assert bundle.main(["--out", str(tmp_path / "b"), "--freeze", str(freeze), "--part-size", "lots"]) == 1
    assert "--part-size 'lots'" in capsys.readouterr().err
    assert bundle.main(["--out", str(tmp_path / "b")]) == 1
    assert "--freeze FILE is needed" in capsys.readouterr().err
    assert bundle.main(["install", "--bundle", str(tmp_path), "--target", str(tmp_path / "t")]) == 1
    assert "SHA256SUMS is missing" in capsys.readouterr().err


def test_bundle_for_this_machine_installs_into_a_fresh_venv_and_doctor_passes(tmp_path: Path):
    """The real thing for this platform. The target is this venv (its freeze): pip sees every
    dependency as present, so the bundle holds verl-ext's wheel alone and nothing is fetched.
    The fresh venv gets this venv's packages through a .pth file (standing in for what the
    target machine has) instead of downloading torch again; verl-ext comes from the bundle."""
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(run_ok([sys.executable, "-m", "pip", "freeze"]).stdout)
    out = tmp_path / "bundle"
    build = run_ok([sys.executable, "-m", "verl_ext.cli", "bundle", "--out", str(out), "--freeze", str(freeze),
                  "--extras", "gui,judge", "--part-size", "64K"], cwd=tmp_path)  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["name"] for p in manifest["packages"]] == ["verl-ext"], build.stdout[-3000:]
    parts = sorted(out.glob("bundle.tar.[0-9]*"))
    assert len(parts) >= 2 and all(p.stat().st_size <= 64 * 1024 for p in parts)

    venv = tmp_path / "fresh"
    fresh_site = layered_venv(venv)
    env = {**os.environ, "PYTHON": sys.executable}
    installed = run_ok(["bash", str(out / "install.sh"), "--venv", str(venv)], cwd=tmp_path, env=env)
    assert "installing 1 wheel(s)" in installed.stdout

    where = run_ok([str(venv / "bin/python"), "-c", "import verl_ext; print(verl_ext.__file__)"], cwd=tmp_path)
    assert where.stdout.strip().startswith(str(fresh_site)), where.stdout
    run_ok([str(venv / "bin/verl-ext"), "doctor"], cwd=tmp_path)

    site = tmp_path / "site"
    run_ok(["bash", str(out / "install.sh"), "--target", str(site)], cwd=tmp_path, env=env)
    assert (site / "verl_ext_bundle/bundle.py").is_file()
    assert f'export PYTHONPATH="{site}' in (site / "env.sh").read_text()


def test_merge_tree_replaces_packages_and_merges_shared_folders(tmp_path: Path):
    dest, src = tmp_path / "site", tmp_path / "new"
    for root, files in {
        dest: ["verl_ext/__init__.py", "verl_ext/stale.py", "hydra_plugins/other/x.py", "bin/ray", "ray/__init__.py"],
        src: ["verl_ext/__init__.py", "hydra_plugins/verl_ext/y.py", "bin/verl-ext"],
    }.items():
        for name in files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(name)
    bundle.merge_tree(src, dest)
    left = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert left == [
        "bin/ray",
        "bin/verl-ext",
        "hydra_plugins/other/x.py",
        "hydra_plugins/verl_ext/y.py",
        "ray/__init__.py",
        "verl_ext/__init__.py",  # the package was replaced: stale.py is gone
    ]


def test_preinstalled_bundle_untars_into_a_target_without_pip(tmp_path: Path, capsys):
    out, site = tmp_path / "bundle", tmp_path / "site"
    assert bundle.main(["--no-deps", "--preinstall", "--out", str(out), "--part-size", "64K"]) == 0
    assert sorted(p.name for p in out.glob("bundle.tar.xz.*"))[0] == "bundle.tar.xz.000"
    assert bundle.main(["install", "--bundle", str(out), "--venv", str(tmp_path / "venv")]) == 1
    assert "built with --preinstall" in capsys.readouterr().err
    assert bundle.main(["install", "--bundle", str(out), "--target", str(site)]) == 0
    assert (site / "verl_ext_bundle/bundle.py").is_file()
    assert (site / "bin/verl-ext").read_text().startswith("#!/usr/bin/env python3\n")
    assert 'export PYTHONPATH="' in capsys.readouterr().out


class _StandInResolver:
    """pip's answer for vLLM on a target with numba 0.68 and numpy 2.5.2: numba is pinned to
    0.65, whose numpy cap pulls an older numpy, until numba itself counts as installed."""

    def __init__(self) -> None:
        self.installed = {"numba": "0.68.0", "numpy": "2.5.2"}

    def resolve(self, requirements, report, for_target):
        plan = _resolved(("vllm", "0.24.0"))
        if self.installed.get("numba") != "0.65.0":
            plan += _resolved(("numba", "0.65.0"), ("numpy", "2.3.5"))
        return plan

    def add_standins(self, packages):
        self.installed.update(packages)


def test_resolve_rounds_stops_left_out_packages_from_shaping_the_bundle(tmp_path: Path):
    present = {"numba": "0.68.0", "numpy": "2.5.2", "torch": "2.11.0"}
    resolver = _StandInResolver()
    excludes = bundle.choose_excludes(extra=["numba"], include=[])
    kept, left_out = bundle.resolve_rounds(resolver, ["vllm"], present, excludes, tmp_path / "r.json")
    assert [i.name for i in kept] == ["vllm"]  # no older numpy shadowing the target's 2.5.2
    assert [(i.name, why) for i, why in left_out] == [("numba", "given with --exclude [exclude numba]")]
    assert resolver.installed["numba"] == "0.65.0"


@pytest.fixture(scope="module")
def stock_venv_python(tmp_path_factory) -> tuple[Path, str]:
    """A venv as `python3 -m venv` makes it, with this Python's bundled (ensurepip) pip, which must be
    older than verl-ext bundle needs (Python 3.11 and 3.12 bundle pip 23.2.1). Its own pip comes first
    on its path; this venv's packages (verl-ext's dependencies) are reachable after it via a .pth file."""
    venv = tmp_path_factory.mktemp("stock") / "venv"
    layered_venv(venv, with_pip=True)
    python = venv / "bin" / "python"
    version = run_ok([str(python), "-c", "import pip; print(pip.__version__)"]).stdout.strip()
    if bundle.pip_version_problem(version) is None:
        cannot_run_here(f"`python -m venv` here gives pip {version}, new enough for verl-ext bundle: no old pip to "
                        "test against (Python 3.11 and 3.12 give pip 23.2.1)")  # fmt: skip
    return python, version


def test_bundle_with_a_stock_venvs_pip_stops_first_naming_the_version_and_the_upgrade(stock_venv_python, tmp_path: Path):
    python, version = stock_venv_python
    proc = subprocess.run([str(python), "-m", "verl_ext.cli", "bundle", "--out", str(tmp_path / "b"), "--no-deps"],
                          env={**os.environ, "PYTHONPATH": str(Path(bundle.__file__).parents[1])},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{python} has pip {version}" in proc.stderr
    assert f"Fix: {python} -m pip install --upgrade 'pip>=23.3'" in proc.stderr
    assert "building the verl-ext wheel" not in proc.stdout  # stopped before any work


# pip's flags for resolving for another machine, as verl-ext bundle passes them (no index: nothing is fetched)
FOR_TARGET = ["install", "--dry-run", "--no-index", "--only-binary=:all:", "--implementation", "cp",
              "--python-version", "3.12", "--platform", "manylinux_2_35_x86_64"]  # fmt: skip


def test_a_resolve_failure_quotes_the_cause_the_old_pip_printed(stock_venv_python, tmp_path: Path):
    python, _ = stock_venv_python
    proc = subprocess.run([str(python), "-m", "pip", *FOR_TARGET, "--report", str(tmp_path / "r.json"), "verl-ext"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode != 0
    message = bundle.resolve_failure((proc.stdout + proc.stderr).splitlines(), ["verl-ext"], "3.12",
                                     ["manylinux_2_35_x86_64"])  # fmt: skip
    assert "Can not use any platform or abi specific options unless installing via '--target'" in message
    assert "--require" not in message  # no pin advice for a cause a pin cannot fix


def test_a_resolve_failure_with_this_pip_quotes_it_and_advises_the_pin(tmp_path: Path):
    opts = bundle.BuildOptions(out=tmp_path, freeze=None, python_version="3.12", platforms=["manylinux_2_35_x86_64"],
                               extras=[], requires=[], excludes=[], strips=[], part_size=1 << 20, project=None,
                               wheel=None, find_links=[], no_deps=False, xz_preset=None, force=False)  # fmt: skip
    pip = bundle._Pip(tmp_path, opts)
    with pytest.raises(BundleError) as failure:
        pip.resolve(["--no-index", "verl-ext-no-such-package"], tmp_path / "r.json", for_target=True)
    assert "No matching distribution found for verl-ext-no-such-package" in str(failure.value)
    assert "Fix: pin a version with --require" in str(failure.value)
