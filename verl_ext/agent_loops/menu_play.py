"""``hybrid_gui_tool``'s T/G menu (``action_format=menu``), for models too small to write calls:
each turn the model answers one letter, a player (``verl_ext.agent_loops.menu_rollouts``) says what
the answer means, and this adapter carries it out on the env over the loop's shared token
machinery (``trajectory`` layout only). The dataset's system prompt is replaced by the menu's;
observations are the menu, not the page.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl.utils.profiler import simple_timer

from verl_ext.agent_loops import menu_rollouts
from verl_ext.agent_loops.episode import MultiTurnAgentLoop, Row
from verl_ext.agent_loops.hybrid_episode import HybridEpisode
from verl_ext.envs import menu
from verl_ext.steps import anchor_key


class MenuPlay:
    """Plays one episode on the menu with the ``rollout`` player (``free``, ``semi_online`` or
    ``plan_execute``); each model turn gets ``max_action_tokens``."""

    def __init__(self, rollout: str, patch_threshold: int, max_action_tokens: int):
        self.rollout = rollout
        self.patch_threshold = patch_threshold
        self.max_action_tokens = max_action_tokens

    async def play(self, loop: MultiTurnAgentLoop, env: Any, sampling_params: dict[str, Any], max_turns: int,
                   episode: HybridEpisode) -> list[Row]:
        player = menu_rollouts.make_player(self.rollout, episode.reset_info, self.patch_threshold)
        episode.recorded = menu_rollouts.RECORDED_FIELDS[self.rollout]
        messages = [{"role": "system", "content": menu.SYSTEM_PROMPT},
                    {"role": "user", "content": player.first_message(episode.obs)}]
        row = Row(await loop.ct_build_initial_tokens(messages))
        sampling_params = {**sampling_params, "max_tokens": self.max_action_tokens}
        request_id = uuid4().hex
        for _ in range(max_turns):
            output, start = await loop.model_turn(row, request_id, sampling_params, [], episode)
            if len(row.response_mask) > loop.response_length:  # the turn would be cut: it is not a step
                episode.stop_reason, episode.truncated = "response_length", True
                break
            text = loop.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            turn = player.turn(text, episode.obs)
            episode.spans.append([start, len(row.response_mask)])
            # the turn's own reward; the env's rewards for the turn's steps are added to it
            episode.record_step(anchor_key(episode.obs.page_text()), turn.description, turn.valid_format,
                                turn.reward)
            episode.matches.append(bool(turn.match))
            episode.roles.append(turn.role)
            episode.subgoals.append(turn.subgoal)
            if turn.decision is not None:
                episode.decisions.append(turn.decision)
            if turn.stop:
                episode.stop_reason = turn.stop
                break
            if turn.action is not None and await _take_steps(env, player, turn.action, episode):
                break
            messages.append({"role": "assistant", "content": text})
            previous = list(messages)
            messages.append({"role": "user", "content": player.feedback(episode.obs)})
            if await loop.observation(row, previous, messages):
                episode.stop_reason, episode.truncated = "response_length", True
                break
        else:
            episode.stop_reason, episode.truncated = "max_turns", True
        if isinstance(player, menu_rollouts.SemiOnlinePlay):
            episode.counts_extra = {"patches": player.patches}
        return [row]


async def _take_steps(env: Any, player: menu_rollouts.Player, action: Any, episode: HybridEpisode) -> bool:
    """Take ``action`` and the rest of the answer's steps (``player.follow_up``) on the env, adding
    their rewards to the turn's; True when the episode is over."""
    while action is not None:
        with simple_timer("tool_calls", episode.metrics):
            obs, reward, terminated, truncated, info = await asyncio.to_thread(env.step, action)
        episode.rewards[-1] += float(reward)
        if info.get("fault"):
            episode.fault, episode.stop_reason = info["fault"], "fault"
            return True
        episode.obs, episode.success = obs, bool(info.get("success", False))
        if episode.end(terminated, truncated):
            return True
        action = player.follow_up(episode.obs)
    return False
