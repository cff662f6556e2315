"""CPU mechanism study: which advantage estimator learns a hierarchical multi-step task fastest?

A tabular softmax policy learns a plan-then-execute task from scratch, one arm per estimator (verl's
``grpo`` and verl-ext's ``gigpo``, ``hgpo``, ``step_grouped``, ``himac``, ``hiper``), every arm the same
rollouts, loss and optimizer; only the advantages differ:

* a task is a hidden order of ``SUBGOALS`` subgoals out of ``CHOICES`` and, per subgoal, a hidden sequence of
  ``SUBGOAL_LENGTH`` executor actions out of ``CHOICES``. A planner turn picks the next subgoal; the wrong
  one costs one blocked executor turn. Executor turns act on the chosen subgoal: a right action advances
  it, a wrong one leaves the state as it was (states recur within a group: GiGPO's anchor states); after
  ``SEGMENT_CAP`` executor turns without finishing, the planner picks again. A finished subgoal pays
  ``1 / SUBGOALS``; success = every subgoal within ``BUDGET`` turns;
* ``TASKS`` tasks a seed, ``GROUP`` rollouts each (one ``uid`` per task); a row per trajectory, one
  response token per turn, the turn's span on it, step metadata as an agent loop writes it
  (``verl_ext.steps.StepMetadata``: anchor = the state, ``action_match`` = the oracle's action,
  ``role``/``subgoal`` = planner or executor and the subgoal pursued);
* advantages: verl's registered ``grpo`` on the episode return, the step-aware ones through
  ``verl_ext.advantages.verl_glue.compute_token_advantages`` with the plugin fragments' settings
  (``plugins/advantage/<name>.yaml``), ``algorithm.gamma = GAMMA``; ``hiper``'s per-step values from a
  tabular critic regressed on its returns;
* update: verl's ``vanilla`` PPO policy loss (token-mean, one on-policy step), Adam on the logits table.

    python -m scripts.bench.estimator_study [--seeds 10] [--steps 300] [--save runs.npz | --load runs.npz] [--write]

Docs section (``--write``; printed otherwise): docs/results.md,
"## Advantage estimators: which to use (mechanism study)".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass

from scripts.bench.report import REPO, cpu_machine, publish, script_parser, target, table as md_table
from scripts.bench.stats import collapsed, fmt_interval, paired_verdict
from verl_ext.advantages.verl_glue import compute_token_advantages
from verl_ext.steps import StepMetadata

HEADING = "## Advantage estimators: which to use (mechanism study)"
ARMS = ("grpo", "gigpo", "hgpo", "step_grouped", "himac", "hiper")
BASELINE = "grpo"
SUBGOALS, CHOICES, SUBGOAL_LENGTH, SEGMENT_CAP, BUDGET = 3, 4, 3, 5, 24
TASKS, GROUP = 8, 8
GAMMA, LAM = 0.95, 1.0
LR, CRITIC_LR = 0.007, 0.2
FINAL_WINDOW = 0.1  # final success: the mean over the last 10% of the steps
FRAGMENTS = REPO / "plugins" / "advantage"
BLOCKED = SUBGOAL_LENGTH  # executor position of a subgoal that is not the next one
PLANNER_STATES = TASKS * SUBGOALS
STATES = PLANNER_STATES + TASKS * CHOICES * (SUBGOAL_LENGTH + 1)


@dataclass(frozen=True)
class Tasks:
    """A seed's tasks: ``order (TASKS, SUBGOALS)`` subgoal ids, ``actions (TASKS, CHOICES, SUBGOAL_LENGTH)``."""

    order: np.ndarray
    actions: np.ndarray


def make_tasks(seed: int) -> Tasks:
    """The hidden subgoal orders and action sequences of ``seed`` (the same in every arm)."""
    rng = np.random.default_rng(seed)
    order = np.stack([rng.permutation(CHOICES)[:SUBGOALS] for _ in range(TASKS)])
    return Tasks(order, rng.integers(0, CHOICES, (TASKS, CHOICES, SUBGOAL_LENGTH)))


