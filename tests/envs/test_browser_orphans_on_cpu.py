"""A browser whose owner died by SIGKILL (a Ray worker killed: atexit never runs) is killed, with its
chromedriver and profile, by the next ``Browser.start`` on the machine; a live owner's is left alone."""

import os
import signal
import subprocess
import sys

import psutil
import pytest

from verl_ext.envs.browser import PROFILE_PREFIX, Browser

pytestmark = pytest.mark.browser

OWNER = "import sys; from verl_ext.envs.browser import Browser; print(Browser().start()._profile, flush=True); sys.stdin.read()"


def _processes_of(profile: str) -> list[psutil.Process]:
    """The browser processes that use ``profile``, and the chromedriver above them."""
    found = [p for p in psutil.process_iter(["cmdline"]) if f"--user-data-dir={profile}" in (p.info["cmdline"] or ())]
    drivers = {p.parent() for p in found if p.parent() is not None and "chromedriver" in p.parent().name()}
    return found + list(drivers)


def test_a_killed_owners_browser_is_reaped_by_the_next_start():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    profile = owner.stdout.readline().strip()
    assert os.path.basename(profile).startswith(f"{PROFILE_PREFIX}{owner.pid}_")
    orphans = _processes_of(profile)
    assert any("chromedriver" in p.name() for p in orphans) and len(orphans) > 1
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert all(p.is_running() for p in orphans)  # nothing in the dead owner closed them

    live = Browser().start()
    try:
        _, still_alive = psutil.wait_procs(orphans, timeout=10)
        assert not still_alive and not os.path.exists(profile)
        other = Browser().start()  # starts reap again: the live owner's browser survives it
        other.close()
        assert live.alive() and os.path.isdir(live._profile)
    finally:
        live.close()
