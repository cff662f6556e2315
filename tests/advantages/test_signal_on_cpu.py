"""``verl_ext.advantages.signal``: what carries signal in a step's advantages, counted on
trainable rows only, and the cause a step without signal names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_ext.advantages import signal

from ..messages import assert_names


def test_rows_tokens_and_groups_are_counted_on_trainable_rows_only():
    advantages = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 9.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]])  # row 2's non-zero is outside its mask
    uids = ["a", "a", "b", "pad_0"]
    report = signal.measure(advantages, mask, uids, signal.trainable_rows(uids, np.zeros(4, dtype=bool)))
    assert (report.rows, report.zero_rows) == (3, 2)  # padding does not count; row 2 trains no non-zero token
    assert (report.tokens, report.zero_tokens) == (7, 6)
    assert (report.groups, report.single_member_groups) == (2, 1)
    assert report.has_signal
    assert report.metrics() == {"verl_ext/signal/zero_advantage_row_share": 2 / 3,
                                "verl_ext/signal/zero_advantage_token_share": 6 / 7,
                                "verl_ext/signal/single_member_group_share": 0.5}


def test_fault_rows_are_not_trainable_and_an_all_fault_step_reports_nothing():
    uids = ["a", "a"]
    trainable = signal.trainable_rows(uids, np.array([True, False]))
    report = signal.measure(torch.zeros(2, 2), torch.ones(2, 2), uids, trainable)
    assert report.rows == 1 and report.single_member_groups == 1 and not report.has_signal
    nothing = signal.measure(torch.zeros(2, 2), torch.ones(2, 2), uids, np.zeros(2, dtype=bool))
    assert nothing.rows == 0 and nothing.metrics() == {}


def test_the_cause_names_the_estimator_the_fix_and_the_opt_out():
    singles = signal.measure(torch.zeros(2, 2), torch.ones(2, 2), ["a", "b"], np.ones(2, dtype=bool))
    assert_names(singles.cause("gigpo"), "algorithm.adv_estimator=gigpo", "actor_rollout_ref.rollout.n",
                 signal.STOP_KEY + "=false")
    equal = signal.measure(torch.zeros(2, 2), torch.ones(2, 2), ["a", "a"], np.ones(2, dtype=bool))
    assert_names(equal.cause("grpo"), "algorithm.adv_estimator=grpo", "rewards are equal", signal.STOP_KEY + "=false")


def _trainer(parameter_sync_step: int, verl_ext_config: dict):
    from verl_ext.compose import compose
    from verl_ext.trainer import VerlExtTrainerSync

    trainer = object.__new__(VerlExtTrainerSync)  # only _check_signal runs: no workers needed
    trainer.config = compose(["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"])
    trainer.local_trigger_step, trainer.parameter_sync_step, trainer.verl_ext_config = 0, parameter_sync_step, verl_ext_config
    return trainer


def _batch(advantage: float):
    from verl import DataProto

    return DataProto.from_dict(tensors={"advantages": torch.full((4, 3), advantage), "response_mask": torch.ones(4, 3)},
                               non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)})


def test_a_step_without_signal_stops_by_default_and_the_opt_out_trains_on():
    with pytest.raises(signal.NoSignalError, match="algorithm.adv_estimator=grpo gave advantage 0 to every token"):
        _trainer(1, {})._check_signal(_batch(0.0), np.zeros(4, dtype=bool), {})
    metrics = {}
    _trainer(1, {"stop_on_zero_signal": False})._check_signal(_batch(0.0), np.zeros(4, dtype=bool), metrics)
    assert metrics["verl_ext/signal/zero_advantage_row_share"] == 1.0


def test_a_separate_async_step_stops_only_if_none_of_its_local_updates_had_signal():
    for first, second, stops in [(0.0, 0.0, True), (1.0, 0.0, False), (0.0, 1.0, False)]:
        trainer = _trainer(2, {})
        trainer._check_signal(_batch(first), np.zeros(4, dtype=bool), {})  # never stops before the last update
        trainer.local_trigger_step = 1
        if stops:
            with pytest.raises(signal.NoSignalError, match="each of this step's 2 local updates"):
                trainer._check_signal(_batch(second), np.zeros(4, dtype=bool), {})
        else:
            trainer._check_signal(_batch(second), np.zeros(4, dtype=bool), {})
