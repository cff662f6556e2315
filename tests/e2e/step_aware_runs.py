"""What the per-estimator trainer-run tests share (``test_step_grouped_e2e.py``,
``test_himac_e2e.py``, ``test_hiper_e2e.py``): a short ``recipes/text_hybrid/run_cpu.sh ADV=<name>``
run that dumps each step's rows (``trainer.v1.verl_ext.dump_advantages_dir``), and the check that
every step's advantage is the pure estimator (``verl_ext.advantages.compute_with_returns``) of the
rows' step metadata. One file per estimator, so pytest-xdist can put the runs on different workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.advantages import compute_with_returns

from .conftest import REPO, assert_finite, read_metrics, run_recipe

GAMMA = 0.95  # the toolcua_hybrid recipe's algorithm.gamma; algorithm.lam is verl's 1.0


def _params(name: str) -> tuple[dict, str]:
    """The fragment's hyper-parameters with the recipe's gamma/lam where it leaves them null."""
    section = dict(OmegaConf.to_container(OmegaConf.load(REPO / "verl_ext/plugins/advantage" / f"{name}.yaml"))
                   ["algorithm"][name])
    episode_score = section.pop("episode_score", "reward")
    fallback = {"gamma": GAMMA, "lam": 1.0}
    return {k: fallback[k] if v is None and k in fallback else v for k, v in section.items()}, episode_score


def _recompute(dump: dict, name: str) -> tuple[list[tuple[int, int, int]], np.ndarray, np.ndarray]:
    """Every step of every row from its own metadata: ``(row, start, end)`` and the pure estimator's
    advantage and return."""
    params, episode_score = _params(name)
    columns: dict[str, list] = {k: [] for k in ("uid", "traj_uid", "step_idx", "anchor", "step_reward", "action_valid",
                                                "action_match", "role", "subgoal", "values", "truncated", "valid")}
    where = []
    scores, values = dump["scores"].double().numpy(), dump["values"]
    for row, (fields, uid) in enumerate(zip(dump["extra_fields"], dump["uids"])):
        meta = fields["verl_ext"]
        n = len(meta["step_idx"])
        rewards = list(meta["step_reward"])
        if episode_score == "reward" and n:  # the reward manager's score: what the steps did not report
            rewards[-1] += scores[row] - sum(meta["step_reward"])
        for j in range(n):
            start, end = meta["spans"][j]
            where.append((row, start, end))
            columns["uid"].append(uid)
            columns["traj_uid"].append(meta["traj_uid"])
            columns["step_idx"].append(meta["step_idx"][j])
            columns["anchor"].append(meta["anchor"][j])
            columns["step_reward"].append(rewards[j])
            columns["action_valid"].append(meta["action_valid"][j])
            columns["action_match"].append((meta.get("action_match") or [True] * n)[j])
            columns["role"].append((meta.get("role") or [""] * n)[j])
            columns["subgoal"].append((meta.get("subgoal") or [None] * n)[j])
            columns["values"].append(float(values[row, start]) if values is not None else 0.0)
            columns["truncated"].append(meta["truncated"])
            columns["valid"].append(meta["valid"])
    arrays = {k: np.array(v, dtype=object if k in ("uid", "traj_uid", "anchor", "role", "subgoal") else None)
              for k, v in columns.items()}
    if values is None:
        arrays.pop("values")
    if all(s is None for s in columns["subgoal"]):
        arrays.pop("subgoal")
    advantages, returns = compute_with_returns(name, **arrays, **params)
    return where, advantages, returns


def train(name: str, out: Path, steps: int, *overrides: str) -> Path:
    """A ``steps``-step run of the text_hybrid recipe with estimator ``name`` into ``out``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ADV", name)
        run_recipe("text_hybrid/run_cpu.sh", out, "data.train_batch_size=4",
                   "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "trainer.test_freq=-1",
                   "trainer.val_before_train=false", f"+trainer.v1.verl_ext.dump_advantages_dir={out}/advantages",
                   *overrides, steps=steps)
    return out


def check_advantages(name: str, out: Path, steps: int) -> None:
    """Every step's advantages and returns on the dumped rows are the pure estimator's of their
    metadata (1e-5), tokens outside steps train nothing, and the rollout recorded its fields."""
    metrics = read_metrics(out / "metrics.jsonl")
    steps_seen = 0
    for step in range(1, steps + 1):
        assert_finite(metrics[step], ["critic/advantages/mean", "actor/pg_loss", "critic/score/mean"])
        dump = torch.load(out / "advantages" / f"step_{step}.pt", weights_only=False)
        assert dump["estimator"] == name
        where, advantages, returns = _recompute(dump, name)
        mask = dump["response_mask"].bool()
        for (row, start, end), advantage, ret in zip(where, advantages, returns):
            on = mask[row, start:end]
            assert on.any(), (row, start, end)
            got = dump["advantages"][row, start:end][on]
            assert torch.allclose(got, torch.full_like(got, float(advantage)), atol=1e-5), (name, step, row, start)
            got = dump["returns"][row, start:end][on]
            assert torch.allclose(got, torch.full_like(got, float(ret)), atol=1e-5), (name, step, row, start)
        covered = torch.zeros_like(mask)
        for row, start, end in where:
            covered[row, start:end] = True
        assert (dump["advantages"][~covered] == 0).all()  # observation tokens and padding train nothing
        assert np.abs(advantages).max() > 0, f"{name} step {step}: every advantage is 0"
        steps_seen += len(where)
        metas = [f["verl_ext"] for f in dump["extra_fields"]]
        if name == "step_grouped":  # the semi-online rollout's record: matches and patched mismatches
            matches = [m for meta in metas for m in meta["action_match"]]
            assert True in matches or False in matches
            assert all("patches" in meta["extras"] for meta in metas)
        else:  # planner/executor turns, every trajectory opening with a planner turn
            assert all(meta["role"][0] == "planner" for meta in metas if meta["role"])
            assert all(meta["subgoal"][0] == "subgoal 1" for meta in metas if meta["subgoal"])
        if name == "hiper":
            assert dump["values"] is not None
            assert_finite(metrics[step], ["critic/vf_loss", "critic/values/mean"])
    assert steps_seen > 0
