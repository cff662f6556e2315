"""DVReward on the final state of MiniDesk tasks: every template's yes/no questions (``tasks.js``
``questions``, reset ``info["dv_questions"]``), the agent loop carrying them to the reward manager,
and the ``toolcua_hybrid_dvreward`` recipe scoring a real episode.

The questions are read by ``answer``, a rule-based reader of the state dump written here, apart from
``tasks.js``: each phrasing the templates use maps to a predicate over the JSON the agent loop stores
as ``extras.artifact.state`` (a question no rule reads fails the tests). The tests hold the
questions to the template's ``check()`` (the in-page verifier) on many final states: solved episodes
(both reference plans), every state along the GUI plan, reference tool plans with one argument
changed (wrong recipient, body, cell value, ...) and random-policy states. On each of them,
``check()`` passes if and only if the reader answers yes to every question.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from verl_ext.envs.minidesk.env import DV_QUESTIONS_VERSION, list_templates
from verl_ext.envs.plans import plan_step_action
from verl_ext.envs.policies import RandomPolicy, ScriptedPolicy
from verl_ext.rewards.dvreward.question_set import clean_questions, dedupe_key, from_extra_info

from ..main_ppo_job import main_ppo_job

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]
TEMPLATES = list_templates()
SEEDS = (0, 1, 7)


# --- a rule-based reader of the state dump -------------------------------------------------------
def _js_string(value: Any) -> str:
    """JavaScript's ``String(value)`` for the JSON values a state dump holds."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_JS_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?infinity")


def _js_number(text: str) -> float | None:
    """JavaScript's unary ``+text`` on a trimmed, lower-cased string; ``None`` for NaN."""
    if text == "":
        return 0.0
    if re.fullmatch(r"0x[0-9a-f]+|0o[0-7]+|0b[01]+", text):
        return float(int(text, 0))
    return float(text.replace("infinity", "inf")) if _JS_DECIMAL.fullmatch(text) else None


def same(a: Any, b: Any) -> bool:
    """tasks.js ``same(a, b)``: trimmed, case-insensitive; numbers compared as numbers."""
    x = ("" if a is None else _js_string(a)).strip().lower()
    y = _js_string(b).strip().lower()
    nx, ny = _js_number(x), _js_number(y)
    if x != "" and nx is not None and ny is not None:
        return abs(nx - ny) < 1e-6 if math.isfinite(nx - ny) else nx == ny
    return x == y


RULES: list[tuple[re.Pattern, Any]] = []


def rule(pattern: str):
    def register(fn):
        RULES.append((re.compile(pattern), fn))
        return fn

    return register


def _mail(s):
    return s["mail"]


def _sent(s, to, subject=None):
    return [m for m in _mail(s) if m["folder"] == "sent" and same(m.get("to"), to)
            and (subject is None or same(m["subject"], subject))]


def _paths(s):
    return [f["path"] for f in s["files"]["files"]]


def _file(s, path):
    return next((f for f in s["files"]["files"] if f["path"] == path), None)


def _cell(s, ref):
    return s["sheet"]["cells"].get(ref)


def _event(s, event_id, title):
    return next((e for e in s["calendar"] if e["id"] == int(event_id) and e["title"] == title), None)


TO_SUBJECT = r'Is there a sent email to (?P<to>.+?) with the subject "(?P<subject>[^"]*)"'
rule(r"Has an answer been submitted\?")(lambda s, g: s["answer"] is not None)
rule(r"Is the submitted answer the number (?P<n>\S+) and nothing else\?")(
    lambda s, g: s["answer"] is not None and same(s["answer"], g["n"]))
rule(r'Is the submitted answer exactly "(?P<t>[^"]*)" \(ignoring letter case\)\?')(
    lambda s, g: s["answer"] is not None and same(s["answer"], g["t"]))
rule(r"Is there an email in the Sent folder addressed to (?P<to>.+)\?")(lambda s, g: bool(_sent(s, g["to"])))
rule(TO_SUBJECT + r" \(ignoring letter case\)\?")(lambda s, g: bool(_sent(s, g["to"], g["subject"])))
rule(TO_SUBJECT + r' and the body "(?P<body>[^"]*)" \(both ignoring letter case\)\?')(
    lambda s, g: any(same(m["body"], g["body"]) for m in _sent(s, g["to"], g["subject"])))
