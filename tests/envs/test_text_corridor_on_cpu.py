"""TextCorridor (the env), and the pieces of the `text_env` agent loop and reward that do not need a
server: token versions, the step-metadata writer, and the reward reading it back."""

from __future__ import annotations

import random

import pytest

from verl_ext.envs.text_corridor import TextCorridor, parse_action


@pytest.mark.parametrize(
    ("text", "action"),
    [("R", "R"), ("left", "L"), ("xyz r L", "R"), ("<|im_end|>", None), ("", None), ("abc 42", None)],
)
def test_the_action_is_the_first_l_or_r_in_any_case(text, action):
    assert parse_action(text) == action


def test_reset_is_seeded_and_starts_between_the_wall_and_the_exit():
    env = TextCorridor()
    starts = {env.reset(seed=s)[1]["start"] for s in range(50)}
    assert starts == set(range(1, env.length - 1))
    assert env.reset(seed=7) == env.reset(seed=7)


def test_walking_right_reaches_the_exit_with_reward_one():
    env = TextCorridor(length=4, start=1)
    env.reset()
    assert env.step("R")[1:4] == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step("r!")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs == "You are at cell 3."


def test_invalid_text_costs_a_step_and_does_not_move():
    env = TextCorridor(length=5, max_steps=2, start=2)
    obs, _ = env.reset()
    next_obs, reward, terminated, truncated, info = env.step("123")
    assert next_obs == obs and not info["action_valid"] and info["action"] is None
    _, reward, terminated, truncated, info = env.step("?")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)


def test_cell_zero_is_a_wall():
    env = TextCorridor(start=0)
    env.reset()
    _, _, _, _, info = env.step("L")
    assert info["position"] == 0 and info["action_valid"]


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="length"):
        TextCorridor(length=2)
    with pytest.raises(ValueError, match="start"):
        TextCorridor(length=5, start=4)


def test_random_play_sometimes_succeeds_and_revisits_states():
    # What GiGPO's anchor groups need: the episodes of one group (same seed) share states.
    rng = random.Random(0)
    env = TextCorridor()
    outcomes, visits = [], []
    for _ in range(4):
        obs, _ = env.reset(seed=3)
        seen, done = [obs], False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(rng.choice(["L", "R", "?"]))
            seen.append(obs)
            done = terminated or truncated
        outcomes.append(reward)
        visits.append(seen)
    group_states = [s for seen in visits for s in seen]
    assert len(set(group_states)) < len(group_states)
    many = []
    for seed in range(200):
        env.reset(seed=seed)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(rng.choice(["L", "R", "?"]))
            done = terminated or truncated
        many.append(reward)
    assert 0 < sum(many) < len(many)


def test_the_reward_reads_the_episode_the_loop_recorded():
    from verl_ext.agent_loops.episode import Episode
    from verl_ext.agent_loops.text_env import write_step_metadata
    from verl_ext.rewards.text_env import compute_score
    from verl_ext.steps import step_metadata

    episode = Episode(spans=[[0, 3], [10, 13]], anchors=["You are at cell 2.", "You are at cell 2."],
                       rewards=[0.0, 1.0], action_valid=[False, True], actions=[None, "R"], success=True,
                       stop_reason="terminated", reset_info={"start": 2, "goal": 3})
    extra_fields = write_step_metadata(episode, "t0").to_extra_fields()
    meta = step_metadata(extra_fields)
    assert meta.spans == [[0, 3], [10, 13]] and meta.action_valid == [False, True]
    score = compute_score("verl_ext/text_corridor", "", "3", extra_info={"split": "val", **extra_fields})
    assert score["score"] == score["success"] == sum(meta.step_reward)
    assert score["invalid_action_rate"] == 0.5 and score["num_steps"] == 2
    # One row per turn: the row holds one step, the counts are still the episode's.
    last_turn = write_step_metadata(episode, "t0", step=1).to_extra_fields()
    assert step_metadata(last_turn).num_steps == 1
    per_turn = compute_score("verl_ext/text_corridor", "", "3", extra_info=last_turn)
    assert per_turn["num_steps"] == 2 and per_turn["invalid_action_rate"] == 0.5
