"""Start-up checks of a ``dvreward`` run (``verl_ext.rewards.dvreward.startup``), on verl's real
Hydra-composed config: an unknown key, a run without a judge, a bad question set in a data file,
and a judge URL where nothing listens (a real closed loopback port) stop before any worker starts,
naming the key, file or URL, never the API key. A live ``verl-ext judge-server`` passes."""

from __future__ import annotations

import json
import socket

import pandas as pd
import pytest

from ..messages import assert_names
from verl_ext.errors import UserError
from verl_ext.rewards.dvreward import judge_server
from verl_ext.rewards.dvreward.describe_task import describe_rows
from verl_ext.rewards.dvreward.startup import check_config, probe_configured_judge, probe_judge, settings_of

SECRET = "sk-test-0123456789abcdef"


def _config(*overrides: str):
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=["reward.reward_manager.name=dvreward", *overrides])


def _closed_port() -> int:
    """A loopback port where nothing listens: bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_run_without_dvreward_is_not_checked(tmp_path):
    config = _config("reward.reward_manager.name=naive", "+reward.reward_kwargs.dvreward.judge_ulr=x")
    assert check_config(config) is None
    probe_configured_judge(config)


def test_an_unknown_key_and_a_missing_judge_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown keys \['reward.reward_kwargs.dvreward.judge_ulr'\]"):
        check_config(_config("+reward.reward_kwargs.dvreward.judge_ulr=http://127.0.0.1:8000/v1"))
    with pytest.raises(ValueError, match=r"DVReward has no judge: set reward.reward_kwargs.dvreward.judge_url"):
        check_config(_config("+reward.reward_kwargs.dvreward.model=judge"))


def test_every_question_set_of_the_data_files_is_checked(tmp_path):
    rows = describe_rows(6, seed=0, split="train")
    good = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(good)
    judge = "+reward.reward_kwargs.dvreward.judge_url=http://127.0.0.1:1/v1"
    assert check_config(_config(judge, f"data.train_files={good}", f"data.val_files={good}")) is not None

    rows[4]["extra_info"]["dv_questions"]["questions"][0]["kind"] = "visual"
    bad = tmp_path / "val.parquet"
    pd.DataFrame(rows).to_parquet(bad)
    with pytest.raises(UserError, match=rf"^{bad} row 4, extra_info\['dv_questions'\], question 0: kind='visual'"):
        check_config(_config(judge, f"data.train_files={good}", f"data.val_files={bad}"))


def test_a_judge_url_where_nothing_listens_stops_naming_the_url_not_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", SECRET)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    config = _config(f"+reward.reward_kwargs.dvreward.judge_url={url}",
                     "+reward.reward_kwargs.dvreward.api_key_env=JUDGE_KEY")
    with pytest.raises(UserError) as info:
        probe_configured_judge(config)
    message = str(info.value)
    assert f"judge_url={url} does not answer (connect: ConnectError" in message and "start the judge" in message
    assert SECRET not in message


def test_a_judge_that_never_answers_stops_the_start_naming_the_url_the_bound_and_the_key(silent_judge):
    config = _config(f"+reward.reward_kwargs.dvreward.judge_url={silent_judge}",
                     "+reward.reward_kwargs.dvreward.timeout_s=0.3")
    with pytest.raises(UserError) as info:
        probe_configured_judge(config)
    assert_names(str(info.value), f"judge_url={silent_judge}", "0.3 s", "reward.reward_kwargs.dvreward.timeout_s")


def test_the_projects_judge_server_passes_and_a_refused_key_is_named(tmp_path, monkeypatch):
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"car": 0.9}))
    monkeypatch.setenv("SERVER_KEY", SECRET)
    with judge_server.spawn(["--fake-answers", str(answers), "--require-api-key-env", "SERVER_KEY"]) as url:
        ok = _config(f"+reward.reward_kwargs.dvreward.judge_url={url}",
                     "+reward.reward_kwargs.dvreward.api_key_env=SERVER_KEY")
        probe_configured_judge(ok)
        monkeypatch.setenv("WRONG_KEY", "sk-wrong-key")
        wrong = _config(f"+reward.reward_kwargs.dvreward.judge_url={url}",
                        "+reward.reward_kwargs.dvreward.api_key_env=WRONG_KEY")
        with pytest.raises(UserError, match=r"\(http_401: .*api_key_env='WRONG_KEY'") as info:
            probe_judge(settings_of(wrong))
        unset = _config(f"+reward.reward_kwargs.dvreward.judge_url={url}",
                        "+reward.reward_kwargs.dvreward.api_key_env=UNSET_KEY_NAME")
        with pytest.raises(UserError, match=r"no_api_key: environment variable UNSET_KEY_NAME is not set"):
            probe_judge(settings_of(unset))
    assert SECRET not in str(info.value) and "sk-wrong-key" not in str(info.value)


def test_a_data_file_without_questions_under_the_key_and_a_missing_env_score_are_named(tmp_path):
    data = tmp_path / "train.parquet"
    pd.DataFrame(describe_rows(4, seed=0, split="train")).to_parquet(data)
    judge = "+reward.reward_kwargs.dvreward.judge_url=http://127.0.0.1:1/v1"
    with pytest.raises(UserError, match=rf"^{data}: none of its 4 rows has questions in extra_info\['dv_question'\]"):
        check_config(_config(judge, f"data.train_files={data}", "+reward.reward_kwargs.dvreward.questions_key=dv_question"))
    # a dotted key may name questions the agent loop supplies: not required in the file
    check_config(_config(judge, f"data.train_files={data}", "+reward.reward_kwargs.dvreward.questions_key=a.b"))
    with pytest.raises(ValueError, match=r"env_weight=0.5 needs an environment score: set "
                                         r"reward.reward_kwargs.dvreward.env_score_key"):
        check_config(_config(judge, "+reward.reward_kwargs.dvreward.env_weight=0.5"))
