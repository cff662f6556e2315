"""The step metadata contract between agent loops and everything that reads steps.

An agent loop records, for each trajectory (one row per trajectory) or each turn (one row per
turn, the agent loop returning a list of outputs), a ``StepMetadata`` and passes
``extra_fields=meta.to_extra_fields()`` to ``AgentLoopOutput``. verl carries it through
TransferQueue as a plain python dict under ``extra_fields["verl_ext"]`` (no custom classes there);
estimators, rewards and providers read it back with ``step_metadata(extra_fields)``, readers of
whole batches (the advantage glue) with ``plain_step_metadata(extra_fields)``.

Layouts:
- one row per trajectory: ``spans[i]`` is the ``[start, end)`` token range of step i in the row's
  response; the step's advantage is written on those tokens.
- one row per turn: a single step per row and ``spans`` is None; the whole response is the step.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

EXTRA_FIELDS_KEY = "verl_ext"
SCHEMA_VERSION = 1
ROLES = ("", "planner", "executor")
_ROLE_SET = frozenset(ROLES)
REQUIRED_FIELDS = ("traj_uid", "step_idx", "anchor", "step_reward")
# Fields with one entry per step (each may be None: not recorded).
PER_STEP_FIELDS = ("anchor", "step_reward", "spans", "action_valid", "action_match", "role", "subgoal")

# What to change when the metadata is missing: named in every error about it.
AGENT_LOOP_SETTING = (
    "run an agent loop that records step metadata, e.g. "
    "actor_rollout_ref.rollout.agent.default_agent_loop=hybrid_gui_tool (or the dataset column "
    "agent_name); a custom agent loop must pass "
    "extra_fields=verl_ext.steps.StepMetadata(...).to_extra_fields() to AgentLoopOutput"
)


class MissingStepMetadataError(KeyError):
    """A row has no ``extra_fields["verl_ext"]``; the message says which agent-loop setting to change."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def anchor_key(observation: Any) -> str:
    """A stable, hashable anchor-state key for an environment observation.

    Text stays as it is (GiGPO groups by exact text and similarity mode compares text). Images
    (numpy arrays), bytes and structured observations become ``"sha256:<hex>"`` of their content;
    arrays include dtype and shape, so equal pixels give equal keys in every process (unlike
    python's salted ``hash``).
    """
    if isinstance(observation, str):
        return observation
    digest = hashlib.sha256()
    if isinstance(observation, np.ndarray):
        array = np.ascontiguousarray(observation)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    elif isinstance(observation, (bytes, bytearray, memoryview)):
        digest.update(bytes(observation))
    elif hasattr(observation, "tobytes") and hasattr(observation, "size"):  # PIL.Image
        digest.update(f"{getattr(observation, 'mode', '')}{observation.size}".encode())
        digest.update(observation.tobytes())
    else:
        digest.update(json.dumps(observation, sort_keys=True, default=repr).encode())
    return "sha256:" + digest.hexdigest()


