"""The question schema, its validation, and `verl-ext dv-questions` against a local server."""

import json

import numpy as np
import pandas as pd
import pytest

from verl_ext.rewards.dvreward import questions as builder
from verl_ext.rewards.dvreward.question_set import clean_questions, from_extra_info, question_problem


@pytest.mark.parametrize(
    "text",
    [
        "What colour is the car?",  # not yes/no
        "Is it red?",  # bare pronoun: not self-contained
        "Is there a car? Is it red?",  # two questions
        "Is there a car, and is the car red?",  # two facts joined
        "Is there a car",  # no question mark
        "Is a?",  # too short
    ],
)
def test_rejects_non_atomic_or_non_yes_no_questions(text):
    assert question_problem(text) is not None


def test_accepts_atomic_self_contained_questions():
    for text in ["Is there a red car?", "Does the sign read 'OPEN'?", "Are there three birds?", "Is this image sharp?"]:
        assert question_problem(text) is None, text


def test_clean_dedupes_caps_and_remaps_parents():
    raw = [
        ("Is there a car?", "semantic", []),  # 0
        ("What colour is the car?", "semantic", [0]),  # 1: dropped (not yes/no)
        ("Is the car red?", "semantic", [0]),  # 2 -> 1, parent 0 kept
        ("is there a CAR ?", "semantic", []),  # 3: duplicate of 0
        ("Is the car's door open?", "semantic", [1, 5]),  # 4 -> 2: parent 1 dropped, 5 is later
        ("Is the image sharp?", "quality", []),  # 5
        ("Is the text legible?", "quality", []),  # 6: over the quality cap
        ("Is there a tree behind the car?", "semantic", []),  # 7: over the semantic cap
    ]
    qs, dropped = clean_questions(raw, max_semantic=3, max_quality=1)
    assert qs.texts == ["Is there a car?", "Is the car red?", "Is the car's door open?", "Is the image sharp?"]
    assert qs.kinds == ["semantic", "semantic", "semantic", "quality"]
    assert qs.parents == [(), (0,), (), ()]
    assert len(dropped) == 4


def test_reads_both_stored_forms():
    # our record, as pandas returns it from parquet (numpy arrays instead of lists)
    record = {
        "version": "dvq-v1",
        "questions": np.array(
            [
                {"text": "Is there a car?", "kind": "semantic", "parents": np.array([], dtype=np.int64)},
                {"text": "Is the car red?", "kind": "semantic", "parents": np.array([0])},
                {"text": "Is the image sharp?", "kind": "quality", "parents": np.array([], dtype=np.int64)},
            ],
            dtype=object,
        ),
    }
    qs = from_extra_info({"dv_questions": record})
    assert qs.kinds == ["semantic", "semantic", "quality"] and qs.parents == [(), (0,), ()]
    assert qs.meta["version"] == "dvq-v1"
    # AlphaGRPO's TextPromptWithQuestionDataset form (strings or {"question": ...})
    alpha = from_extra_info(
        {"semantic_questions": ["Is there a car?", {"question": "Is it red?"}], "quality_questions": ["Q?"]}
    )
    assert alpha.texts == ["Is there a car?", "Is it red?", "Q?"]
    assert from_extra_info({}) is None


@pytest.mark.parametrize("parents, bad", [([-1], -1), ([2], 2), ([1], 1)])
def test_parent_indices_from_a_row_must_name_earlier_questions(parents, bad):
    # -1 would wrap to the last question and a forward reference (2, or itself: 1) would gate on a
    # value the one-pass gating has not gated yet; both are refused, naming the row and question.
    record = {"questions": [
        {"text": "Is there a car?", "kind": "semantic", "parents": []},
        {"text": "Is the car red?", "kind": "semantic", "parents": parents},
        {"text": "Is the image sharp?", "kind": "quality", "parents": []},
    ]}
    with pytest.raises(ValueError, match=rf"row \(split='train', index=7\).*question 1: parents=\[{bad}\] has parent index {bad}"):
        from_extra_info({"split": "train", "index": 7, "dv_questions": record})


def test_clean_drops_links_the_semantic_first_order_makes_forward():
    # a semantic question depending on an earlier quality one: after semantic-first reordering the
    # parent comes later, so the link goes and the set stays valid
    qs, _ = clean_questions(
        [("Is the image sharp?", "quality", []), ("Is there a sharp car?", "semantic", [0])], 5, 5
    )
    assert qs.texts == ["Is there a sharp car?", "Is the image sharp?"] and qs.parents == [(), ()]


def _decomposition(subject: str) -> str:
    return (
        "```json\n"
        + json.dumps(
            {
                "semantic": [
                    {"q": f"Is there a {subject}?", "parents": []},
                    {"q": f"Is the {subject} blue?", "parents": [0]},
                    {"q": f"Is there a {subject}?", "parents": []},
                    "What is it?",
                ],
                "quality": ["Is the image free of visual artifacts?"],
            }
        )
        + "\n```"
    )