@dataclass
class Rollouts:
    """One batch of ``TASKS * GROUP`` episodes, turn ``t`` of episode ``i`` at ``[i, t]``: ``state``, ``action``,
    ``reward``, ``planner``, ``match``, ``subgoal`` (N, BUDGET), valid where ``t < length[i]``; the rest (N,)."""

    task: np.ndarray
    state: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    planner: np.ndarray
    match: np.ndarray
    subgoal: np.ndarray
    length: np.ndarray
    success: np.ndarray
    truncated: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        return np.arange(BUDGET)[None] < self.length[:, None]

    @property
    def returns(self) -> np.ndarray:
        return self.reward.sum(1)


def rollout(tasks: Tasks, logits: np.ndarray, rng: np.random.Generator) -> Rollouts:
    """``GROUP`` episodes of every task, all episodes stepped together, actions sampled from ``logits``."""
    n = TASKS * GROUP
    task = np.repeat(np.arange(TASKS), GROUP)
    done_subgoals = np.zeros(n, int)  # subgoals finished
    position = np.zeros(n, int)  # executor progress inside the next subgoal (kept across segments)
    chosen = np.full(n, -1)  # the planner's pick; -1: the planner acts next
    segment_turns, length = np.zeros(n, int), np.zeros(n, int)  # executor turns since the planner's; turns taken
    alive = np.ones(n, bool)
    record = {k: np.zeros((n, BUDGET), int) for k in ("state", "action", "planner", "match", "subgoal")}
    reward = np.zeros((n, BUDGET))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    for t in range(BUDGET):
        planning = chosen < 0
        step_subgoal = np.where(planning, 0, chosen)
        next_subgoal = tasks.order[task, np.minimum(done_subgoals, SUBGOALS - 1)]
        on_next = step_subgoal == next_subgoal
        exec_position = np.where(on_next, position, BLOCKED)  # the executor's row of a subgoal not the next one
        state = np.where(planning, task * SUBGOALS + np.minimum(done_subgoals, SUBGOALS - 1),  # planner rows first
                         PLANNER_STATES + (task * CHOICES + step_subgoal) * (SUBGOAL_LENGTH + 1) + exec_position)
        cumulative = probs[state].cumsum(1)
        action = np.minimum((rng.random(n)[:, None] > cumulative).sum(1), CHOICES - 1)
        oracle = np.where(planning, next_subgoal,
                          tasks.actions[task, step_subgoal, np.minimum(position, SUBGOAL_LENGTH - 1)])
        match = (action == oracle) & (planning | on_next)
        for key, value in (("state", state), ("action", action), ("planner", planning), ("match", match),
                           ("subgoal", np.where(planning, action, step_subgoal))):
            record[key][alive, t] = value[alive]
        length += alive
        # transitions
        executing = alive & ~planning
        advanced = executing & match
        position = position + advanced
        finished = advanced & (position == SUBGOAL_LENGTH)
        reward[finished, t] = 1.0 / SUBGOALS
        done_subgoals = done_subgoals + finished
        position = np.where(finished, 0, position)
        segment_turns = np.where(planning, 0, segment_turns + 1)
        back_to_planner = executing & (finished | ~on_next | (segment_turns >= SEGMENT_CAP))
        chosen = np.where(alive & planning, action, np.where(back_to_planner, -1, chosen))
        alive &= done_subgoals < SUBGOALS
    success = done_subgoals == SUBGOALS
    return Rollouts(task, record["state"], record["action"], reward, record["planner"].astype(bool),
                    record["match"].astype(bool), record["subgoal"], length, success, ~success)


def anchor_text(state: int) -> str:
    """The observation an agent loop would record for a table row: the planner's progress or the
    executor's subgoal and position (the task is the ``uid``)."""
    if state < PLANNER_STATES:
        return f"plan: {state % SUBGOALS} subgoals done"
    subgoal, position = divmod((state - PLANNER_STATES) % (CHOICES * (SUBGOAL_LENGTH + 1)), SUBGOAL_LENGTH + 1)
    return f"subgoal {subgoal}: " + ("blocked" if position == BLOCKED else f"step {position}")