rule(TO_SUBJECT + r" \(ignoring letter case\) whose body is the number (?P<n>\S+)\?")(
    lambda s, g: any(same(m["body"], g["n"]) for m in _sent(s, g["to"], g["subject"])))
rule(TO_SUBJECT + r' \(ignoring letter case\) whose body contains "(?P<body>[^"]*)"\?')(
    lambda s, g: any(g["body"] in m["body"] for m in _sent(s, g["to"], g["subject"])))
rule(r"Is the (?P<app>Mail|Files) app shown on screen\?")(lambda s, g: s["app"] == g["app"].lower())
rule(r'Is the email from (?P<sender>.+?) with the subject "(?P<subject>[^"]*)" open in the Mail app\?')(
    lambda s, g: any(m["id"] == s["view"]["open_email_id"] and m["from"] == g["sender"]
                     and m["subject"] == g["subject"] for m in _mail(s)))
rule(r"Is every email from (?P<sender>.+?) starred\?")(
    lambda s, g: all(m["starred"] for m in _mail(s) if m["from"] == g["sender"] and m["folder"] != "sent"))
rule(r"Is every email outside the Sent folder that is not from (?P<sender>.+?) unstarred\?")(
    lambda s, g: not any(m["starred"] for m in _mail(s) if m["from"] != g["sender"] and m["folder"] != "sent"))
rule(r"Is every email from (?P<sender>.+?) in the Archive folder\?")(
    lambda s, g: all(m["folder"] == "archive" for m in _mail(s) if m["from"] == g["sender"]))
rule(r"Is every email not from (?P<sender>.+?) in the Inbox\?")(
    lambda s, g: all(m["folder"] == "inbox" for m in _mail(s) if m["from"] != g["sender"]))
rule(r'Is the email with the subject "(?P<subject>[^"]*)" in the Trash folder\?')(
    lambda s, g: (lambda hits: bool(hits) and all(m["folder"] == "trash" for m in hits))(
        [m for m in _mail(s) if m["subject"] == g["subject"]]))
rule(r'Is every email other than the one with the subject "(?P<subject>[^"]*)" in the Inbox\?')(
    lambda s, g: all(m["folder"] == "inbox" for m in _mail(s) if m["subject"] != g["subject"]))
rule(r"Is every email in the Inbox marked as read\?")(
    lambda s, g: all(m["read"] for m in _mail(s) if m["folder"] == "inbox"))
rule(r"Is there a file at the path (?P<path>\S+)\?")(lambda s, g: g["path"] in _paths(s))


@rule(r'Is the content of the file (?P<path>\S+) exactly "(?P<text>[^"]*)"(?P<ci> \(ignoring letter case\))?\?')
def _content(s, g):
    f = _file(s, g["path"])
    return f is not None and (same(f["content"], g["text"]) if g["ci"] else f["content"] == g["text"])


rule(r"Is the file (?P<path>\S+) absent from the file system\?")(lambda s, g: g["path"] not in _paths(s))
rule(r"Is there a file named (?P<name>\S+) in the folder (?P<dir>\S+)\?")(
    lambda s, g: f"{g['dir']}/{g['name']}" in _paths(s))
rule(r"Are there exactly (?P<n>\d+) files in total across all folders\?")(
    lambda s, g: len(s["files"]["files"]) == int(g["n"]))
rule(r'Is there a folder named "(?P<name>[^"]*)"\?')(lambda s, g: g["name"] in s["files"]["folders"])
rule(r"Is the folder (?P<dir>\S+) open in the Files app\?")(lambda s, g: s["view"]["files_folder"] == g["dir"])
rule(r"Does cell (?P<ref>[A-D]\d+) hold the number (?P<n>\S+)\?")(lambda s, g: same(_cell(s, g["ref"]), g["n"]))
rule(r'Does cell (?P<ref>[A-D]\d+) hold "(?P<text>[^"]*)" \(ignoring letter case\)\?')(
    lambda s, g: same(_cell(s, g["ref"]), g["text"]))
