"""verl-ext's checkpoint state files: atomic writes, a manifest written last, and a load that
refuses a torn or changed folder instead of loading it half-written (``verl_ext.checkpoint_files``).
The kill tests in tests/e2e stop real trainers at ``verl_ext.faults``' crash points."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from verl_ext import checkpoint_files as cf

from .messages import assert_names

STATE = {"shadow": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "steps": 7, "versions": [3, 4]}


def test_a_saved_folder_loads_bit_for_bit_after_its_manifest_is_checked(tmp_path):
    record = cf.save_file(STATE, str(tmp_path / "rank_0.pt"))
    cf.write_manifest(str(tmp_path), 7, [record])
    assert record["sha256"] == cf.sha256_of(str(tmp_path / "rank_0.pt"))  # hashed while written
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]  # temporary names renamed away
    manifest = cf.read_manifest(str(tmp_path), 7)
    loaded, sha = cf.load_file(str(tmp_path), "rank_0.pt", manifest)
    assert sha == record["sha256"] and torch.equal(loaded["shadow"], STATE["shadow"])
    assert loaded["steps"] == 7 and loaded["versions"] == [3, 4]


def test_nothing_saved_is_none_and_files_without_a_manifest_are_refused(tmp_path):
    assert cf.read_manifest(str(tmp_path / "absent"), 3) is None
    cf.save_file(STATE, str(tmp_path / "rank_0.pt"))  # a save cut short before its manifest
    with pytest.raises(cf.TornStateError) as err:
        cf.read_manifest(str(tmp_path), 3)
    assert_names(str(err.value), "rank_0.pt", cf.MANIFEST, "latest_checkpointed_iteration.txt", "delete the folder")


def test_a_changed_file_a_missing_rank_and_another_steps_manifest_are_refused(tmp_path):
    record = cf.save_file(STATE, str(tmp_path / "rank_0.pt"))
    cf.write_manifest(str(tmp_path), 5, [record])
    with pytest.raises(cf.TornStateError, match="of step 5, but verl resumes step 6"):
        cf.read_manifest(str(tmp_path), 6)
    manifest = cf.read_manifest(str(tmp_path), 5)
    with pytest.raises(cf.TornStateError, match="another number of ranks"):
        cf.load_file(str(tmp_path), "rank_1.pt", manifest)
    with open(tmp_path / "rank_0.pt", "r+b") as file:  # one byte flipped on disk
        file.seek(record["bytes"] // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(cf.TornStateError, match="does not match"):
        cf.load_file(str(tmp_path), "rank_0.pt", manifest)


def test_a_writer_killed_mid_file_leaves_the_previous_file_whole(tmp_path):
    """SIGKILL while ``save_file`` writes a large state: the file at the final name is still the
    previous save (the new bytes only ever went to a temporary name)."""
    path = tmp_path / "rank_0.pt"
    cf.write_manifest(str(tmp_path), 1, [cf.save_file(STATE, str(path))])
    before = cf.sha256_of(str(path))
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, torch\n"
        "from verl_ext import checkpoint_files as cf\n"
        "big = {'shadow': torch.zeros(64 * 1024 * 1024)}\n"  # 256 MiB: still writing when killed
        "print('writing', flush=True)\n"
        f"cf.save_file(big, {str(path)!r})\n"
    )], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    while not [p for p in os.listdir(tmp_path) if ".tmp." in p]:  # wait until the new bytes are being written
        assert writer.poll() is None, "the writer ended before it was killed"
    writer.kill()
    writer.wait()
    assert cf.sha256_of(str(path)) == before
    assert json.loads((tmp_path / cf.MANIFEST).read_text())["files"]["rank_0.pt"]["sha256"] == before
    loaded, _ = cf.load_file(str(tmp_path), "rank_0.pt", cf.read_manifest(str(tmp_path), 1))
    assert torch.equal(loaded["shadow"], STATE["shadow"])


def test_crash_points_fire_only_where_and_when_named(monkeypatch):
    from verl_ext import faults

    monkeypatch.setenv(faults.CRASH_ENV, "verl_checkpoint@3")
    assert faults.armed("verl_checkpoint") and not faults.armed("update")
    faults.crash_point("verl_checkpoint", 2)  # another step: nothing happens
    faults.crash_point("update", 3)
    with pytest.raises(ValueError, match="unknown crash point"):
        faults.crash_point("elsewhere", 3)
    killed = subprocess.run([sys.executable, "-c", "from verl_ext import faults; faults.crash_point('update', 4)"],
                            env={**os.environ, faults.CRASH_ENV: "update@4"}, capture_output=True, text=True)
    assert killed.returncode == -9 and "killing the trainer process" in killed.stderr