def step_metadata(batch: Rollouts) -> list[dict]:
    """Each row's ``extra_fields`` as an agent loop writes them (one row per trajectory, turn t on token t)."""
    return [StepMetadata(
        traj_uid=f"traj{i}", step_idx=list(range(steps)), anchor=[anchor_text(s) for s in batch.state[i, :steps]],
        step_reward=batch.reward[i, :steps].tolist(), spans=[[t, t + 1] for t in range(steps)],
        action_valid=[True] * steps, action_match=batch.match[i, :steps].tolist(),
        role=["planner" if p else "executor" for p in batch.planner[i, :steps]],
        subgoal=[str(g) for g in batch.subgoal[i, :steps]], truncated=bool(batch.truncated[i]),
    ).to_extra_fields() for i, steps in enumerate(batch.length)]


def algorithm_config(arm: str) -> DictConfig:
    """The ``algorithm`` section a run with ``+plugins/advantage=<arm>`` gets (verl's own for grpo)."""
    base = OmegaConf.create({"adv_estimator": arm, "gamma": GAMMA, "lam": LAM, "norm_adv_by_std_in_grpo": True})
    return base if arm == BASELINE else OmegaConf.merge(base, OmegaConf.load(FRAGMENTS / f"{arm}.yaml").algorithm)