rule(r"Is cell (?P<ref>[A-D]\d+) empty\?")(lambda s, g: not str(_cell(s, g["ref"]) or "").strip())
rule(r'Does row (?P<row>\d+) of the sheet hold exactly Item "(?P<A>[^"]*)", Qty "(?P<B>[^"]*)", '
     r'Price "(?P<C>[^"]*)" and Region "(?P<D>[^"]*)"\?')(
    lambda s, g: all(_cell(s, c + g["row"]) == g[c] for c in "ABCD"))
rule(r'Is the (?P<key>theme|language|time zone) setting "(?P<value>[^"]*)"\?')(
    lambda s, g: s["settings"][g["key"].replace("time zone", "timezone")] == g["value"])
rule(r"(?:Are (?P<n>notifications)|Is (?P<a>autosave)) turned (?P<on>on|off)\?")(
    lambda s, g: s["settings"][g["n"] or g["a"]] is (g["on"] == "on"))
rule(r'Is there a calendar event titled "(?P<title>[^"]*)" \(ignoring letter case\)'
     r"(?: dated (?P<date>\S+?)(?: at (?P<time>\S+))?)?\?")(
    lambda s, g: any(same(e["title"], g["title"]) and g["date"] in (None, e["date"]) and g["time"] in (None, e["time"])
                     for e in s["calendar"]))
rule(r'Is the calendar event "(?P<title>[^"]*)" \(id (?P<id>\d+)\) dated (?P<date>\S+)\?')(
    lambda s, g: (lambda e: e is not None and e["date"] == g["date"])(_event(s, g["id"], g["title"])))
rule(r'Is the calendar event "(?P<title>[^"]*)" \(id (?P<id>\d+)\) scheduled at (?P<time>\S+)\?')(
    lambda s, g: (lambda e: e is not None and e["time"] == g["time"])(_event(s, g["id"], g["title"])))
rule(r'Is the calendar free of any event titled "(?P<title>[^"]*)"\?')(
    lambda s, g: not any(e["title"] == g["title"] for e in s["calendar"]))
rule(r"Is the calendar free of any event on (?P<date>\S+)\?")(
    lambda s, g: not any(e["date"] == g["date"] for e in s["calendar"]))
rule(r"Does the calendar hold exactly (?P<n>\d+) events\?")(lambda s, g: len(s["calendar"]) == int(g["n"]))


def answer(question: str, state: dict) -> bool:
    """The true answer to ``question`` in ``state`` (a MiniDesk state dump); exactly one rule reads
    each phrasing, so a question the rules do not cover (or cover twice) raises."""
    hits = [(match, fn) for pattern, fn in RULES if (match := pattern.fullmatch(question))]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} rules read {question!r}")
    match, fn = hits[0]
    return bool(fn(state, match.groupdict()))


# --- helpers -----------------------------------------------------------------------------------
def artifact_state(env) -> dict:
    """The state dump exactly as the agent loop stores it (``extras.artifact.state``), read back."""
    return json.loads(json.dumps(env.state_dump(), sort_keys=True))


def texts_of(info: dict) -> list[str]:
    return [q["text"] for q in info["dv_questions"]["questions"]]


def verdict(env, texts: list[str]) -> tuple[bool, list[bool]]:
    """(check() passes, the reader's answer to each of ``texts``) in the env's current state."""
    state = artifact_state(env)
    return env.browser.js("return DESK.verify();"), [answer(t, state) for t in texts]


def disagreement(env, texts: list[str], label: Any) -> tuple | None:
    """``None`` when check() passes exactly when every question is answered yes, else a report."""
    ok, answers = verdict(env, texts)
    if ok != all(answers):
        return (label, ok, [t for t, a in zip(texts, answers, strict=True) if not a] or "all yes")
    return None


def step_until_done(env, policy, obs, max_steps: int = 40):
    for _ in range(max_steps):
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        assert info["fault"] is None, info
        if terminated or truncated:
            break
    return obs


