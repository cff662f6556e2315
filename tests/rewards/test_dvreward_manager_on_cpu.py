"""The `dvreward` reward manager inside verl's own RewardLoopWorker, against a local judge server.

The config is verl's real `ppo_trainer` composed by Hydra with the documented overrides; the
worker is verl's `RewardLoopWorker` (the class its Ray actor wraps), built and called the way
`RewardLoopManager` and `AgentLoopWorker._compute_score` do; the input is a DataProto laid out
exactly like the one `AgentLoopWorker._compute_score` sends (verl 0.9.1, agent_loop.py).
"""

import copy
import json
import logging
import time

import numpy as np
import pytest
import torch
from omegaconf import open_dict
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

from ..messages import assert_names
from verl_ext.rewards.dvreward.judge_server import bind
from verl_ext.steps import StepMetadata

TASK = "Draw a red car parked behind a tree."


@pytest.fixture(scope="module")
def base_config(tiny_model_dir):
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                "reward.reward_manager.name=dvreward",
                "+reward.reward_kwargs.dvreward.judge_url=http://127.0.0.1:9/v1",
                "+reward.reward_kwargs.dvreward.max_retries=0",
            ],
        )


def _config(base, **dvreward):
    config = copy.deepcopy(base)
    with open_dict(config):
        config.reward.reward_kwargs.dvreward.update(dvreward)
    return config


def _questions(golden, parents=None):
    parents = parents or [[] for _ in golden["kinds"]]
    return {
        "version": "dvq-v1",
        "questions": [
            {"text": q, "kind": k, "parents": p} for q, k, p in zip(golden["p"], golden["kinds"], parents, strict=True)
        ],
    }


def _trajectory(tokenizer, responses, extra_info, extra_fields=None) -> DataProto:
    """One trajectory with one output per response, as AgentLoopWorker._compute_score builds it."""
    messages = [{"role": "user", "content": TASK}]
    prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    prompts, outs = [], []
    for text in responses:
        prompts.append(torch.tensor(prompt_ids, dtype=torch.int64))
        outs.append(torch.tensor(tokenizer.encode(text) + [tokenizer.eos_token_id], dtype=torch.int64))
        prompt_ids = prompt_ids + outs[-1].tolist()  # the next turn's prompt holds the history
    input_ids = [torch.cat([p, r]) for p, r in zip(prompts, outs, strict=True)]
    pad = lambda xs: torch.nn.utils.rnn.pad_sequence(xs, batch_first=True, padding_value=0)  # noqa: E731
    n = len(responses)
    batch = TensorDict(
        {
            "prompts": pad(prompts),
            "responses": pad(outs),
            "attention_mask": pad([torch.ones_like(x) for x in input_ids]),
            "input_ids": pad(input_ids),
            "position_ids": pad([torch.arange(len(x)) for x in input_ids]),
        },
        batch_size=n,
    )

    def column(value):
        array = np.empty(n, dtype=object)
        array[:] = [value] * n
        return array

    row = {
        "data_source": "t2i",
        "reward_model": {"ground_truth": ""},
        "extra_info": extra_info,
        "raw_prompt": messages,
        "index": 0,
    }
    non_tensor = {k: column(v) for k, v in row.items()}
    non_tensor.update(
        __num_turns__=np.array([2 * (i + 1) for i in range(n)]),
        tool_extra_fields=np.array([dict(extra_fields or {}) for _ in range(n)], dtype=object),
        prompt_len=np.array([len(p) for p in prompts]),
        response_len=np.array([len(r) for r in outs]),
    )
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def _score(worker: RewardLoopWorker, data: DataProto) -> dict:
    # a Ray async actor runs compute_score on the loop the worker was built on
    return worker.loop.run_until_complete(worker.compute_score(data))


def test_dvreward_is_registered_through_the_verl_plugin_entry_point():
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

    assert get_reward_manager_cls("dvreward").__module__ == "verl_ext.rewards.dvreward.manager"


def test_external_judge_golden_score(base_config, fake_judge, golden):
    server = fake_judge(golden["p"])
    worker = RewardLoopWorker(_config(base_config, judge_url=server.url))
    data = _trajectory(worker.input_tokenizer, ["a red car behind a tree"], {"dv_questions": _questions(golden)})
    result = _score(worker, data)
    info = result["reward_extra_info"]
    assert result["reward_score"] == pytest.approx(golden["score"]["geometric"], abs=1e-4)
    assert (info["dv_valid"], info["dv_failed"], info["dv_fail_reason"]) == (1, 0, "")
    assert (info["dv_semantic"], info["dv_quality"]) == (pytest.approx(0.6), pytest.approx(0.8))
    assert json.loads(info["dv_question_scores"]) == pytest.approx(list(golden["p"].values()))
    assert info["dv_n_questions"] == 3 and info["dv_failure_rate"] == 0.0
    # the same trajectory again: every answer comes from the cache
    again = _score(worker, data)["reward_extra_info"]
    assert again["dv_cache_hit_rate"] == 1.0 and server.requests() == 3


