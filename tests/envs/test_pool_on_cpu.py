"""Env pool and fault handling in a real browser: kill Chromium mid-episode, get a fault (not a
reward), and a transparently restarted browser on the next lease; the concurrency cap holds."""

from __future__ import annotations

import threading

import pytest

from ..messages import assert_names
from verl_ext.envs.core import GuiAction, ToolCall
from verl_ext.envs.pool import EnvPool, make_env

pytestmark = pytest.mark.browser


@pytest.fixture
def pool():
    pool = EnvPool(lambda: make_env("minidesk"), max_envs=1)
    yield pool
    pool.close()


def test_browser_killed_mid_episode_is_a_fault_then_restarted(pool):
    with pool.lease() as env:
        obs, info = pool.reset(env, seed=0, options={"task": "mail_star_sender"})
        obs, *_ = env.step(GuiAction("click", element=obs.find("app-mail").id))
        old_pids = env.browser.pids()
        env.browser.kill_browser()
        obs2, reward, terminated, truncated, info = env.step(ToolCall("mail_star", {"sender": "x"}))
        assert info["fault"]["kind"] in ("browser_crash", "driver_timeout")
        assert truncated and not terminated and reward == 0.0 and obs2 is obs
        # Further steps keep reporting the same fault instead of touching the dead browser.
        assert env.step(GuiAction("done"))[4]["fault"] == info["fault"]
    assert pool.stats()["faults"] == 1

    with pool.lease() as env:  # same env object, new browser, usable at once
        assert env.browser.pids() and env.browser.pids()[0] != old_pids[0]
        obs, info = pool.reset(env, seed=0, options={"task": "mail_star_sender"})
        plan = info["plans"]["tool"]
        *_, step_info = env.step(ToolCall(plan[0]["tool"], plan[0]["args"]))
        assert step_info["success"] is True
    stats = pool.stats()
    assert stats["restarts"] == 1 and stats["created"] == 1 and stats["leases"] == 2


def test_reset_after_the_browser_died_between_episodes_restarts_it(pool):
    with pool.lease() as env:
        pool.reset(env, seed=0, options={"task": "mail_open"})
        env.browser.kill_browser()
        obs, info = pool.reset(env, seed=1, options={"task": "mail_open"})  # retried once on a fresh browser
        assert obs.elements and env.faulted is None
    assert pool.stats()["restarts"] == 1


def test_concurrency_cap(pool):
    inside, peak, lock = [0], [0], threading.Lock()

    def worker():
        with pool.lease():
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1 and pool.stats()["created"] == 1 and pool.stats()["leases"] == 4


def test_close_leaves_no_browser_processes():
    import psutil

    pool = EnvPool(lambda: make_env("minidesk"), max_envs=2)
    with pool.lease() as env:
        pids = env.browser.pids()
        assert len(pids) > 1
    pool.close()
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive


def test_hung_page_is_a_driver_timeout_fault_and_the_pool_recovers():
    pool = EnvPool(lambda: make_env("minidesk", command_timeout_s=3), max_envs=1)
    try:
        with pool.lease() as env:
            obs, _ = pool.reset(env, seed=0, options={"task": "mail_open"})
            # The next click never returns: the page's handler loops forever.
            env.browser.js("document.addEventListener('mousedown', function () { while (true) {} }, true);")
            *_, truncated, info = env.step(GuiAction("click", element=obs.find("app-mail").id))
            assert truncated and info["fault"]["kind"] == "driver_timeout"
            assert_names(info["fault"]["message"], "Chromium for env minidesk", "3 s", "env_options.command_timeout_s")
        with pool.lease() as env:
            obs, info = pool.reset(env, seed=1, options={"task": "mail_open"})
            *_, step_info = env.step(GuiAction("click", element=obs.find("app-mail").id))
            assert step_info["fault"] is None
        assert pool.stats()["restarts"] == 1 and pool.stats()["faults"] == 1
    finally:
        pool.close()


def test_page_script_failure_is_a_page_error_fault(pool):
    with pool.lease() as env:
        obs, _ = pool.reset(env, seed=0, options={"task": "mail_open"})
        env.browser.get("about:blank")  # the app is gone: its verifier cannot run
        *_, truncated, info = env.step(GuiAction("scroll", direction="down"))
        assert truncated and info["fault"]["kind"] == "page_error"


def test_many_waiting_trajectories_do_not_starve_the_executor():
    """More async waiters than executor threads: leases waiting for a slot must not block threads."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    pool = EnvPool(lambda: make_env("minidesk"), max_envs=1)

    async def episode(seed: int) -> bool:
        async with pool.alease() as env:
            obs, info = await asyncio.to_thread(pool.reset, env, seed=seed, options={"task": "mail_open"})
            *_, step_info = await asyncio.to_thread(env.step, GuiAction("click", element=obs.find("app-mail").id))
            return step_info["fault"] is None

    async def main() -> list[bool]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        return await asyncio.gather(*(episode(i) for i in range(6)))

    try:
        assert asyncio.run(main()) == [True] * 6
        assert pool.stats()["leases"] == 6 and pool.stats()["created"] == 1
    finally:
        pool.close()


def test_env_backends_by_name_registration_or_import_path():
    from verl_ext.envs.minidesk.env import MiniDeskEnv
    from verl_ext.envs.pool import make_env, register_env_backend

    env = make_env("verl_ext.envs.minidesk.env:MiniDeskEnv", max_steps=3)  # no browser until reset
    assert isinstance(env, MiniDeskEnv) and env.max_steps == 3
    env.close()
    with pytest.raises(ValueError, match="built in"):
        register_env_backend("minidesk", MiniDeskEnv)
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        make_env("verl_ext.envs.minidesk.env:Nope")
    with pytest.raises(ValueError, match="use one of minidesk, miniwob"):
        make_env("no_such_backend")