# --- the questions themselves ------------------------------------------------------------------
def test_every_template_writes_valid_questions_into_reset_info(minidesk):
    problems = []
    for template in TEMPLATES:
        for seed in SEEDS:
            obs, info = minidesk.reset(seed=seed, options={"task": template})
            record = info["dv_questions"]
            assert (record["version"], record["model"]) == (DV_QUESTIONS_VERSION, "template")
            questions = from_extra_info(info, "dv_questions")  # what the dvreward manager reads
            raw = [(q["text"], q["kind"], q["parents"]) for q in record["questions"]]
            cleaned, dropped = clean_questions(raw, max_semantic=len(raw), max_quality=len(raw))
            keys = [dedupe_key(t) for t in questions.texts]
            if (dropped or cleaned.questions != questions.questions or len(set(keys)) != len(keys)
                    or "semantic" not in questions.kinds):
                problems.append((template, seed, dropped, questions.texts))
            for i, parents in enumerate(questions.parents):  # DSG links point back, to semantic parents
                assert all(0 <= p < i and questions.kinds[p] == "semantic" for p in parents), (template, i)
            # every quoted value of the instruction (subject, body, title, text, ...) is asked about
            for value in re.findall(r'"([^"]+)"', obs.instruction):
                assert any(value in t for t in questions.texts), (template, seed, value)
            # the reader covers every phrasing, and the initial state is not solved: some answer is no
            ok, answers = verdict(minidesk, texts_of(info))
            assert not ok and not all(answers), (template, seed)
    assert not problems


@pytest.mark.parametrize("mode", ["tool", "gui"])
def test_solved_episodes_answer_yes_to_every_question(minidesk, mode):
    failures = []
    for template in TEMPLATES:
        for seed in SEEDS[:2] if mode == "gui" else SEEDS:
            obs, info = minidesk.reset(seed=seed, options={"task": template})
            policy = ScriptedPolicy(mode)
            policy.reset(obs, info, minidesk.tool_schemas())
            step_until_done(minidesk, policy, obs)
            texts = texts_of(info)
            ok, answers = verdict(minidesk, texts)
            if not ok or not all(answers):
                failures.append((template, seed, ok, [t for t, a in zip(texts, answers, strict=True) if not a]))
    assert not failures


def test_questions_agree_with_the_verifier_along_the_gui_plan(minidesk):
    """Every intermediate state of the GUI plan (partly done: one of two emails starred, the
    subject typed but not sent, ...) and the solved end: check() passes iff all answers are yes."""
    problems, states = [], 0
    for template in TEMPLATES:
        for seed in (0, 1):
            obs, info = minidesk.reset(seed=seed, options={"task": template})
            for i, step in enumerate(info["plans"]["gui"]):
                obs, *_ = minidesk.step(plan_step_action(step, obs))
                states += 1
                problems.append(disagreement(minidesk, texts_of(info), (template, seed, f"gui step {i}")))
    bad = [p for p in problems if p]
    assert states > 250 and not bad, bad


def _mutated(value: Any) -> Any:
    if isinstance(value, bool):
        return not value  # e.g. the other sort order
    text = str(value)
    if re.fullmatch(r"-?\d+(\.\d+)?", text.strip()):
        return str(float(text) + 1)  # another number
    return "" if "@" not in text and len(text) < 3 else text[:-1] + ("x" if text[-1] != "x" else "y")


def test_questions_agree_with_the_verifier_on_wrong_tool_calls(minidesk):
    """The tool plan with one argument changed: a wrong recipient, subject or body, another cell,
    value, date, folder or title, a wrong answer. Typical wrong final states, each one with at least
    one question answered no (and the few changes check() tolerates, with none)."""
    problems, wrong = [], 0
    for template in TEMPLATES:
        for seed in (0, 1):
            _, info = minidesk.reset(seed=seed, options={"task": template})
            plan = info["plans"]["tool"]
            variants = [(i, key) for i, step in enumerate(plan) for key in (step.get("args") or {})]
            variants += [(i, "text") for i, step in enumerate(plan) if step.get("gui") == "answer"]
            for i, key in variants:
                obs, info = minidesk.reset(seed=seed, options={"task": template})
                for j, step in enumerate(info["plans"]["tool"]):
                    step = json.loads(json.dumps(step))
                    if j == i:
                        (step["args"] if "args" in step else step)[key] = _mutated(
                            (step["args"] if "args" in step else step)[key])
                    obs, _, terminated, truncated, step_info = minidesk.step(plan_step_action(step, obs))
                    if terminated or truncated:
                        break
                wrong += not minidesk.browser.js("return DESK.verify();")
                problems.append(disagreement(minidesk, texts_of(info), (template, seed, f"tool step {i} {key}")))
    bad = [p for p in problems if p]
    assert wrong > 100 and not bad, bad


