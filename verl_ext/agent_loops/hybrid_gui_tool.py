"""``hybrid_gui_tool``: a verl agent loop that plays one hybrid GUI + tool env episode.

Per trajectory: lease an env from the process-wide pool (the loop object holds it for the whole
episode; nothing is keyed by ``request_id``), reset it to the row's task, then alternate
model turn -> verl's tool parser -> ``EnvTool.execute`` (one env step) -> observation, until the
env terminates, the step/turn/length budget runs out, or the model stops calling functions.
Tokens are built only with verl's Continuous-Token helpers (``ct_build_initial_tokens`` /
``ct_merge_assistant_token`` / ``ct_merge_context_msg``); decoded text is never re-encoded.

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
  (``verl_ext.envs.menu``; ``trajectory`` layout only). The
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
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_parser import ToolParser
from verl.utils.profiler import simple_timer

from verl_ext.agent_loops import menu_rollouts
from verl_ext.envs import menu
from verl_ext.envs.core import ActionError, EnvFault, Observation, action_from_call
from verl_ext.envs.policies import SYSTEM_PROMPT
from verl_ext.envs.pool import get_pool
from verl_ext.envs.tools import ToolDef
from verl_ext.agent_loops.env_tools import EnvTool, png_to_image
from verl_ext.old_logits.rollout_client import PER_CALL_KEYS, TurnTokens
from verl_ext.steps import StepMetadata, anchor_key

LAYOUTS = ("trajectory", "per_turn")
ACTION_FORMATS = ("tool_call", "menu")


@dataclass
class _Episode:
    """What the loop records while it plays (turned into StepMetadata at the end)."""

    obs: Observation | None = None
    spans: list[list[int]] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    valid_format: list[bool] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    success: bool = False
    truncated: bool = False
    stop_reason: str = ""
    fault: dict[str, str] | None = None
    reset_info: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    artifact: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    server_fields: dict[str, Any] = field(default_factory=dict)  # the first reply's extra_fields
    decisions: list[dict[str, str]] = field(default_factory=list)  # {choice, better} per decision (text_hybrid)
    follower: menu.DecisionFollower | None = None  # tool_call format: which decisions the calls take
    matches: list[bool] = field(default_factory=list)  # per step: action_match (rollout=semi_online)
    roles: list[str] = field(default_factory=list)  # per step: role (rollout=plan_execute)
    subgoals: list[str | None] = field(default_factory=list)  # per step: subgoal key (rollout=plan_execute)
    recorded: frozenset[str] = frozenset()  # which of the three lists above go into StepMetadata
    counts_extra: dict[str, int] = field(default_factory=dict)  # rollout-specific counts for extras


@dataclass
class _Row:
    """One training row: its tokens (prompt + response), response mask/logprobs, per-token fields
    of its generate() calls (weight versions, rollout-side old log-probs)."""

    token_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    tokens: TurnTokens
    images: list[Any] = field(default_factory=list)  # every image in token_ids, in order (VL models)


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
class HybridGuiToolAgentLoop(AgentLoopBase):
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
        if layout not in LAYOUTS:
            raise ValueError(f"hybrid_gui_tool layout must be one of {LAYOUTS}, got {layout!r} "
                             "(agent loop kwarg layout)")
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
        self.action_format = action_format
        self.max_action_tokens = max_action_tokens
        self.env_options = dict(env_options or {})
        self.rollout = rollout
        self.patch_threshold = int(patch_threshold)
        self.tool_parser = ToolParser.get_tool_parser(multi_turn.format, self.tokenizer)
        self.max_tool_response_length = multi_turn.max_tool_response_length
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        backend, task, seed = task_of(kwargs.get("extra_info") or {})
        pool = get_pool(backend, max_envs=self.max_envs, max_steps=self.max_steps, screenshots=self.screenshots,
                        **self.env_options)
        raw_prompt = list(kwargs.get("raw_prompt") or [])
        episode = _Episode()
        async with pool.alease() as env:
            try:
                episode.obs, episode.reset_info = await asyncio.to_thread(pool.reset, env, task, seed)
            except EnvFault as fault:
                episode.fault, episode.stop_reason = fault.as_dict(), "fault"
                prompt = raw_prompt or [{"role": "system", "content": SYSTEM_PROMPT}]
                prompt_ids = await self.ct_build_initial_tokens(prompt)
                rows = [_Row(prompt_ids, [], [], TurnTokens())]
            else:
                if self.action_format == "menu":
                    rows = await self._play_menu(env, sampling_params, episode)
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
        outputs = self._outputs(rows, episode)
        return outputs if self.layout == "per_turn" else outputs[0]

    # --- the two layouts --------------------------------------------------------------------
    async def _play_trajectory(self, env: Any, tools: dict[str, EnvTool], sampling_params: dict[str, Any],
                               raw_prompt: list[dict[str, Any]], episode: _Episode) -> list[_Row]:
        schemas = _schemas(tools)
        images = self._images(episode.obs)
        messages = self._first_messages(raw_prompt, episode.obs.render(), images)
        prompt_ids = await self.ct_build_initial_tokens(messages, tools=schemas, images=images or None)
        row = _Row(prompt_ids, [], [], TurnTokens(), images)  # the same list: tool responses extend it
        request_id = uuid4().hex  # one per trajectory: the server keeps its prefix cache
        for _ in range(self.max_turns):
            output, start = await self._model_turn(row, request_id, sampling_params, images, episode)
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
            if await self._observation(row, previous, messages, tools=schemas):
                episode.stop_reason = "response_length"
                break
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        return [row]

    async def _play_per_turn(self, env: Any, tools: dict[str, EnvTool], sampling_params: dict[str, Any],
                             raw_prompt: list[dict[str, Any]], episode: _Episode) -> list[_Row]:
        schemas = _schemas(tools)
        rows: list[_Row] = []
        history: list[str] = []
        request_id = uuid4().hex
        for _ in range(self.max_turns):
            images = self._images(episode.obs)
            recent = history[-self.history_window:] if self.history_window > 0 else []
            past = "Previous actions (latest last):\n" + "\n".join(recent) + "\n\n" if recent else ""
            messages = self._first_messages(raw_prompt, past + episode.obs.render(), images)
            prompt_ids = await self.ct_build_initial_tokens(messages, tools=schemas, images=images or None)
            output = await self._generate(request_id, prompt_ids, sampling_params, images, episode)
            merged, mask, logprobs = await self.ct_merge_assistant_token(
                prompt_ids, output.token_ids, [], [] if output.log_probs else None,
                assistant_logprobs=output.log_probs or None,
            )
            turn = TurnTokens()
            turn.add(output)
            rows.append(_Row(merged.token_ids, mask, logprobs or [], turn, images))
            content, call, response = await self._act(env, tools, output.token_ids, episode,
                                                      execute=len(mask) < self.response_length)
            if response is None:
                break
            history.append(f"{len(history) + 1}. {json.dumps(_call_dict(call))} -> "
                           f"{json.dumps(episode.obs.last_result, default=str)[:300]}")
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        return rows

    async def _play_menu(self, env: Any, sampling_params: dict[str, Any], episode: _Episode) -> list[_Row]:
        player = menu_rollouts.make_player(self.rollout, episode.reset_info, self.patch_threshold)
        episode.recorded = menu_rollouts.RECORDED_FIELDS[self.rollout]
        messages = [{"role": "system", "content": menu.SYSTEM_PROMPT},
                    {"role": "user", "content": player.first_message(episode.obs)}]
        row = _Row(await self.ct_build_initial_tokens(messages), [], [], TurnTokens())
        sampling_params = {**sampling_params, "max_tokens": self.max_action_tokens}
        request_id = uuid4().hex
        for _ in range(self.max_turns):
            output, start = await self._model_turn(row, request_id, sampling_params, [], episode)
            if len(row.response_mask) > self.response_length:  # the turn would be cut: it is not a step
                episode.stop_reason, episode.truncated = "response_length", True
                break
            text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            turn = player.turn(text, episode.obs)
            episode.spans.append([start, len(row.response_mask)])
            episode.anchors.append(anchor_key(episode.obs.page_text()))
            episode.valid_format.append(turn.valid_format)
            episode.actions.append(turn.description)
            episode.rewards.append(turn.reward)  # the env's rewards for the turn's steps are added to it
            episode.matches.append(bool(turn.match))
            episode.roles.append(turn.role)
            episode.subgoals.append(turn.subgoal)
            if turn.decision is not None:
                episode.decisions.append(turn.decision)
            if turn.stop:
                episode.stop_reason = turn.stop
                break
            if turn.action is not None and await self._menu_steps(env, player, turn.action, episode):
                break
            messages.append({"role": "assistant", "content": text})
            previous = list(messages)
            messages.append({"role": "user", "content": player.feedback(episode.obs)})
            if await self._observation(row, previous, messages):
                episode.stop_reason, episode.truncated = "response_length", True
                break
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        if isinstance(player, menu_rollouts.SemiOnlinePlay):
            episode.counts_extra = {"patches": player.patches}
        return [row]

    async def _menu_steps(self, env: Any, plans: menu_rollouts.Player, action: Any, episode: _Episode) -> bool:
        """Take ``action`` and the rest of the answer's steps (``plans.follow_up``) on the env,
        adding their rewards to the turn's; True when the episode is over."""
        while action is not None:
            with simple_timer("tool_calls", episode.metrics):
                obs, reward, terminated, truncated, info = await asyncio.to_thread(env.step, action)
            episode.rewards[-1] += float(reward)
            if info.get("fault"):
                episode.fault, episode.stop_reason = info["fault"], "fault"
                return True
            episode.obs, episode.success = obs, bool(info.get("success", False))
            if terminated or truncated:
                episode.truncated = truncated
                episode.stop_reason = "terminated" if terminated else "max_steps"
                return True
            action = plans.follow_up(episode.obs)
        return False

    # --- tokens of one row: a model turn, an observation ----------------------------------------
    async def _model_turn(self, row: _Row, request_id: str, sampling_params: dict[str, Any], images: list[Any],
                          episode: _Episode) -> tuple[Any, int]:
        """Generate one model turn onto ``row``; returns the server output and the turn's first
        position in the response."""
        output = await self._generate(request_id, row.token_ids, sampling_params, images, episode)
        row.tokens.add(output)
        start = len(row.response_mask)
        merged, row.response_mask, logprobs = await self.ct_merge_assistant_token(
            row.token_ids, output.token_ids, row.response_mask,
            row.logprobs if (row.logprobs or output.log_probs) else None,
            assistant_logprobs=output.log_probs or None,
        )
        row.token_ids, row.logprobs = merged.token_ids, logprobs or row.logprobs
        return output, start

    async def _observation(self, row: _Row, previous: list[dict[str, Any]], messages: list[dict[str, Any]],
                           **template_kwargs: Any) -> bool:
        """Append the tokens of ``messages`` beyond ``previous`` to ``row`` (masked out); True when
        the response budget is used up."""
        merged, row.response_mask, logprobs = await self.ct_merge_context_msg(
            previous, messages, row.token_ids, row.response_mask, row.logprobs or None, **template_kwargs,
        )
        row.token_ids, row.logprobs = merged.token_ids, logprobs or row.logprobs
        return len(row.response_mask) >= self.response_length

    # --- one step, shared by the function-call layouts ----------------------------------------
    async def _generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                        images: list[Any], episode: _Episode) -> Any:
        with simple_timer("generate_sequences", episode.metrics):
            output = await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                image_data=images or None,
            )
        if not episode.server_fields:  # as verl's tool loop: keep what the server reported
            episode.server_fields = {k: v for k, v in output.extra_fields.items() if k not in PER_CALL_KEYS}
        return output

    async def _act(self, env: Any, tools: dict[str, EnvTool], token_ids: list[int], episode: _Episode,
                   execute: bool) -> tuple[str, Any, Any]:
        """Record the model turn as a step and, if it holds a call and ``execute``, run it on the env.

        Returns ``(content, call, tool response)``; the response is None when the episode is over
        (no call, budget exhausted, fault, env done) with ``episode.stop_reason`` set.
        """
        content, calls = await self.tool_parser.extract_tool_calls(token_ids, [t.tool_schema for t in tools.values()])
        episode.anchors.append(anchor_key(episode.obs.page_text()))
        episode.valid_format.append(len(calls) == 1)
        episode.actions.append(calls[0].name if calls else "")
        episode.rewards.append(0.0)
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
        if info["terminated"] or info["truncated"]:
            episode.truncated = info["truncated"]
            episode.stop_reason = "terminated" if info["terminated"] else "max_steps"
            return content, call, None
        return content, call, response

    @staticmethod
    def _follow(episode: _Episode, name: str, arguments: Any, state: tuple[int, int] | None) -> None:
        """Record the decision this call takes, if any, from the env's ``state`` (text_hybrid's
        ``decision_state()``; ``menu.DecisionFollower``)."""
        try:
            action = action_from_call(name, arguments)
        except ActionError:
            action = None
        decision = episode.follower.observe(action, episode.obs, state)
        if decision is not None:
            episode.decisions.append(decision)

    # --- messages and outputs ---------------------------------------------------------------
    def _images(self, obs: Observation) -> list[Any]:
        return [png_to_image(obs.screenshot)] if self.screenshots and obs.screenshot else []

    def _first_messages(self, raw_prompt: list[dict[str, Any]], text: str, images: list[Any]) -> list[dict[str, Any]]:
        return first_messages(raw_prompt, text, images)

    def _tool_message(self, response: Any, call_id: str | None) -> dict[str, Any]:
        return tool_message(response.text or "", response.image, call_id, self.max_tool_response_length)

    def _artifact(self, env: Any) -> dict[str, Any]:
        """Final-state artifact for judge rewards: the state dump (JSON text) and optionally a PNG."""
        artifact = {"state": json.dumps(env.state_dump(), sort_keys=True)}
        if self.artifact_screenshot:
            artifact["screenshot_png_b64"] = base64.b64encode(env.screenshot()).decode()
        return artifact

    def _outputs(self, rows: list[_Row], episode: _Episode) -> list[AgentLoopOutput]:
        """One ``AgentLoopOutput`` per row; every row of a trajectory has the same extra-field keys."""
        traj_uid, limit, outputs = uuid4().hex, self.response_length, []
        for i, row in enumerate(rows):
            n_resp = len(row.response_mask)
            step = None if self.layout == "trajectory" or episode.fault and not episode.anchors else i
            extra_fields = {**episode.server_fields, **write_step_metadata(episode, traj_uid, step).to_extra_fields()}
            # per-token weight versions (and rollout-side old log-probs) for the old-logit providers
            extra_fields.update(row.tokens.extra_fields(row.response_mask, limit))
            mask = [0] * n_resp if episode.fault is not None else row.response_mask  # faults train nothing
            outputs.append(AgentLoopOutput(
                prompt_ids=row.token_ids[: len(row.token_ids) - n_resp],
                response_ids=row.token_ids[len(row.token_ids) - n_resp:][:limit] if n_resp else [],
                response_mask=mask[:limit], response_logprobs=row.logprobs[:limit] if row.logprobs else None,
                num_turns=2 * len(episode.anchors) + 1 if step is None else 2, metrics=episode.metrics,
                extra_fields=extra_fields, multi_modal_data={"images": row.images} if row.images else None,
            ))
        return outputs


