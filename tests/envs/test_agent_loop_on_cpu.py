"""The ``hybrid_gui_tool`` agent loop against verl's real hermes tool parser, verl's
Continuous-Token builder and a real (locally built) tokenizer, with a scripted policy behind a
fake ``server_manager`` that returns ``TokenOutput`` s (the pattern of verl's own agent-loop tests).

The scripted policy reads the observation from its prompt tokens, as a model would: it finds the
Mail button's id in the page text and the sender in the instruction.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    """The loop leases envs from process-wide pools; close their browsers after this module."""
    from verl_ext.envs.pool import close_all_pools

    yield
    close_all_pools()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from verl_ext.tiny_model import make_tiny_model

    return AutoTokenizer.from_pretrained(make_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0))


class ScriptedServer:
    """``generate()`` returns the tokens of the next scripted reply; a reply is a function of the
    decoded prompt so far (the policy's view), returning text."""

    def __init__(self, tokenizer: Any, replies: list[Any]):
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        prompt = self.tokenizer.decode(prompt_ids)
        self.prompts.append(prompt)
        text = self.replies.pop(0)(prompt) + "<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        # The server reports the weight version it generated with (vLLM/SGLang: one per call).
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed",
                           extra_fields={"global_steps": len(self.prompts)})


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def click_mail(prompt: str) -> str:
    last_page = prompt.rsplit("Page (", 1)[1]
    element = re.search(r'\[(\d+)\] button "Mail"', last_page).group(1)
    return "Action: open the mail app.\n" + call("computer_use", action="click", element=int(element))


def star_sender(prompt: str) -> str:
    sender = re.search(r"Star every email from (.+?)\.", prompt).group(1)
    return call("mail_star", sender=sender)


def make_loop(tokenizer: Any, server: ScriptedServer, **loop_kwargs: Any):
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from verl_ext.agent_loops.hybrid_gui_tool import HybridGuiToolAgentLoop

    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "prompt_length": 8192, "response_length": 16384,
            "multi_turn": {"max_assistant_turns": 10, "max_tool_response_length": 8000, "format": "hermes"},
        }},
        "data": {},
    })
    return HybridGuiToolAgentLoop(
        trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer, processor=None,
        dataset_cls=None, data_config=DictConfigWrap(config.data), hf_model_type="qwen2", max_envs=1, **loop_kwargs,
    )


def run(tokenizer: Any, server: ScriptedServer, template: str, seed: int = 0):
    """One episode; the loop object is built inside the event loop, as verl's worker does."""
    import asyncio

    extra_info = {"env": {"backend": "minidesk", "task": template, "seed": seed}}
    prompt = [{"role": "system", "content": "Solve the task with GUI actions or tools."},
              {"role": "user", "content": "Here is your task."}]

    async def episode():
        loop = make_loop(tokenizer, server)
        return await loop.run({"temperature": 1.0}, raw_prompt=prompt, extra_info=extra_info)

    return asyncio.run(episode())


def test_gui_then_tool_episode_succeeds_and_records_steps(tokenizer):
    from verl_ext.steps import step_metadata

    server = ScriptedServer(tokenizer, [click_mail, star_sender])
    out = run(tokenizer, server, "mail_star_sender", seed=3)
    meta = step_metadata(out.extra_fields)
    assert meta.valid and meta.num_steps == 2
    assert meta.extras["success"] is True and meta.extras["stop_reason"] == "terminated"
    assert (meta.extras["num_gui_steps"], meta.extras["num_tool_calls"]) == (1, 1)
    assert meta.extras["tool_beneficial"] is True and meta.extras["format_ok"] is True
    assert meta.step_reward == [0.0, 1.0]
    assert json.loads(meta.extras["artifact"]["state"])["template"] == "mail_star_sender"
    # Model tokens are exactly the generated ones (mask 1), observations are masked out (0).
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    for start, end in meta.spans:
        assert all(out.response_mask[start:end]) and end > start
    model_tokens = sum(out.response_mask)
    assert model_tokens == sum(end - start for start, end in meta.spans)
    assert 0 < model_tokens < len(out.response_mask)  # the first observation follows turn 1
    # The second prompt the policy saw contains the tool response for its click.
    assert "<tool_response>" in server.prompts[1] and "Result:" in server.prompts[1]
    # Per-token weight versions for the old-logit providers: turn i was generated by version i+1.
    versions = out.extra_fields["token_global_steps"]
    assert len(versions) == len(out.response_mask)
    for turn, (start, end) in enumerate(meta.spans):
        assert set(versions[start:end]) == {turn + 1}
    assert all(v == -1 for v, m in zip(versions, out.response_mask) if not m)
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (1, 2)


