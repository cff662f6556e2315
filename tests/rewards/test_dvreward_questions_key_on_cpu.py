"""``questions_key`` with dots: the manager reads a row's questions from the agent loop's
``extra_fields`` (``verl_ext.extras.dv_questions``), as docs/reference/dvreward.md documents."""

from verl_ext.rewards.dvreward.question_set import from_extra_info
from verl_ext.steps import StepMetadata

RECORD = {"version": "minidesk-v1", "questions": [
    {"text": "Is there an email in the Sent folder addressed to a@b.test?", "kind": "semantic", "parents": []},
    {"text": 'Is there a sent email to a@b.test with the subject "Hi" (ignoring letter case)?', "kind": "semantic",
     "parents": [0]},
]}


def test_dotted_key_descends_into_the_step_metadata_extras():
    # the fields the manager builds: dataset extra_info, then the agent loop's extra_fields
    fields = {"env": {"task": "mail_send"}, **StepMetadata(
        traj_uid="t", step_idx=[0], anchor=["a"], step_reward=[0.0], extras={"dv_questions": RECORD},
    ).to_extra_fields()}
    questions = from_extra_info(fields, "verl_ext.extras.dv_questions")
    assert questions.texts == [q["text"] for q in RECORD["questions"]]
    assert questions.parents == [(), (0,)] and questions.meta == {"version": "minidesk-v1"}


def test_a_field_named_with_dots_wins_and_a_missing_path_is_no_questions():
    other = {"questions": [{"text": "Is the sky blue today?", "kind": "semantic", "parents": []}]}
    fields = {"a.b": other, "a": {"b": RECORD}}
    assert from_extra_info(fields, "a.b").texts == ["Is the sky blue today?"]
    assert from_extra_info({"a": {"c": RECORD}}, "a.b") is None
    assert from_extra_info({"a": "not a mapping"}, "a.b.c") is None
