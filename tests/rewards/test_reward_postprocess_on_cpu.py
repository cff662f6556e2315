"""Group-level reward post-processing (``verl_ext.rewards.postprocess``) on verl ``DataProto`` batches:
ToolCUA's R_length from the step metadata, written onto each trajectory's last response token."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.rewards import postprocess
from verl_ext.steps import StepMetadata


def _fields(traj: str, steps: int, success: bool, valid: bool = True, step_idx: list[int] | None = None) -> dict:
    idx = step_idx if step_idx is not None else [0]
    return StepMetadata(traj_uid=traj, step_idx=idx, anchor=["a"] * len(idx), step_reward=[0.0] * len(idx),
                        valid=valid, extras={"num_steps": steps, "success": success}).to_extra_fields()


def _batch(uids: list[str], lengths: list[int], width: int = 6):
    from verl import DataProto

    mask = torch.zeros(len(uids), width)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    scores = torch.zeros(len(uids), width)
    data = DataProto.from_dict(tensors={"response_mask": mask, "token_level_rewards": scores},
                               non_tensors={"uid": np.array(uids, dtype=object)})
    return data, scores


ALGO = OmegaConf.create({"path_length_reward": {"weight": 0.2, "max_steps": 30}})


def test_bonus_matches_the_worked_check_and_lands_on_the_last_token():
    # the ToolCUA path-reward worked check (arXiv 2605.12481; λ=0.4, β=0.2): steps (3, 9, 30, 12), the first two succeed: s_bar = 13.5.
    uids = ["g"] * 4
    fields = [_fields("t1", 3, True), _fields("t2", 9, True), _fields("t3", 30, False), _fields("t4", 12, False)]
    data, original = _batch(uids, [2, 6, 4, 1])
    metrics = postprocess.apply(data, fields, ALGO)
    rewards = data.batch["token_level_rewards"]
    expected = 0.2 * np.array([1 + 10.5 / 13.5, 1 + 4.5 / 13.5, 0.0, 0.0])
    np.testing.assert_allclose(rewards.sum(-1).numpy(), expected, atol=1e-6)
    assert rewards[0, 1] == pytest.approx(expected[0]) and rewards[1, 5] == pytest.approx(expected[1])
    assert torch.count_nonzero(original) == 0  # the input tensor (aliased by verl) is not modified
    assert metrics["verl_ext/path_length_reward/success_steps"] == pytest.approx(6.0)


def test_invalid_trajectories_leave_the_group_mean_and_gain_nothing():
    uids = ["g", "g", "g"]
    fields = [_fields("t1", 2, True), _fields("t2", 6, True), _fields("t3", 1, True, valid=False)]
    data, _ = _batch(uids, [3, 3, 3])
    postprocess.apply(data, fields, ALGO)
    s_bar = 4.0  # (2 + 6) / 2: the faulted 1-step trajectory does not count
    expected = 0.2 * np.array([1 + (s_bar - 2) / s_bar, np.exp(-(6 - s_bar) / (30 - s_bar)), 0.0])
    np.testing.assert_allclose(data.batch["token_level_rewards"].sum(-1).numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("flagged_row", [0, 1])  # one row per trajectory; or only its last turn's row
def test_trajectories_dvreward_could_not_judge_leave_the_group_mean(flagged_row):
    # t3 (2 steps, success) was not judged: DVReward flagged its reward dv_valid=0. Like every other
    # group statistic (verl_ext.advantages.validity), s_bar leaves it out and it gains nothing.
    uids = ["g", "g", "g", "g"]
    unjudged = [_fields("t3", 2, True, step_idx=[0]), _fields("t3", 2, True, step_idx=[1])]
    unjudged[flagged_row]["reward_extra_info"] = {"dv_valid": 0}
    fields = [_fields("t1", 2, True), _fields("t2", 6, True), *unjudged]
    for f in fields[:2]:
        f["reward_extra_info"] = {"dv_valid": 1}
    data, _ = _batch(uids, [3, 3, 3, 3])
    postprocess.apply(data, fields, ALGO, flag_key="dv_valid")
    s_bar = 4.0  # (2 + 6) / 2, not (2 + 6 + 2) / 3
    expected = 0.2 * np.array([1 + (s_bar - 2) / s_bar, np.exp(-(6 - s_bar) / (30 - s_bar)), 0.0, 0.0])
    np.testing.assert_allclose(data.batch["token_level_rewards"].sum(-1).numpy(), expected, atol=1e-6)


def test_one_row_per_turn_pays_the_trajectory_once_on_its_last_turn():
    uids = ["g", "g", "g", "pad_0"]
    fields = [_fields("t1", 2, True, step_idx=[1]), _fields("t1", 2, True, step_idx=[0]),
              _fields("t2", 4, True, step_idx=[0]), {}]
    data, _ = _batch(uids, [2, 2, 2, 0])
    postprocess.apply(data, fields, ALGO)
    totals = data.batch["token_level_rewards"].sum(-1).numpy()
    assert totals[1] == 0.0 and totals[3] == 0.0  # earlier turn, padding
    np.testing.assert_allclose(totals[[0, 2]], 0.2 * np.array([1 + 1 / 3, np.exp(-1 / 27)]), atol=1e-6)


def test_switches_and_errors_name_the_key():
    assert postprocess.enabled(OmegaConf.create({})) == []
    assert postprocess.enabled(OmegaConf.create({"path_length_reward": {"weight": 0.0}})) == []
    data, _ = _batch(["g"], [1])
    with pytest.raises(ValueError, match="algorithm.path_length_reward.max_steps"):
        postprocess.apply(data, [_fields("t", 1, True)], OmegaConf.create({"path_length_reward": {"weight": 1}}))
    no_counts = StepMetadata(traj_uid="t", step_idx=[0], anchor=["a"], step_reward=[0.0]).to_extra_fields()
    with pytest.raises(KeyError, match="hybrid_gui_tool"):
        postprocess.apply(data, [no_counts], ALGO)