def token_advantages(arm: str, config: DictConfig, batch: Rollouts, fields: list[dict],
                     values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` (N, BUDGET) of ``arm``: verl's registered grpo on the episode return
    (on the last turn's token), the step-aware ones through the verl-ext trainer's glue."""
    mask = torch.from_numpy(batch.mask).float()
    uids = [f"task{t}" for t in batch.task]
    scores = torch.from_numpy(batch.returns)
    if arm == BASELINE:
        token_rewards = torch.zeros_like(mask)
        token_rewards[torch.arange(len(scores)), torch.from_numpy(batch.length - 1)] = scores.float()
        return get_adv_estimator_fn(arm)(token_level_rewards=token_rewards, response_mask=mask,
                                         index=np.array(uids, dtype=object), config=config)
    return compute_token_advantages(arm, response_mask=mask, extra_fields=fields, uids=uids, scores=scores,
                                    algo_config=config, values=values)


@dataclass
class ArmRun:
    """One arm on one seed: success rate per step, seconds per update (advantages; advantages + update)."""

    success: np.ndarray
    advantage_seconds: np.ndarray
    update_seconds: np.ndarray


def run_arm(arm: str, seed: int, steps: int) -> ArmRun:
    """Train a fresh table on ``seed``'s tasks with ``arm``'s advantages for ``steps`` updates."""
    tasks = make_tasks(seed)
    rng = np.random.default_rng(seed + 10_000)  # rollout stream: shared by the arms of a seed
    config = algorithm_config(arm)
    table = torch.zeros(STATES, CHOICES, requires_grad=True)
    critic = np.zeros(STATES)
    optimizer = torch.optim.Adam([table], lr=LR)
    policy_loss = get_policy_loss_fn("vanilla")
    actor = omega_conf_to_dataclass(OmegaConf.create({
        "_target_": "verl.workers.config.ActorConfig", "strategy": "fsdp", "rollout_n": GROUP,
        "ppo_micro_batch_size_per_gpu": 1}))
    success, advantage_seconds, update_seconds = [], [], []
    for _ in range(steps):
        batch = rollout(tasks, table.detach().numpy(), rng)
        fields = step_metadata(batch)
        state, action = torch.from_numpy(batch.state), torch.from_numpy(batch.action)
        start = time.perf_counter()
        values = torch.from_numpy(critic[batch.state]).float() if arm == "hiper" else None
        advantages, returns = token_advantages(arm, config, batch, fields, values)
        advantage_seconds.append(time.perf_counter() - start)
        mask = torch.from_numpy(batch.mask).float()
        if arm == "hiper":  # the critic regresses on the returns (A + V), one mean step per visited state
            visited, error = batch.state[batch.mask], np.zeros(STATES)
            np.add.at(error, visited, returns.numpy()[batch.mask] - critic[visited])
            critic += CRITIC_LR * error / np.maximum(np.bincount(visited, minlength=STATES), 1)
        log_prob = torch.log_softmax(table[state], -1).gather(-1, action[..., None])[..., 0]
        loss, _ = policy_loss(old_log_prob=log_prob.detach(), log_prob=log_prob, advantages=advantages,
                              response_mask=mask, loss_agg_mode="token-mean", config=actor)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        update_seconds.append(time.perf_counter() - start)
        success.append(batch.success.mean())
    return ArmRun(np.array(success), np.array(advantage_seconds), np.array(update_seconds))


def arm_metrics(runs: list[ArmRun]) -> dict[str, np.ndarray]:
    """Per seed: success AUC (mean over steps), final success (last ``FINAL_WINDOW``), collapse flag
    (final below half the peak of the 10-step running mean, peak at least 0.3), median seconds per update."""
    success = np.stack([r.success for r in runs])
    window = max(1, int(round(FINAL_WINDOW * success.shape[1])))
    final = success[:, -window:].mean(1)
    smooth = np.stack([np.convolve(s, np.ones(10) / 10, mode="valid") for s in success])
    return {"auc": success.mean(1), "final": final, "collapsed": collapsed(final, smooth.max(1)),
            "advantage_s": np.array([np.median(r.advantage_seconds) for r in runs]),
            "update_s": np.array([np.median(r.update_seconds) for r in runs])}


def report(runs: dict[str, list[ArmRun]], seeds: list[int], steps: int, seconds: float) -> str:
    """The docs section: the task, the baseline's curve, the per-arm table and the paired differences."""
    metrics = {arm: arm_metrics(r) for arm, r in runs.items()}
    base = metrics[BASELINE]
    best = max(ARMS, key=lambda arm: metrics[arm]["auc"].mean())
    curve = np.stack([r.success for r in runs[BASELINE]]).mean(0)
    points = sorted({0, steps // 4, steps // 2, 3 * steps // 4, steps - 1})
    rows = [(f"`{arm}`", fmt_interval(m["auc"]), fmt_interval(m["final"]),
             paired_verdict(m["auc"], base["auc"]) if arm != BASELINE else "—",
             paired_verdict(m["final"], base["final"]) if arm != BASELINE else "—",
             fmt_interval(m["advantage_s"] / base["advantage_s"], 2), fmt_interval(m["update_s"] / base["update_s"], 2),
             f"{int(m['collapsed'].sum())}/{len(seeds)}") for arm, m in metrics.items()]
    against_best = [f"- `{arm}` − `{best}`: AUC {paired_verdict(metrics[arm]['auc'], metrics[best]['auc'])}; "
                    f"final {paired_verdict(metrics[arm]['final'], metrics[best]['final'])}"
                    for arm in ARMS if arm != best]
    command = f"python -m scripts.bench.estimator_study --seeds {len(seeds)} --steps {steps} --write"
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return "\n\n".join([
        HEADING,
        f"`{command}` ({date}): {seconds / 60:.1f} min on {cpu_machine()}, torch {torch.__version__}, one thread.",
        "A CPU mechanism study with a tabular policy, not LLM training: it compares the estimators' learning signal "
        f"on one small task where all of them apply. Task: a hidden order of {SUBGOALS} subgoals out of {CHOICES}, "
        f"each needing {SUBGOAL_LENGTH} right executor actions out of {CHOICES}; a planner turn picks the next "
        "subgoal (a wrong pick costs one blocked executor turn), a wrong executor action leaves the state as it was, "
        f"{SEGMENT_CAP} executor turns without finishing hand back to the planner, a finished subgoal pays "
        f"1/{SUBGOALS}, success = all of them within {BUDGET} turns. {TASKS} tasks x {GROUP} rollouts a step (one "
        f"`uid` a task), {len(seeds)} paired seeds (same tasks, same initial table, same rollout random stream in "
        f"every arm), {steps} steps. Every arm: verl's `vanilla` PPO loss (token-mean, one on-policy step), Adam lr "
        f"{LR} on a logits table, γ = {GAMMA}; only the advantages differ: verl's registered `grpo`, the others "
        "through `verl_ext.advantages.verl_glue.compute_token_advantages` with the plugin fragments' settings and "
        "step metadata as an agent loop records it (anchor = the state, `action_match` = the oracle's action, "
        "`role`/`subgoal` = planner or executor and the subgoal pursued); `hiper`'s values come from a tabular "
        f"critic (lr {CRITIC_LR}) fitted to its returns.",
        "Success = share of the step's training rollouts that finish every subgoal; AUC = its mean over all steps; "
        f"final = its mean over the last {FINAL_WINDOW:.0%} of the steps; collapse = final below half the peak of "
        "the 10-step running mean (peak ≥ 0.3). Intervals: t-based 95% over seeds (differences paired by seed). "
        "Cost: median seconds per update (advantages alone; advantages + critic + policy step), as a ratio to "
        "`grpo`'s on the same seed (rollouts excluded: the same in every arm).",
        "`grpo`'s success over steps (mean over seeds): "
        + ", ".join(f"step {p}: {curve[p]:.2f}" for p in points) + ".",
        md_table(["arm", "success AUC", "final success", "AUC − grpo", "final − grpo",
                  "advantage time / grpo", "update time / grpo", "collapses"], rows),
        f"Against the arm with the highest mean AUC (`{best}`):",
        "\n".join(against_best),
        "Limits of the task:",
        "\n".join([
            "- The policy is a table over the current state (no history, no generalisation between states or tasks), "
            "and the tasks of a seed differ only in hidden labels: the spread between seeds is small, so the "
            "intervals are narrow. They bound this task's learning signal, not the spread between tasks.",
            "- Rollouts are online in every arm. `step_grouped` groups steps by index, which here are different "
            "states in different rollouts (UI-S1's semi-online rollout keeps every rollout on the reference path; it "
            "is not simulated); its returns are cut at the first action that differs from the oracle's.",
            "- `hiper`'s critic is a table: its cost ratio leaves out a critic model's forward and backward pass, "
            "which with an LLM critic is about the actor's own cost.",
            f"- `hgpo` keeps the fragment's `history_length` ({algorithm_config('hgpo').hgpo.history_length}); the "
            "policy sees the current state only, so its history levels split groups by the path to a state, not by "
            "what the policy saw.",
            "",
        ]),
    ])


def save_runs(path: Path, runs: dict[str, list[ArmRun]], seconds: float) -> None:
    """The per-step results of every run, ``<arm>/<field>`` arrays of shape (seeds, steps), as ``.npz``."""
    arrays = {f"{arm}/{name}": np.stack([getattr(r, name) for r in arm_runs])
              for arm, arm_runs in runs.items() for name in ArmRun.__dataclass_fields__}
    np.savez(path, seconds=seconds, **arrays)


def load_runs(path: Path) -> tuple[dict[str, list[ArmRun]], float]:
    """``save_runs``'s file read back: the runs and the study's wall time."""
    data = np.load(path)
    names = list(ArmRun.__dataclass_fields__)
    runs = {arm: [ArmRun(*row) for row in zip(*(data[f"{arm}/{name}"] for name in names))] for arm in ARMS}
    return runs, float(data["seconds"])


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--seeds", type=int, default=10, help="paired seeds per arm")
    parser.add_argument("--steps", type=int, default=300, help="updates per run")
    parser.add_argument("--save", type=Path, help="also write the per-step results to this .npz")
    parser.add_argument("--load", type=Path, help="report the runs of a --save file instead of training")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.load:
        runs, seconds = load_runs(args.load)
    else:
        start = time.perf_counter()
        runs: dict[str, list[ArmRun]] = {arm: [] for arm in ARMS}
        for seed in range(args.seeds):  # every arm on a seed before the next: a slow phase hits all arms
            for arm in ARMS:
                runs[arm].append(run_arm(arm, seed, args.steps))
        seconds = time.perf_counter() - start
        if args.save:
            save_runs(args.save, runs, seconds)
    seeds = list(range(len(runs[BASELINE])))
    publish(target(args), HEADING, report(runs, seeds, len(runs[BASELINE][0].success), seconds))


if __name__ == "__main__":
    main()
