"""Random step batches for the tests and the benchmark (vectorised, so 1M rows build quickly)."""

from __future__ import annotations

import numpy as np

BASE = ("uid", "traj_uid", "step_idx", "anchor", "step_reward")
TEXT = ("uid", "traj_uid", "anchor", "role", "subgoal")


def random_steps(seed: int, n_groups: int = 6, group_size: int = 4, max_len: int = 9,
                 n_anchors: int = 5, shuffle: bool = True) -> dict[str, np.ndarray]:
    """Flat step rows: groups of up to ``group_size`` trajectories of 1..``max_len`` steps, sparse
    terminal rewards (0 or 10) plus small step rewards, a shared start state, anchors drawn from
    ``n_anchors`` states (so states repeat across and within trajectories), some truncated
    trajectories, planner/executor roles and critic values. Rows are shuffled unless told not to.
    """
    rng = np.random.default_rng(seed)
    traj_group = np.repeat(np.arange(n_groups), rng.integers(1, group_size + 1, n_groups))
    lengths = rng.integers(1, max_len + 1, len(traj_group))
    traj = np.repeat(np.arange(len(traj_group)), lengths)
    n = len(traj)
    step = np.arange(n) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    last = step == lengths[traj] - 1
    truncated = (rng.random(len(traj_group)) < 0.3)[traj]
    small = rng.choice([0.0, 0.0, 0.5], n)
    reward = np.where(last & ~truncated, 10.0 * rng.integers(0, 2, n), small)
    states = np.array(["start"] + [f"obs{i}" for i in range(n_anchors)], dtype=object)
    anchor = np.where(step == 0, 0, rng.integers(1, n_anchors + 1, n))
    roles = np.array(["planner", "executor"], dtype=object)
    role = np.where((step == 0) | (rng.random(n) < 0.3), 0, 1)
    data = {
        "uid": np.array([f"g{i}" for i in range(n_groups)], dtype=object)[traj_group[traj]],
        "traj_uid": np.array([f"t{i}" for i in range(len(traj_group))], dtype=object)[traj],
        "step_idx": step,
        "anchor": states[anchor],
        "step_reward": reward,
        "action_valid": rng.random(n) < 0.8,
        "action_match": rng.random(n) < 0.8,
        "role": roles[role],
        "subgoal": np.array(["sg0", "sg1", "sg2"], dtype=object)[rng.integers(0, 3, n)],
        "values": rng.normal(size=n),
        "truncated": truncated,
    }
    if shuffle:
        perm = rng.permutation(n)
        data = {k: v[perm] for k, v in data.items()}
    return data