def write_step_metadata(episode: _Episode, traj_uid: str, step: int | None = None) -> StepMetadata:
    """The one writer of this loop's ``extra_fields["verl_ext"]`` (contract: ``verl_ext.steps``;
    layouts: ``StepMetadata.of_row``). Episode-level ``extras`` are the same on every row."""
    counts = episode.counts
    return StepMetadata.of_row(
        traj_uid, step, anchors=episode.anchors, step_rewards=episode.rewards, spans=episode.spans,
        action_valid=episode.valid_format,
        action_match=episode.matches if "action_match" in episode.recorded else None,
        role=episode.roles if "role" in episode.recorded else None,
        subgoal=episode.subgoals if "subgoal" in episode.recorded else None,
        valid=episode.fault is None,
        invalid_reason=f"env_fault:{episode.fault['kind']}" if episode.fault else "",
        truncated=episode.truncated,
        extras={
            "success": episode.success,
            "num_steps": counts.get("steps", 0),
            "num_tool_calls": counts.get("tool", 0),
            "num_gui_steps": counts.get("gui", 0),
            "num_invalid_actions": counts.get("invalid", 0),
            "format_ok": bool(episode.anchors) and all(episode.valid_format),
            "valid_calls": sum(episode.valid_format),  # model turns holding exactly one parseable call
            "tool_beneficial": episode.reset_info.get("tool_beneficial"),
            "ref_steps": episode.reset_info.get("ref_steps"),
            "task": episode.reset_info.get("task"),
            "seed": episode.reset_info.get("seed"),
            "actions": episode.actions,
            "stop_reason": episode.stop_reason,
            "env_fault": episode.fault,
            "artifact": episode.artifact,
            "dv_questions": episode.reset_info.get("dv_questions"),  # DVReward questions (MiniDesk)
            "decisions": episode.decisions,  # text_hybrid: {choice, better} per decision (menu answers, or calls)
            **episode.counts_extra,  # rollout=semi_online: patches
        },
    )


