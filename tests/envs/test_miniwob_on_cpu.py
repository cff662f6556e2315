"""MiniWoB++ through the hybrid env API: tasks load, the in-page verifier scores, the wall-clock
episode timeout is disabled, and the env stays GUI-only."""

from __future__ import annotations

import re

import pytest

from verl_ext.envs.core import GuiAction, ToolCall

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def miniwob():
    from verl_ext.envs.miniwob_env import MiniWoBEnv

    env = MiniWoBEnv()
    yield env
    env.close()


def test_more_than_one_hundred_tasks():
    from verl_ext.envs.miniwob_env import list_tasks

    assert len(list_tasks()) >= 100


def test_click_button_solved_and_verified(miniwob):
    obs, info = miniwob.reset(seed=1, options={"task": "click-button"})
    target = re.search(r'"(.+?)"', obs.instruction).group(1)
    button = next(e for e in obs.elements if e.role == "button" and e.text == target)
    obs, reward, terminated, truncated, info = miniwob.step(GuiAction("click", element=button.id))
    assert (reward, terminated, info["raw_reward"]) == (1.0, True, 1.0)


def test_wrong_answer_is_binary_zero(miniwob):
    obs, _ = miniwob.reset(seed=1, options={"task": "click-button"})
    target = re.search(r'"(.+?)"', obs.instruction).group(1)
    wrong = next(e for e in obs.elements if e.role == "button" and e.text != target)
    _, reward, terminated, _, info = miniwob.step(GuiAction("click", element=wrong.id))
    assert terminated and reward == 0.0 and info["raw_reward"] < 0


def test_type_and_submit(miniwob):
    obs, _ = miniwob.reset(seed=2, options={"task": "enter-text"})
    word = re.search(r'"(.+?)"', obs.instruction).group(1)
    field = next(e for e in obs.elements if e.role == "textbox")
    obs, *_ = miniwob.step(GuiAction("type", element=field.id, text=word))
    submit = next(e for e in obs.elements if e.role == "button")
    _, reward, terminated, *_ = miniwob.step(GuiAction("click", element=submit.id))
    assert terminated and reward == 1.0


def test_episode_timeout_is_disabled(miniwob):
    from verl_ext.envs.miniwob_env import NO_TIMEOUT_MS

    for task in ("click-button", "email-inbox-important", "search-engine"):  # 10 s, 30 s, 20 s by default
        miniwob.reset(seed=0, options={"task": task})
        assert miniwob.browser.js("return core.EPISODE_MAX_TIME;") == NO_TIMEOUT_MS


def test_same_seed_same_task_instance(miniwob):
    first = miniwob.reset(seed=5, options={"task": "click-checkboxes"})[0].page_text()
    miniwob.reset(seed=0, options={"task": "click-button"})
    assert miniwob.reset(seed=5, options={"task": "click-checkboxes"})[0].page_text() == first


def test_tools_are_refused_with_a_readable_error(miniwob):
    obs, _ = miniwob.reset(seed=0, options={"task": "click-button"})
    assert obs.tools == ["computer_use"]
    obs, reward, terminated, *_ = miniwob.step(ToolCall("mail_star", {"sender": "x"}))
    assert obs.last_result["success"] is False and "unknown tool" in obs.last_result["error_message"]
    obs, *_ = miniwob.step(GuiAction("answer", text="x"))
    assert "take no answer" in obs.last_result["error_message"] and not terminated


def test_a_sample_of_tasks_loads(miniwob):
    from verl_ext.envs.miniwob_env import list_tasks

    for task in list_tasks()[::10]:
        obs, _ = miniwob.reset(seed=0, options={"task": task})
        assert obs.instruction, task