def test_questions_agree_with_the_verifier_on_random_states(minidesk):
    problems = []
    for k, template in enumerate(TEMPLATES):
        obs, info = minidesk.reset(seed=3, options={"task": template})
        policy = RandomPolicy(seed=k, tool_prob=0.5)
        policy.reset(obs, info, minidesk.tool_schemas())
        for step in range(8):
            obs, _, terminated, truncated, _ = minidesk.step(policy.act(obs))
            problems.append(disagreement(minidesk, texts_of(info), (template, step)))
            if terminated or truncated:
                break
    bad = [p for p in problems if p]
    assert not bad, bad


def _collateral_changes(state: dict, texts: list[str]) -> dict[str, list[tuple[str, dict]]]:
    """Per app, page-API calls that change something the task did not ask about (an entity no
    question names): starring, moving or sending another email, deleting or adding a file or an
    event, overwriting a cell, flipping the theme."""
    def mentioned(value: Any) -> bool:
        return any(str(value) in t for t in texts)

    others = [m for m in state["mail"]
              if m["folder"] != "sent" and not mentioned(m["from"]) and not mentioned(m["subject"])]
    files = [f["path"] for f in state["files"]["files"] if not mentioned(f["path"])]
    events = [e["title"] for e in state["calendar"] if not mentioned(e["title"])]
    folders = state["files"]["folders"]
    changes = {
        "mail": [("mail_send", {"to": "someone@else.test", "subject": "Extra", "body": "extra"})],
        "files": [("files_write", {"path": folders[0] + "/extra.txt", "content": "x"})] if folders else [],
        "calendar": [("calendar_add", {"title": "Extra", "date": "2026-06-01", "time": "09:00"})],
        "sheet": [("sheet_set_cell", {"cell": "C2", "value": "0.01"})],
        "settings": [("settings_set", {"key": "theme", "value": "dark" if state["settings"]["theme"] == "light"
                                       else "light"})],
    }
    if others:
        changes["mail"] += [("mail_star", {"sender": others[0]["from"]}),
                            ("mail_move", {"subject": others[-1]["subject"], "folder": "trash"})]
    if files:
        changes["files"].append(("files_delete", {"path": files[0]}))
    if events:
        changes["calendar"].append(("calendar_delete", {"title": events[0]}))
    return changes


def test_questions_agree_with_the_verifier_after_collateral_changes(minidesk):
    """Solved with the tool plan, then one more change in the task's apps that no question names:
    where check() forbids it (starring another sender's email, one file too many, ...) some
    question is answered no; where check() ignores it, every question is still answered yes."""
    problems, broke = [], 0

    def solve(template: str) -> dict:
        obs, info = minidesk.reset(seed=0, options={"task": template})
        policy = ScriptedPolicy("tool")
        policy.reset(obs, info, minidesk.tool_schemas())
        step_until_done(minidesk, policy, obs)
        return info

    for template in TEMPLATES:
        info = solve(template)
        texts = texts_of(info)
        changes = _collateral_changes(artifact_state(minidesk), texts)  # from the solved state
        for app in info["apps"]:
            for name, args in changes[app]:
                solve(template)
                result = minidesk.browser.js("return DESK.callTool(arguments[0], arguments[1]);", name, args)
                assert result["success"], (template, name, result)
                broke += not minidesk.browser.js("return DESK.verify();")
                problems.append(disagreement(minidesk, texts, (template, name, args)))
    bad = [p for p in problems if p]
    assert broke >= 10 and not bad, bad


# --- agent loop -> dvreward manager with the recipe's config -------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    from verl_ext.envs.pool import close_all_pools

    yield
    close_all_pools()


