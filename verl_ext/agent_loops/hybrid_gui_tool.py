"""``hybrid_gui_tool``: a verl agent loop that plays one hybrid GUI + tool env episode.

Per trajectory: lease an env from the process-wide pool (the loop object holds it for the whole
episode; nothing is keyed by ``request_id``), reset it to the row's task, then alternate
model turn -> verl's tool parser -> ``EnvTool.execute`` (one env step) -> observation, until the
env terminates, the step/turn/length budget runs out, or the model stops calling functions.
Tokens, rows and outputs are the shared skeleton's (``verl_ext.agent_loops.episode``); this
module holds the env adapter (pool lease, reset, one call = one env step) and the function-call
turn; the chat format is ``verl_ext.agent_loops.tool_call_messages``.

Two layouts (constructor ``layout``):

- ``trajectory`` (default): one training row per episode; observations come back as ``tool``
  messages (masked out), each model turn is a step with its token span.
- ``per_turn``: one row per model turn (``run`` returns a list, verl v1 trainers only), verl-agent
  style: each prompt holds the task, the last ``history_window`` actions with their results, and
  the current page. HGPO's context-consistency groups are defined for this layout.

Two action formats (constructor ``action_format``):

- ``tool_call`` (default): the model writes function calls (verl's tool parser, ``multi_turn.format``);
  GUI primitives go through ``computer_use``, app tools are called directly.
- ``menu``: for models too small to write calls (the cpu recipes' tiny model): each turn the
  model answers ``T`` or ``G``: on MiniDesk the next step of the task's tool-preferring or
  GUI-only reference plan, on text_hybrid the next decision (subgoal) done by tools or by the GUI
  (``verl_ext.envs.menu``, played by ``verl_ext.agent_loops.menu_play``; ``trajectory`` layout
  only). The
  dataset's system prompt is replaced by the menu's; observations are the menu, not the page.
  An answer that names no available option ends the episode, as a reply without a function
  call does in ``tool_call`` mode.

Three rollouts of the menu (constructor ``rollout``; ``verl_ext.agent_loops.menu_rollouts``):
``free`` (default, as above); ``semi_online`` (UI-S1: plays against text_hybrid's oracle, records
``action_match`` per step and patches mismatched answers with the reference answer, up to
``patch_threshold`` times: for the ``step_grouped`` estimator); ``plan_execute`` (a planner turn
per subgoal writes its plan, executor turns take its steps; records ``role`` and ``subgoal`` per
step: for ``himac`` and ``hiper``).

Dataset row (``extra_info``): ``env`` = {``backend``: minidesk|miniwob, ``task``, ``seed``} (or flat
``env_backend`` / ``task`` / ``seed`` keys). Output ``extra_fields["verl_ext"]`` is a
``verl_ext.steps.StepMetadata`` whose ``extras`` carry success, counts, the tool-beneficial label,
fault, and the final-state artifact; ``verl_ext.rewards.env_rewards.compute_score`` reads them.
``extra_fields["token_global_steps"]`` gives the weight version of each response token.

An env fault marks the trajectory ``valid=False`` and zeroes its response masks: it contributes no
gradient and estimators drop it from group statistics (never scored as a failure).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_parser import ToolParser
from verl.utils.profiler import simple_timer

from verl_ext.agent_loops import menu_rollouts
from verl_ext.agent_loops.env_tools import EnvTool, png_to_image
from verl_ext.agent_loops.episode import MultiTurnAgentLoop, Row, check_layout, past_actions
from verl_ext.agent_loops.hybrid_episode import HybridEpisode, write_step_metadata
from verl_ext.agent_loops.menu_play import MenuPlay
from verl_ext.agent_loops.tool_call_messages import (
    assistant_message,
    call_dict,
    first_messages,
    schemas_of,
    tool_message,
)
from verl_ext.envs import menu
from verl_ext.envs.core import ActionError, EnvFault, Observation, action_from_call
from verl_ext.envs.policies import SYSTEM_PROMPT
from verl_ext.envs.pool import get_pool
from verl_ext.envs.tools import ToolDef
from verl_ext.steps import StepMetadata, anchor_key

ACTION_FORMATS = ("tool_call", "menu")


def task_of(extra_info: dict[str, Any]) -> tuple[str, dict[str, Any], int]:
    """(backend, task spec, seed) from a dataset row's ``extra_info``; names the keys if absent."""
    env = extra_info.get("env") or {}
    backend = env.get("backend") or extra_info.get("env_backend") or "minidesk"
    task = env.get("task") or extra_info.get("task")
    if not task:
        raise ValueError("hybrid_gui_tool needs the task in the dataset row: extra_info.env = "
                         "{backend: minidesk|miniwob, task: <template>, seed: <int>}")
    seed = int(env.get("seed", extra_info.get("seed", 0)))
    return backend, {"template": task, "seed": seed}, seed


