"""``text_env``: a verl agent loop that plays one ``TextCorridor`` episode per trajectory.

One row per trajectory: model turn -> ``env.step(text)`` -> observation as a user message ->
model turn ..., until the env terminates or truncates or the response budget runs out. Tokens are
built only with verl's Continuous-Token helpers (``ct_build_initial_tokens`` /
``ct_merge_assistant_token`` / ``ct_merge_context_msg``), so observation tokens get
``response_mask`` 0 and decoded text is never re-encoded into the model's own turns.

Dataset row (``extra_info``): ``seed`` (the env reset seed; rows sharing a ``uid`` share it, so a
group starts from one state) and optional ``env`` = {``length``, ``max_steps``, ``start``}.

Output ``extra_fields``:
- ``"verl_ext"``: a ``verl_ext.steps.StepMetadata`` (one step per assistant turn: its token span,
  anchor = the observation before acting, env reward, action validity; ``extras`` carry
  ``success`` and counts, which ``verl_ext.rewards.text_env.compute_score`` turns into the score);
- ``"token_global_steps"``: the weight version of every response token, -1 on observation tokens;
- ``"min_global_steps"`` / ``"max_global_steps"``: what verl's own loops copy from the server
  reply (the v1 trainer tags every row with them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.utils.profiler import simple_timer

from verl_ext.envs.text_corridor import TextCorridor
from verl_ext.rollout_client import TOKEN_VERSIONS_KEY, align_token_versions, call_token_versions
from verl_ext.steps import StepMetadata, anchor_key



@dataclass
class _Episode:
    """What the loop records while it plays (turned into StepMetadata at the end)."""

    spans: list[list[int]] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    action_valid: list[bool] = field(default_factory=list)
    actions: list[str | None] = field(default_factory=list)
    model_versions: list[int] = field(default_factory=list)  # one per generated token, in order
    call_versions: list[int] = field(default_factory=list)  # min/max weight version of each server call
    success: bool = False
    truncated: bool = False
    stop_reason: str = ""
    reset_info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def env_of(extra_info: dict[str, Any]) -> tuple[TextCorridor, int]:
    """The env and reset seed a dataset row asks for; names the key when it is missing."""
    if "seed" not in extra_info:
        raise ValueError("text_env needs the env seed in the dataset row: extra_info.seed = <int> "
                         "(verl-ext prepare-data text_corridor writes it)")
    options = dict(extra_info.get("env") or {})
    return TextCorridor(**options), int(extra_info["seed"])


@register("text_env")
class TextEnvAgentLoop(AgentLoopBase):
    """Agent loop over ``TextCorridor``. Constructor kwargs (YAML ``agent_loop_config_path`` route):

    Args:
        max_action_tokens: ``max_tokens`` of each model turn; the action is parsed from them.
    """

    def __init__(self, *args: Any, max_action_tokens: int = 6, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_action_tokens = max_action_tokens
        self.max_assistant_turns = self.rollout_config.multi_turn.max_assistant_turns
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        env, seed = env_of(kwargs.get("extra_info") or {})
        obs, reset_info = env.reset(seed=seed)
        episode = _Episode(reset_info=reset_info)
        messages = _initial_messages(list(kwargs.get("raw_prompt") or []), obs)
        prompt_ids = await self.ct_build_initial_tokens(messages)
        response_mask: list[int] = []
        logprobs: list[float] = []
        sampling_params = {**sampling_params, "max_tokens": self.max_action_tokens}
        request_id = uuid4().hex  # one id per trajectory: the server keeps its prefix cache
        max_turns = min(env.max_steps, self.max_assistant_turns or env.max_steps)
        for _ in range(max_turns):
            with simple_timer("generate_sequences", episode.metrics):
                output = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params
                )
            start = len(response_mask)
            merged, response_mask, logprobs = await self.ct_merge_assistant_token(
                prompt_ids, output.token_ids, response_mask, logprobs, assistant_logprobs=output.log_probs
            )
            prompt_ids = merged.token_ids
            episode.model_versions += call_token_versions(output)
            episode.call_versions += [output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]]
            if len(response_mask) > self.response_length:  # the turn would be cut: it is not a step
                episode.stop_reason, episode.truncated = "response_length", True
                break
            text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            episode.spans.append([start, len(response_mask)])
            episode.anchors.append(anchor_key(obs))
            obs, reward, terminated, truncated, info = env.step(text)
            episode.rewards.append(reward)
            episode.action_valid.append(info["action_valid"])
            episode.actions.append(info["action"])
            episode.success = bool(info["success"])
            if terminated or truncated:
                episode.stop_reason = "terminated" if terminated else "max_steps"
                episode.truncated = truncated
                break
            messages.append({"role": "assistant", "content": text})
            previous = list(messages)
            messages.append({"role": "user", "content": obs})
            merged, response_mask, logprobs = await self.ct_merge_context_msg(
                previous, messages, prompt_ids, response_mask, logprobs
            )
            prompt_ids = merged.token_ids
            if len(response_mask) >= self.response_length:
                episode.stop_reason, episode.truncated = "response_length", True
                break
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        return self._output(prompt_ids, response_mask, logprobs, episode)

    def _output(self, prompt_ids: list[int], response_mask: list[int], logprobs: list[float],
                episode: _Episode) -> AgentLoopOutput:
        n_resp = len(response_mask)
        limit = self.response_length
        versions = align_token_versions(response_mask, episode.model_versions)
        extra_fields: dict[str, Any] = write_step_metadata(episode, uuid4().hex).to_extra_fields()
        extra_fields[TOKEN_VERSIONS_KEY] = versions[:limit]
        extra_fields["min_global_steps"] = min(episode.call_versions)
        extra_fields["max_global_steps"] = max(episode.call_versions)
        return AgentLoopOutput(
            prompt_ids=prompt_ids[: len(prompt_ids) - n_resp],
            response_ids=prompt_ids[len(prompt_ids) - n_resp:][:limit],
            response_mask=response_mask[:limit],
            response_logprobs=logprobs[:limit],
            num_turns=2 * len(episode.spans) + 1,
            metrics=episode.metrics,
            extra_fields=extra_fields,
        )


def write_step_metadata(episode: _Episode, traj_uid: str) -> StepMetadata:
    """The one writer of this loop's ``extra_fields["verl_ext"]`` (contract: ``verl_ext.steps``)."""
    n = len(episode.spans)
    return StepMetadata(
        traj_uid=traj_uid,
        step_idx=list(range(n)),
        anchor=episode.anchors,
        step_reward=episode.rewards,
        spans=episode.spans,
        action_valid=episode.action_valid,
        truncated=episode.truncated,
        extras={
            "success": episode.success,
            "num_steps": n,
            "num_invalid_actions": n - sum(episode.action_valid),
            "num_right": episode.actions.count("R"),
            "start": episode.reset_info.get("start"),
            "goal": episode.reset_info.get("goal"),
            "actions": episode.actions,
            "stop_reason": episode.stop_reason,
        },
    )


def _initial_messages(raw_prompt: list[dict[str, Any]], obs: str) -> list[dict[str, Any]]:
    """The dataset prompt with the first observation appended to its last user turn."""
    if raw_prompt and raw_prompt[-1]["role"] == "user":
        return raw_prompt[:-1] + [{"role": "user", "content": f"{raw_prompt[-1]['content']}\n{obs}"}]
    return raw_prompt + [{"role": "user", "content": obs}]
