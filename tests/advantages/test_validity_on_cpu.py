"""Faults are not answers: a row the reward manager flagged (``dv_valid=0``) gets zero advantage and
stays out of its group's statistics, with verl's own estimators (GRPO through verl 0.9.1's v1
``compute_advantage_for_multi_trajectories``, GAE) and a verl-ext step-aware one (GiGPO), on real
``DataProto`` batches, going through the trainer's hook (``verl_ext.trainer``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.advantages import validity

L = 6


def _flag(valid: bool | None) -> dict:
    """A row's extra_fields as verl stores them: the manager's reward_extra_info (None: no DVReward)."""
    return {} if valid is None else {"reward_extra_info": {"dv_valid": int(valid), "score": 0.0}}


def _batch(uids: list[str], scores: list[float], lengths: list[int], values: torch.Tensor | None = None):
    from verl import DataProto

    mask = torch.zeros(len(uids), L, dtype=torch.int64)
    rewards = torch.zeros(len(uids), L)
    for i, (n, s) in enumerate(zip(lengths, scores)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    tensors = {"response_mask": mask, "token_level_rewards": rewards, "token_level_scores": rewards}
    if values is not None:
        tensors["values"] = values
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(uids, dtype=object)})


def _through_trainer_hook(data, extra_fields, estimate, nan_scores=False):
    """What the verl-ext trainer runs around verl's one estimator call (see VerlExtTrainerMixin)."""
    from verl_ext.advantage_step import exclude_invalid_rewards

    metrics: dict = {}
    invalid = exclude_invalid_rewards(data, extra_fields, "dv_valid", nan_scores, metrics)
    return validity.zero_out(estimate(data), invalid), metrics


def test_invalid_rows_reads_the_flag_and_never_flags_padding_or_unflagged_rows():
    uids = ["a", "a", "b", "pad-0", "c"]
    fields = [_flag(True), _flag(False), None, _flag(False), _flag(None)]
    assert validity.invalid_rows(uids, fields, "dv_valid").tolist() == [False, True, False, False, False]
    assert not validity.invalid_rows(uids, fields, None).any()
    isolated = validity.isolate_groups(np.array(uids, dtype=object), np.array([0, 1, 0, 0, 1], dtype=bool))
    assert isolated[0] == "a" and isolated[1] not in uids and isolated[4] not in uids and isolated[1] != isolated[4]


def test_flag_key_follows_the_configured_reward_manager():
    assert validity.flag_key(OmegaConf.create({"reward_manager": {"name": "dvreward"}})) == "dv_valid"
    assert validity.flag_key(OmegaConf.create({"reward_manager": {"name": "naive"}})) is None


def test_grpo_group_statistics_leave_out_the_failed_row():
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    def grpo(data):
        keys = [f"{u}_{i}_0" for i, u in enumerate(data.non_tensor_batch["uid"])]  # {uid}_{session}_{index}
        return compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="grpo", num_repeat=4)

    # one group of 4: the judge failed on row 3, which the manager scored failed_score = 0.0
    fields = [_flag(True), _flag(True), _flag(True), _flag(False)]
    data, metrics = _through_trainer_hook(_batch(["g"] * 4, [1.0, 0.5, 0.0, 0.0], [3, 4, 5, 6]), fields, grpo)
    adv = data.batch["advantages"]
    # golden: the valid scores (1, 0.5, 0) have mean 0.5 and (unbiased) std 0.5 -> (1, 0, -1)
    expected = [1.0, 0.0, -1.0]
    for i, value in enumerate(expected):
        torch.testing.assert_close(adv[i, : 3 + i], torch.full((3 + i,), value), atol=1e-5, rtol=0)
    assert torch.all(adv[3] == 0) and torch.all(data.batch["token_level_rewards"][3] == 0)
    assert data.batch["response_mask"][3].sum() == 0  # written back by verl with rollout correction
    assert metrics == {"verl_ext/invalid_reward/excluded_rows": 1.0, "verl_ext/invalid_reward/excluded_fraction": 0.25}

    # without the hook the failed 0 would be a real answer and shift the group: not (1, 0, -1)
    plain = grpo(_batch(["g"] * 4, [1.0, 0.5, 0.0, 0.0], [3, 4, 5, 6])).batch["advantages"]
    assert abs(float(plain[0, 0]) - 1.0) > 0.1 and float(plain[3, 0]) != 0.0


