"""A user's mistake on the ``verl-ext`` command line ends in one line naming the flag or file and
exit code 2 (``verl_ext.errors.UserError``, printed by ``verl_ext.cli``), never a traceback, and
``verl-ext eval`` never reports an accuracy over zero episodes. Each case runs the real CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from verl_ext.envs.eval_cli import format_report
from verl_ext.rewards.env_rewards import reward_components
from .messages import assert_names


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl_ext.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def assert_one_line_error(proc: subprocess.CompletedProcess, command: str, *phrases: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"verl-ext {command}: error: "), proc.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("dataset, env", [("minidesk", "MiniDesk"), ("text_hybrid", "text_hybrid")])
def test_prepare_data_unknown_template_names_it_and_the_known_ones(tmp_path, dataset, env):
    proc = run_cli("prepare-data", dataset, str(tmp_path), "--train-size", "2", "--val-size", "1",
                   "--templates", "no_such_template")
    line = assert_one_line_error(proc, "prepare-data", f"unknown {env} templates ['no_such_template']", "--templates",
                                 "known: ")
    assert not list(tmp_path.iterdir()) and "settings" in line  # nothing written; a real template is listed


def test_prepare_data_show_todo_on_a_dataset_without_observations_is_refused(tmp_path):
    proc = run_cli("prepare-data", "text_hybrid", str(tmp_path), "--train-size", "2", "--val-size", "1", "--show-todo")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert_names(proc.stderr, "verl-ext prepare-data: error:", "--show-todo", "text_hybrid_sft")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("dataset, size, option, phrase", [
    ("text_hybrid", "2", ["--tool-oversample", "2"], "--tool-oversample applies to the text_hybrid_sft dataset only"),
    ("text_hybrid_sft", "2", ["--tool-oversample", "0"], "argument --tool-oversample: '0' is not a whole number >= 1"),
    ("text_hybrid_sft", "2", ["--balance-labels"], "--balance-labels applies to the text_hybrid_decisions dataset only"),
    ("text_hybrid_decisions", "3", ["--balance-labels"],
     "--balance-labels needs an even --train-size (half per label), got 3"),
    ("text_hybrid_decisions", "2", ["--warmup-targets", "shorter"],
     "--warmup-targets applies to the text_hybrid_switch_warmup dataset only"),
    ("text_hybrid_switch_warmup", "2", ["--warmup-targets", "best"], "argument --warmup-targets: invalid choice: 'best'"),
])
def test_prepare_data_option_is_refused_where_it_does_not_apply(tmp_path, dataset, size, option, phrase):
    """A dataset option on another dataset, or with a value it cannot take, stops before any file is written."""
    proc = run_cli("prepare-data", dataset, str(tmp_path), "--train-size", size, "--val-size", "1", *option)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert phrase in proc.stderr
    assert not list(tmp_path.iterdir())


def test_eval_on_a_missing_checkpoint_says_the_path_does_not_exist(tmp_path):
    missing = tmp_path / "runs" / "global_step_30"
    proc = run_cli("eval", "--policy", f"checkpoint:{missing}", "--tasks", "mail_star_sender")
    assert_one_line_error(proc, "eval", f"the path {missing} does not exist")


@pytest.mark.parametrize("spec", ["5-2", "0", "x", "-3", "2-"])
def test_eval_seeds_that_give_no_episode_name_the_flag(spec):
    proc = run_cli("eval", "--policy", "scripted-tool", "--tasks", "mail_star_sender", "--seeds", spec)
    assert_one_line_error(proc, "eval", f"--seeds {spec!r} gives no episode", "LO <= HI")


def test_eval_report_of_only_faulted_episodes_has_no_accuracy():
    faulted = {**reward_components({"success": False, "num_steps": 2}, valid=False, max_steps=8), "task": "t"}
    report = format_report([faulted, faulted])
    assert "overall: episodes=0 faults=2 accuracy=n/a" in report and "0.00" not in report


def test_judge_server_bad_json_names_the_file_and_line(tmp_path):
    answers = tmp_path / "answers.json"
    answers.write_text('{\n  "red car": 0.9,\n  "blue car": 0.1,\n}\n')  # trailing comma
    proc = run_cli("judge-server", "--fake-answers", str(answers))
    assert_one_line_error(proc, "judge-server", f"--fake-answers {answers}: not valid JSON at line 4")
    proc = run_cli("judge-server", "--fake-answers", str(tmp_path / "missing.json"))
    assert_one_line_error(proc, "judge-server", "missing.json: no such file")
    answers.write_text('[{"match": ["car"], "pyes": 0.9}]')  # a misspelt key
    proc = run_cli("judge-server", "--fake-answers", str(answers))
    assert_one_line_error(proc, "judge-server", "not a map of substrings", "pyes")


def test_judge_server_on_a_port_in_use_names_the_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_cli("judge-server", "--fake-answers", "/dev/null", "--port", str(port))
    assert_one_line_error(proc, "judge-server", f"port {port} on 127.0.0.1 is in use", "--port 0")


@pytest.mark.parametrize("args", [("prepare-data", "arithmetic", "OUT", "--train-size", "0"),
                                  ("eval", "--parallel", "0"), ("eval", "--max-steps", "-1"),
                                  ("judge-server", "--fake-answers", "x.json", "--max-batch", "0")])
def test_counts_below_one_are_refused_by_the_flags_parser(tmp_path, args):
    proc = run_cli(*[str(tmp_path) if a == "OUT" else a for a in args])
    flag = next(a for a in args if a.startswith("--") and a not in ("--fake-answers",))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"verl-ext {args[0]}: error: argument {flag}: '{args[args.index(flag) + 1]}' is not a whole number >= 1" \
        in proc.stderr
    assert not list(tmp_path.iterdir())


def test_dv_questions_names_a_missing_input_and_a_base_url_where_nothing_listens(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    common = ("-o", str(tmp_path / "out.parquet"), "--base-url", url, "--model", "m")
    proc = run_cli("dv-questions", str(tmp_path / "train.parquet"), *common)
    assert_one_line_error(proc, "dv-questions", f"input {tmp_path / 'train.parquet'}: no such file")
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"prompt": "Draw a red car."}\n')
    proc = run_cli("dv-questions", str(rows), *common)
    assert_one_line_error(proc, "dv-questions", f"--base-url {url} does not answer (connect: ConnectError")


def test_eval_sft_names_a_missing_data_file_and_reports_no_rate_over_zero_turns(tmp_path, tiny_model_dir, capsys):
    proc = run_cli("eval-sft", tiny_model_dir, str(tmp_path / "val.parquet"))
    assert_one_line_error(proc, "eval-sft", f"DATA {tmp_path / 'val.parquet'}: the file does not exist")
    import pandas as pd

    from verl_ext.cli import main  # in this process: the same entry point, without a second verl import

    data = tmp_path / "transcripts.parquet"
    pd.DataFrame({"messages": [json.dumps([{"role": "user", "content": "hi"}])]}).to_parquet(data)
    assert main(["eval-sft", tiny_model_dir, str(data)]) == 2
    assert capsys.readouterr().err == f"verl-ext eval-sft: error: {data} has no ['tools'] column: not SFT transcripts " \
                                      "(verl-ext prepare-data text_hybrid_sft)\n"
    pd.DataFrame({"messages": [json.dumps([{"role": "user", "content": "hi"}])], "tools": ["[]"]}).to_parquet(data)
    assert main(["eval-sft", tiny_model_dir, str(data)]) == 2
    assert capsys.readouterr().err == f"verl-ext eval-sft: error: {data} holds no assistant turn to score: " \
                                      "there is no call rate to report\n"
