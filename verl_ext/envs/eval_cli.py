"""``verl-ext eval``: run a policy on MiniDesk or MiniWoB++ tasks in parallel browsers, or on the
browserless TextHybrid tasks, and print accuracy, tool-invocation rate (TIR) and average completion
steps (ACS), OSWorld-MCP style.

    verl-ext eval --env minidesk --policy scripted-tool --seeds 3 --parallel 2
    verl-ext eval --env miniwob --policy http://localhost:8000/v1 --tasks click-button,enter-text
    verl-ext eval --policy checkpoint:runs/toolcua_hybrid/.../global_step_30 --action-format menu --max-steps 8
    verl-ext eval --env text_hybrid --tasks settings_panel --show-todo --policy checkpoint:runs/.../huggingface
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from verl_ext.cli_args import positive_int
from verl_ext.envs.base import ScreenEnv
from verl_ext.envs.core import EnvFault
from verl_ext.envs.policies import Policy, check_policy_spec, make_policy
from verl_ext.envs.pool import EnvPool, make_env
from verl_ext.errors import UserError
from verl_ext.rewards.env_rewards import episode_metrics, reward_components


def play_episode(pool: EnvPool, env: ScreenEnv, policy: Policy, task: str, seed: int) -> dict[str, Any]:
    """One episode; returns ``reward_components`` plus ``task``, ``seed``, ``fault``, ``seconds``."""
    started = time.perf_counter()
    fault, success, info = None, False, {}
    try:
        obs, info = pool.reset(env, seed=seed, options={"task": task})
        policy.reset(obs, info, env.tool_schemas())
        done = False
        while not done:
            obs, _, terminated, truncated, step_info = env.step(policy.act(obs))
            fault = step_info.get("fault")
            success = bool(step_info.get("success"))
            done = terminated or truncated
    except EnvFault as err:
        fault = err.as_dict()
    extras = {"success": success, "num_steps": env.counts["steps"], "num_tool_calls": env.counts["tool"],
              "tool_beneficial": info.get("tool_beneficial", False), "format_ok": True}
    record = reward_components(extras, valid=fault is None, max_steps=env.max_steps)
    return {**record, "task": task, "seed": seed, "fault": fault, "seconds": time.perf_counter() - started,
            "ref_steps": info.get("ref_steps")}


def _tasks(env_name: str, spec: str) -> list[str]:
    if env_name == "minidesk":
        from verl_ext.envs.minidesk.env import list_templates

        known = list_templates()
    elif env_name == "text_hybrid":
        from verl_ext.envs.text_hybrid_apps import APPS

        known = list(APPS)
    else:
        from verl_ext.envs.miniwob_env import list_tasks

        known = list_tasks()
    if spec == "all":
        return known
    chosen = [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in known]
    if unknown:
        raise UserError(f"--tasks: unknown {env_name} task(s) {unknown}; known: {', '.join(known)}")
    return chosen


class _Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int, width: int = 30):
        self.total, self.width, self.done, self.ok = total, width, 0, 0
        self._lock = threading.Lock()
        self._start = time.perf_counter()

    def update(self, success: bool) -> None:
        with self._lock:
            self.done += 1
            self.ok += int(success)
            filled = int(self.width * self.done / self.total)
            rate = self.done / max(time.perf_counter() - self._start, 1e-9)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                             f"success {self.ok}/{self.done}  {rate:.1f} ep/s")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def evaluate(env_name: str, policy_spec: str, tasks: list[str], seeds: list[int], parallel: int = 2,
             max_steps: int = 30, progress: bool = True, action_format: str = "tool_call",
             env_options: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every (task, seed) episode with ``parallel`` browsers: (records in input order, pool stats).
    ``env_options``: further constructor options of the env (text_hybrid's ``show_todo``)."""
    pool = EnvPool(lambda: make_env(env_name, max_steps=max_steps, **(env_options or {})), max_envs=parallel)
    jobs = [(task, seed) for task in tasks for seed in seeds]
    bar = _Progress(len(jobs)) if progress else None

    def job(task: str, seed: int) -> dict[str, Any]:
        with pool.lease() as env:
            record = play_episode(pool, env, make_policy(policy_spec, seed, action_format=action_format), task, seed)
        if bar:
            bar.update(record["success"] > 0)
        return record

    try:
        with ThreadPoolExecutor(max_workers=parallel) as executor:
            records = list(executor.map(lambda j: job(*j), jobs))
    finally:
        stats = pool.stats()
        pool.close()
    return records, stats