def test_gae_batch_whitening_leaves_out_the_failed_row():
    from verl.trainer.ppo.ray_trainer import compute_advantage

    values = torch.linspace(0.1, 0.6, 4 * L).reshape(4, L)

    def gae(data):
        return compute_advantage(data, adv_estimator="gae", gamma=1.0, lam=1.0, config=OmegaConf.create({}))

    fields = [_flag(True), _flag(True), _flag(False), _flag(True)]
    data, _ = _through_trainer_hook(_batch(list("abcd"), [1.0, 0.0, 0.0, 0.5], [3, 4, 5, 6], values), fields, gae)
    kept = [0, 1, 3]
    alone = gae(_batch(list("abd"), [1.0, 0.0, 0.5], [3, 4, 6], values[kept]))
    torch.testing.assert_close(data.batch["advantages"][kept] * alone.batch["response_mask"],
                               alone.batch["advantages"] * alone.batch["response_mask"])
    assert torch.all(data.batch["advantages"][2] == 0)
    torch.testing.assert_close(data.batch["returns"][2], values[2])  # the critic's own estimate: no target


def test_step_aware_gigpo_treats_the_failed_row_as_invalid():
    # the GiGPO reference code's toy (langfengQ/verl-agent @ 20bd331, gigpo/core_gigpo.py) (three trajectories, golden GiGPO advantages) plus a fourth
    # trajectory in the same group whose judge failed: the golden numbers must not move.
    from verl_ext.advantages.verl_glue import compute_token_advantages
    from verl_ext.steps import StepMetadata

    trajs = {"t1": list("ABC"), "t2": list("ADBC"), "t3": list("ADDE"), "t4": list("AB")}
    rewards = {"t1": [0, 0, 10], "t2": [0, 0, 0, 10], "t3": [0, 0, 0, 0], "t4": [0, 0]}
    golden = {"t1": [6.7951, 3.6364, 3.6364], "t2": [6.3439, 9.6530, 3.6364, 3.6364],
              "t3": [-12.2299, -9.3720, -9.3720, -6.3636]}
    config = OmegaConf.create({"gamma": 0.95, "gigpo": {"mode": "mean_norm"}})
    width = 16
    extra, mask = [], torch.zeros(4, width, dtype=torch.int64)
    for i, (t, anchors) in enumerate(trajs.items()):
        spans = [[4 * s, 4 * s + 3] for s in range(len(anchors))]
        meta = StepMetadata(t, list(range(len(anchors))), anchors, rewards[t], spans=spans).to_extra_fields()
        extra.append({**meta, **_flag(t != "t4")})
        for s, e in spans:
            mask[i, s:e] = 1
    from verl import DataProto

    scores = torch.zeros(4, width)
    scores[:, 0] = torch.tensor([10.0, 10.0, 0.0, 0.0])  # t4: the manager's failed_score
    data = DataProto.from_dict(tensors={"response_mask": mask, "token_level_rewards": scores},
                               non_tensors={"uid": np.array(["g"] * 4, dtype=object)})

    def gigpo(data):
        adv, ret = compute_token_advantages(
            "gigpo", response_mask=data.batch["response_mask"], extra_fields=extra,
            uids=list(data.non_tensor_batch["uid"]), scores=data.batch["token_level_rewards"].sum(-1),
            algo_config=config)
        data.batch["advantages"], data.batch["returns"] = adv, ret
        return data

    data, _ = _through_trainer_hook(data, extra, gigpo, nan_scores=True)
    adv = data.batch["advantages"]
    for i, t in enumerate(["t1", "t2", "t3"]):
        np.testing.assert_allclose(adv[i, 0:16:4][: len(golden[t])].numpy(), golden[t], atol=1e-4)
    assert torch.all(adv[3] == 0)
    assert torch.isfinite(data.batch["token_level_rewards"]).all()  # the NaN marker does not leak out


