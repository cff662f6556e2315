"""Speed and memory of the hybrid GUI + tool envs (MiniDesk, MiniWoB++) in headless Chromium.

Measures reset and step latency (p50/p95), steps/s with 1, 2, 4, 8 parallel envs, and memory per
env (RSS and PSS of each env's chromedriver + Chromium processes), and compares them with
BrowserGym's figures (browsergym-core 0.14.3, measured once on a 2-core machine of the same kind; ≈1.7 s per step including a 0.5 s sleep, ≈1.5 GB RSS per env).

    python -m scripts.bench.bench_envs                      # print the table
    python -m scripts.bench.bench_envs --write

Docs section (``--write``; printed otherwise): docs/results.md, "## Hybrid GUI + tool environments".
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time

from scripts.bench.report import cpu_machine, publish, script_parser, table, target

from verl_ext.envs.core import GuiAction, ToolCall  # noqa: E402
from verl_ext.envs.minidesk.env import list_templates  # noqa: E402
from verl_ext.envs.policies import ScriptedPolicy  # noqa: E402
from verl_ext.envs.pool import make_env  # noqa: E402

# BrowserGym (browsergym-core 0.14.3 with its MiniWoB++ tasks), measured once on this kind of machine: reset 0.95-1.36 s, noop() step ~1.7 s,
# of which 0.5 s is its pre_observation_delay sleep, which the comparison leaves out. BrowserGym has
# no tool calls: tool steps have no BrowserGym counterpart.
BROWSERGYM_PRE_OBSERVATION_DELAY_S = 0.5
BROWSERGYM_S = {"reset": 1.15, "gui_step": 1.7 - BROWSERGYM_PRE_OBSERVATION_DELAY_S}
BROWSERGYM_ENV_RSS_BYTES = 1.5e9
SECTION = "## Hybrid GUI + tool environments"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed(seconds: list[float], call, *args, **kwargs):
    """``call(*args, **kwargs)``, its wall time appended to ``seconds``."""
    t0 = time.perf_counter()
    result = call(*args, **kwargs)
    seconds.append(time.perf_counter() - t0)
    return result


def latency(backend: str, n: int) -> dict[str, list[float]]:
    """Reset, GUI-step and tool-step latencies (seconds) on one env."""
    env = make_env(backend)
    out: dict[str, list[float]] = {"reset": [], "gui_step": [], "tool_step": []}
    try:
        env.reset(seed=0, options={"task": "mail_open" if backend == "minidesk" else "click-button"})  # warm-up: browser start
        for i in range(n):
            if backend == "minidesk":
                obs, info = timed(out["reset"], env.reset, seed=i, options={"task": "mail_star_sender"})
                timed(out["gui_step"], env.step, GuiAction("click", element=obs.find("app-mail").id))
                step = info["plans"]["tool"][0]
                timed(out["tool_step"], env.step, ToolCall(step["tool"], step["args"]))
            else:
                obs, _ = timed(out["reset"], env.reset, seed=i, options={"task": "click-checkboxes"})
                box = next(e for e in obs.elements if e.role == "checkbox")
                timed(out["gui_step"], env.step, GuiAction("click", element=box.id))
    finally:
        env.close()
    return {k: v for k, v in out.items() if v}


def play_gui_episode(env, template: str, seed: int) -> int:
    """One episode of ``template`` by the scripted GUI plan; returns its number of steps."""
    obs, info = env.reset(seed=seed, options={"task": template})
    policy = ScriptedPolicy("gui")
    policy.reset(obs, info, [])
    steps, done = 0, False
    while not done:
        obs, _, terminated, truncated, _ = env.step(policy.act(obs))
        steps, done = steps + 1, terminated or truncated
    return steps


def throughput(n_envs: int, episodes_per_env: int) -> tuple[float, float]:
    """(steps/s, mean s/step) of ``n_envs`` envs, each in its own thread replaying MiniDesk GUI plans."""
    envs = [make_env("minidesk") for _ in range(n_envs)]
    templates = list_templates()
    steps = [0] * n_envs

    def work(i: int) -> None:
        env = envs[i]
        for k in range(episodes_per_env):
            steps[i] += play_gui_episode(env, templates[(i * 7 + k) % len(templates)], k)

    try:
        for env in envs:  # browsers start outside the timed region
            env.reset(seed=0, options={"task": "mail_open"})
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n_envs)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
    finally:
        for env in envs:
            env.close()
    return sum(steps) / elapsed, elapsed * n_envs / sum(steps)


def memory(max_envs: int) -> list[tuple[int, float, float]]:
    """[(n envs, total RSS MB, total PSS MB)] as envs are added one by one (each after one episode)."""
    envs, rows = [], []
    try:
        for n in range(1, max_envs + 1):
            env = make_env("minidesk")
            play_gui_episode(env, "files_to_mail", n)
            envs.append(env)
            rss = sum(e.browser.memory_bytes("rss") for e in envs) / 1e6
            pss = sum(e.browser.memory_bytes("pss") for e in envs) / 1e6
            rows.append((n, rss, pss))
    finally:
        for env in envs:
            env.close()
    return rows


def machine() -> str:
    chromium = os.popen("chromium --version 2>/dev/null").read().strip() or "chromium ?"
    return f"{cpu_machine()}, Linux {platform.release()}, {chromium}"


def report(n_latency: int, episodes: int, parallel: list[int], mem_envs: int) -> str:
    load_before = os.getloadavg()[0]
    body = _tables(n_latency, episodes, parallel, mem_envs)
    return "\n".join([
        SECTION, "", f"Machine: {machine()}; no GPU; 1-minute load average {load_before:.1f} at the start of this "
        f"run, {os.getloadavg()[0]:.1f} at the end. `python -m scripts.bench.bench_envs`.", "", *body]) + "\n"


def _tables(n_latency: int, episodes: int, parallel: list[int], mem_envs: int) -> list[str]:
    lines = []
    cells = []
    for backend in ("minidesk", "miniwob"):
        for op, values in latency(backend, n_latency).items():
            p50 = statistics.median(values)
            cells.append([backend, op, f"{p50 * 1e3:.1f}", f"{percentile(values, 0.95) * 1e3:.1f}",
                          f"{BROWSERGYM_S[op] / p50:.0f}x faster" if op in BROWSERGYM_S else "no counterpart"])
    lines.append(table(["backend", "operation", "p50 (ms)", "p95 (ms)", "vs BrowserGym (same operation)"], cells))
    lines += ["", table(["parallel envs", "steps/s (MiniDesk GUI plans)", "wall s per step per env"],
                        [[n, f"{rate:.1f}", f"{per_step * 1e3:.0f} ms"] for n in parallel
                         for rate, per_step in [throughput(n, episodes)]])]
    rows = memory(mem_envs)
    lines += ["", table(["envs", "total RSS (MB)", "total PSS (MB)", "marginal RSS per extra env (MB)",
                         "marginal PSS (MB)"],
                        [[n, f"{rss:.0f}", f"{pss:.0f}", *(("", "") if i == 0 else
                                                           (f"{rss - rows[i - 1][1]:.0f}", f"{pss - rows[i - 1][2]:.0f}"))]
                         for i, (n, rss, pss) in enumerate(rows)])]
    if len(rows) > 1:
        rss_per_env = statistics.median(rows[i][1] - rows[i - 1][1] for i in range(1, len(rows)))
        pss_per_env = statistics.median(rows[i][2] - rows[i - 1][2] for i in range(1, len(rows)))
        lines += ["", f"Median extra memory per env: {rss_per_env:.0f} MB RSS, "
                  f"{BROWSERGYM_ENV_RSS_BYTES / 1e6 / rss_per_env:.1f}x less than BrowserGym's; PSS "
                  f"{pss_per_env:.0f} MB. First env: "
                  f"{rows[0][1]:.0f} MB RSS / {rows[0][2]:.0f} MB PSS."]
    return lines


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--latency-runs", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=6, help="episodes per env in the throughput runs")
    parser.add_argument("--parallel", default="1,2,4,8")
    parser.add_argument("--memory-envs", type=int, default=8)
    args = parser.parse_args()
    publish(target(args), SECTION,
            report(args.latency_runs, args.episodes, [int(x) for x in args.parallel.split(",")], args.memory_envs))


if __name__ == "__main__":
    main()
