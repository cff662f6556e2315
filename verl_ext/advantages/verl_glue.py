"""From verl's batch (tensors + per-row ``extra_fields``) to token advantages, for the trainer hook.

The trainer fetches ``response_mask``, ``extra_fields``, ``uid`` and the reward scores of a batch
and calls ``compute_token_advantages``; everything step-aware happens in the pure functions of
``verl_ext.advantages``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl_ext.advantages import compute_with_returns, grouping, hyperparameters
from verl_ext.steps import MissingStepMetadataError, step_metadata

EPISODE_SCORES = ("reward", "steps")
# Keys an estimator may take from ``algorithm.*`` when its own section does not set them.
_ALGORITHM_FALLBACK = ("gamma", "lam")
_DTYPES = {"row": np.int64, "start": np.int64, "end": np.int64, "step_idx": np.int64, "step_reward": np.float64,
           "action_valid": bool, "action_match": bool, "valid": bool, "truncated": bool}


def estimator_params(name: str, algo_config: Any) -> tuple[dict[str, Any], str]:
    """Hyper-parameters of ``name`` from ``algorithm.<name>.*`` and the glue's ``episode_score``.

    ``gamma``/``lam`` fall back to ``algorithm.gamma``/``algorithm.lam``.
    """
    section = algo_config.get(name, None) if algo_config is not None else None
    if section is not None and not isinstance(section, dict):
        from omegaconf import OmegaConf

        section = OmegaConf.to_container(section, resolve=True)
    params = dict(section or {})
    episode_score = params.pop("episode_score", "reward")
    if episode_score not in EPISODE_SCORES:
        raise ValueError(f"algorithm.{name}.episode_score must be one of {EPISODE_SCORES}, got {episode_score!r}")
    accepted = hyperparameters(name)
    for key in _ALGORITHM_FALLBACK:
        if key in accepted and key not in params and algo_config.get(key, None) is not None:
            params[key] = algo_config.get(key)
    return params, episode_score


def compute_token_advantages(
    name: str,
    *,
    response_mask: torch.Tensor,
    extra_fields: list[dict],
    uids: list[str],
    scores: torch.Tensor,
    algo_config: Any,
    row_keys: list[str] | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level ``(advantages, returns)`` of a verl batch for a step-aware estimator.

    Args:
        name: estimator name (``algorithm.adv_estimator``).
        response_mask: shape (bs, L), 1 on model tokens.
        extra_fields: bs dicts; ``extra_fields[i]["verl_ext"]`` is row i's ``StepMetadata``.
        uids: bs episode-group ids; rows whose uid starts with ``"pad"`` are verl's padding and
            get zeros (their ``extra_fields`` may be empty).
        scores: shape (bs,), the reward manager's score of each row. With
            ``algorithm.<name>.episode_score="reward"`` (default) a trajectory's score is its
            row's (one row per trajectory) or its last turn's row's (one row per turn), and
            ``score - sum(step rewards)`` (a judge or outcome reward the env did not report per
            step) is added to the last step's reward; a NaN score (failed judge) marks the
            trajectory invalid. ``"steps"`` ignores ``scores``.
        algo_config: the ``algorithm`` config; hyper-parameters come from ``algorithm.<name>``.
        row_keys: TransferQueue keys of the rows, used to name rows in errors.
        values: shape (bs, L), critic values (``hiper`` only), read at each step's first token.

    Returns:
        ``(advantages, returns)``, float32 tensors of shape (bs, L) on ``response_mask``'s device:
        each step's value on its span's tokens (one row per trajectory) or on the whole response
        (one row per turn), zero wherever ``response_mask`` is 0 and on padding rows.

    Raises:
        MissingStepMetadataError: a non-padding row without step metadata.
        verl_ext.advantages.StepDataError: inconsistent steps (the message names trajectories).
    """
    params, episode_score = estimator_params(name, algo_config)
    mask = response_mask.detach().cpu().numpy().astype(bool)
    bs, length = mask.shape
    labels = row_keys if row_keys is not None else [f"row {i}" for i in range(bs)]
    steps = _flatten_steps(extra_fields, uids, labels, length)
    if not len(steps["row"]):  # padding only
        zeros = torch.zeros(bs, length, dtype=torch.float32, device=response_mask.device)
        return zeros, zeros.clone()
    if values is not None:
        value_rows = values.detach().float().cpu().numpy()
        steps["values"] = value_rows[steps["row"], np.minimum(steps["start"], length - 1)]
    if episode_score == "reward":
        steps["step_reward"], scored = _with_terminal_residual(steps, scores.detach().double().cpu().numpy())
        steps["valid"] &= scored  # a NaN score is a failed judge: no signal, not a zero reward
    row, start, end = steps.pop("row"), steps.pop("start"), steps.pop("end")
    advantages, returns = compute_with_returns(name, **steps, **params)
    owner = _span_owner(row, start, end, bs, length, labels)
    painted = [np.where(mask & (owner >= 0), per_step[np.maximum(owner, 0)], 0.0)
               for per_step in (advantages, returns)]
    return tuple(torch.as_tensor(x, dtype=torch.float32, device=response_mask.device) for x in painted)