@dataclass
class StepMetadata:
    """The steps of one trajectory (or of one turn, in the one-row-per-turn layout).

    Per-step lists all have one entry per step.

    Attributes:
        traj_uid: trajectory id, shared by all turn rows of one trajectory.
        step_idx: index of each step in its trajectory (0-based, contiguous over the trajectory).
        anchor: anchor-state key of each step: the raw observation before acting, without history
            or prompt template (``anchor_key``).
        step_reward: env reward of each step.
        spans: ``[start, end)`` response-token range of each step (one row per trajectory), or
            None when the row is a single turn (one row per turn).
        action_valid: format validity of each step (verl-agent ``is_action_valid``).
        action_match: whether each action matched the reference action (UI-S1), or None.
        role: ``""``, ``"planner"`` or ``"executor"`` for each step.
        subgoal: key of the subgoal each step writes or pursues (hierarchical estimators), or None.
        valid: False when the trajectory must not be trained on (env fault, judge failure); it is
            then excluded from group statistics and gets advantage 0.
        invalid_reason: why ``valid`` is False.
        truncated: the trajectory was cut by a step limit instead of terminating.
        extras: other plain values recorded by the agent loop (counts, success, ...).
    """

    traj_uid: str
    step_idx: list[int]
    anchor: list[str]
    step_reward: list[float]
    spans: list[list[int]] | None = None
    action_valid: list[bool] | None = None
    action_match: list[bool] | None = None
    role: list[str] | None = None
    subgoal: list[str] | None = None
    valid: bool = True
    invalid_reason: str = ""
    truncated: bool = False
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_steps(self.traj_uid, self.step_idx, {k: getattr(self, k) for k in PER_STEP_FIELDS})

    @classmethod
    def of_row(cls, traj_uid: str, step: int | None, *, anchors: list[str], step_rewards: list[float],
               spans: list[list[int]], action_valid: list[bool], action_match: list[bool] | None = None,
               role: list[str] | None = None, subgoal: list[str] | None = None, **trajectory: Any) -> StepMetadata:
        """What an agent loop writes on one row of an episode: all steps with their token spans
        (``step=None``, one row per trajectory) or only step ``step`` without spans (one row per
        turn). ``action_match``, ``role``, ``subgoal``: the optional per-step fields, None when the
        loop does not record them. ``trajectory``: the trajectory-level fields (``valid``,
        ``truncated``, ``extras``, ...), the same on every row of the episode."""
        pick = range(len(anchors)) if step is None else [step]

        def picked(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in pick]

        return cls(
            traj_uid=traj_uid,
            step_idx=list(pick),
            anchor=[anchors[i] for i in pick],
            step_reward=[step_rewards[i] for i in pick],
            spans=spans if step is None else None,
            action_valid=[action_valid[i] for i in pick],
            action_match=picked(action_match),
            role=picked(role),
            subgoal=picked(subgoal),
            **trajectory,
        )

    @property
    def num_steps(self) -> int:
        return len(self.step_idx)

    def to_extra_fields(self) -> dict[str, dict[str, Any]]:
        """``{"verl_ext": plain dict}``, ready for ``AgentLoopOutput(extra_fields=...)``."""
        plain = asdict(self)
        plain["step_idx"] = [int(i) for i in self.step_idx]
        plain["step_reward"] = [float(r) for r in self.step_reward]
        if self.spans is not None:
            plain["spans"] = [[int(s), int(e)] for s, e in self.spans]
        plain["version"] = SCHEMA_VERSION
        return {EXTRA_FIELDS_KEY: plain}

    @classmethod
    def from_extra_fields(cls, extra_fields: dict[str, Any] | None) -> StepMetadata:
        """Read the metadata back from a row's ``extra_fields`` (a dict after TransferQueue).

        Raises:
            MissingStepMetadataError: no ``extra_fields["verl_ext"]``; names the agent-loop setting.
            ValueError: a newer schema version or malformed lists.
        """
        plain = dict(_plain_of(extra_fields))
        plain.pop("version", None)
        extras = dict(plain.pop("extras", None) or {})
        extras.update({k: plain.pop(k) for k in list(plain) if k not in _FIELD_NAMES})
        return cls(**plain, extras=extras)


_FIELD_NAMES = frozenset(f.name for f in fields(StepMetadata))


def _plain_of(extra_fields: dict[str, Any] | None) -> dict[str, Any]:
    """The plain dict under ``extra_fields["verl_ext"]``, with its version and required keys checked."""
    plain = (extra_fields or {}).get(EXTRA_FIELDS_KEY)
    if not plain:
        raise MissingStepMetadataError(
            f"this row has no step metadata (extra_fields[{EXTRA_FIELDS_KEY!r}]): {AGENT_LOOP_SETTING}"
        )
    version = plain.get("version", SCHEMA_VERSION)
    if version > SCHEMA_VERSION:
        raise ValueError(f"step metadata version {version} is newer than this verl-ext ({SCHEMA_VERSION})")
    missing = [k for k in REQUIRED_FIELDS if k not in plain]
    if missing:
        raise MissingStepMetadataError(
            f"step metadata lacks {missing} (written by an older or custom agent loop?): {AGENT_LOOP_SETTING}"
        )
    return plain


def _check_steps(traj_uid: str, step_idx: list[int], per_step: dict[str, Any]) -> None:
    """The checks every reader makes: per-step lists as long as ``step_idx``, known roles, spans
    that are ``[start, end)`` pairs. ``per_step`` maps ``PER_STEP_FIELDS`` (missing = None)."""
    n = len(step_idx)
    wrong = {k: len(v) for k in PER_STEP_FIELDS if (v := per_step.get(k)) is not None and len(v) != n}
    if wrong:
        raise ValueError(f"StepMetadata of {traj_uid!r}: {n} steps but lengths {wrong}")
    role, spans = per_step.get("role"), per_step.get("spans")
    if role is not None and not _ROLE_SET.issuperset(role):
        raise ValueError(f"StepMetadata of {traj_uid!r}: role must be one of {ROLES}")
    if spans is not None and any(len(s) != 2 or s[0] > s[1] for s in spans):
        raise ValueError(f"StepMetadata of {traj_uid!r}: spans must be [start, end) pairs")


def step_metadata(extra_fields: dict[str, Any] | None) -> StepMetadata:
    """The one accessor: the ``StepMetadata`` of a row, from its ``extra_fields``."""
    return StepMetadata.from_extra_fields(extra_fields)


def plain_step_metadata(extra_fields: dict[str, Any] | None) -> dict[str, Any]:
    """The accessor for readers of whole batches: a row's metadata as the plain dict TransferQueue
    carries (``StepMetadata`` field names; optional fields may be absent; unknown keys are left in
    place), after exactly the checks ``step_metadata`` makes, without building a ``StepMetadata``
    (that costs more per row than the advantage estimator itself).

    Raises:
        MissingStepMetadataError, ValueError: as ``step_metadata``.
    """
    plain = _plain_of(extra_fields)
    _check_steps(plain["traj_uid"], plain["step_idx"], plain)
    return plain
