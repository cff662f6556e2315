"""Every field of a stored DVReward question set is checked when the set is read, before any judge
call (``question_set.validate_question_set``): a question with an unknown ``kind`` or without
``text`` used to be judged as "None" or to fall out of both means while the sample counted as
valid. The error names where the set is, the question, the field, its value and the fix."""

from __future__ import annotations

import numpy as np
import pytest

from verl_ext.errors import UserError
from verl_ext.rewards.dvreward.question_set import from_extra_info, validate_question_set

GOOD = {"text": "Is there a red car?", "kind": "semantic", "parents": []}


def _record(bad: dict) -> dict:
    return {"version": "dvq-v1", "questions": [GOOD, bad]}


@pytest.mark.parametrize(
    "bad, field_value",
    [
        ({"text": "Is the car red?", "kind": "visual", "parents": []}, "kind='visual' is not 'semantic' or 'quality'"),
        ({"text": "Is the car red?", "parents": []}, "kind=None is not 'semantic' or 'quality'"),
        ({"kind": "semantic", "parents": []}, "text=None is not a non-empty string"),
        ({"text": "  ", "kind": "semantic", "parents": []}, "text='  ' is not a non-empty string"),
        ({"text": 7, "kind": "semantic", "parents": []}, "text=7 is not a non-empty string"),
        ({"question": "Is the car red?", "kind": "semantic"}, "question='Is the car red?' is not a question field"),
        ({"text": "Is the car red?", "kind": "semantic", "parents": "0"}, "parents='0' is not a list of question indices"),
        ({"text": "Is the car red?", "kind": "semantic", "parents": [True]}, "parents=[True] is not a list of question"),
        ({"text": "Is the car red?", "kind": "semantic", "parents": [1]}, "parents=[1] has parent index 1"),
        ({"text": "Is the car red?", "kind": "semantic", "parents": [-1]}, "parents=[-1] has parent index -1"),
        ("Is the car red?", "question='Is the car red?' is not a mapping"),
    ],
)
def test_a_bad_field_names_the_set_question_field_value_and_fix(bad, field_value):
    with pytest.raises(UserError) as info:
        validate_question_set(_record(bad), "data/train.parquet row 3")
    message = str(info.value)
    assert message.startswith(f"data/train.parquet row 3, question 1: {field_value}"), message
    assert "verl-ext dv-questions" in message  # the fix


def test_a_dataset_row_names_its_split_index_and_key():
    row = {"split": "train", "index": 7, "dv_questions": _record({"text": "Is the car red?", "kind": "Semantic"})}
    with pytest.raises(UserError, match=r"^dataset row \(split='train', index=7\), extra_info\['dv_questions'\], "
                                        r"question 1: kind='Semantic'"):
        from_extra_info(row)


def test_a_record_that_is_not_a_question_list_and_alphagrpo_blanks_are_refused():
    with pytest.raises(UserError, match="is not a record with a 'questions' list"):
        from_extra_info({"dv_questions": {"questions": "Is there a car?"}}, where="row 0")
    with pytest.raises(UserError, match="is not a record with a 'questions' list"):
        from_extra_info({"dv_questions": "Is there a car?"}, where="row 0")
    with pytest.raises(UserError, match=r"row 0, extra_info\['quality_questions'\]\[1\]=None"):
        from_extra_info({"semantic_questions": ["Is there a car?"], "quality_questions": ["Is it sharp?", None]},
                        where="row 0")


def test_valid_sets_read_as_before_from_lists_and_parquet_arrays():
    parquet_like = {"version": "dvq-v1", "questions": np.array([
        {"text": "Is there a car?", "kind": "semantic", "parents": np.array([], dtype=np.int64)},
        {"text": "Is the car red?", "kind": "semantic", "parents": np.array([0])},
        {"text": "Is the image sharp?", "kind": "quality", "parents": None},
    ], dtype=object)}
    qs = validate_question_set(parquet_like, "row 0")
    assert qs.kinds == ["semantic", "semantic", "quality"] and qs.parents == [(), (0,), ()]
    assert qs.meta == {"version": "dvq-v1"}
    assert validate_question_set({"questions": None}, "row 0") is None  # no questions: flagged no_questions
    assert validate_question_set({"questions": []}, "row 0") is None