@pytest.mark.parametrize("method", ["mean", "sum_mean"])
def test_aggregation_is_configurable(base_config, fake_judge, golden, method):
    server = fake_judge(golden["p"])
    worker = RewardLoopWorker(_config(base_config, judge_url=server.url, aggregation=method))
    data = _trajectory(worker.input_tokenizer, ["a red car"], {"dv_questions": _questions(golden)})
    assert _score(worker, data)["reward_score"] == pytest.approx(golden["score"][method], abs=1e-4)


def test_combined_with_env_score_on_the_last_output(base_config, fake_judge, golden):
    # rules need the last turn's text: judging an earlier output would match nothing (a fault)
    server = fake_judge([{"match": ["FINAL: car drawn", q], "p_yes": p} for q, p in golden["p"].items()])
    worker = RewardLoopWorker(
        _config(base_config, judge_url=server.url, dv_weight=0.5, env_weight=0.5, env_score_key="env.success")
    )
    data = _trajectory(
        worker.input_tokenizer,
        ["thinking about cars", "FINAL: car drawn"],
        {"dv_questions": _questions(golden)},
        extra_fields={"env": {"success": 1.0}},
    )
    result = _score(worker, data)
    assert result["reward_score"] == pytest.approx(0.5 * golden["score"]["geometric"] + 0.5 * 1.0, abs=1e-4)
    assert result["reward_extra_info"]["env_score"] == 1.0


def _episode(valid: bool, state: str, success: bool) -> dict:
    """The hybrid_gui_tool agent loop's extra_fields: StepMetadata with the final-state artifact."""
    meta = StepMetadata(
        traj_uid="t0",
        step_idx=[0],
        anchor=["a"],
        step_reward=[0.0],
        valid=valid,
        invalid_reason="" if valid else "env_fault:timeout",
        extras={"success": success, "artifact": {"state": state}},
    )
    return meta.to_extra_fields()


def test_gui_final_state_artifact_and_success_from_step_metadata(base_config, fake_judge):
    questions = {"questions": [{"text": "Is the email from Gerta starred?", "kind": "semantic", "parents": []}]}
    server = fake_judge([{"match": ['"starred": ["gerta"]', "Is the email from Gerta starred?"], "p_yes": 0.64}])
    worker = RewardLoopWorker(
        _config(
            base_config,
            judge_url=server.url,
            artifact_key="verl_ext.extras.artifact.state",
            env_score_key="verl_ext.extras.success",
            dv_weight=0.5,
            env_weight=0.5,
        )
    )
    episode = _episode(valid=True, state='{"starred": ["gerta"]}', success=True)
    data = _trajectory(worker.input_tokenizer, ["<tool_call>...</tool_call>"], {"dv_questions": questions}, episode)
    result = _score(worker, data)
    # no quality questions: quality mean 1.0, so geometric = sqrt(0.64) (AlphaGRPO's DVReward: JunyiWuCode/AlphaGRPO, alpha_grpo/rewards/rewards.py)
    assert result["reward_score"] == pytest.approx(0.5 * 0.8 + 0.5 * 1.0)

    # an episode the agent loop marked invalid (env fault) is flagged without asking the judge
    faulted = _trajectory(worker.input_tokenizer, ["x"], {"dv_questions": questions}, _episode(False, "{}", False))
    info = _score(worker, faulted)["reward_extra_info"]
    assert (info["dv_valid"], info["dv_fail_reason"]) == (0, "trajectory_invalid:env_fault:timeout")
    assert server.requests() == 1