class ScriptedServer:
    """The agent loop's ``server_manager``: each ``generate`` returns the next scripted reply (a
    function of the decoded prompt, as a model sees it)."""

    def __init__(self, tokenizer: Any, replies: list[Any]):
        self.tokenizer, self.replies = tokenizer, list(replies)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        text = self.replies.pop(0)(self.tokenizer.decode(prompt_ids)) + "<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={})


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _send(body: str | None = None):
    """A reply that sends the email the mail_send instruction asks for (with ``body`` if given)."""

    def reply(prompt: str) -> str:
        to, subject, wanted = re.search(r'Send an email to (\S+) with the subject "(.+?)" and the body "(.+?)"\.',
                                        prompt).groups()
        return _call("mail_send", to=to, subject=subject, body=body or wanted)

    return reply


def _play_mail_send(tokenizer, seed: int, replies: list) -> tuple[dict, Any]:
    """One real hybrid_gui_tool episode of mail_send; returns (dataset row, AgentLoopOutput)."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from verl_ext.agent_loops.hybrid_gui_tool import HybridGuiToolAgentLoop

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 8192, "response_length": 16384,
        "multi_turn": {"max_assistant_turns": 10, "max_tool_response_length": 8000, "format": "hermes"}}},
        "data": {}})
    row = {"extra_info": {"env": {"backend": "minidesk", "task": "mail_send", "seed": seed}},
           "raw_prompt": [{"role": "system", "content": "Solve the task with GUI actions or tools."},
                          {"role": "user", "content": "Here is your task."}]}

    async def episode():
        loop = HybridGuiToolAgentLoop(
            trainer_config=DictConfigWrap(config), server_manager=ScriptedServer(tokenizer, replies),
            tokenizer=tokenizer, processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
            hf_model_type="qwen2", max_envs=1)
        return await loop.run({"temperature": 1.0}, **row)

    return row, asyncio.run(episode())


def _trajectory(row: dict, out: Any):
    """The DataProto verl's AgentLoopWorker._compute_score sends for one trajectory (verl 0.9.1)."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl import DataProto

    prompt, response = torch.tensor([out.prompt_ids]), torch.tensor([out.response_ids])
    input_ids = torch.cat([prompt, response], dim=1)
    batch = TensorDict({"prompts": prompt, "responses": response, "input_ids": input_ids,
                        "attention_mask": torch.ones_like(input_ids),
                        "position_ids": torch.arange(input_ids.shape[1])[None]}, batch_size=1)

    def column(value):
        array = np.empty(1, dtype=object)
        array[0] = value
        return array

    non_tensor = {"data_source": column("verl_ext/minidesk"), "reward_model": column({"ground_truth": ""}),
                  "extra_info": column(row["extra_info"]), "raw_prompt": column(row["raw_prompt"]),
                  "index": column(0), "__num_turns__": np.array([out.num_turns]),
                  "tool_extra_fields": column(out.extra_fields), "prompt_len": np.array([prompt.shape[1]]),
                  "response_len": np.array([response.shape[1]])}
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


P_YES, P_NO = 0.9, 0.2  # the rule judge's P(yes) when the true answer is yes / no