def test_bad_tool_arguments_are_reported_to_the_model(tokenizer):
    from verl_ext.steps import step_metadata

    replies = [lambda p: call("mail_star", who="nobody"), lambda p: call("no_such_tool"), star_sender]
    server = ScriptedServer(tokenizer, replies)
    out = run(tokenizer, server, "mail_star_sender", seed=4)
    meta = step_metadata(out.extra_fields)
    assert meta.extras["success"] is True and meta.num_steps == 3
    assert meta.extras["num_invalid_actions"] == 2
    assert "unknown argument(s) ['who']" in server.prompts[1]
    assert "unknown tool 'no_such_tool'" in server.prompts[2]


def test_reply_without_tool_call_ends_the_episode(tokenizer):
    from verl_ext.steps import step_metadata

    server = ScriptedServer(tokenizer, [lambda p: "I am done."])
    out = run(tokenizer, server, "mail_open")
    meta = step_metadata(out.extra_fields)
    # The turn is still a step (its tokens need an advantage), but no env step was taken.
    assert meta.num_steps == 1 and meta.action_valid == [False] and meta.extras["num_steps"] == 0
    assert meta.extras["stop_reason"] == "no_tool_call" and meta.extras["actions"] == [""]
    assert meta.extras["success"] is False and meta.extras["format_ok"] is False
    assert sum(out.response_mask) == len(out.response_mask) > 0 and meta.spans == [[0, len(out.response_mask)]]


def test_browser_crash_mid_episode_marks_the_trajectory_invalid(tokenizer):
    from verl_ext.envs.pool import get_pool
    from verl_ext.steps import step_metadata

    def crash_then_act(prompt: str) -> str:
        pool = get_pool("minidesk", max_envs=1, max_steps=30, screenshots=False)
        for env in pool._all:  # the env this episode holds
            env.browser.kill_browser()
        return star_sender(prompt)

    server = ScriptedServer(tokenizer, [crash_then_act])
    out = run(tokenizer, server, "mail_star_sender", seed=5)
    meta = step_metadata(out.extra_fields)
    assert not meta.valid and meta.invalid_reason.startswith("env_fault:")
    assert meta.extras["env_fault"]["kind"] in ("browser_crash", "driver_timeout")
    assert sum(out.response_mask) == 0  # no gradient from a faulted episode

    # The next episode on the same pool gets a restarted browser, transparently.
    restarts = get_pool("minidesk", max_envs=1, max_steps=30, screenshots=False).stats()["restarts"]
    out = run(tokenizer, ScriptedServer(tokenizer, [star_sender]), "mail_star_sender", seed=6)
    assert step_metadata(out.extra_fields).extras["success"] is True
    assert get_pool("minidesk", max_envs=1, max_steps=30, screenshots=False).stats()["restarts"] == restarts + 1


def test_registered_in_verl_registry():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import verl_ext.agent_loops.registration  # noqa: F401

    assert _agent_loop_registry["hybrid_gui_tool"]["_target_"].endswith("HybridGuiToolAgentLoop")


def test_per_turn_layout_returns_one_row_per_turn(tokenizer):
    """verl-agent style rows: each prompt = task + recent actions + current page; one step each."""
    import asyncio

    from verl_ext.steps import step_metadata

    server = ScriptedServer(tokenizer, [click_mail, star_sender])
    extra_info = {"env": {"backend": "minidesk", "task": "mail_star_sender", "seed": 8}}

    async def episode():
        loop = make_loop(tokenizer, server, layout="per_turn", history_window=4)
        prompt = [{"role": "user", "content": "Task:"}]
        return await loop.run({"temperature": 1.0}, raw_prompt=prompt, extra_info=extra_info)

    outputs = asyncio.run(episode())
    assert len(outputs) == 2
    metas = [step_metadata(o.extra_fields) for o in outputs]
    assert [m.step_idx for m in metas] == [[0], [1]] and metas[0].traj_uid == metas[1].traj_uid
    assert all(m.spans is None and m.num_steps == 1 for m in metas)
    assert metas[1].step_reward == [1.0] and all(m.extras["success"] for m in metas)
    assert all(set(o.response_mask) == {1} for o in outputs)  # the whole response is the model's turn
    assert len({frozenset(o.extra_fields) for o in outputs}) == 1  # same keys on every row (verl needs it)
    # The second prompt repeats the first action and shows the page after it, not the old page.
    assert "Previous actions" not in server.prompts[0] and '1. {"name": "computer_use"' in server.prompts[1]
    assert '[1] button "Mail" selected' in server.prompts[1]
    assert "<tool_response>" not in server.prompts[1]
