"""verl glue: step advantages painted onto tokens, on hand-made tensors."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.advantages import StepDataError, compute, compute_with_returns
from verl_ext.advantages.verl_glue import compute_token_advantages
from verl_ext.steps import MissingStepMetadataError, StepMetadata

# the GiGPO reference code's toy (langfengQ/verl-agent @ 20bd331, gigpo/core_gigpo.py), with its golden GiGPO advantages (mean_norm, gamma 0.95).
TRAJS = {"t1": list("ABC"), "t2": list("ADBC"), "t3": list("ADDE")}
REWARDS = {"t1": [0, 0, 10], "t2": [0, 0, 0, 10], "t3": [0, 0, 0, 0]}
GOLDEN = {"t1": [6.7951, 3.6364, 3.6364], "t2": [6.3439, 9.6530, 3.6364, 3.6364],
          "t3": [-12.2299, -9.3720, -9.3720, -6.3636]}
CONFIG = OmegaConf.create({"gamma": 0.95, "gigpo": {"mode": "mean_norm"}})
L = 16


def trajectory_rows(rewards=REWARDS):
    """One row per trajectory: step s owns tokens [4s, 4s+3); token 4s+3 is an observation."""
    extra, mask = [], torch.zeros(len(TRAJS) + 1, L, dtype=torch.int64)
    for i, (t, anchors) in enumerate(TRAJS.items()):
        n = len(anchors)
        spans = [[4 * s, 4 * s + 3] for s in range(n)]
        extra.append(StepMetadata(t, list(range(n)), anchors, rewards[t], spans=spans).to_extra_fields())
        for s, e in spans:
            mask[i, s:e] = 1
    extra.append({})  # verl's padding row
    uids = ["g"] * len(TRAJS) + ["pad-0"]
    scores = torch.tensor([10.0, 10.0, 0.0, 0.0])
    return extra, mask, uids, scores


def turn_rows():
    """One row per turn: each row is one step, the whole response is the step."""
    extra, uids, keys = [], [], []
    for t, anchors in TRAJS.items():
        for s, a in enumerate(anchors):
            extra.append(StepMetadata(t, [s], [a], [REWARDS[t][s]]).to_extra_fields())
            uids.append("g")
            keys.append(f"g_{t}_{s}")
    mask = torch.zeros(len(extra), L, dtype=torch.int64)
    mask[:, :5] = 1
    scores = torch.tensor([float(sum(REWARDS[k[2:4]][: int(k[-1]) + 1])) for k in keys])
    return extra, mask, uids, scores, keys


def test_one_row_per_trajectory_paints_each_step_on_its_span():
    extra, mask, uids, scores = trajectory_rows()
    adv, ret = compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                        scores=scores, algo_config=CONFIG)
    assert adv.shape == ret.shape == mask.shape and adv.dtype == torch.float32
    for i, t in enumerate(TRAJS):
        for s, value in enumerate(GOLDEN[t]):
            torch.testing.assert_close(adv[i, 4 * s:4 * s + 3], torch.full((3,), value), atol=1e-4, rtol=0)
    assert torch.all(adv[mask == 0] == 0)  # observations, tail padding
    assert torch.all(adv[-1] == 0)  # padding row
    torch.testing.assert_close(ret, adv)


def test_one_row_per_turn_matches_the_trajectory_layout():
    extra, mask, uids, scores, keys = turn_rows()
    adv, _ = compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                      scores=scores, algo_config=CONFIG, row_keys=keys)
    expected = np.concatenate([GOLDEN[t] for t in TRAJS])
    np.testing.assert_allclose(adv[:, :5].numpy(), np.repeat(expected[:, None], 5, 1), atol=1e-4)
    assert torch.all(adv[:, 5:] == 0)


def test_outcome_reward_missing_from_steps_goes_on_the_last_step():
    # The env reported nothing per step; the reward manager's score is the outcome.
    zeros = {t: [0] * len(r) for t, r in REWARDS.items()}
    extra, mask, uids, scores = trajectory_rows(zeros)
    adv, _ = compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                      scores=scores, algo_config=CONFIG)
    for i, t in enumerate(TRAJS):
        np.testing.assert_allclose(adv[i, 0:16:4][: len(GOLDEN[t])].numpy(), GOLDEN[t], atol=1e-4)
    steps_only = OmegaConf.create({"gamma": 0.95, "gigpo": {"mode": "mean_norm", "episode_score": "steps"}})
    adv, _ = compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                      scores=scores, algo_config=steps_only)
    assert torch.all(adv == 0)


def test_invalid_trajectory_is_zero_and_left_out_of_the_groups():
    extra, mask, uids, scores = trajectory_rows()
    meta = StepMetadata.from_extra_fields(extra[2])
    meta.valid, meta.invalid_reason = False, "judge failed"
    extra[2] = meta.to_extra_fields()
    adv, _ = compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                      scores=scores, algo_config=CONFIG)
    assert torch.all(adv[2] == 0)
    two = {k: [] for k in ("uid", "traj_uid", "step_idx", "anchor", "step_reward")}
    for t in ("t1", "t2"):
        for s, a in enumerate(TRAJS[t]):
            for k, v in zip(two, ("g", t, s, a, REWARDS[t][s])):
                two[k].append(v)
    expected = compute("gigpo", **two, gamma=0.95, mode="mean_norm")
    np.testing.assert_allclose(adv[0, 0:12:4].numpy(), expected[:3], atol=1e-6)
    np.testing.assert_allclose(adv[1, 0:16:4].numpy(), expected[3:], atol=1e-6)


def test_missing_metadata_names_the_row_and_the_setting():
    extra, mask, uids, scores, keys = turn_rows()
    extra[4] = {}
    with pytest.raises(MissingStepMetadataError, match=r"g_t2_1 \(uid 'g'\).*default_agent_loop"):
        compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                 scores=scores, algo_config=CONFIG, row_keys=keys)


def test_bad_step_data_and_spans_are_refused():
    extra, mask, uids, scores = trajectory_rows()
    extra.append(StepMetadata("t1", [3], ["Z"], [0.0]).to_extra_fields())  # t1 again, other uid
    uids.append("other")
    mask = torch.cat([mask, torch.ones(1, L, dtype=torch.int64)])
    with pytest.raises(StepDataError, match="different uid.*'t1'"):
        compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                 scores=torch.zeros(5), algo_config=CONFIG)
    extra, mask, uids, scores = trajectory_rows()
    extra[0] = StepMetadata("t1", [0, 1, 2], list("ABC"), [0, 0, 10],
                            spans=[[0, 5], [4, 7], [8, 11]]).to_extra_fields()
    with pytest.raises(ValueError, match="overlap"):
        compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                 scores=scores, algo_config=CONFIG)
    extra[0] = StepMetadata("t1", [0, 1], list("AB"), [0, 10]).to_extra_fields()
    with pytest.raises(ValueError, match="no spans"):
        compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                 scores=scores, algo_config=CONFIG)


def test_unknown_config_key_names_the_section():
    extra, mask, uids, scores = trajectory_rows()
    config = OmegaConf.create({"gigpo": {"mode": "mean_norm", "step_advantage_weight": 1.0}})
    with pytest.raises(TypeError, match=r"algorithm\.gigpo.*step_advantage_weight"):
        compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                 scores=scores, algo_config=config)


def test_hiper_reads_values_at_each_step_start_and_returns_critic_targets():
    roles = ["planner", "executor", "executor", "planner", "executor"]
    spans = [[0, 2], [2, 5], [5, 8], [8, 10], [10, 14]]
    meta = StepMetadata("t", list(range(5)), list("abcde"), [0.0, 0.0, 1.0, 0.0, 2.0], spans=spans, role=roles)
    mask = torch.ones(1, L, dtype=torch.int64)
    values = torch.zeros(1, L)
    step_values = [0.5, 0.2, 0.1, 0.7, 0.3]
    for (s, e), v in zip(spans, step_values):
        values[0, s:e] = v
        values[0, s + 1] = 99.0  # only the first token of a step is read
    config = OmegaConf.create({"gamma": 0.9, "lam": 0.8, "hiper": {"norm_adv": False}})
    adv, ret = compute_token_advantages("hiper", response_mask=mask, extra_fields=[meta.to_extra_fields()],
                                        uids=["g"], scores=torch.tensor([3.0]), algo_config=config,
                                        values=values)
    exp_adv, exp_ret = compute_with_returns(
        "hiper", uid=["g"] * 5, traj_uid=["t"] * 5, step_idx=range(5), anchor=list("abcde"),
        step_reward=[0.0, 0.0, 1.0, 0.0, 2.0], role=roles, values=step_values, gamma=0.9, lam=0.8,
        norm_adv=False)
    for i, (s, e) in enumerate(spans):
        np.testing.assert_allclose(adv[0, s:e].numpy(), exp_adv[i], rtol=1e-6)
        np.testing.assert_allclose(ret[0, s:e].numpy(), exp_ret[i], rtol=1e-6)
    assert torch.all(adv[0, 14:] == 0)


def test_verl_registration_points_to_the_verl_ext_trainer():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import verl_ext.advantages.registration  # noqa: F401

    for name in ("gigpo", "hgpo", "step_grouped", "himac", "hiper"):
        with pytest.raises(RuntimeError, match=r"step metadata|per-step metadata") as info:
            get_adv_estimator_fn(name)(token_level_rewards=None, response_mask=None, config=None)
        assert "trainer.v1.trainer_mode=verl_ext" in str(info.value)


def test_a_batch_of_padding_only_gives_zeros():
    mask = torch.zeros(2, L, dtype=torch.int64)
    adv, ret = compute_token_advantages("hgpo", response_mask=mask, extra_fields=[{}, {}],
                                        uids=["pad-a", "pad-b"], scores=torch.zeros(2), algo_config=CONFIG)
    assert adv.shape == (2, L) and not adv.any() and not ret.any()


def test_nan_score_from_a_failed_judge_invalidates_the_trajectory():
    extra, mask, uids, scores = trajectory_rows()
    scores[2] = float("nan")
    adv, _ = compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                      scores=scores, algo_config=CONFIG)
    meta = StepMetadata.from_extra_fields(extra[2])
    meta.valid = False
    extra[2] = meta.to_extra_fields()
    flagged, _ = compute_token_advantages("gigpo", response_mask=mask, extra_fields=extra, uids=uids,
                                          scores=torch.tensor([10.0, 10.0, 0.0, 0.0]), algo_config=CONFIG)
    torch.testing.assert_close(adv, flagged)
    assert torch.all(adv[2] == 0)


def test_painting_matches_a_token_by_token_loop():
    # Rows in any order, several spans per row, gaps, zero-length spans, spans past the end (cut),
    # rows without steps, a random mask: each token gets its step's value or 0.
    from verl_ext.advantages.verl_glue import _paint

    rng = np.random.default_rng(0)
    bs, length = 7, 40
    row, start, end = [], [], []
    for r in rng.permutation(bs)[:5]:
        cuts = np.sort(rng.choice(np.arange(length + 6), 2 * rng.integers(1, 5), replace=False))
        for s, e in cuts.reshape(-1, 2):
            row.append(r), start.append(s), end.append(e if rng.random() < 0.8 else s)
    shuffle = rng.permutation(len(row))
    row, start, end = (np.array(x)[shuffle] for x in (row, start, end))
    mask = rng.random((bs, length)) < 0.8
    adv, ret = rng.normal(size=len(row)), rng.normal(size=len(row))
    painted = _paint(row, start, end, (adv, ret), mask, [f"row {i}" for i in range(bs)])
    for values, tokens in zip((adv, ret), painted):
        expected = np.zeros((bs, length), dtype=np.float32)
        for j in range(len(row)):
            for t in range(start[j], min(end[j], length)):
                expected[row[j], t] = values[j] if mask[row[j], t] else 0.0
        assert tokens.dtype == np.float32
        np.testing.assert_array_equal(tokens, expected)