def _flatten_steps(
    extra_fields: list[dict], uids: list[str], labels: list[str], length: int
) -> dict[str, np.ndarray]:
    """One entry per step of every non-padding row; the per-row dict parsing verl forces on us."""
    columns: dict[str, list] = {k: [] for k in (
        "row", "start", "end", "uid", "traj_uid", "step_idx", "anchor", "step_reward",
        "action_valid", "action_match", "role", "subgoal", "valid", "truncated")}
    for i, uid in enumerate(uids):
        if str(uid).startswith("pad"):
            continue
        try:
            meta = step_metadata(extra_fields[i])
        except MissingStepMetadataError as exc:
            raise MissingStepMetadataError(f"{labels[i]} (uid {uid!r}): {exc}") from None
        n = meta.num_steps
        if meta.spans is None and n != 1:
            raise ValueError(
                f"{labels[i]} (traj_uid {meta.traj_uid!r}) has {n} steps but no spans: a row with "
                "several steps (one row per trajectory) needs each step's token span"
            )
        spans = meta.spans if meta.spans is not None else [[0, length]]
        columns["row"] += [i] * n
        columns["start"] += [s for s, _ in spans]
        columns["end"] += [e for _, e in spans]
        columns["uid"] += [uid] * n
        columns["traj_uid"] += [meta.traj_uid] * n
        columns["step_idx"] += meta.step_idx
        columns["anchor"] += meta.anchor
        columns["step_reward"] += meta.step_reward
        columns["action_valid"] += meta.action_valid or [True] * n
        columns["action_match"] += meta.action_match or [True] * n
        columns["role"] += meta.role or [""] * n
        columns["subgoal"] += meta.subgoal or [None] * n
        columns["valid"] += [meta.valid] * n
        columns["truncated"] += [meta.truncated] * n
    if all(s is None for s in columns["subgoal"]):  # himac then falls back to subgoal ordinals
        del columns["subgoal"]
    # Ids, anchors, roles and subgoals stay python objects (fromiter keeps a list element intact).
    return {k: np.asarray(v, dtype=_DTYPES[k]) if k in _DTYPES else np.fromiter(v, dtype=object, count=len(v))
            for k, v in columns.items()}


def _with_terminal_residual(
    steps: dict[str, np.ndarray], row_scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Step rewards with ``score - sum(step rewards)`` added on each trajectory's last step, and
    per step whether its trajectory's score is finite."""
    traj, names = grouping.factorize(steps["traj_uid"])
    order = np.lexsort((steps["step_idx"], traj))
    last = order[np.append(traj[order][1:] != traj[order][:-1], True)]  # last step of each traj
    score = np.zeros(len(names))
    score[traj[last]] = row_scores[steps["row"][last]]
    finite = np.isfinite(score)
    residual = np.where(finite, score - grouping.segment_sum(steps["step_reward"], traj, len(names)), 0.0)
    reward = steps["step_reward"].copy()
    reward[last] += residual[traj[last]]
    return reward, finite[traj]


def _span_owner(
    row: np.ndarray, start: np.ndarray, end: np.ndarray, bs: int, length: int, labels: list[str]
) -> np.ndarray:
    """Shape (bs, L): the step (index into the flat steps) owning each token, -1 for none."""
    start, end = np.clip(start, 0, length), np.clip(end, 0, length)
    order = np.lexsort((start, row))
    same_row = row[order][1:] == row[order][:-1]
    overlap = same_row & (start[order][1:] < end[order][:-1])
    if overlap.any():
        bad = sorted({labels[r] for r in row[order][1:][overlap]})
        raise ValueError(f"step spans overlap in {bad}: each token belongs to at most one step")
    # Integer difference array: +id at a span's start, -id at its end; no float round-off.
    marks = np.zeros((bs, length + 1), dtype=np.int64)
    ids = np.arange(len(row)) + 1
    np.add.at(marks, (row, start), ids)
    np.add.at(marks, (row, end), -ids)
    return np.cumsum(marks, axis=1)[:, :length] - 1