def _verl_rows(subjects):
    return [
        {
            "data_source": "t2i",
            "prompt": [{"role": "system", "content": "be good"}, {"role": "user", "content": f"Draw a blue {s}."}],
            "reward_model": {"ground_truth": ""},
            "extra_info": {"index": i},
        }
        for i, s in enumerate(subjects)
    ]


def _cli(tmp_path, url, src, out, *extra):
    return builder.main(
        [
            str(src),
            "-o",
            str(out),
            "--base-url",
            url,
            "--model",
            "decomposer",
            "--quiet",
            "--cache",
            str(tmp_path / "cache.jsonl"),
            *extra,
        ]
    )


def test_builder_writes_questions_and_caches_by_prompt(tmp_path, fake_judge):
    subjects = ["car", "boat", "car"]  # one duplicate prompt
    server = fake_judge({f"Draw a blue {s}.": {"content": _decomposition(s)} for s in set(subjects)})
    src = tmp_path / "train.parquet"
    pd.DataFrame(_verl_rows(subjects)).to_parquet(src)

    assert _cli(tmp_path, server.url, src, tmp_path / "out.parquet") == 0
    assert server.requests() == 2  # distinct prompts only
    rows = pd.read_parquet(tmp_path / "out.parquet").to_dict(orient="records")
    qs = from_extra_info(rows[1]["extra_info"])
    assert qs.texts == ["Is there a boat?", "Is the boat blue?", "Is the image free of visual artifacts?"]
    assert qs.parents == [(), (0,), ()] and qs.meta["version"] == builder.DECOMPOSE_PROMPT_VERSION
    assert rows[1]["extra_info"]["index"] == 1  # existing extra_info kept

    # a re-run (JSONL in and out, parent links dropped) is served from the cache: no new request
    jsonl = tmp_path / "train.jsonl"
    pd.DataFrame(_verl_rows(subjects)).to_json(jsonl, orient="records", lines=True)
    assert _cli(tmp_path, server.url, jsonl, tmp_path / "out.jsonl", "--no-parents") == 0
    assert server.requests() == 2
    first = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert [q["parents"] for q in first["extra_info"]["dv_questions"]["questions"]] == [[], [], []]

    # another cap changes the request, so it is asked again; the LLM's extra questions are capped
    assert _cli(tmp_path, server.url, src, tmp_path / "capped.parquet", "--max-semantic", "1") == 0
    assert server.requests() == 4
    capped = from_extra_info(pd.read_parquet(tmp_path / "capped.parquet").iloc[0]["extra_info"])
    assert capped.texts == ["Is there a car?", "Is the image free of visual artifacts?"]


def test_builder_resumes_after_failures(tmp_path, fake_judge):
    src = tmp_path / "train.parquet"
    pd.DataFrame(_verl_rows(["car", "boat", "kite"])).to_parquet(src)
    broken = fake_judge(
        {
            "Draw a blue car.": {"content": _decomposition("car")},
            "Draw a blue boat.": {"content": "I cannot help with that."},  # no JSON
            "Draw a blue kite.": {"status": 503},
        }
    )
    assert _cli(tmp_path, broken.url, src, tmp_path / "out.parquet", "--retries", "0") == 1
    assert not (tmp_path / "out.parquet").exists()  # nothing half-done is written

    healthy = fake_judge({f"Draw a blue {s}.": {"content": _decomposition(s)} for s in ["car", "boat", "kite"]})
    assert _cli(tmp_path, healthy.url, src, tmp_path / "out.parquet") == 0
    assert healthy.requests() == 2  # the car answer came from the cache
    rows = pd.read_parquet(tmp_path / "out.parquet").to_dict(orient="records")
    first_questions = [from_extra_info(r["extra_info"]).texts[0] for r in rows]
    assert first_questions == ["Is there a car?", "Is there a boat?", "Is there a kite?"]


def test_cache_key_depends_on_prompt_version_model_and_request(monkeypatch):
    messages = builder.decompose_messages("Draw a cat.", 10, 2)
    key = builder.cache_key(messages, "m")
    assert key == builder.cache_key(builder.decompose_messages("Draw a cat.", 10, 2), "m")
    assert key != builder.cache_key(messages, "other-model")
    assert key != builder.cache_key(builder.decompose_messages("Draw a cat.", 5, 2), "m")
    monkeypatch.setattr(builder, "DECOMPOSE_PROMPT_VERSION", "dvq-v2")
    assert key != builder.cache_key(messages, "m")


def test_cache_survives_a_write_torn_by_an_interruption(tmp_path):
    path = tmp_path / "cache.jsonl"
    cache = builder.QuestionCache(str(path))
    cache.add("k1", "Draw a cat.", [["Is there a cat?", "semantic", []]])
    with open(path, "a") as f:
        f.write('{"key": "k2", "prompt": "Draw a d')  # killed mid-line
    reloaded = builder.QuestionCache(str(path))
    assert list(reloaded.entries) == ["k1"]
    reloaded.add("k3", "Draw a fish.", [])
    assert list(builder.QuestionCache(str(path)).entries) == ["k1", "k3"]
