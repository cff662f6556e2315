"""``decision_turn``: one model turn at a critical switching step (``verl_ext.datasets.decisions``),
the rollout of the single-turn RL stage of ToolCUA's pipeline.

verl's ``single_turn_agent`` builds its prompt without tool schemas; a decision row carries its
episode's own tools (app tools + distractors, as ``hybrid_gui_tool`` offers them), so this loop
builds the prompt with them through the same Continuous-Token builder the multi-turn loop uses:
the tokens equal the ``hybrid_gui_tool`` loop's at the same state. The reply is parsed with verl's
tool parser (``multi_turn.format``) as that loop parses it, and the parsed calls go to the reward
in ``extra_fields["decision_calls"]`` (verl's reward loop merges ``extra_fields`` into
``extra_info``; ``verl_ext.rewards.decision_reward``).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_parser import ToolParser
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.utils.profiler import simple_timer

from verl_ext.rewards.decision_reward import CALLS_KEY, row_tools


@register("decision_turn")
class DecisionTurnAgentLoop(AgentLoopBase):
    """Single-turn loop over decision rows: prompt (with the row's tools) -> one reply -> parsed calls."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tool_parser = ToolParser.get_tool_parser(self.rollout_config.multi_turn.format, self.tokenizer)
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length

    @staticmethod
    def tools_of(extra_info: dict[str, Any]) -> list[dict[str, Any]]:
        """The row's tool schemas (``extra_info.tools``, JSON text)."""
        tools = row_tools(extra_info)
        if tools is None:
            raise ValueError("decision_turn needs the episode's tool schemas in extra_info.tools; build the rows "
                             "with `verl-ext prepare-data text_hybrid_decisions`")
        return tools

    async def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The prompt tokens of a decision row: ``messages`` with the row's ``tools``."""
        ids = await self.ct_build_initial_tokens(messages, tools=tools)
        if len(ids) > self.prompt_length:
            raise ValueError(f"decision prompt of {len(ids)} tokens exceeds data.max_prompt_length="
                             f"{self.prompt_length}; raise it (the rows are whole transcripts up to the decision)")
        return ids

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        from verl_ext.datasets.decisions import decoded_prompt

        tools = self.tools_of(kwargs.get("extra_info") or {})
        prompt_ids = await self.prompt_ids(list(decoded_prompt(kwargs["raw_prompt"])), tools)
        if self.tool_parser.stop_token_ids:  # parsers whose models do not stop after a call
            stops = set(sampling_params.get("stop_token_ids") or []) | set(self.tool_parser.stop_token_ids)
            sampling_params = {**sampling_params, "stop_token_ids": sorted(stops)}
        metrics: dict[str, Any] = {}
        with simple_timer("generate_sequences", metrics):
            output = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=prompt_ids,
                                                        sampling_params=sampling_params)
        merged, response_mask, logprobs = await self.ct_merge_assistant_token(
            prompt_ids, output.token_ids, [], [] if output.log_probs else None,
            assistant_logprobs=output.log_probs or None,
        )
        n_resp = len(response_mask)
        _, calls = await self.tool_parser.extract_tool_calls(
            output.token_ids, [OpenAIFunctionToolSchema.model_validate(t) for t in tools])
        extra_fields = {**output.extra_fields,
                        CALLS_KEY: [{"name": c.name, "arguments": c.arguments} for c in calls]}
        return AgentLoopOutput(
            prompt_ids=merged.token_ids[: len(merged.token_ids) - n_resp],
            response_ids=merged.token_ids[len(merged.token_ids) - n_resp:][: self.response_length],
            response_mask=response_mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            num_turns=2, metrics=metrics, extra_fields=extra_fields,
        )
