"""Tool schemas, argument validation, action parsing, the sandbox, and the OSWorld-MCP / OSWorld
loaders (contract-tested against a small local fake backend). No browser needed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from verl_ext.envs.core import ActionError, GuiAction, ToolCall, action_from_call
from verl_ext.envs.minidesk.catalog import ALL_TOOLS, DISTRACTORS
from verl_ext.envs.osworld import ExternalToolset, OSWorldTask, load_mcp_tools, normalize_result
from verl_ext.envs.sandbox import Sandbox
from verl_ext.envs.tools import COMPUTER_USE


def test_importing_envs_is_cheap():
    code = "import sys, verl_ext.envs; print(any(m in sys.modules for m in ('selenium', 'torch', 'verl')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_every_schema_survives_verls_schema_model():
    """verl keeps only type/description/enum per property: our schemas must round-trip exactly."""
    from verl.tools.schemas import OpenAIFunctionToolSchema

    for tool in [COMPUTER_USE, *ALL_TOOLS.values()]:
        schema = tool.schema()
        parsed = OpenAIFunctionToolSchema.model_validate(schema).model_dump(exclude_unset=True, exclude_none=True)
        assert parsed["function"]["parameters"] == schema["function"]["parameters"], tool.name
    assert len(DISTRACTORS) >= 5


def test_tool_config_yaml_loads_through_verl(tmp_path):
    from verl.tools.tool_registry import load_all_tools

    from verl_ext.agent_loops.env_tools import EnvTool, write_tool_config

    tools = load_all_tools(tool_config_path=str(write_tool_config(tmp_path / "tools.yaml")), function_tool_path=None)
    assert {t.name for t in tools} == {"computer_use", *ALL_TOOLS}
    assert all(isinstance(t, EnvTool) for t in tools)


def test_env_tool_without_env_returns_a_structured_error():
    import asyncio

    from verl_ext.agent_loops.env_tools import EnvTool

    response, reward, _ = asyncio.run(EnvTool.from_def(ALL_TOOLS["mail_star"]).execute("id", {"sender": "x"}))
    result = json.loads(response.text)
    assert result["success"] is False and "hybrid_gui_tool" in result["error_message"] and reward == 0.0


@pytest.mark.parametrize("name,args,expected", [
    ("computer_use", {"action": "click", "element": 3}, GuiAction("click", element=3)),
    ("computer_use", '{"action": "click", "element": "3"}', GuiAction("click", element=3)),
    ("computer_use", {"action": "type", "element": 2, "text": 42}, GuiAction("type", element=2, text="42")),
    ("computer_use", {"action": "done"}, GuiAction("done")),
    ("mail_star", {"sender": "Bo"}, ToolCall("mail_star", {"sender": "Bo"})),
])
def test_action_from_call(name, args, expected):
    assert action_from_call(name, args) == expected


@pytest.mark.parametrize("args,message", [
    ({"action": "click"}, "needs ['element']"),
    ({"action": "click", "element": 1.5}, "must be an integer"),
    ({"action": "click", "element": True}, "must be an integer"),
    ({"action": "key", "key": "F13"}, "key must be one of"),
    ({"action": "scroll", "direction": "left"}, "direction must be"),
    ({"action": "click", "element": 1, "target": 2}, "unknown argument"),
    ("{not json", "not valid JSON"),
    ([1, 2], "must be a JSON object"),
])
def test_action_from_call_rejects_bad_arguments(args, message):
    with pytest.raises(ActionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        action_from_call("computer_use", args)


def test_tool_validate_coerces_unambiguous_values():
    sort = ALL_TOOLS["sheet_sort"]
    assert sort.validate({"column": "B", "descending": "true"}) == {"column": "B", "descending": True}
    convert = ALL_TOOLS["unit_convert"]
    coerced = convert.validate({"value": "2.5", "from_unit": "m", "to_unit": 3})
    assert coerced == {"value": 2.5, "from_unit": "m", "to_unit": "3"}
    with pytest.raises(ActionError, match="must be of type boolean"):
        sort.validate({"column": "B", "descending": "maybe"})


def test_sandbox_resolution(tmp_path):
    box = Sandbox()
    try:
        assert box.relative("Documents//a.txt") == "Documents/a.txt"
        assert box.relative("./Documents/a.txt") == "Documents/a.txt"
        for bad in ("../x", "/etc/passwd", "a/../../b", "a\x00b", "c:/x", "", " "):
            with pytest.raises(ActionError):
                box.resolve(bad)
        (box.root / "link").symlink_to(tmp_path)
        with pytest.raises(ActionError, match="leaves the sandbox"):
            box.resolve("link/file.txt")
        box.mirror(["Docs"], [{"path": "Docs/a.txt", "content": "hi"}])
        assert box.listing() == ["Docs/a.txt"] and box.read_text("Docs/a.txt") == "hi"
    finally:
        box.close()
    assert not box.root.exists()


# --- OSWorld-MCP tool JSON ----------------------------------------------------------------------
# Shaped like OSWorld-MCP's mcp_server/tools/apis/<group>.json: OpenAI function entries named
# "<Class>.<method>"; its server registers them as "<group>.<method>", the group being the file's
# name (libreoffice_calc2.json holds class CalcToolsPlus). Descriptions are ours.
CALC_TOOLS = [
    {"type": "function", "function": {
        "name": "CalcTools.set_cell_value", "description": "Write a value into one cell of the active sheet.",
        "parameters": {"type": "object", "properties": {
            "cell": {"type": "string", "description": "cell reference such as 'A1'"},
            "value": {"type": "string", "description": "the value"}}, "required": ["cell", "value"]}}},
    {"type": "function", "function": {
        "name": "CalcTools.sort_column", "description": "Sort one column.",
        "parameters": {"type": "object", "properties": {
            "column_name": {"type": "string", "description": "column letter"},
            "ascending": {"type": "boolean", "description": "sort order, default True"},
            "start_index": {"type": "integer", "description": "first row to sort, default 2"}},
            "required": ["column_name"]}}},
]
CALC_PLUS_TOOLS = [
    {"type": "function", "function": {
        "name": "CalcToolsPlus.fill_blank_down", "description": "Fill blank cells from the cell above.",
        "parameters": {"type": "object", "properties": {
            "columns": {"type": "array", "items": {"type": "string"}, "description": "column letters; all if omitted"}}}}},
]


class FakeCalcServer:
    """A tiny stand-in for OSWorld-MCP's server: tools registered as "<group>.<method>", results as
    its wrapper returns them."""

    def __init__(self):
        self.cells: dict[str, str] = {}
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, name: str, args: dict):
        self.calls.append((name, args))
        if name == "libreoffice_calc.set_cell_value":
            if not args["cell"][0].isalpha():
                return "Error: invalid cell " + args["cell"]
            self.cells[args["cell"]] = args["value"]
            return {"success": True, "result": "ok", "error_message": ""}
        if name == "libreoffice_calc.sort_column":
            raise RuntimeError("document not open")
        if name == "libreoffice_calc2.fill_blank_down":
            return f"filled {args.get('columns')}"
        raise KeyError(f"Unknown tool: {name}")  # what a server says for an unregistered name


def test_osworld_mcp_tools_load_flat_and_call_through_a_backend(tmp_path):
    from verl.tools.schemas import OpenAIFunctionToolSchema

    (tmp_path / "libreoffice_calc.json").write_text(json.dumps(CALC_TOOLS))
    (tmp_path / "libreoffice_calc2.json").write_text(json.dumps(CALC_PLUS_TOOLS))
    tools = load_mcp_tools(tmp_path / "libreoffice_calc.json") + load_mcp_tools(tmp_path / "libreoffice_calc2.json")
    assert [t.remote_name for t in tools] == [
        "libreoffice_calc.set_cell_value", "libreoffice_calc.sort_column", "libreoffice_calc2.fill_blank_down"]
    assert [t.definition.name for t in tools] == [
        "libreoffice_calc_set_cell_value", "libreoffice_calc_sort_column", "libreoffice_calc2_fill_blank_down"]
    assert load_mcp_tools(CALC_TOOLS, group="libreoffice_calc")[0].remote_name == "libreoffice_calc.set_cell_value"
    assert load_mcp_tools(CALC_TOOLS, group="")[0].remote_name == "CalcTools.set_cell_value"  # names as given
    set_cell, sort, fill = (t.definition for t in tools)
    assert set_cell.params["value"].required and sort.params["column_name"].required
    assert not sort.params["start_index"].required and "(optional)" in sort.params["start_index"].description
    assert not fill.params["columns"].required and "JSON array of string" in fill.params["columns"].description
    for t in tools:  # flat enough for verl
        schema = t.definition.schema()
        assert OpenAIFunctionToolSchema.model_validate(schema).model_dump(exclude_unset=True, exclude_none=True)[
            "function"]["parameters"] == schema["function"]["parameters"]

    server = FakeCalcServer()
    toolset = ExternalToolset(tools, server)
    assert toolset.call("libreoffice_calc_set_cell_value", {"cell": "B2", "value": "7"}) == \
        {"success": True, "result": "ok", "error_message": ""}
    assert server.cells == {"B2": "7"}
    failed = toolset.call("libreoffice_calc_set_cell_value", {"cell": "22", "value": "7"})
    assert failed["success"] is False and failed["error_message"].startswith("Error: invalid cell")
    crashed = toolset.call("libreoffice_calc_sort_column", {"column_name": "A"})
    assert crashed == {"success": False, "result": None, "error_message": "RuntimeError: document not open"}
    assert toolset.call("libreoffice_calc2_fill_blank_down", {"columns": ["A"]})["result"] == "filled ['A']"
    assert "missing required" in toolset.call("libreoffice_calc_set_cell_value", {"cell": "B2"})["error_message"]
    assert "unknown tool" in toolset.call("nope", {})["error_message"]
    assert len(server.calls) == 4  # invalid arguments never reached the backend


def test_normalize_result_follows_osworld_mcp():
    assert normalize_result("Failed to open file")["success"] is False
    assert normalize_result("File not found: a.txt")["success"] is False
    assert normalize_result([1, 2]) == {"success": True, "result": [1, 2], "error_message": ""}


# --- OSWorld task JSON ------------------------------------------------------------------------
def osworld_task(**evaluator):
    return {"id": "0b17a146-2934-46c7-8727-73ff6b6483e8", "snapshot": "libreoffice_calc", "source": "author",
            "instruction": "Fill B2 with 7.", "config": [{"type": "open", "parameters": {"path": "/home/user/a.xlsx"}}],
            "related_apps": ["libreoffice_calc"], "evaluator": evaluator}


def test_osworld_task_evaluates_with_getters_and_metrics():
    env = {"B2": "7", "B3": "1"}
    getters = {"get_cell": lambda env, spec: env[spec["cell"]], "get_rule": lambda env, spec: spec["rules"]["expected"]}
    metrics = {"exact_match": lambda result, expected: float(result == expected),
               "is_number": lambda result: float(result.isdigit())}
    one = OSWorldTask.load(osworld_task(func="exact_match", result={"type": "cell", "cell": "B2"},
                                        expected={"type": "rule", "rules": {"expected": "7"}}))
    assert one.evaluate(env, metrics, getters) == 1.0 and one.related_apps == ["libreoffice_calc"]
    both = osworld_task(func=["exact_match", "is_number"], conj="and",
                        result=[{"type": "cell", "cell": "B3"}, {"type": "cell", "cell": "B2"}],
                        expected=[{"type": "rule", "rules": {"expected": "7"}}, None])
    assert OSWorldTask.load(both).evaluate(env, metrics, getters) == 0.0
    either = {**both, "evaluator": {**both["evaluator"], "conj": "or"}}
    assert OSWorldTask.load(either).evaluate(env, metrics, getters) == 1.0


def test_osworld_task_evaluation_follows_osworld_evaluate():
    # OSWorld's DesktopEnv.evaluate: no expected spec -> metric(result, **options); a result file
    # that is missing -> 0; "infeasible" -> 1 exactly when the agent's last action was FAIL, and
    # any other task -> 0 when it was.
    calls = []

    def read_file(env, spec):
        if spec["path"] not in env:
            raise FileNotFoundError(spec["path"])
        return env[spec["path"]]

    def check_include_exclude(result, rules=None, **options):  # a result-only metric, as OSWorld's
        calls.append((result, rules, options))
        return float(all(word in result for word in options["include"]))

    getters = {"get_vm_file": read_file, "get_rule": lambda env, spec: spec["rules"]}
    metrics = {"check_include_exclude": check_include_exclude, "exact_match": lambda result, expected: float(result == expected)}
    env = {"/home/user/out.txt": "hello world"}
    result = {"type": "vm_file", "path": "/home/user/out.txt"}
    for no_expected in ({}, {"expected": None}, {"expected": {}}):
        task = OSWorldTask.load(osworld_task(func="check_include_exclude", result=result, options={"include": ["hello"]},
                                             **no_expected))
        assert task.evaluate(env, metrics, getters) == 1.0
    assert calls == [("hello world", None, {"include": ["hello"]})] * 3
    listed = OSWorldTask.load(osworld_task(
        func=["check_include_exclude", "exact_match"], result=[result, result],
        expected=[None, {"type": "rule", "rules": "hello world"}], options=[{"include": ["world"]}, None]))
    assert listed.evaluate(env, metrics, getters) == 1.0 and calls[-1] == ("hello world", None, {"include": ["world"]})

    missing = OSWorldTask.load(osworld_task(func="exact_match", result={"type": "vm_file", "path": "/nope"},
                                            expected={"type": "rule", "rules": "x"}))
    assert missing.evaluate(env, metrics, getters) == 0.0
    either = OSWorldTask.load(osworld_task(
        func=["exact_match", "exact_match"], conj="or", result=[{"type": "vm_file", "path": "/nope"}, result],
        expected=[{"type": "rule", "rules": "x"}, {"type": "rule", "rules": "hello world"}]))
    assert either.evaluate(env, metrics, getters) == 1.0

    infeasible = OSWorldTask.load(osworld_task(func="infeasible"))
    assert infeasible.evaluate(env, {}, {}, action_history=["pyautogui.click(1, 2)", "FAIL"]) == 1.0
    assert infeasible.evaluate(env, {}, {}, action_history=[{"action_type": "FAIL"}]) == 1.0
    assert infeasible.evaluate(env, {}, {}, action_history=["FAIL", "DONE"]) == 0.0
    assert infeasible.evaluate(env, {}, {}) == 0.0
    feasible = OSWorldTask.load(osworld_task(func="exact_match", result=result, expected={"type": "rule", "rules": "hello world"}))
    assert feasible.evaluate(env, metrics, getters, action_history=["DONE"]) == 1.0
    assert feasible.evaluate(env, metrics, getters, action_history=["FAIL"]) == 0.0


@pytest.mark.parametrize("evaluator,message", [
    ({}, "no 'func'"),
    ({"func": ["a", "b"], "result": [{"type": "x"}]}, "must be a list of 2"),
    ({"func": "a", "conj": "xor"}, "conj"),
])
def test_osworld_task_validation(evaluator, message):
    with pytest.raises(ValueError, match=message):
        OSWorldTask.load(osworld_task(**evaluator))