class RuleJudge:
    """A judge-server backend that answers from the artifact it is sent: the state dump in the user
    message is read with ``answer``; P(yes) is ``P_YES`` or ``P_NO`` (as first-token log-probs)."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict, str]] = []

    def complete(self, batch):
        from verl_ext.rewards.dvreward.judge_backends import Completion

        out = []
        for request in batch:
            artifact, question = request.user_text().removeprefix("Artifact:\n").rsplit("\n\nQuestion: ", 1)
            state = json.loads(artifact)
            self.seen.append((state, question))
            p = P_YES if answer(question, state) else P_NO
            word = "yes" if p >= 0.5 else "no"
            top = [("yes", math.log(p)), ("no", math.log(1.0 - p))]
            out.append(Completion(word, [(word, dict(top)[word], top)]))
        return out


@pytest.fixture(scope="module")
def recipe_config(tiny_model_dir):
    """The recipe's config as verl's main_ppo composes it (``--cfg job``), as the docs select it
    (its composition and verl's checks: ``tests/test_toolcua_hybrid_dvreward_recipe_on_cpu.py``)."""
    from omegaconf import OmegaConf

    args = ["--config-dir", str(REPO / "recipes/toolcua_hybrid"), "+recipe=toolcua_hybrid_dvreward",
            "+plugins/backend=cpu", f"actor_rollout_ref.model.path={tiny_model_dir}", "--cfg", "job"]
    code, out, err = main_ppo_job(args)
    assert code == 0, f"main_ppo --cfg job exited {code}:\n{err[-3000:]}"
    return OmegaConf.create(out)


def test_recipe_scores_real_episodes_with_dv_and_env_scores(recipe_config, monkeypatch):
    """A solved and a wrong mail_send episode of the real agent loop, scored by verl's
    RewardLoopWorker with the recipe's config against a judge over HTTP that reads the state dump:
    score = dv_weight * mean(P(yes)) + env_weight * path reward, with the configured weights."""
    import copy

    from omegaconf import open_dict
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_ext.rewards.dvreward.judge_server import ServerThread
    from verl_ext.steps import step_metadata

    judge = RuleJudge()
    with ServerThread(judge) as server:
        monkeypatch.setenv("DVREWARD_JUDGE_URL", server.url)
        worker = RewardLoopWorker(copy.deepcopy(recipe_config))
        assert worker.reward_manager.judge.endpoint.base_url == server.url  # from $DVREWARD_JUDGE_URL
        tokenizer = worker.input_tokenizer
        # solved with one tool call (tool_beneficial): path reward 1 + 1 + 0.4
        solved = _play_mail_send(tokenizer, 5, [_send()])
        # the right address and subject, a wrong body, then `done`: format ok, no success
        wrong = _play_mail_send(tokenizer, 5, [_send("See you soon."), lambda p: _call("computer_use", action="done")])

        meta = step_metadata(solved[1].extra_fields)
        questions = meta.extras["dv_questions"]["questions"]  # copied from the reset by the agent loop
        assert meta.extras["success"] and len(questions) == 3 and questions[2]["parents"] == [1]
        assert not step_metadata(wrong[1].extra_fields).extras["success"]

        def score(episode, **overrides):
            config = copy.deepcopy(recipe_config)
            with open_dict(config):
                config.reward.reward_kwargs.dvreward.update(overrides)
            w = RewardLoopWorker(config) if overrides else worker
            return w.loop.run_until_complete(w.compute_score(_trajectory(*episode)))

        result = score(solved)
        info = result["reward_extra_info"]
        assert (info["dv_valid"], info["dv_n_questions"], info["dv_n_failed"]) == (1, 3, 0)
        assert json.loads(info["dv_question_scores"]) == pytest.approx([P_YES] * 3)
        assert info["env_score"] == pytest.approx(2.4)
        assert result["reward_score"] == pytest.approx(1.0 * P_YES + 1.0 * 2.4)  # 3.3
        # the judge was asked about the stored final state: the sent email is in the dump it read
        sent = [m for m in judge.seen[-1][0]["mail"] if m["folder"] == "sent"]
        assert len(judge.seen) == 3 and len(sent) == 1
        assert judge.seen[-1][0] == json.loads(meta.extras["artifact"]["state"])

        result = score(wrong)
        info = result["reward_extra_info"]
        assert json.loads(info["dv_question_scores"]) == pytest.approx([P_YES, P_YES, P_NO])  # the body is wrong
        dv = (P_YES + P_YES + P_NO) / 3
        assert (info["dv_score"], info["env_score"]) == (pytest.approx(dv), pytest.approx(1.0))  # R_fmt only
        assert result["reward_score"] == pytest.approx(dv + 1.0)  # 1.6667

        # the weights and the env score are configurable
        assert score(wrong, dv_weight=0.5, env_weight=2.0)["reward_score"] == pytest.approx(0.5 * dv + 2.0)
        plain = score(wrong, env_score_key="verl_ext.extras.success")
        assert (plain["reward_extra_info"]["env_score"], plain["reward_score"]) == (0.0, pytest.approx(dv))
