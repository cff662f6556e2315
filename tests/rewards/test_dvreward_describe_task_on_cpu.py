"""The ``dv_describe`` task of ``recipes/dvreward_judge``: templated prompts whose stored questions
pass DVReward's own validation, its format check, and the cpu recipe's rule-based judge answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_ext.rewards.dvreward.describe_task import OBJECTS, compute_score, describe_rows
from verl_ext.rewards.dvreward.judge import Artifact
from verl_ext.rewards.dvreward.judge_backends import ChatRequest, FakeBackend
from verl_ext.rewards.dvreward.question_set import from_extra_info, question_problem

ANSWERS = Path(__file__).resolve().parents[2] / "recipes/dvreward_judge/cpu_judge_answers.json"


def test_rows_carry_valid_questions_with_a_parent_link(tmp_path):
    from verl_ext.data import main as prepare_data

    prepare_data(["dv_describe", str(tmp_path), "--train-size", "12", "--val-size", "2"])
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "train.parquet").to_dict("records")
    assert len(rows) == 12
    for row in rows:
        questions = from_extra_info(row["extra_info"])  # read back from parquet like the manager does
        assert questions.kinds == ["semantic", "semantic", "quality", "quality"]
        assert questions.parents == [(), (0,), (), ()]
        assert all(question_problem(q) is None for q in questions.texts)
        assert questions.meta["version"] == "template-v1"
    assert describe_rows(5, 0, "train") == describe_rows(5, 0, "train") != describe_rows(5, 0, "val")


@pytest.mark.parametrize(("text", "score"), [("A red car.", 1.0), ("A red car", 0.0), ("Red. Car.", 0.0),
                                             ("", 0.0), ("word " * 31 + ".", 0.0)])
def test_format_check(text, score):
    assert compute_score("verl_ext/dv_describe", text, "red car") == score


def _answer(backend: FakeBackend, question: str, response: str):
    request = ChatRequest(messages=[{"role": "user", "content": Artifact.text(response).user_content(question)}])
    return backend.complete([request])[0]


def test_cpu_judge_answers_every_template_question_and_fails_only_kites():
    backend = FakeBackend(json.loads(ANSWERS.read_text()))
    for row in describe_rows(64, 0, "train"):
        obj = next(o for o in OBJECTS if o in row["prompt"][0]["content"])
        for question in from_extra_info(row["extra_info"]).texts:
            completion = _answer(backend, question, "a plain answer")
            if obj == "kite" and "kite" in question:
                assert completion.http_status == 503
            else:
                assert completion.http_status == 200 and completion.content in ("yes", "no"), question
    # the quality answers depend on the response, so GRPO groups see different scores
    single = "Is the text a single sentence?"
    markup = "Is the text free of markup or code?"
    assert _answer(backend, single, "a car.").content == "yes" != _answer(backend, single, "a car").content
    assert _answer(backend, markup, "a car").content == "yes" != _answer(backend, markup, "<tool_call>").content
