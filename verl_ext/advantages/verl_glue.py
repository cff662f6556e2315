"""From verl's batch (tensors + per-row ``extra_fields``) to token advantages, for the trainer hook.

The trainer fetches ``response_mask``, ``extra_fields``, ``uid`` and the reward scores of a batch
and calls ``compute_token_advantages``; everything step-aware happens in the pure functions of
``verl_ext.advantages``.
"""

from __future__ import annotations

from itertools import chain
from operator import methodcaller
from typing import Any

import numpy as np
import torch

from verl_ext.advantages import compute_with_returns, grouping, hyperparameters
from verl_ext.steps import MissingStepMetadataError, plain_step_metadata

EPISODE_SCORES = ("reward", "steps")
# Keys an estimator may take from ``algorithm.*`` when its own section does not set them.
_ALGORITHM_FALLBACK = ("gamma", "lam")


def estimator_params(name: str, algo_config: Any) -> tuple[dict[str, Any], str]:
    """Hyper-parameters of ``name`` from ``algorithm.<name>.*`` and the glue's ``episode_score``.

    ``gamma``/``lam`` unset or null (as the fragments ship them) fall back to
    ``algorithm.gamma``/``algorithm.lam``, then to the estimator's default.
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
        if key in accepted and params.get(key) is None:
            params.pop(key, None)
            if algo_config.get(key, None) is not None:
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
    mask = response_mask.detach().cpu().numpy() != 0
    bs, length = mask.shape
    labels = row_keys if row_keys is not None else [f"row {i}" for i in range(bs)]
    steps = _flatten_steps(extra_fields, uids, labels, length)
    if not len(steps["row"]):  # padding only
        zeros = torch.zeros(bs, length, dtype=torch.float32, device=response_mask.device)
        return zeros, zeros.clone()
    if values is not None:
        first_token = torch.from_numpy(np.minimum(steps["start"], length - 1))
        steps["values"] = values.detach().cpu()[torch.from_numpy(steps["row"]), first_token].double().numpy()
    if episode_score == "reward":
        steps["step_reward"], scored = _with_terminal_residual(steps, scores.detach().double().cpu().numpy())
        steps["valid"] &= scored  # a NaN score is a failed judge: no signal, not a zero reward
    row, start, end = steps.pop("row"), steps.pop("start"), steps.pop("end")
    advantages, returns = compute_with_returns(name, **steps, **params)
    painted = _paint(row, start, end, (advantages, returns), mask, labels)
    return tuple(torch.from_numpy(x).to(response_mask.device) for x in painted)


def _flatten_steps(
    extra_fields: list[dict], uids: list[str], labels: list[str], length: int
) -> dict[str, np.ndarray]:
    """One entry per step of every non-padding row: the per-row dict parsing verl forces on us,
    kept to one pass over the rows and one C-level pass (``chain``) per column."""
    rows = [i for i, uid in enumerate(uids) if not str(uid).startswith("pad")]
    metas = []
    for i in rows:
        try:
            metas.append(plain_step_metadata(extra_fields[i]))
        except MissingStepMetadataError as exc:
            raise MissingStepMetadataError(f"{labels[i]} (uid {uids[i]!r}): {exc}") from None
    counts = np.fromiter((len(m["step_idx"]) for m in metas), dtype=np.int64, count=len(metas))
    unspanned = [(i, m) for i, m, n in zip(rows, metas, counts) if m.get("spans") is None and n > 1]
    if unspanned:
        i, meta = unspanned[0]
        raise ValueError(
            f"{labels[i]} (traj_uid {meta['traj_uid']!r}) has {len(meta['step_idx'])} steps but no spans: "
            "a row with several steps (one row per trajectory) needs each step's token span"
        )

    def per_step(key: str, missing: Any = None) -> list:
        """The flat column of a per-step field; ``missing`` on every step of rows without it."""
        values = list(map(methodcaller("get", key), metas))  # C loops where every row recorded it
        if None in values:
            values = [[missing] * n if v is None else v for v, n in zip(values, counts.tolist())]
        return list(chain.from_iterable(values))

    def per_row(values: list, dtype: Any) -> np.ndarray:
        return np.repeat(np.array(values, dtype=dtype), counts)

    def objects(values: list) -> np.ndarray:  # fromiter keeps each element intact, even a list
        return np.fromiter(values, dtype=object, count=len(values))

    spans = np.array(per_step("spans", [0, length]), dtype=np.int64).reshape(-1, 2)
    columns = {
        "row": per_row(rows, np.int64), "start": spans[:, 0], "end": spans[:, 1],
        "uid": np.repeat(objects([uids[i] for i in rows]), counts),
        "traj_uid": np.repeat(objects([m["traj_uid"] for m in metas]), counts),
        "step_idx": np.array(per_step("step_idx"), dtype=np.int64),
        "anchor": objects(per_step("anchor")),
        "step_reward": np.array(per_step("step_reward"), dtype=np.float64),
        "action_valid": np.array(per_step("action_valid", True), dtype=bool),
        "action_match": np.array(per_step("action_match", True), dtype=bool),
        "role": objects(per_step("role", "")),
        "valid": per_row([m.get("valid", True) for m in metas], bool),
        "truncated": per_row([m.get("truncated", False) for m in metas], bool),
    }
    if any(m.get("subgoal") is not None for m in metas):  # else himac falls back to subgoal ordinals
        columns["subgoal"] = objects(per_step("subgoal"))
    return columns


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


def _paint(
    row: np.ndarray, start: np.ndarray, end: np.ndarray, per_step: tuple[np.ndarray, ...], mask: np.ndarray,
    labels: list[str],
) -> list[np.ndarray]:
    """Each array of ``per_step`` (n,) written on its steps' token spans: float32 (bs, L), 0 outside
    spans and where ``mask`` (bs, L) is False.

    The spans cut every row into runs (gap, span, gap, span, ..., tail); one ``np.repeat`` of the
    run values over the run lengths writes the whole batch in a single sequential pass, with the
    values copied exactly.
    """
    bs, length = mask.shape
    start, end = np.clip(start, 0, length), np.clip(end, 0, length)
    order = np.lexsort((start, row))
    row, start, end = row[order], start[order], end[order]
    same_row = np.append(False, row[1:] == row[:-1])
    prev_end = np.where(same_row, np.roll(end, 1), 0)
    if (start < prev_end).any():
        bad = sorted({labels[r] for r in row[start < prev_end]})
        raise ValueError(f"step spans overlap in {bad}: each token belongs to at most one step")
    # Run j of the sorted steps sits after 2 runs per earlier step and one tail per earlier row.
    n, at = len(row), 2 * np.arange(len(row)) + row
    steps_through_row = np.cumsum(np.bincount(row, minlength=bs))
    tail_at = 2 * steps_through_row + np.arange(bs)
    last_end = np.zeros(bs, dtype=np.int64)
    row_last = np.append(~same_row[1:], True)
    last_end[row[row_last]] = end[row_last]
    run_length = np.zeros(2 * n + bs, dtype=np.int64)
    run_length[at], run_length[at + 1], run_length[tail_at] = start - prev_end, end - start, length - last_end
    painted = []
    for values in per_step:
        run_value = np.zeros(2 * n + bs, dtype=np.float32)
        run_value[at + 1] = values[order]
        tokens = np.repeat(run_value, run_length).reshape(bs, length)
        tokens *= mask
        painted.append(tokens)
    return painted
