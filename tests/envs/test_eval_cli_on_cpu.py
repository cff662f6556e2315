"""``verl-ext eval`` end to end on a few tasks (low parallelism: shared CI machines)."""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading

import pytest

from verl_ext.envs.eval_cli import main
from ..messages import assert_names


@pytest.mark.browser
def test_eval_scripted_and_random_policies(tmp_path, capsys):
    out = tmp_path / "records.json"
    tasks = "mail_star_sender,settings_theme,files_read_answer"
    assert main(["--env", "minidesk", "--policy", "scripted-tool", "--tasks", tasks, "--seeds", "2",
                 "--parallel", "2", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    # settings_theme is not tool-beneficial: a tool-preferring policy earns no TIR there.
    assert "overall: episodes=6 faults=0 accuracy=1.000 TIR=0.667" in printed.out
    assert "6/6" in printed.err  # the progress bar
    records = json.loads(out.read_text())
    assert {r["task"] for r in records} == set(tasks.split(",")) and all(r["success"] == 1.0 for r in records)

    assert main(["--env", "minidesk", "--policy", "random", "--tasks", tasks, "--seeds", "2", "--parallel", "1",
                 "--max-steps", "5", "--no-per-task"]) == 0
    assert "accuracy=0.000" in capsys.readouterr().out


@pytest.mark.browser
def test_eval_miniwob_random(capsys):
    assert main(["--env", "miniwob", "--policy", "random", "--tasks", "click-button,click-link", "--seeds", "1",
                 "--parallel", "1", "--max-steps", "3"]) == 0
    assert "episodes=2 faults=0" in capsys.readouterr().out


@pytest.mark.browser
def test_scripted_policy_on_miniwob_is_refused():
    with pytest.raises(SystemExit):
        main(["--env", "miniwob", "--policy", "scripted-gui"])


@contextlib.contextmanager
def chat_endpoint(answer):
    """A loopback fake of /v1/chat/completions: ``answer(request body)`` gives the reply's message;
    yields (base URL, the request bodies received)."""
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(body)
            data = json.dumps({"choices": [{"message": answer(body)}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", requests
    finally:
        server.shutdown()


@pytest.mark.browser
def test_eval_with_an_openai_compatible_endpoint(capsys):
    """The endpoint answers with a native tool call."""

    def star_the_sender(body):
        sender = re.search(r"Star every email from (.+?)\.", body["messages"][1]["content"]).group(1)
        function = {"name": "mail_star", "arguments": json.dumps({"sender": sender})}
        return {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": function}]}

    with chat_endpoint(star_the_sender) as (url, requests):
        assert main(["--env", "minidesk", "--policy", url, "--tasks", "mail_star_sender", "--seeds", "2",
                     "--parallel", "1", "--no-per-task"]) == 0
    assert "accuracy=1.000 TIR=1.000 ACS=1.00" in capsys.readouterr().out
    tool_names = {t["function"]["name"] for t in requests[0]["tools"]}
    assert {"computer_use", "mail_star"} <= tool_names


@pytest.mark.parametrize("show_todo", [False, True])
def test_eval_text_hybrid_shows_the_to_do_line_only_with_show_todo(show_todo, capsys):
    """``--show-todo`` plays text_hybrid as a SHOW_TODO=1 checkpoint was trained: the policy's
    observation ends with the items still to do. The endpoint answers without a call (``done``)."""
    with chat_endpoint(lambda body: {"role": "assistant", "content": "finished"}) as (url, requests):
        flags = ["--show-todo"] if show_todo else []
        assert main(["--env", "text_hybrid", "--policy", url, "--tasks", "settings_panel", "--seeds", "2",
                     "--parallel", "1", "--no-per-task", *flags]) == 0
    assert "overall: episodes=2 faults=0 accuracy=0.000" in capsys.readouterr().out
    first_turns = [body["messages"][1]["content"] for body in requests]
    assert len(first_turns) == 2
    assert all(("\nTo do: " in turn) == show_todo for turn in first_turns)


def test_show_todo_outside_text_hybrid_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--env", "minidesk", "--show-todo"])
    assert_names(capsys.readouterr().err, "--show-todo", "--env text_hybrid", "--env minidesk")
