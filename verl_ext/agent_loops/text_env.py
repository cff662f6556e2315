"""``text_env``: a verl agent loop that plays one ``TextCorridor`` episode per trajectory.

Model turn -> ``env.step(text)`` -> observation -> model turn ..., until the env terminates or
truncates or the response budget runs out. Two layouts (constructor ``layout``):

- ``trajectory`` (default): one row per episode; each observation is appended as a user message,
  so observation tokens get ``response_mask`` 0.
- ``per_turn``: one row per model turn (``run`` returns a list; verl's v1 trainers store each as
  its own row), verl-agent style: each prompt is the task, the last ``history_window`` actions
  with the observation each led to, and the current observation. HGPO's context groups are
  defined for this layout (``algorithm.hgpo.history_length`` = ``history_window``).

Tokens are built only with verl's Continuous-Token helpers (``ct_build_initial_tokens`` /
``ct_merge_assistant_token`` / ``ct_merge_context_msg``), so decoded text is never re-encoded into
the model's own turns.

Dataset row (``extra_info``): ``seed`` (the env reset seed; rows sharing a ``uid`` share it, so a
group starts from one state) and optional ``env`` = {``length``, ``max_steps``, ``start``}.

Output ``extra_fields``:
- ``"verl_ext"``: a ``verl_ext.steps.StepMetadata`` (one step per assistant turn: its token span,
  anchor = the observation before acting, env reward, action validity; ``extras`` carry
  ``success`` and counts, which ``verl_ext.rewards.text_env.compute_score`` turns into the score).
  In the ``per_turn`` layout each row carries its own step, without a span, and the episode's
  ``extras``;
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
from verl_ext.old_logits.rollout_client import TurnTokens
from verl_ext.steps import StepMetadata, anchor_key

LAYOUTS = ("trajectory", "per_turn")


@dataclass
class _Episode:
    """What the loop records while it plays (turned into StepMetadata at the end)."""

    spans: list[list[int]] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    action_valid: list[bool] = field(default_factory=list)
    actions: list[str | None] = field(default_factory=list)
    tokens: TurnTokens = field(default_factory=TurnTokens)  # per-token versions (+ old log-probs) of every call
    call_versions: list[int] = field(default_factory=list)  # min/max weight version of each server call
    success: bool = False
    truncated: bool = False
    stop_reason: str = ""
    reset_info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Row:
    """One training row: prompt, response, and what goes with each response token."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float] | None
    token_fields: dict[str, Any]  # per-token versions (-1 on observation tokens), rollout-side old log-probs
    call_versions: list[int]  # min/max weight version of each server call that wrote the row


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
        layout: ``trajectory`` (one row per episode) or ``per_turn`` (one row per turn, v1 trainers).
        history_window: ``per_turn`` only: how many past actions (with the observation each led
            to) every prompt repeats.
    """

    def __init__(self, *args: Any, max_action_tokens: int = 6, layout: str = "trajectory",
                 history_window: int = 2, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if layout not in LAYOUTS:
            raise ValueError(f"text_env layout must be one of {LAYOUTS}, got {layout!r} (agent loop kwarg layout)")
        self.max_action_tokens = max_action_tokens
        self.layout = layout
        self.history_window = history_window
        self.max_assistant_turns = self.rollout_config.multi_turn.max_assistant_turns
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        env, seed = env_of(kwargs.get("extra_info") or {})
        obs, reset_info = env.reset(seed=seed)
        episode = _Episode(reset_info=reset_info)
        raw_prompt = list(kwargs.get("raw_prompt") or [])
        sampling_params = {**sampling_params, "max_tokens": self.max_action_tokens}
        max_turns = min(env.max_steps, self.max_assistant_turns or env.max_steps)
        if self.layout == "trajectory":
            return await self._play_trajectory(env, obs, raw_prompt, sampling_params, max_turns, episode)
        return await self._play_per_turn(env, obs, raw_prompt, sampling_params, max_turns, episode)

    async def _play_trajectory(self, env: TextCorridor, obs: str, raw_prompt: list[dict[str, Any]],
                               sampling_params: dict[str, Any], max_turns: int, episode: _Episode) -> AgentLoopOutput:
        messages = _initial_messages(raw_prompt, obs)
        prompt_ids = await self.ct_build_initial_tokens(messages)
        response_mask: list[int] = []
        logprobs: list[float] = []
        request_id = uuid4().hex  # one id per trajectory: the server keeps its prefix cache
        for _ in range(max_turns):
            output = await self._generate(request_id, prompt_ids, sampling_params, episode)
            start = len(response_mask)
            merged, response_mask, logprobs = await self.ct_merge_assistant_token(
                prompt_ids, output.token_ids, response_mask, logprobs, assistant_logprobs=output.log_probs
            )
            prompt_ids = merged.token_ids
            episode.tokens.add(output)
            if len(response_mask) > self.response_length:  # the turn would be cut: it is not a step
                episode.stop_reason, episode.truncated = "response_length", True
                break
            episode.spans.append([start, len(response_mask)])
            text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            obs, done = _step(env, obs, text, episode)
            if done:
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
        n_resp, limit = len(response_mask), self.response_length
        row = _Row(prompt_ids[: len(prompt_ids) - n_resp], prompt_ids[len(prompt_ids) - n_resp:][:limit],
                   response_mask[:limit], logprobs[:limit], episode.tokens.extra_fields(response_mask, limit),
                   episode.call_versions)
        return _output(row, write_step_metadata(episode, uuid4().hex), 2 * len(episode.spans) + 1, episode)

    async def _play_per_turn(self, env: TextCorridor, obs: str, raw_prompt: list[dict[str, Any]],
                             sampling_params: dict[str, Any], max_turns: int, episode: _Episode) -> list[AgentLoopOutput]:
        # A turn never outgrows the response budget, so every turn is a step.
        sampling_params = {**sampling_params, "max_tokens": min(self.max_action_tokens, self.response_length)}
        rows: list[_Row] = []
        history: list[str] = []
        request_id = uuid4().hex
        for _ in range(max_turns):
            recent = history[-self.history_window:] if self.history_window > 0 else []
            past = "Previous actions (latest last):\n" + "\n".join(recent) + "\n" if recent else ""
            prompt_ids = await self.ct_build_initial_tokens(_initial_messages(raw_prompt, past + obs))
            output = await self._generate(request_id, prompt_ids, sampling_params, episode)
            merged, response_mask, logprobs = await self.ct_merge_assistant_token(
                prompt_ids, output.token_ids, [], [] if output.log_probs else None, assistant_logprobs=output.log_probs
            )
            tokens, n_prompt = merged.token_ids, len(merged.token_ids) - len(response_mask)
            turn = TurnTokens()
            turn.add(output)
            rows.append(_Row(tokens[:n_prompt], tokens[n_prompt:], response_mask, logprobs or None,
                             turn.extra_fields(response_mask, len(response_mask)), episode.call_versions[-2:]))
            text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            obs, done = _step(env, obs, text, episode)
            history.append(f"{len(history) + 1}. {episode.actions[-1] or 'invalid'} -> {obs}")
            if done:
                break
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        traj_uid = uuid4().hex
        # Built after the episode: every row carries the episode's outcome in its extras.
        return [_output(row, write_step_metadata(episode, traj_uid, step=i), 2, episode) for i, row in enumerate(rows)]

    async def _generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                        episode: _Episode) -> Any:
        with simple_timer("generate_sequences", episode.metrics):
            output = await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params
            )
        episode.call_versions += [output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]]
        return output


def _step(env: TextCorridor, obs: str, text: str, episode: _Episode) -> tuple[str, bool]:
    """Play ``text`` from ``obs`` and record the step; returns the next observation and whether the
    episode is over."""
    episode.anchors.append(anchor_key(obs))
    obs, reward, terminated, truncated, info = env.step(text)
    episode.rewards.append(reward)
    episode.action_valid.append(info["action_valid"])
    episode.actions.append(info["action"])
    episode.success = bool(info["success"])
    if terminated or truncated:
        episode.stop_reason = "terminated" if terminated else "max_steps"
        episode.truncated = truncated
    return obs, terminated or truncated


def _output(row: _Row, meta: StepMetadata, num_turns: int, episode: _Episode) -> AgentLoopOutput:
    extra_fields: dict[str, Any] = meta.to_extra_fields()
    extra_fields.update(row.token_fields)
    extra_fields["min_global_steps"] = min(row.call_versions)
    extra_fields["max_global_steps"] = max(row.call_versions)
    return AgentLoopOutput(
        prompt_ids=row.prompt_ids, response_ids=row.response_ids, response_mask=row.response_mask,
        response_logprobs=row.logprobs, num_turns=num_turns, metrics=episode.metrics, extra_fields=extra_fields,
    )


def write_step_metadata(episode: _Episode, traj_uid: str, step: int | None = None) -> StepMetadata:
    """The one writer of this loop's ``extra_fields["verl_ext"]`` (contract: ``verl_ext.steps``;
    layouts: ``StepMetadata.of_row``). The episode's ``extras`` are the same on every row."""
    n = len(episode.anchors)
    return StepMetadata.of_row(
        traj_uid, step, anchors=episode.anchors, step_rewards=episode.rewards, spans=episode.spans,
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