def test_genrm_router_address_and_custom_verifier(base_config, fake_judge, golden, tiny_model_dir, tmp_path):
    """verl's GenRM path: the worker gets the router address; verl requires a custom reward function
    with an enabled reward model, and the manager uses it as the environment verifier."""
    verifier = tmp_path / "verifier.py"
    verifier.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info, reward_router_address=None, **kw):\n"
        "    assert reward_router_address is not None\n"
        "    return {'score': 0.25 if 'car' in solution_str else 0.0}\n"
    )
    server = fake_judge(golden["p"])
    config = _config(base_config, env_weight=1.0)
    with open_dict(config):
        del config.reward.reward_kwargs.dvreward["judge_url"]
        config.reward.reward_model.enable = True
        config.reward.reward_model.model_path = tiny_model_dir
        config.reward.custom_reward_function.path = str(verifier)
    worker = RewardLoopWorker(config, reward_router_address=server.address)
    assert worker.reward_manager.judge.endpoint.base_url == server.url
    data = _trajectory(worker.input_tokenizer, ["a red car"], {"dv_questions": _questions(golden)})
    result = _score(worker, data)
    assert result["reward_score"] == pytest.approx(golden["score"]["geometric"] + 0.25, abs=1e-4)
    assert server.requests() == 3


def test_dsg_gating_through_the_manager(base_config, fake_judge, golden):
    p = dict(golden["p"], **{"Is there a red car in the picture?": 0.2})  # the parent is a "no"
    server = fake_judge(p)
    worker = RewardLoopWorker(_config(base_config, judge_url=server.url))
    questions = _questions(golden, parents=[[], [0], []])
    info = _score(worker, _trajectory(worker.input_tokenizer, ["x"], {"dv_questions": questions}))["reward_extra_info"]
    assert json.loads(info["dv_question_scores"]) == pytest.approx([0.2, 0.0, 0.8])


def _dead_url() -> str:
    sock = bind(0)
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


def test_judge_down_flags_the_trajectory_instead_of_scoring_zero(base_config, fake_judge, golden):
    worker = RewardLoopWorker(_config(base_config, judge_url=_dead_url(), failed_score=-1.0))
    data = _trajectory(worker.input_tokenizer, ["x"], {"dv_questions": _questions(golden)})
    failed = _score(worker, data)
    info = failed["reward_extra_info"]
    assert failed["reward_score"] == -1.0
    assert (info["dv_valid"], info["dv_failed"], info["dv_fail_reason"]) == (0, 1, "judge_failed:connect")
    assert info["dv_score"] is None and info["dv_failure_rate"] == 1.0

    # verl stacks reward_extra_info by the first sample's keys: failed and valid rows share them
    healthy = RewardLoopWorker(_config(base_config, judge_url=fake_judge(golden["p"]).url))
    assert set(_score(healthy, data)["reward_extra_info"]) == set(info)

    raising = RewardLoopWorker(_config(base_config, judge_url=_dead_url(), on_failure="raise"))
    with pytest.raises(RuntimeError, match="judge_failed"):
        _score(raising, data)


def test_a_judge_that_never_answers_times_out_naming_the_judge_the_bound_and_the_keys(base_config, golden,
                                                                                      silent_judge, caplog):
    flagging = RewardLoopWorker(_config(base_config, judge_url=silent_judge, timeout_s=0.3))
    data = _trajectory(flagging.input_tokenizer, ["x"], {"dv_questions": _questions(golden)})
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="verl_ext"):
        info = _score(flagging, data)["reward_extra_info"]
    assert time.perf_counter() - start < 10  # 3 questions in parallel, 1 attempt of 0.3 s each
    assert info["dv_fail_reason"] == "judge_failed:timeout"
    parts = (f"judge at {silent_judge}/chat/completions", "0.3 s", "reward.reward_kwargs.dvreward.timeout_s",
             "reward.reward_kwargs.dvreward.max_retries")
    assert_names(caplog.text, *parts)
    raising = RewardLoopWorker(_config(base_config, judge_url=silent_judge, timeout_s=0.3, on_failure="raise"))
    with pytest.raises(RuntimeError) as caught:
        _score(raising, data)
    assert_names(str(caught.value), *parts)


def test_partial_failures_are_excluded_and_counted(base_config, fake_judge, golden):
    p = dict(golden["p"])
    p["Is the red car parked behind a tree?"] = {"content": "unclear"}
    worker = RewardLoopWorker(_config(base_config, judge_url=fake_judge(p).url))
    info = _score(worker, _trajectory(worker.input_tokenizer, ["x"], {"dv_questions": _questions(golden)}))[
        "reward_extra_info"
    ]
    assert info["dv_valid"] == 1 and info["dv_n_failed"] == 1
    assert info["dv_semantic"] == pytest.approx(0.9)  # the failed question is not a "no"


