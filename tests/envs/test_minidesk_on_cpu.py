"""MiniDesk in a real headless Chromium: every template solvable by GUI alone and by the
tool-preferring path, labels consistent with reference steps, security of the file tools,
structured tool-argument errors, observation formats."""

from __future__ import annotations

import http.server
import io
import json
import threading

import pytest

from verl_ext.envs.core import GuiAction, ToolCall
from verl_ext.envs.minidesk.env import list_templates
from verl_ext.envs.policies import RandomPolicy, ScriptedPolicy

pytestmark = pytest.mark.browser
TEMPLATES = list_templates()
SEEDS = (0, 1, 7)


def play(env, policy, template: str, seed: int) -> tuple[float, dict, dict]:
    obs, info = env.reset(seed=seed, options={"task": template})
    policy.reset(obs, info, env.tool_schemas())
    done, reward, step_info = False, 0.0, {}
    while not done:
        obs, reward, terminated, truncated, step_info = env.step(policy.act(obs))
        assert step_info["fault"] is None, step_info
        done = terminated or truncated
    return reward, info, step_info


def test_at_least_thirty_templates():
    assert len(TEMPLATES) >= 30 and len(set(TEMPLATES)) == len(TEMPLATES)


@pytest.mark.parametrize("mode", ["gui", "tool"])
def test_every_template_is_solvable(minidesk, mode):
    """One env, every template and seed in a row: also catches state leaking between episodes."""
    failures = []
    for template in TEMPLATES:
        for seed in SEEDS:
            reward, info, step_info = play(minidesk, ScriptedPolicy(mode), template, seed)
            counts = step_info["counts"]
            if reward != 1.0 or counts["steps"] != info["ref_steps"][mode] or counts["invalid"]:
                failures.append((template, seed, reward, counts, info["ref_steps"]))
            if mode == "gui":
                assert counts["tool"] == 0  # the GUI path really uses no tool
    assert not failures


def test_tool_beneficial_label_matches_reference_steps(minidesk):
    from verl_ext.envs.minidesk.env import template_catalog

    catalog = template_catalog()  # what data preparation reads without a browser
    for template in TEMPLATES:
        for seed in SEEDS:
            _, info = minidesk.reset(seed=seed, options={"task": template})
            gui, tool = info["ref_steps"]["gui"], info["ref_steps"]["tool"]
            assert info["tool_beneficial"] == (tool < gui), (template, seed, info["ref_steps"])
            assert catalog[template] == {"apps": info["apps"], "tool_beneficial": info["tool_beneficial"]}
    labels = [minidesk.reset(seed=0, options={"task": t})[1]["tool_beneficial"] for t in TEMPLATES]
    assert 0.15 < labels.count(False) / len(labels) < 0.5  # both kinds are well represented


def test_initial_state_is_not_already_solved(minidesk):
    for template in TEMPLATES:
        minidesk.reset(seed=2, options={"task": template})
        assert minidesk.browser.js("return DESK.verify();") is False, template


def test_seeds_generate_different_instances_and_same_seed_repeats(minidesk):
    for template in ("mail_star_sender", "sheet_sort", "files_rename", "calendar_add"):
        texts = {minidesk.reset(seed=seed, options={"task": template})[0].instruction + minidesk.reset(seed=seed, options={"task": template})[0].page_text()
                 for seed in range(6)}
        assert len(texts) >= 3, template
        first = minidesk.reset(seed=11, options={"task": template})[0].instruction
        assert minidesk.reset(seed=11, options={"task": template})[0].instruction == first


def test_random_policy_almost_always_fails(minidesk):
    policy = RandomPolicy(seed=0)
    wins = sum(play(minidesk, policy, t, 0)[0] for t in TEMPLATES)
    assert wins <= 0.1 * len(TEMPLATES)


def test_episode_tools_include_app_tools_and_distractors(minidesk):
    obs, _ = minidesk.reset(seed=0, options={"task": "settings_from_mail"})
    groups = {t.name: t.group for t in minidesk.tool_defs()}
    assert obs.tools[0] == "computer_use"
    assert {"mail", "settings", "distractor"} <= set(groups.values())
    assert "calendar_add" not in groups  # only the task's apps
    assert list(groups.values()).count("distractor") == 3


