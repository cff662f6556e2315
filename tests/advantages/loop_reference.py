"""Straightforward Python-loop versions of the estimators, written from the papers and reference code (GiGPO arXiv 2505.10978, HGPO arXiv 2602.22817, HiPER arXiv 2602.16165, HiMAC arXiv 2603.00977).

They are the reference the vectorised package is tested against (random data) and benchmarked
against (scripts/bench/bench_advantages.py). Deliberately plain: dicts of lists, one pass per row,
numpy only for a group's mean/std, like the reference implementations. Not part of the package.
"""

from __future__ import annotations

import difflib
from collections import defaultdict

import numpy as np

HGPO_TIE_RTOL = 1e-9  # docs/reference/advantages.md: HGPO drops levels whose return ties the centre


def _trajectories(traj_uid, step_idx):
    """traj -> row indices in step order."""
    rows = defaultdict(list)
    for i, t in enumerate(traj_uid):
        rows[t].append(i)
    for t in rows:
        rows[t].sort(key=lambda i: step_idx[i])
    return rows


def _returns(traj_rows, reward, gamma, match=None):
    out = [0.0] * len(reward)
    for rows in traj_rows.values():
        running = 0.0
        for pos in range(len(rows) - 1, -1, -1):
            i = rows[pos]
            if match is not None:
                nxt_ok = pos == len(rows) - 1 or match[rows[pos + 1]]
                if not (match[i] and nxt_ok):
                    running = 0.0
            running = reward[i] + gamma * running
            out[i] = running
    return out


def _relative(groups, value, mode, ddof, eps, singleton, baseline="mean", tie_rtol=0.0):
    """groups: key -> list of row ids. Returns {row: advantage}; a value within ``tie_rtol`` times
    the group's mean |value| of the centre gets exactly 0 (HGPO's tie rule)."""
    out = {}
    for members in groups.values():
        vals = np.array([value[i] for i in members], dtype=np.float64)
        if len(members) == 1:
            out[members[0]] = 0.0 if singleton == "zero" else vals[0]
            continue
        centre = np.median(vals) if baseline == "median" else np.mean(vals)
        scale = np.std(vals, ddof=ddof) + eps if mode == "mean_std_norm" else 1.0
        tie = tie_rtol * np.mean(np.abs(vals))
        for i, v in zip(members, vals):
            out[i] = 0.0 if abs(v - centre) <= tie else (v - centre) / scale
    return out


def _episode(uid, traj_rows, reward, mode, eps, pooled="steps", baseline="mean", penalty=None,
             tie_rtol=0.0):
    score = {}
    for rows in traj_rows.values():
        total = sum(reward[i] for i in rows)
        for i in rows:
            score[i] = total
    row_score = {i: score[i] - (penalty[i] if penalty else 0.0) for i in score}
    if pooled == "steps":
        groups = defaultdict(list)
        for i in score:
            groups[uid[i]].append(i)
        return _relative(groups, row_score, mode, 1, eps, "raw", baseline, tie_rtol)
    by_uid = defaultdict(list)
    for rows in traj_rows.values():
        by_uid[uid[rows[0]]].append(score[rows[0]])
    out = {}
    for i in score:
        vals = np.array(by_uid[uid[i]])
        if len(vals) == 1:
            out[i] = row_score[i]
            continue
        centre = np.median(vals) if baseline == "median" else vals.mean()
        scale = vals.std(ddof=1) + eps if mode == "mean_std_norm" else 1.0
        out[i] = (row_score[i] - centre) / scale
    return out


def gigpo(uid, traj_uid, step_idx, anchor, step_reward, *, gamma=1.0, mode="mean_norm",
          step_advantage_w=1.0, enable_similarity=False, similarity_thresh=0.95,
          episode_stats="steps", baseline="mean", invalid_action_penalty=0.0,
          action_valid=None, epsilon=1e-6):
    traj_rows = _trajectories(traj_uid, step_idx)
    penalty = None
    if action_valid is not None:
        penalty = [invalid_action_penalty * (0.0 if v else 1.0) for v in action_valid]
    episode = _episode(uid, traj_rows, step_reward, mode, epsilon, episode_stats, baseline, penalty)
    returns = _returns(traj_rows, step_reward, gamma)
    if penalty:
        returns = [r - p for r, p in zip(returns, penalty)]
    groups = defaultdict(list)
    clusters = defaultdict(list)  # uid -> [(representative, cluster id)]
    for t in sorted(traj_rows, key=str):
        for i in traj_rows[t]:
            key = (uid[i], anchor[i])
            if enable_similarity:
                for rep, cid in clusters[uid[i]]:
                    if difflib.SequenceMatcher(None, anchor[i], rep).ratio() >= similarity_thresh:
                        key = cid
                        break
                else:
                    clusters[uid[i]].append((anchor[i], key))
            groups[key].append(i)
    step = _relative(groups, returns, mode, 1, epsilon, "zero", baseline)
    return np.array([episode[i] + step_advantage_w * step[i] for i in range(len(uid))])