@register("hybrid_gui_tool")
class HybridGuiToolAgentLoop(MultiTurnAgentLoop):
    """Agent loop over a hybrid env. Constructor kwargs (YAML ``agent_loop_config_path`` route):

    Args:
        max_envs: browsers per agent-loop worker process (the pool's cap).
        max_steps: env step limit per episode (``S_max``); also capped by ``multi_turn.max_assistant_turns``.
        layout: ``trajectory`` (one row per episode) or ``per_turn`` (one row per turn, v1 trainers).
        history_window: ``per_turn`` only: how many past actions each prompt repeats.
        screenshots: send screenshots to VL models (needs a processor); text observations always.
        artifact_screenshot: store a base64 PNG of the final page in the artifact (large).
        action_format: ``tool_call`` (function calls) or ``menu`` (one letter, T/G; see above).
        max_action_tokens: ``menu`` only: ``max_tokens`` of each model turn.
        env_options: further constructor options of the env backend (e.g. text_hybrid's ``show_todo``:
            set it as the SFT demonstrations and decision rows were built).
        rollout: ``menu`` only: ``free``, ``semi_online`` or ``plan_execute`` (see above; the last two
            need text_hybrid).
        patch_threshold: ``semi_online`` only: patched answers allowed per trajectory, the next
            mismatch ends it (UI-S1's script: 2; -1: no limit).
    """

    def __init__(self, *args: Any, tools: Any = None, max_envs: int = 4, max_steps: int = 30,
                 layout: str = "trajectory", history_window: int = 4, screenshots: bool = False,
                 artifact_screenshot: bool = False, action_format: str = "tool_call", max_action_tokens: int = 4,
                 env_options: dict[str, Any] | None = None, rollout: str = "free", patch_threshold: int = 2,
                 **kwargs: Any):
        # ``tools`` (verl's multi_turn.tool_config_path tools) is accepted and not used: each
        # episode's env defines its own tool list (task apps + distractors).
        super().__init__(*args, **kwargs)
        check_layout("hybrid_gui_tool", layout)
        if action_format not in ACTION_FORMATS:
            raise ValueError(f"hybrid_gui_tool action_format must be one of {ACTION_FORMATS}, got {action_format!r}")
        if action_format == "menu" and layout != "trajectory":
            raise ValueError("hybrid_gui_tool action_format=menu supports layout=trajectory only")
        if rollout not in menu_rollouts.ROLLOUTS:
            raise ValueError(f"hybrid_gui_tool rollout must be one of {menu_rollouts.ROLLOUTS}, got {rollout!r}")
        if rollout != "free" and action_format != "menu":
            raise ValueError(f"hybrid_gui_tool rollout={rollout} is played on the T/G menu: set action_format=menu "
                             "(with layout=trajectory)")
        multi_turn = self.rollout_config.multi_turn
        self.max_turns = min(max_steps, multi_turn.max_assistant_turns or max_steps)
        self.max_envs = max_envs
        self.max_steps = max_steps
        self.layout = layout
        self.history_window = history_window
        self.screenshots = bool(screenshots and getattr(self.processor, "image_processor", None))
        self.artifact_screenshot = artifact_screenshot
        self.env_options = dict(env_options or {})
        self.menu_play = MenuPlay(rollout, int(patch_threshold), max_action_tokens) if action_format == "menu" else None
        self.tool_parser = ToolParser.get_tool_parser(multi_turn.format, self.tokenizer)
        self.max_tool_response_length = multi_turn.max_tool_response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        backend, task, seed = task_of(kwargs.get("extra_info") or {})
        pool = get_pool(backend, max_envs=self.max_envs, max_steps=self.max_steps, screenshots=self.screenshots,
                        **self.env_options)
        raw_prompt = list(kwargs.get("raw_prompt") or [])
        episode = HybridEpisode()
        async with pool.alease() as env:
            try:
                episode.obs, episode.reset_info = await asyncio.to_thread(
                    pool.reset, env, seed=seed, options={"task": task})
            except EnvFault as fault:
                episode.fault, episode.stop_reason = fault.as_dict(), "fault"
                prompt = raw_prompt or [{"role": "system", "content": SYSTEM_PROMPT}]
                rows = [Row(await self.ct_build_initial_tokens(prompt))]
            else:
                if self.menu_play is not None:
                    rows = await self.menu_play.play(self, env, sampling_params, self.max_turns, episode)
                else:
                    episode.follower = menu.decision_follower(episode.reset_info)
                    tools = {t.name: EnvTool.from_def(t) for t in env.tool_defs()}
                    if self.tool_parser.stop_token_ids:  # parsers whose models do not stop after a call
                        stops = set(sampling_params.get("stop_token_ids") or []) | set(self.tool_parser.stop_token_ids)
                        sampling_params = {**sampling_params, "stop_token_ids": sorted(stops)}
                    play = self._play_trajectory if self.layout == "trajectory" else self._play_per_turn
                    rows = await play(env, tools, sampling_params, raw_prompt, episode)
                episode.counts = dict(env.counts)
                if episode.fault is None:
                    episode.artifact = await asyncio.to_thread(self._artifact, env)
        outputs = self.outputs(rows, episode, uuid4().hex, per_turn=self.layout == "per_turn")
        return outputs if self.layout == "per_turn" else outputs[0]

    def step_metadata(self, episode: HybridEpisode, traj_uid: str, step: int | None) -> StepMetadata:
        return write_step_metadata(episode, traj_uid, step)

    # --- the two layouts --------------------------------------------------------------------
    async def _play_trajectory(self, env: Any, tools: dict[str, EnvTool], sampling_params: dict[str, Any],
                               raw_prompt: list[dict[str, Any]], episode: HybridEpisode) -> list[Row]:
        schemas = schemas_of(tools)
        images = self._images(episode.obs)
        messages = first_messages(raw_prompt, episode.obs.render(), images)
        prompt_ids = await self.ct_build_initial_tokens(messages, tools=schemas, images=images or None)
        row = Row(prompt_ids, images=images)  # the same list: tool responses extend it
        request_id = uuid4().hex  # one per trajectory: the server keeps its prefix cache
        for _ in range(self.max_turns):
            output, start = await self.model_turn(row, request_id, sampling_params, images, episode)
            episode.spans.append([start, min(len(row.response_mask), self.response_length)])
            fits = len(row.response_mask) < self.response_length
            content, call, response = await self._act(env, tools, output.token_ids, episode, execute=fits)
            if response is None:
                break
            messages.append(assistant_message(content, call))  # already in the tokens (merged above)
            previous = list(messages)
            messages.append(self._tool_message(response, call.tool_call_id))
            if response.image:
                images.extend(response.image)
            if await self.observation(row, previous, messages, tools=schemas):
                episode.stop_reason = "response_length"
                break
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        return [row]

    async def _play_per_turn(self, env: Any, tools: dict[str, EnvTool], sampling_params: dict[str, Any],
                             raw_prompt: list[dict[str, Any]], episode: HybridEpisode) -> list[Row]:
        schemas = schemas_of(tools)
        rows: list[Row] = []
        history: list[str] = []
        request_id = uuid4().hex
        for _ in range(self.max_turns):
            images = self._images(episode.obs)
            past = past_actions(history, self.history_window)
            messages = first_messages(raw_prompt, f"{past}\n\n{episode.obs.render()}" if past else episode.obs.render(),
                                      images)
            row = Row(await self.ct_build_initial_tokens(messages, tools=schemas, images=images or None), images=images)
            output, _ = await self.model_turn(row, request_id, sampling_params, images, episode)
            rows.append(row)
            content, call, response = await self._act(env, tools, output.token_ids, episode,
                                                      execute=len(row.response_mask) < self.response_length)
            if response is None:
                break
            history.append(f"{len(history) + 1}. {json.dumps(call_dict(call))} -> "
                           f"{json.dumps(episode.obs.last_result, default=str)[:300]}")
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        return rows

    # --- one function-call turn ------------------------------------------------------------------
    async def _act(self, env: Any, tools: dict[str, EnvTool], token_ids: list[int], episode: HybridEpisode,
                   execute: bool) -> tuple[str, Any, Any]:
        """Record the model turn as a step and, if it holds a call and ``execute``, run it on the env.

        Returns ``(content, call, tool response)``; the response is None when the episode is over
        (no call, budget exhausted, fault, env done) with ``episode.stop_reason`` set.
        """
        content, calls = await self.tool_parser.extract_tool_calls(token_ids, [t.tool_schema for t in tools.values()])
        episode.record_step(anchor_key(episode.obs.page_text()), calls[0].name if calls else "", len(calls) == 1)
        if not execute:
            episode.stop_reason = "response_length"
            return content, None, None
        if not calls:  # no parsable function call: the episode ends (ToolCUA's format rule)
            episode.stop_reason = "no_tool_call"
            return content, None, None
        call = calls[0]
        # An unknown name still costs a step and gets a readable error from the env.
        tool = tools.get(call.name) or EnvTool.from_def(ToolDef(call.name, "not offered in this episode"))
        arguments = json.loads(call.arguments)
        if episode.follower is not None:
            self._follow(episode, call.name, arguments, env.decision_state())
        with simple_timer("tool_calls", episode.metrics):
            response, reward, info = await tool.execute("", arguments if isinstance(arguments, dict) else {},
                                                        env=env, with_image=self.screenshots)
        episode.rewards[-1] = float(reward)
        if info["info"].get("fault"):
            episode.fault, episode.stop_reason = info["info"]["fault"], "fault"
            return content, call, None
        episode.obs = info["observation"]
        episode.success = bool(info["info"].get("success", False))
        if episode.end(info["terminated"], info["truncated"]):
            return content, call, None
        return content, call, response

    @staticmethod
    def _follow(episode: HybridEpisode, name: str, arguments: Any, state: tuple[int, int] | None) -> None:
        """Record the decision this call takes, if any, from the env's ``state`` (text_hybrid's
        ``decision_state()``; ``menu.DecisionFollower``)."""
        try:
            action = action_from_call(name, arguments)
        except ActionError:
            action = None
        decision = episode.follower.observe(action, episode.obs, state)
        if decision is not None:
            episode.decisions.append(decision)

    # --- observations and the final state ---------------------------------------------------------
    def _images(self, obs: Observation) -> list[Any]:
        return [png_to_image(obs.screenshot)] if self.screenshots and obs.screenshot else []

    def _tool_message(self, response: Any, call_id: str | None) -> dict[str, Any]:
        return tool_message(response.text or "", response.image, call_id, self.max_tool_response_length)

    def _artifact(self, env: Any) -> dict[str, Any]:
        """Final-state artifact for judge rewards: the state dump (JSON text) and optionally a PNG."""
        artifact = {"state": json.dumps(env.state_dump(), sort_keys=True)}
        if self.artifact_screenshot:
            artifact["screenshot_png_b64"] = base64.b64encode(env.screenshot()).decode()
        return artifact