def test_no_flagged_row_changes_nothing():
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    def grpo(data):
        keys = [f"{u}_{i}_0" for i, u in enumerate(data.non_tensor_batch["uid"])]
        return compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="grpo", num_repeat=2)

    hooked, metrics = _through_trainer_hook(_batch(["g", "g"], [1.0, 0.0], [2, 3]), [_flag(True)] * 2, grpo)
    plain = grpo(_batch(["g", "g"], [1.0, 0.0], [2, 3]))
    torch.testing.assert_close(hooked.batch["advantages"], plain.batch["advantages"])
    assert metrics["verl_ext/invalid_reward/excluded_rows"] == 0.0


@pytest.mark.parametrize("nan_scores", [False, True])
def test_exclude_replaces_the_reward_tensor_instead_of_writing_into_it(nan_scores):
    # verl's token_level_rewards aliases token_level_scores (and rm_scores) when KL-in-reward is off
    data = _batch(["g", "g"], [1.0, 0.5], [2, 2])
    scores = data.batch["token_level_scores"]
    validity.exclude(data, np.array([False, True]), nan_scores)
    assert scores[1].sum() == 0.5 and torch.isfinite(scores).all()
    assert data.non_tensor_batch["uid"][1] != "g"


def test_env_faults_leave_grpo_groups_without_a_flagging_reward_manager():
    # hybrid_gui_tool marks a faulted episode valid=False (its score is a placeholder 0): with any
    # reward manager, verl's GRPO must not count it in the group.
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from verl_ext.steps import StepMetadata
    from verl_ext.advantage_step import exclude_invalid_rewards

    def meta(valid: bool) -> dict:
        return StepMetadata(traj_uid=f"t{valid}", step_idx=[0], anchor=["a"], step_reward=[0.0], valid=valid,
                            invalid_reason="" if valid else "env_fault:browser_crash").to_extra_fields()

    fields = [meta(True), meta(True), meta(True), meta(False)]
    assert validity.invalid_rows(["g"] * 4, fields, None).tolist() == [False, False, False, True]
    data = _batch(["g"] * 4, [1.0, 0.5, 0.0, 0.0], [3, 4, 5, 6])
    metrics: dict = {}
    invalid = exclude_invalid_rewards(data, fields, None, False, metrics)
    keys = [f"g_{i}_0" for i in range(4)]
    data = validity.zero_out(compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator="grpo", num_repeat=4), invalid)
    adv = data.batch["advantages"]
    for i, value in enumerate([1.0, 0.0, -1.0]):  # as if the faulted row were not there
        torch.testing.assert_close(adv[i, : 3 + i], torch.full((3 + i,), value), atol=1e-5, rtol=0)
    assert torch.all(adv[3] == 0) and metrics["verl_ext/invalid_reward/excluded_rows"] == 1.0


def test_a_batch_with_every_row_excluded_stops_naming_the_reasons_and_the_judge():
    # a judge where nothing listens used to run to the end: excluded_fraction 1.0, grad norm 0, exit 0
    from verl_ext.advantage_step import exclude_invalid_rewards

    judge_failed = {"reward_extra_info": {"dv_valid": 0, "dv_fail_reason": "judge_failed:connect"}}
    env_fault = {"verl_ext": {"valid": False, "invalid_reason": "env_fault:timeout"}}
    data = _batch(["a", "a", "b", "pad-0"], [0.0] * 4, [2] * 4)
    config = OmegaConf.create({"reward": {"reward_manager": {"name": "dvreward"},
                                          "reward_kwargs": {"dvreward": {"judge_url": "http://127.0.0.1:9/v1"}}}})
    with pytest.raises(validity.NothingToLearnError) as info:
        exclude_invalid_rewards(data, [judge_failed, judge_failed, env_fault, None], "dv_valid", False, {}, config)
    assert str(info.value) == (
        "verl-ext: all 3 rows of this training batch were excluded as faults (judge_failed:connect x2, "
        "trajectory_invalid:env_fault:timeout x1); stopping instead of training on nothing. "
        "The judge: reward.reward_kwargs.dvreward.judge_url=http://127.0.0.1:9/v1"
    )
    # one row left to learn from: the step trains on it
    data = _batch(["a", "a"], [0.0, 1.0], [2, 2])
    invalid = exclude_invalid_rewards(data, [judge_failed, _flag(True)], "dv_valid", False, {}, config)
    assert invalid.tolist() == [True, False]
