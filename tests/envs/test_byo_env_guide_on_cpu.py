"""``docs/howto/bring_your_own_env.md`` is true: every Python block of the guide runs, top to bottom in
one namespace (the blocks assert their own results), and the env and tool it defines work with
the rest of verl-ext's machinery as the guide says (verl's tool schema and hermes parser, the
env rewards, the step-metadata readers)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "bring_your_own_env.md"
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def guide_blocks(language: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block of ``language`` in the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in _BLOCK.finditer(text) if m.group(1) == language]


@pytest.fixture(scope="module")
def guide() -> dict[str, Any]:
    """The namespace left by running every Python block of the guide."""
    namespace: dict[str, Any] = {"__name__": "byo_env_guide"}
    try:
        for line, code in guide_blocks("python"):
            # The file name makes a failing block's traceback point at its line in the guide.
            exec(compile(code, f"{GUIDE}:{line}", "exec"), namespace)  # noqa: S102 - the guide's own code
        yield namespace
    finally:
        if "pool" in namespace:
            namespace["pool"].close()


def test_the_guide_has_the_blocks_this_test_relies_on():
    blocks = guide_blocks("python")
    assert len(blocks) >= 8, "the guide's python blocks were not found (fence format changed?)"
    for name in ("class TallyEnv", "EnvTool.from_def", "EnvPool(", "def trajectory_row", "def turn_rows",
                 "compute_token_advantages("):
        assert any(name in code for _, code in blocks), f"no guide block defines/uses {name}"


def test_every_python_block_runs(guide):
    assert guide["pool"].stats()["in_use"] == 0  # every lease was given back


def test_yaml_blocks_parse():
    import yaml

    (line, code), = guide_blocks("yaml")
    loops = yaml.safe_load(code)
    assert loops[0]["name"] and loops[0]["_target_"].count(".") >= 1, f"agent_loop_config_path example at line {line}"


def test_rendered_observation_in_the_guide_is_what_the_env_renders(guide):
    env = guide["TallyEnv"](max_steps=10)
    try:
        obs, _ = env.reset(seed=1, options={"task": "tally"})
    finally:
        env.close()
    (_, shown), = guide_blocks("text")
    assert obs.render() == shown.rstrip("\n")


def test_tally_tool_round_trips_through_verl_schema_and_hermes_parser(guide, tiny_model_dir):
    """The schema verl renders into the prompt parses the model's call back to an env step."""
    import asyncio
    import json

    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.schemas import OpenAIFunctionToolSchema

    tool = guide["tool"]
    schema = guide["TALLY_SET"].schema()
    assert OpenAIFunctionToolSchema.model_validate(schema).model_dump(exclude_unset=True, exclude_none=True) == schema
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Set it to 4."}], tools=[schema],
                                           tokenize=False)
    assert '"name": "tally_set"' in prompt
    reply = '<tool_call>\n{"name": "tally_set", "arguments": {"value": 4}}\n</tool_call><|im_end|>'
    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    _, calls = asyncio.run(parser.extract_tool_calls(tokenizer.encode(reply, add_special_tokens=False),
                                                     [tool.tool_schema]))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("tally_set", {"value": 4})]


def test_env_rewards_and_step_readers_accept_the_guide_rows(guide):
    """The rows of section 4 are what the env reward and the step accessor expect."""
    from verl_ext.rewards.env_rewards import reward_components
    from verl_ext.steps import step_metadata

    row = guide["trajectory_row"]("traj-r", ["count 0", "count 1"], [0.0, 1.0])
    meta = step_metadata(row.extra_fields)
    assert meta.num_steps == 2 and meta.spans == [[0, 3], [7, 9]]
    assert sum(row.response_mask) == sum(end - start for start, end in meta.spans)
    components = reward_components(meta.extras, meta.valid)
    assert components["success"] == components["tool_ok"] == 1.0
    turns = guide["turn_rows"]("traj-t", ["count 0", "count 1"], [0.0, 1.0])
    assert {step_metadata(r.extra_fields).traj_uid for r in turns} == {"traj-t"}
    assert len({frozenset(r.extra_fields) for r in turns}) == 1  # same keys on every row


def test_per_turn_rows_feed_hgpo(guide):
    import torch

    from verl_ext.advantages.verl_glue import compute_token_advantages

    rows = guide["turn_rows"]("traj-t1", ["count 0", "count 1"], [0.0, 1.0]) + \
        guide["turn_rows"]("traj-t2", ["count 0", "count 5"], [0.0, 0.0])
    mask = torch.tensor([r.response_mask for r in rows])
    advantages, _ = compute_token_advantages(
        "hgpo", response_mask=mask, extra_fields=[r.extra_fields for r in rows], uids=["tally-0"] * 4,
        scores=torch.tensor([0.0, 1.0, 0.0, 0.0]), algo_config={},
    )
    assert advantages[0].sum() > 0 > advantages[2].sum()  # first turns: same page, different outcomes


def test_tool_without_schema_outside_minidesk_is_a_clear_error():
    from verl_ext.agent_loops.env_tools import EnvTool

    with pytest.raises(ValueError, match="give its tool_schema"):
        EnvTool({"type": "native", "name": "tally_set"})
