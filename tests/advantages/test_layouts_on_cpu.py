"""Both layouts of the ``text_env`` agent loop, played with the same scripted answers, give every
step the same advantage: one row per trajectory (steps painted on their spans) and one row per
turn (verl-agent style prompts with a short history; each row is one step).

The loop runs with verl's real Continuous-Token helpers and a real (locally built) tokenizer; only
the model is replaced by a server that answers from a script, as verl's own agent-loop tests do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.steps import step_metadata

# Two episodes of one group from cell 1 of a 5-cell corridor (exit 4, 6 turns): one walks right
# to the exit, one wanders, says something invalid and runs out of turns. They share states.
EPISODES = [["R", "R", "R"], ["L", "R", "?", "R", "L", "L"]]
ENV = {"length": 5, "max_steps": 6, "start": 1}
CONFIG = OmegaConf.create({"gamma": 0.95, "gigpo": {"mode": "mean_norm"}, "hgpo": {"history_length": 2}})


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from verl_ext.tiny_model import make_tiny_model

    return AutoTokenizer.from_pretrained(make_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0))


class ScriptedServer:
    """``generate()`` answers the next scripted text; records the prompts it was sent."""

    def __init__(self, tokenizer: Any, answers: list[str]):
        self.tokenizer, self.answers, self.prompts = tokenizer, list(answers), []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(self.tokenizer.decode(prompt_ids))
        ids = self.tokenizer.encode(self.answers.pop(0) + "<|im_end|>", add_special_tokens=False)
        version = {"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3}
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields=version)


def play(tokenizer: Any, answers: list[str], **loop_kwargs: Any) -> tuple[Any, ScriptedServer]:
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from verl_ext.agent_loops.text_env import TextEnvAgentLoop

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 512, "response_length": 256, "multi_turn": {"max_assistant_turns": None}}}, "data": {}})
    server = ScriptedServer(tokenizer, answers)

    async def episode():  # built inside the event loop, as verl's worker does
        loop = TextEnvAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                                processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
                                hf_model_type="qwen2", **loop_kwargs)
        prompt = [{"role": "user", "content": "Walk to the exit. Each turn, answer L or R."}]
        return await loop.run({"temperature": 1.0}, raw_prompt=prompt, extra_info={"seed": 0, "env": ENV})

    return asyncio.run(episode()), server


def rows_of(outputs: list[Any]) -> dict[str, Any]:
    """What the trainer hands the glue: right-padded response masks, extra_fields, uids, scores."""
    length = max(len(o.response_mask) for o in outputs)
    mask = torch.tensor([o.response_mask + [0] * (length - len(o.response_mask)) for o in outputs])
    # verl puts the episode's score (success) on every row of a multi-output agent loop.
    scores = torch.tensor([float(step_metadata(o.extra_fields).extras["success"]) for o in outputs])
    return dict(response_mask=mask, extra_fields=[o.extra_fields for o in outputs], uids=["g"] * len(outputs),
                scores=scores)


def test_per_turn_rows_carry_one_step_and_a_short_history(tokenizer):
    outputs, server = play(tokenizer, EPISODES[1], layout="per_turn", history_window=2)
    metas = [step_metadata(o.extra_fields) for o in outputs]
    assert len(outputs) == 6 and [m.step_idx for m in metas] == [[i] for i in range(6)]
    assert len({m.traj_uid for m in metas}) == 1 and all(m.spans is None for m in metas)
    assert [m.anchor[0] for m in metas] == [f"You are at cell {c}." for c in (1, 0, 1, 1, 2, 1)]
    assert [m.action_valid[0] for m in metas] == [True, True, False, True, True, True]
    assert all(m.extras["num_steps"] == 6 and m.extras["success"] is False for m in metas)
    assert all(o.num_turns == 2 and set(o.response_mask) == {1} for o in outputs)
    assert len({frozenset(o.extra_fields) for o in outputs}) == 1  # same keys on every row (verl needs it)
    # Turn 5's prompt: the task, the last two actions with where they led, the current cell.
    assert "Previous actions" not in server.prompts[0]
    fifth = server.prompts[4]
    assert "Walk to the exit" in fifth and "1. L" not in fifth and "2. R" not in fifth
    assert "3. invalid -> You are at cell 1.\n4. R -> You are at cell 2.\nYou are at cell 2." in fifth


@pytest.mark.parametrize("estimator", ["gigpo", "hgpo"])
def test_both_layouts_give_every_step_the_same_advantage(tokenizer, estimator):
    from verl_ext.advantages.verl_glue import compute_token_advantages

    per_step = {}
    for layout in ("trajectory", "per_turn"):
        outputs = []
        for answers in EPISODES:
            played, _ = play(tokenizer, answers, layout=layout, history_window=2)
            outputs += played if layout == "per_turn" else [played]
        adv, _ = compute_token_advantages(estimator, algo_config=CONFIG, **rows_of(outputs))
        metas = [step_metadata(o.extra_fields) for o in outputs]
        # The value on the first token of each step, in (episode, step) order.
        per_step[layout] = np.array([adv[r, span[0]].item() for r, m in enumerate(metas)
                                     for span in (m.spans or [[0, 1]])])
    assert len(per_step["per_turn"]) == sum(map(len, EPISODES))
    np.testing.assert_allclose(per_step["per_turn"], per_step["trajectory"], rtol=1e-6)
    assert per_step["trajectory"].std() > 0  # the group is informative: the two episodes differ