def format_report(records: list[dict[str, Any]], per_task: bool = True) -> str:
    lines = []
    if per_task:
        by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            by_task[r["task"]].append(r)
        lines.append(f"{'task':<28} {'n':>3} {'acc':>6} {'TIR':>6} {'ACS':>6}")
        for task, rows in by_task.items():
            m = episode_metrics(rows)
            scores = f"{m['accuracy']:>6.2f} {m['tir']:>6.2f} {m['acs']:>6.2f}" if m["episodes"] else "  (all faulted)"
            lines.append(f"{task:<28} {len(rows):>3} {scores}")
    m = episode_metrics(records)
    scores = f"accuracy={m['accuracy']:.3f} TIR={m['tir']:.3f} ACS={m['acs']:.2f}" if m["episodes"] else "accuracy=n/a"
    lines.append(f"overall: episodes={int(m['episodes'])} faults={int(m['faults'])} {scores}")
    return "\n".join(lines)


def _seeds(spec: str) -> list[int]:
    """``N`` (seeds 0..N-1) or ``LO-HI`` (inclusive); a spec that gives no seed raises ``UserError``."""
    lo, dash, hi = spec.partition("-")
    try:
        seeds = list(range(int(lo), int(hi) + 1)) if dash else list(range(int(spec)))
    except ValueError:
        seeds = []
    if not seeds:
        raise UserError(f"--seeds {spec!r} gives no episode: use N >= 1 (seeds 0..N-1) or LO-HI with LO <= HI, e.g. 2-5")
    return seeds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verl-ext eval", description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--env", choices=("minidesk", "miniwob", "text_hybrid"), default="minidesk")
    parser.add_argument("--policy", default="scripted-tool",
                        help="scripted-gui | scripted-tool | scripted-oracle (text_hybrid) | random | http(s)://host/v1 (OpenAI-compatible) | "
                             "checkpoint:DIR (a transformers model folder or a verl checkpoint global_step_N)")
    parser.add_argument("--action-format", choices=("tool_call", "menu"), default="tool_call",
                        help="checkpoint policies: how the model acts (menu = the T/G menu of the cpu recipes)")
    parser.add_argument("--tasks", default="all", help="comma-separated task ids, or 'all'")
    parser.add_argument("--seeds", default="2", help="N (seeds 0..N-1) or LO-HI")
    parser.add_argument("--parallel", type=positive_int, default=2, help="browsers at once")
    parser.add_argument("--max-steps", type=positive_int, default=30)
    parser.add_argument("--show-todo", action="store_true",
                        help="text_hybrid: end each observation with the task's items still to do, as for a "
                             "checkpoint trained with the recipes' SHOW_TODO=1 (text_hybrid's show_todo)")
    parser.add_argument("--json", help="also write every episode record to this file")
    parser.add_argument("--no-per-task", action="store_true", help="print only the overall line")
    args = parser.parse_args(argv)
    if args.env == "miniwob" and args.policy.startswith("scripted"):
        parser.error("scripted policies replay MiniDesk reference plans; use random or a model URL for miniwob")
    if args.show_todo and args.env != "text_hybrid":
        parser.error(f"--show-todo applies to --env text_hybrid only (got --env {args.env})")

    check_policy_spec(args.policy)  # before any browser starts
    records, stats = evaluate(args.env, args.policy, _tasks(args.env, args.tasks), _seeds(args.seeds), args.parallel,
                              args.max_steps, action_format=args.action_format,
                              env_options={"show_todo": True} if args.show_todo else None)
    print(format_report(records, per_task=not args.no_per_task))
    print(f"browsers: created={stats['created']} restarts={stats['restarts']} faulted episodes={stats['faults']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1, default=str)
    if not episode_metrics(records)["episodes"]:
        print("verl-ext eval: every episode faulted: there is no accuracy to report", file=sys.stderr)
        return 1
    return 0
