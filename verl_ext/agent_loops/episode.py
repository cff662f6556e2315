"""The skeleton every verl-ext multi-turn agent loop shares: what an episode records, the rows it
writes, the two layouts, and how a row becomes an ``AgentLoopOutput``.

A loop plays an env and decides what a turn means (its env adapter and chat format); this module
holds the rest, once:

- ``Episode``: the per-step records (token span, anchor state, reward, action validity, action) and
  the episode's outcome, turned into ``verl_ext.steps.StepMetadata`` by the loop's own writer.
- ``Row``: one training row's tokens, response mask, log-probs, and the per-token fields
  (weight versions, rollout-side old log-probs) of the server calls that wrote it.
- ``MultiTurnAgentLoop``: model turns and masked-out observations appended with verl's
  Continuous-Token helpers (decoded text is never re-encoded), one ``generate`` that records what
  the server reports, and ``outputs`` that writes every row's ``extra_fields`` the same way.

Layouts: ``trajectory`` (one row per episode, observations masked out, each model turn a step with
its span) and ``per_turn`` (one row per model turn, verl-agent style: each prompt repeats the last
``history_window`` actions; ``run`` returns a list, verl v1 trainers only).

Server fields of a row: the first reply's ``extra_fields`` (what verl's own tool loop keeps), less
the per-call keys; the per-token fields of the row's calls; and ``min_global_steps`` /
``max_global_steps`` over the row's calls as the server reported them, or over the row's token
versions when the server reports no range (the v1 trainer tags every row with them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer

from verl_ext.old_logits.rollout_client import PER_CALL_KEYS, TurnTokens
from verl_ext.steps import StepMetadata

LAYOUTS = ("trajectory", "per_turn")


@dataclass
class Episode:
    """What a loop records while it plays (its metadata writer turns it into ``StepMetadata``)."""

    spans: list[list[int]] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    action_valid: list[bool] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    success: bool = False
    truncated: bool = False
    stop_reason: str = ""
    fault: dict[str, str] | None = None  # an env fault: the episode trains nothing
    reset_info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    server_fields: dict[str, Any] = field(default_factory=dict)  # the first reply's, less the per-call keys

    def record_step(self, anchor: str, action: Any, valid: bool, reward: float = 0.0) -> None:
        self.anchors.append(anchor)
        self.actions.append(action)
        self.action_valid.append(valid)
        self.rewards.append(reward)

    def end(self, terminated: bool, truncated: bool) -> bool:
        """Record the env's end of the episode, if it ended; True when it did."""
        if terminated or truncated:
            self.truncated = truncated
            self.stop_reason = "terminated" if terminated else "max_steps"
        return terminated or truncated


@dataclass
class Row:
    """One training row: its tokens (prompt + response), response mask and log-probs, the per-token
    fields of its generate() calls, and the weight-version range each call reported."""

    token_ids: list[int]
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tokens: TurnTokens = field(default_factory=TurnTokens)
    images: list[Any] = field(default_factory=list)  # every image in token_ids, in order (VL models)
    call_versions: list[int] = field(default_factory=list)  # min and max global step of each call


def check_layout(loop: str, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"{loop} layout must be one of {LAYOUTS}, got {layout!r} (agent loop kwarg layout)")


def past_actions(history: list[str], window: int) -> str:
    """The ``per_turn`` prompt's recap of the last ``window`` actions, or "" when there are none."""
    recent = history[-window:] if window > 0 else []
    return "Previous actions (latest last):\n" + "\n".join(recent) if recent else ""


class MultiTurnAgentLoop(AgentLoopBase):
    """The token and output machinery of a multi-turn loop; subclasses play the env and write the
    step metadata (``step_metadata``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.response_length = self.rollout_config.response_length

    def step_metadata(self, episode: Episode, traj_uid: str, step: int | None) -> StepMetadata:
        raise NotImplementedError

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       images: list[Any], episode: Episode) -> Any:
        with simple_timer("generate_sequences", episode.metrics):
            output = await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                image_data=images or None,
            )
        if not episode.server_fields:  # as verl's tool loop: keep what the server reported first
            episode.server_fields = {k: v for k, v in output.extra_fields.items() if k not in PER_CALL_KEYS}
        return output

    async def model_turn(self, row: Row, request_id: str, sampling_params: dict[str, Any], images: list[Any],
                         episode: Episode) -> tuple[Any, int]:
        """Generate one model turn onto ``row``; returns the server output and the turn's first
        position in the response."""
        output = await self.generate(request_id, row.token_ids, sampling_params, images, episode)
        row.tokens.add(output)
        if "min_global_steps" in output.extra_fields:
            row.call_versions += [output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]]
        start = len(row.response_mask)
        merged, row.response_mask, logprobs = await self.ct_merge_assistant_token(
            row.token_ids, output.token_ids, row.response_mask,
            row.logprobs if (row.logprobs or output.log_probs) else None,
            assistant_logprobs=output.log_probs or None,
        )
        row.token_ids, row.logprobs = merged.token_ids, logprobs or row.logprobs
        return output, start

    async def observation(self, row: Row, previous: list[dict[str, Any]], messages: list[dict[str, Any]],
                          **template_kwargs: Any) -> bool:
        """Append the tokens of ``messages`` beyond ``previous`` to ``row`` (masked out); True when
        the response budget is used up."""
        merged, row.response_mask, logprobs = await self.ct_merge_context_msg(
            previous, messages, row.token_ids, row.response_mask, row.logprobs or None, **template_kwargs,
        )
        row.token_ids, row.logprobs = merged.token_ids, logprobs or row.logprobs
        return len(row.response_mask) >= self.response_length

    def outputs(self, rows: list[Row], episode: Episode, traj_uid: str, per_turn: bool) -> list[AgentLoopOutput]:
        """One ``AgentLoopOutput`` per row; every row of a trajectory has the same extra-field keys.
        A faulty episode's rows keep their tokens with the response mask zeroed: they train nothing."""
        limit, outputs = self.response_length, []
        for i, row in enumerate(rows):
            n_resp = len(row.response_mask)
            step = i if per_turn and (episode.fault is None or episode.anchors) else None
            extra_fields = {**episode.server_fields, **self.step_metadata(episode, traj_uid, step).to_extra_fields()}
            # per-token weight versions (and rollout-side old log-probs) for the old-logit providers
            extra_fields.update(row.tokens.extra_fields(row.response_mask, limit))
            if row.call_versions:
                extra_fields["min_global_steps"] = min(row.call_versions)
                extra_fields["max_global_steps"] = max(row.call_versions)
            mask = [0] * n_resp if episode.fault is not None else row.response_mask
            outputs.append(AgentLoopOutput(
                prompt_ids=row.token_ids[: len(row.token_ids) - n_resp],
                response_ids=row.token_ids[len(row.token_ids) - n_resp:][:limit] if n_resp else [],
                response_mask=mask[:limit], response_logprobs=row.logprobs[:limit] if row.logprobs else None,
                num_turns=2 if step is not None else 2 * len(episode.anchors) + 1, metrics=episode.metrics,
                extra_fields=extra_fields, multi_modal_data={"images": row.images} if row.images else None,
            ))
        return outputs