def test_tool_argument_errors_are_structured(minidesk):
    minidesk.reset(seed=0, options={"task": "mail_send"})
    cases = [
        (ToolCall("mail_send", {"to": "a@b.test"}), "missing required argument(s) ['subject', 'body']"),
        (ToolCall("mail_send", {"to": "a", "subject": "s", "body": "b", "cc": "x"}), "unknown argument(s) ['cc']"),
        (ToolCall("mail_move", {"folder": "spam", "sender": "x"}), "must be one of"),
        (ToolCall("mail_star", {"sender": ["list"]}), "must be of type string"),
        (ToolCall("mail_star", {"sender": "Nobody Known"}), "no email from"),
        (ToolCall("calendar_add", {"title": "x", "date": "d", "time": "t"}), "unknown tool"),
        (ToolCall("computer_use", {"action": "fly"}), "'action' must be one of"),
        (ToolCall("computer_use", {"action": "click"}), "needs ['element']"),
        (GuiAction("click", element=999), "no element [999]"),
    ]
    for action, message in cases:
        obs, reward, terminated, truncated, info = minidesk.step(action)
        result = obs.last_result
        assert result["success"] is False and message in result["error_message"], (action, result)
        assert not terminated and info["fault"] is None
    assert minidesk.counts["invalid"] == len(cases) - 1  # "no email from" is a valid call that failed


def test_js_tool_errors_are_structured(minidesk):
    minidesk.reset(seed=0, options={"task": "sheet_set_cell"})
    for action, message in [
        (ToolCall("sheet_set_cell", {"cell": "Z9", "value": "1"}), "bad cell reference"),
        (ToolCall("sheet_set_range", {"range": "A2:B3", "values": "1,2,3"}), "does not match range"),
    ]:
        obs, *_ = minidesk.step(action)
        assert obs.last_result["success"] is False and message in obs.last_result["error_message"]


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "Documents/../../x", "..", "C:/x", "a\\..\\b", ""])
def test_file_tools_reject_paths_outside_the_sandbox(minidesk, path):
    minidesk.reset(seed=0, options={"task": "files_delete"})
    for name, args in [("files_read", {"path": path}), ("files_delete", {"path": path}),
                       ("files_write", {"path": path, "content": "x"})]:
        obs, *_ = minidesk.step(ToolCall(name, args))
        assert obs.last_result["success"] is False
        assert "sandbox" in obs.last_result["error_message"] or "invalid path" in obs.last_result["error_message"]


def test_symlink_out_of_the_sandbox_is_rejected(minidesk, tmp_path):
    minidesk.reset(seed=0, options={"task": "files_read_answer"})
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (minidesk.sandbox.root / "escape").symlink_to(tmp_path)
    obs, *_ = minidesk.step(ToolCall("files_read", {"path": "escape/secret.txt"}))
    assert obs.last_result["success"] is False and "top secret" not in json.dumps(obs.last_result)


def test_sandbox_mirrors_the_page_file_system(minidesk):
    _, info = minidesk.reset(seed=3, options={"task": "files_create"})
    before = set(minidesk.sandbox.listing())
    path = info["plans"]["tool"][0]["args"]["path"]
    content = info["plans"]["tool"][0]["args"]["content"]
    _, reward, terminated, *_ = minidesk.step(ToolCall("files_write", {"path": path, "content": content}))
    assert reward == 1.0 and terminated
    assert set(minidesk.sandbox.listing()) == before | {path}
    dump = minidesk.state_dump()
    assert path in dump["sandbox_files"] and any(f["path"] == path for f in dump["files"]["files"])


def test_distractor_tools_do_nothing_useful_and_never_touch_the_network(minidesk):
    minidesk.reset(seed=0, options={"task": "mail_open"})
    for name in [t.name for t in minidesk.tool_defs() if t.group == "distractor"]:
        args = {p: (1 if spec.type in ("integer", "number") else "x")
                for p, spec in minidesk._tools[name].params.items()}
        obs, reward, terminated, truncated, _ = minidesk.step(ToolCall(name, args))
        assert reward == 0.0 and not terminated