def hgpo(uid, traj_uid, step_idx, anchor, step_reward, *, gamma=1.0, mode="mean_std_norm",
         history_length=2, length_weight_alpha=1.0, base_group=False, baseline="mean",
         epsilon=1e-6):
    traj_rows = _trajectories(traj_uid, step_idx)
    returns = _returns(traj_rows, step_reward, gamma)
    items = defaultdict(list)  # row -> [(length, advantage)]
    if base_group:
        base = _episode(uid, traj_rows, step_reward, mode, epsilon, "steps", baseline,
                        tie_rtol=HGPO_TIE_RTOL)
        for i, a in base.items():
            items[i].append((1, a))
    for k in range(1, history_length + 2):
        groups = defaultdict(list)
        for rows in traj_rows.values():
            for pos, i in enumerate(rows):
                if pos >= k - 1:
                    key = (uid[i],) + tuple(anchor[rows[p]] for p in range(pos - k + 1, pos + 1))
                    groups[key].append(i)
        for i, a in _relative(groups, returns, mode, 0, epsilon, "zero", baseline, HGPO_TIE_RTOL).items():
            items[i].append((k + 1, a))
    out = np.zeros(len(uid))
    for i, its in items.items():
        kept = [(length ** length_weight_alpha, a) for length, a in its if a != 0]
        total = sum(w for w, _ in kept)
        out[i] = sum(w * a for w, a in kept) / (total + epsilon) if kept else 0.0
    return out


def step_grouped(uid, traj_uid, step_idx, anchor, step_reward, *, gamma=1.0, mode="mean_norm",
                 episode_advantage_w=1.0, step_advantage_w=1.0, baseline="mean", action_match=None,
                 epsilon=1e-6):
    traj_rows = _trajectories(traj_uid, step_idx)
    match = list(action_match) if action_match is not None else [True] * len(uid)
    returns = _returns(traj_rows, step_reward, gamma, match)
    by_uid, by_step = defaultdict(list), defaultdict(list)
    for i in range(len(uid)):
        by_uid[uid[i]].append(i)
        by_step[(uid[i], step_idx[i])].append(i)
    episode = _relative(by_uid, step_reward, mode, 1, epsilon, "raw", baseline)
    step = _relative(by_step, returns, mode, 1, epsilon, "zero", baseline)
    return np.array([episode_advantage_w * episode[i] + step_advantage_w * step[i]
                     for i in range(len(uid))])


def himac(uid, traj_uid, step_idx, anchor, step_reward, *, role, subgoal=None, gamma=1.0,
          mode="mean_std_norm", train_role="both", baseline="mean", epsilon=1e-6):
    traj_rows = _trajectories(traj_uid, step_idx)
    returns = _returns(traj_rows, step_reward, gamma)
    macro = _episode(uid, traj_rows, step_reward, mode, epsilon, "trajectories", baseline)
    groups = defaultdict(list)
    for rows in traj_rows.values():
        ordinal = 0
        for i in rows:
            if role[i] == "planner":
                ordinal += 1
            else:
                groups[(uid[i], subgoal[i] if subgoal is not None else ordinal)].append(i)
    micro = _relative(groups, returns, mode, 1, epsilon, "zero", baseline)
    out = np.zeros(len(uid))
    for i in range(len(uid)):
        if role[i] == "planner":
            out[i] = macro[i] if train_role in ("both", "planner") else 0.0
        else:
            out[i] = micro[i] if train_role in ("both", "executor") else 0.0
    return out


def hiper(uid, traj_uid, step_idx, anchor, step_reward, *, role, values, truncated, gamma=1.0,
          lam=1.0, lam_seg=0.95, bootstrap_truncated=True, norm_adv=True, epsilon=1e-8):
    traj_rows = _trajectories(traj_uid, step_idx)
    adv = np.zeros(len(uid))
    for rows in traj_rows.values():
        boot = truncated[rows[0]] and bootstrap_truncated
        segments = []
        for i in rows:
            if role[i] == "planner":
                segments.append([i, []])
            else:
                segments[-1][1].append(i)
        for k, (_planner, execs) in enumerate(segments):
            nxt_high = values[segments[k + 1][0]] if k + 1 < len(segments) else None
            running = 0.0
            for j in range(len(execs) - 1, -1, -1):
                i = execs[j]
                if j + 1 < len(execs):
                    v_next = values[execs[j + 1]]
                elif nxt_high is not None:
                    v_next = nxt_high
                else:
                    v_next = values[i] if boot else 0.0
                delta = step_reward[i] + gamma * v_next - values[i]
                carry = running if j + 1 < len(execs) else 0.0
                running = delta + gamma * lam * carry
                adv[i] = running
        running = 0.0
        for k in range(len(segments) - 1, -1, -1):
            p, execs = segments[k]
            seg_return = step_reward[p] + sum(gamma ** j * step_reward[e] for j, e in enumerate(execs))
            g = gamma ** len(execs)
            if k + 1 < len(segments):
                target = seg_return + g * values[segments[k + 1][0]]
                running = target - values[p] + g * lam_seg * running
            else:
                target = seg_return + g * (values[p] if boot else 0.0)
                running = target - values[p]
            adv[p] = running
    returns = adv + np.asarray(values, dtype=np.float64)
    if norm_adv:
        for level in ("planner", "executor"):
            rows = [i for i in range(len(uid)) if role[i] == level]
            if rows:
                vals = adv[rows]
                adv[rows] = (vals - vals.mean()) / (vals.std() + epsilon)
    return adv, returns


LOOPS = {"gigpo": gigpo, "hgpo": hgpo, "step_grouped": step_grouped, "himac": himac, "hiper": hiper}
