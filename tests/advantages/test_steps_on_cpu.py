"""The step metadata contract: plain-dict round trip, anchor keys, missing-metadata errors."""

import copy
import json

import numpy as np
import pytest

from verl_ext.steps import (
    EXTRA_FIELDS_KEY,
    MissingStepMetadataError,
    StepMetadata,
    anchor_key,
    plain_step_metadata,
    step_metadata,
)


def sample() -> StepMetadata:
    return StepMetadata(
        traj_uid="t1", step_idx=[0, 1], anchor=["obs a", anchor_key(np.zeros((2, 2), np.uint8))],
        step_reward=[0.0, 1.0], spans=[[0, 5], [9, 12]], action_valid=[True, False],
        role=["planner", "executor"], valid=False, invalid_reason="env fault",
        extras={"tool_calls": 2},
    )


def test_extra_fields_are_plain_json_and_round_trip():
    extra = sample().to_extra_fields()
    assert list(extra) == [EXTRA_FIELDS_KEY]
    # TransferQueue stores python dicts: nothing but lists, numbers, strings, bools and None.
    plain = json.loads(json.dumps(extra))
    assert plain == extra
    assert step_metadata(copy.deepcopy(plain)) == sample()


def test_unknown_keys_from_newer_writers_land_in_extras():
    extra = sample().to_extra_fields()
    extra[EXTRA_FIELDS_KEY]["gui_actions"] = 3
    assert step_metadata(extra).extras == {"tool_calls": 2, "gui_actions": 3}


@pytest.mark.parametrize("extra", [None, {}, {"other": 1}, {EXTRA_FIELDS_KEY: {}},
                                   {EXTRA_FIELDS_KEY: {"traj_uid": "t", "step_idx": [0]}}])
def test_missing_metadata_names_the_agent_loop_setting(extra):
    with pytest.raises(MissingStepMetadataError, match="agent loop.*default_agent_loop"):
        step_metadata(extra)


def test_newer_schema_is_refused():
    extra = sample().to_extra_fields()
    extra[EXTRA_FIELDS_KEY]["version"] = 99
    with pytest.raises(ValueError, match="newer"):
        step_metadata(extra)


@pytest.mark.parametrize("bad", [
    dict(anchor=["only one"]),
    dict(spans=[[0, 5]]),
    dict(spans=[[5, 0], [6, 7]]),
    dict(role=["planner", "boss"]),
])
def test_inconsistent_lists_are_refused(bad):
    fields = dict(traj_uid="t", step_idx=[0, 1], anchor=["a", "b"], step_reward=[0.0, 1.0]) | bad
    with pytest.raises(ValueError, match="'t'"):
        StepMetadata(**fields)
    # The batch readers' accessor makes the same checks on the plain dict a row carries.
    with pytest.raises(ValueError, match="'t'"):
        plain_step_metadata({EXTRA_FIELDS_KEY: fields})


@pytest.mark.parametrize("extra", [None, {}, {EXTRA_FIELDS_KEY: {"traj_uid": "t", "step_idx": [0]}}])
def test_plain_accessor_refuses_missing_metadata_alike(extra):
    with pytest.raises(MissingStepMetadataError, match="agent loop.*default_agent_loop"):
        plain_step_metadata(extra)


def test_plain_accessor_returns_the_row_dict_unchanged():
    extra = sample().to_extra_fields()
    assert plain_step_metadata(extra) is extra[EXTRA_FIELDS_KEY]


def test_anchor_key_is_stable_and_content_based():
    image = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert anchor_key("text obs") == "text obs"
    assert anchor_key(image) == anchor_key(image.copy()) != anchor_key(image.reshape(4, 3))
    assert anchor_key(image) != anchor_key(image.astype(np.int16))
    assert anchor_key({"b": 1, "a": [1, 2]}) == anchor_key({"a": [1, 2], "b": 1})
    assert anchor_key(b"\x00\x01").startswith("sha256:")


def test_of_row_writes_both_layouts_of_one_episode():
    episode = dict(anchors=["a", "b", "c"], step_rewards=[0.0, 0.5, 1.0], spans=[[0, 2], [4, 6], [8, 9]],
                   action_valid=[True, False, True])
    whole = StepMetadata.of_row("t", None, **episode, truncated=True, extras={"success": True})
    assert whole.step_idx == [0, 1, 2] and whole.spans == episode["spans"] and whole.truncated
    turn = StepMetadata.of_row("t", 1, **episode, valid=False, extras={"success": True})
    assert (turn.step_idx, turn.anchor, turn.step_reward, turn.action_valid, turn.spans) == ([1], ["b"], [0.5], [False], None)
    assert not turn.valid and turn.extras == {"success": True}