def test_gui_primitives_type_key_scroll_and_click_at(minidesk):
    obs, _ = minidesk.reset(seed=1, options={"task": "mail_send"})
    obs, *_ = minidesk.step(GuiAction("click", element=obs.find("app-mail").id))
    obs, *_ = minidesk.step(GuiAction("click", element=obs.find("mail-compose").id))
    obs, *_ = minidesk.step(GuiAction("type", element=obs.find("compose-to").id, text="x@y.test"))
    assert obs.find("compose-to").value == "x@y.test" and "focused" in obs.find("compose-to").states
    obs, *_ = minidesk.step(GuiAction("key", key="Tab"))
    assert "focused" in obs.find("compose-subject").states
    obs, *_ = minidesk.step(GuiAction("scroll", direction="down"))
    assert obs.last_result["success"] is True
    obs, *_ = minidesk.step(GuiAction("click_at", x=5000, y=5))
    assert "outside" in obs.last_result["error_message"]
    obs, *_ = minidesk.step(GuiAction("type", element=obs.find("compose-to").id, text=""))
    assert obs.find("compose-to").value == ""


def test_observation_text_and_screenshot(minidesk):
    from PIL import Image

    obs, _ = minidesk.reset(seed=0, options={"task": "calendar_delete_title"})
    text = obs.render()
    assert text.startswith("Task: Delete the event") and '[1] button "Mail"' in text and "Step 0/30" in text
    assert "data-k" not in text and all(e.key is None or e.key not in text for e in obs.elements)
    png = minidesk.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(io.BytesIO(png)).size[0] > 0


def test_answer_ends_question_tasks(minidesk):
    _, info = minidesk.reset(seed=0, options={"task": "calendar_count_answer"})
    right = info["plans"]["gui"][-1]["text"]
    obs, reward, terminated, *_ = minidesk.step(GuiAction("answer", text=str(int(right) + 1)))
    assert terminated and reward == 0.0
    minidesk.reset(seed=0, options={"task": "calendar_count_answer"})
    obs, reward, terminated, *_ = minidesk.step(GuiAction("answer", text=f" {right} "))
    assert terminated and reward == 1.0


def test_max_steps_truncates(minidesk):
    minidesk.reset(seed=0, options={"task": "mail_open"})
    for _ in range(minidesk.max_steps):
        obs, reward, terminated, truncated, _ = minidesk.step(GuiAction("scroll", direction="up"))
    assert truncated and not terminated and reward == 0.0
    with pytest.raises(RuntimeError, match="reset"):
        minidesk.step(GuiAction("done"))


def test_nothing_reaches_the_network():
    """DNS is mapped away for every host but localhost and other traffic goes to a dead proxy."""
    from verl_ext.envs.browser import Browser

    from verl_ext.envs.core import EnvFault

    browser = Browser().start()
    try:
        for url in ("http://example.com/", "https://93.184.215.14/", "http://[2606:2800:220:1::]/"):
            with pytest.raises(EnvFault, match="net::ERR_") as fault:
                browser.get(url)
            assert fault.value.kind == "page_error"
            assert browser.js("return location.protocol") == "chrome-error:"
        # A loopback-only server is allowed (the other way to serve pages).
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
            assert browser.js("return location.protocol") == "http:"
        finally:
            server.shutdown()
    finally:
        browser.close()


def test_reset_reloads_the_page_if_it_was_navigated_away(minidesk):
    minidesk.reset(seed=0, options={"task": "mail_open"})
    minidesk.browser.get("about:blank")
    obs, _ = minidesk.reset(seed=1, options={"task": "mail_open"})
    assert obs.find("app-mail") is not None


@pytest.mark.browser
def test_screenshots_cover_the_whole_viewport(minidesk):
    import io

    from PIL import Image

    minidesk.reset(seed=0, options={"task": {"template": "mail_send", "seed": 0}})
    image = Image.open(io.BytesIO(minidesk.screenshot()))
    assert image.size == (minidesk.browser.width, minidesk.browser.height)  # click_at's coordinate space