def test_rows_without_questions_or_artifact_are_flagged(base_config, fake_judge, golden):
    worker = RewardLoopWorker(_config(base_config, judge_url=fake_judge(golden["p"]).url))
    info = _score(worker, _trajectory(worker.input_tokenizer, ["x"], {}))["reward_extra_info"]
    assert (info["dv_failed"], info["dv_fail_reason"]) == (1, "no_questions")
    worker = RewardLoopWorker(_config(base_config, judge_url=fake_judge(golden["p"]).url, artifact_key="screenshot"))
    info = _score(worker, _trajectory(worker.input_tokenizer, ["x"], {"dv_questions": _questions(golden)}))[
        "reward_extra_info"
    ]
    assert (info["dv_failed"], info["dv_fail_reason"]) == (1, "no_artifact")


def test_colocated_reward_model_input_is_flagged_with_its_own_reason(base_config, fake_judge, golden):
    """verl's colocated-RM path (_compute_reward_colocate) sends only these four fields."""
    worker = RewardLoopWorker(_config(base_config, judge_url=fake_judge(golden["p"]).url))
    full = _trajectory(worker.input_tokenizer, ["x"], {"dv_questions": _questions(golden)})
    raw_prompt = np.empty(1, dtype=object)
    raw_prompt[:] = [[{"role": "user", "content": TASK}]]
    data = DataProto(
        batch=full.batch.select("prompts", "responses", "attention_mask"), non_tensor_batch={"raw_prompt": raw_prompt}
    )
    info = _score(worker, data)["reward_extra_info"]
    assert (info["dv_valid"], info["dv_fail_reason"]) == (0, "no_extra_info")


def test_config_errors_name_the_key(base_config):
    with pytest.raises(ValueError, match=r"reward\.reward_kwargs\.dvreward\.judgeurl"):
        RewardLoopWorker(_config(base_config, judgeurl="http://x"))
    config = _config(base_config)
    with open_dict(config):
        del config.reward.reward_kwargs.dvreward["judge_url"]
    with pytest.raises(ValueError, match="judge_url"):
        RewardLoopWorker(config)
    with pytest.raises(ValueError, match="env_score_key"):
        RewardLoopWorker(_config(base_config, env_weight=0.5))


def test_training_metrics_from_the_managers_rows(base_config, fake_judge, golden):
    # What the verl-ext trainer logs each step (verl_ext/dvreward/*) from the rows' reward_extra_info.
    from verl_ext.rewards.dvreward.metrics import training_metrics

    healthy = RewardLoopWorker(_config(base_config, judge_url=fake_judge(golden["p"]).url))
    down = RewardLoopWorker(_config(base_config, judge_url=_dead_url()))
    data = _trajectory(healthy.input_tokenizer, ["a red car"], {"dv_questions": _questions(golden)})
    rows = [{"reward_extra_info": _score(w, data)["reward_extra_info"]} for w in (healthy, healthy, down)]
    rows.append({})  # a row from another reward (no DVReward keys) is skipped
    m = training_metrics(rows)
    assert m["verl_ext/dvreward/score/mean"] == pytest.approx(golden["score"]["geometric"], abs=1e-4)
    assert (m["verl_ext/dvreward/semantic/mean"], m["verl_ext/dvreward/quality/mean"]) == (
        pytest.approx(0.6), pytest.approx(0.8))
    assert m["verl_ext/dvreward/valid_fraction"] == pytest.approx(2 / 3)
    assert m["verl_ext/dvreward/questions_per_sample"] == 3.0
    assert m["verl_ext/dvreward/failure_rate"] == pytest.approx(3 / 9)  # the judge-down row's 3 questions
    assert m["verl_ext/dvreward/cache_hit_rate"] == pytest.approx(3 / 9)  # the 2nd healthy row: all cached
    assert m["verl_ext/dvreward/judge_latency_s/max"] >= m["verl_ext/dvreward/judge_latency_s/mean"] >= 0.0
    # every row flagged: no score to average, and no NaN logged
    only_failed = training_metrics(rows[2:])
    assert "verl_ext/dvreward/score/mean" not in only_failed and only_failed["verl_ext/dvreward/valid_fraction"] == 0.0
    assert training_metrics([{}, None]) == {}


def test_a_question_with_an_unknown_kind_stops_before_any_judge_call(base_config, fake_judge, golden):
    # it used to be judged and then fall out of both means: every score 0 while valid_fraction read 1.0
    server = fake_judge(golden["p"])
    worker = RewardLoopWorker(_config(base_config, judge_url=server.url))
    questions = _questions(golden)
    questions["questions"][2]["kind"] = "visual"
    data = _trajectory(worker.input_tokenizer, ["a red car"], {"dv_questions": questions, "split": "train", "index": 4})
    with pytest.raises(ValueError, match=r"row \(split='train', index=4\).*question 2: kind='visual' is not"):
        _score(worker, data)
    assert server.requests() == 0