def _schemas(tools: dict[str, EnvTool]) -> list[dict[str, Any]]:
    return [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools.values()]


# The message builders below are the loop's whole chat format; SFT demonstrations
# (``verl_ext.datasets.demos``) reuse them so that SFT and RL see the same transcripts.
def tool_schemas(tool_defs: list[ToolDef]) -> list[dict[str, Any]]:
    """The ``tools`` the loop passes to the chat template for an env's tool definitions."""
    return _schemas({t.name: EnvTool.from_def(t) for t in tool_defs})


def first_messages(raw_prompt: list[dict[str, Any]], text: str, images: list[Any] | None = None) -> list[dict[str, Any]]:
    """The dataset prompt with ``text`` (the observation) appended to its last user turn."""
    messages = raw_prompt or [{"role": "system", "content": SYSTEM_PROMPT}]
    if messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], str) and not images:
        return messages[:-1] + [{"role": "user", "content": messages[-1]["content"] + "\n\n" + text}]
    return messages + [{"role": "user", "content": _content(text, images)}]


def tool_message(text: str, images: list[Any] | None, call_id: str | None, max_length: int) -> dict[str, Any]:
    """An observation as the ``tool`` message after a call, cut to ``max_length`` characters."""
    if len(text) > max_length:
        text = text[:max_length] + "...(truncated)"
    message = {"role": "tool", "content": _content(text, images)}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


def _call_dict(call: Any) -> dict[str, Any]:
    return {"name": call.name, "arguments": json.loads(call.arguments)}


def assistant_message(content: str, call: Any) -> dict[str, Any]:
    tool_call = {"type": "function", "function": _call_dict(call)}
    if call.tool_call_id is not None:
        tool_call["id"] = call.tool_call_id
    return {"role": "assistant", "content": content or "", "tool_calls": [tool_call]}


def _content(text: str, images: list[Any] | None) -> Any:
    """Message content: plain text, or image parts + text for VL models (as verl's tool loop does)."""
    if not images:
        return text
    return [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": text}]
