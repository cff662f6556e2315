"""``text_env``: a verl agent loop that plays one ``TextCorridor`` episode per trajectory.

Model turn -> ``env.step(text)`` -> observation -> model turn ..., until the env terminates or
truncates or the response budget runs out. Two layouts (constructor ``layout``):

- ``trajectory`` (default): one row per episode; each observation is appended as a user message,
  so observation tokens get ``response_mask`` 0.
- ``per_turn``: one row per model turn (``run`` returns a list; verl's v1 trainers store each as
  its own row), verl-agent style: each prompt is the task, the last ``history_window`` actions
  with the observation each led to, and the current observation. HGPO's context groups are
  defined for this layout (``algorithm.hgpo.history_length`` = ``history_window``).

Tokens, rows and outputs are the shared skeleton's (``verl_ext.agent_loops.episode``); this
module holds what is TextCorridor's: the env, the chat format and the step metadata's extras.

Dataset row (``extra_info``): ``seed`` (the env reset seed; rows sharing a ``uid`` share it, so a
group starts from one state) and optional ``env`` = {``length``, ``max_steps``, ``start``}.

Output ``extra_fields``:
- ``"verl_ext"``: a ``verl_ext.steps.StepMetadata`` (one step per assistant turn: its token span,
  anchor = the observation before acting, env reward, action validity; ``extras`` carry
  ``success`` and counts, which ``verl_ext.rewards.text_env.compute_score`` turns into the score).
  In the ``per_turn`` layout each row carries its own step, without a span, and the episode's
  ``extras``;
- ``"token_global_steps"``: the weight version of every response token, -1 on observation tokens;
- the server's fields (``min_global_steps`` / ``max_global_steps`` among them), as the skeleton
  records them.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register

from verl_ext.agent_loops.episode import Episode, MultiTurnAgentLoop, Row, check_layout, past_actions
from verl_ext.envs.text_corridor import TextCorridor
from verl_ext.steps import StepMetadata, anchor_key


def env_of(extra_info: dict[str, Any]) -> tuple[TextCorridor, int]:
    """The env and reset seed a dataset row asks for; names the key when it is missing."""
    if "seed" not in extra_info:
        raise ValueError("text_env needs the env seed in the dataset row: extra_info.seed = <int> "
                         "(verl-ext prepare-data text_corridor writes it)")
    options = dict(extra_info.get("env") or {})
    return TextCorridor(**options), int(extra_info["seed"])


@register("text_env")
class TextEnvAgentLoop(MultiTurnAgentLoop):
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
        check_layout("text_env", layout)
        self.max_action_tokens = max_action_tokens
        self.layout = layout
        self.history_window = history_window
        self.max_assistant_turns = self.rollout_config.multi_turn.max_assistant_turns

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        env, seed = env_of(kwargs.get("extra_info") or {})
        obs, reset_info = env.reset(seed=seed)
        episode = Episode(reset_info=reset_info)
        raw_prompt = list(kwargs.get("raw_prompt") or [])
        sampling_params = {**sampling_params, "max_tokens": self.max_action_tokens}
        max_turns = min(env.max_steps, self.max_assistant_turns or env.max_steps)
        if self.layout == "trajectory":
            rows = await self._play_trajectory(env, obs, raw_prompt, sampling_params, max_turns, episode)
            return self.outputs(rows, episode, uuid4().hex, per_turn=False)[0]
        rows = await self._play_per_turn(env, obs, raw_prompt, sampling_params, max_turns, episode)
        return self.outputs(rows, episode, uuid4().hex, per_turn=True)

    async def _play_trajectory(self, env: TextCorridor, obs: str, raw_prompt: list[dict[str, Any]],
                               sampling_params: dict[str, Any], max_turns: int, episode: Episode) -> list[Row]:
        messages = _initial_messages(raw_prompt, obs)
        row = Row(await self.ct_build_initial_tokens(messages))
        request_id = uuid4().hex  # one id per trajectory: the server keeps its prefix cache
        for _ in range(max_turns):
            output, start = await self.model_turn(row, request_id, sampling_params, [], episode)
            if len(row.response_mask) > self.response_length:  # the turn would be cut: it is not a step
                episode.stop_reason, episode.truncated = "response_length", True
                break
            episode.spans.append([start, len(row.response_mask)])
            text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            obs, done = _step(env, obs, text, episode)
            if done:
                break
            messages.append({"role": "assistant", "content": text})
            previous = list(messages)
            messages.append({"role": "user", "content": obs})
            if await self.observation(row, previous, messages):
                episode.stop_reason, episode.truncated = "response_length", True
                break
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        return [row]

    async def _play_per_turn(self, env: TextCorridor, obs: str, raw_prompt: list[dict[str, Any]],
                             sampling_params: dict[str, Any], max_turns: int, episode: Episode) -> list[Row]:
        # A turn never outgrows the response budget, so every turn is a step.
        sampling_params = {**sampling_params, "max_tokens": min(self.max_action_tokens, self.response_length)}
        rows: list[Row] = []
        history: list[str] = []
        request_id = uuid4().hex
        for _ in range(max_turns):
            past = past_actions(history, self.history_window)
            row = Row(await self.ct_build_initial_tokens(_initial_messages(raw_prompt, f"{past}\n{obs}" if past else obs)))
            output, _ = await self.model_turn(row, request_id, sampling_params, [], episode)
            rows.append(row)
            text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            obs, done = _step(env, obs, text, episode)
            history.append(f"{len(history) + 1}. {episode.actions[-1] or 'invalid'} -> {obs}")
            if done:
                break
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        return rows

    def step_metadata(self, episode: Episode, traj_uid: str, step: int | None) -> StepMetadata:
        return write_step_metadata(episode, traj_uid, step)


def _step(env: TextCorridor, obs: str, text: str, episode: Episode) -> tuple[str, bool]:
    """Play ``text`` from ``obs`` and record the step; returns the next observation and whether the
    episode is over."""
    anchor = anchor_key(obs)
    obs, reward, terminated, truncated, info = env.step(text)
    episode.record_step(anchor, info["action"], info["action_valid"], reward)
    episode.success = bool(info["success"])
    return obs, episode.end(terminated, truncated)


def write_step_metadata(episode: Episode, traj_uid: str, step: int | None = None) -> StepMetadata:
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
