"""Does each plugin earn its place? The tiny model on the browserless hybrid GUI + tool apps through verl's trainer.

``recipes/text_hybrid/run_cpu.sh``, one T/G decision per subgoal, same seeds and budget for every arm:

- ``estimators`` (synchronous, verl's PPO loss): grpo vs gigpo vs hgpo: held-out success, steps per
  successful episode, and *when to switch*: the tool-use rate where tools are strictly shorter vs where the
  GUI is, per task and per decision.
- ``old_logits`` (verl's colocate_async, batches queued 3 ahead, hgpo): fair arms with the same loss
  (``ppo_ewma``) and rollout correction, only the old-logit source differs (``current``, ``rollout``,
  ``snapshot``, ``ewma``, ``ewma_bound``, ``loglinear``): final success, clip fraction, what the correction
  removes from fresh and stale tokens, per-token staleness, the EWMA's age, time per step.

Mean and standard error over seeds per arm; every pairwise difference of final values is tested against
two standard errors of the difference (``compare``). Runs are seed-major (a partial sweep still compares
every arm); finished runs are reused; ``--report-only`` reports exactly the runs found.

    python -m scripts.bench.text_hybrid_study --steps 25 --seeds 0 1 2

Docs section (``--write``; printed otherwise): docs/results.md, "## text_hybrid study: which plugin earns its place".
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
from scripts.bench.launch import REPO, Runs
from scripts.bench.learning_runs import logged_steps, machine_line, series, study_command, study_parser, sweep
from scripts.bench.report import figure, publish, table, target
from scripts.bench.stats import fmt_mean_se, last_finite, mean_and_se, two_se_verdict

HEADING = "## text_hybrid study: which plugin earns its place"
SCRIPT = "text_hybrid/run_cpu.sh"
VAL = "val-aux/verl_ext/text_hybrid/{}/mean@1"
MAX_STEPS = 24  # S_max of the recipe (len_gain = success * (1 - steps / S_max))
VAL_EPISODES = 64  # validation instances per evaluation (run_cpu.sh --val-size), one episode each
GOAL_TOOL, GOAL_GUI = 0.8, 0.2  # the goal: tools on >= 80% where they help, <= 20% where they do not
PARTS = {
    "estimators": {
        "grpo": {"MODE": "sync", "ADV": "grpo", "LOSS": "vanilla", "PROVIDER": "current"},
        "gigpo": {"MODE": "sync", "ADV": "gigpo", "LOSS": "vanilla", "PROVIDER": "current"},
        "hgpo": {"MODE": "sync", "ADV": "hgpo", "LOSS": "vanilla", "PROVIDER": "current"},
    },
    "old_logits": {  # fair arms: one loss, one correction, only the provider differs
        provider: {"MODE": "colocate_async", "ADV": "hgpo", "LOSS": "ppo_ewma", "PROVIDER": provider}
        for provider in ("current", "rollout", "snapshot", "ewma", "ewma_bound", "loglinear")
    },
}
ASYNC_KEYS = {  # label -> (metric, how it is reduced over the training steps)
    "PPO clip fraction": ("actor/pg_clipfrac", "mean"),
    "rejection-masked fraction (token_k1 band)": ("rollout_corr/rollout_rs_token_k1_masked_fraction", "mean"),
    "masked fraction, fresh tokens (numerics)": ("old_logits/correction/masked_fresh", "mean"),
    "masked fraction, stale tokens": ("old_logits/correction/masked_stale", "mean"),
    "IS-truncated fraction, stale tokens": ("old_logits/correction/truncated_stale", "mean"),
    "KL(behaviour, old log-probs) (`rollout_corr/kl`)": ("rollout_corr/kl", "mean"),
    "token staleness (versions), mean": ("old_logits/stale/version_gap_mean", "mean"),
    "token staleness (versions), max": ("old_logits/stale/version_gap_max", "max"),
    "verl's trajectory staleness (a lower bound), max": ("training/off_policy/trajectory_staleness/max", "max"),
    "EWMA age (optimizer steps)": ("old_logits/ewma/age_steps", "mean"),
    "stale tokens' age (optimizer steps)": ("old_logits/token_age_steps/stale_mean", "mean"),
    "time per step (s)": ("timing_s/step", "mean"),
    "old-log-prob time per step (s)": ("timing_s/old_log_prob", "mean"),
}


# --- derived validation metrics: ratios of verl's per-key means ------------------------------------
def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` where ``den > 0``, else NaN (a rate over an empty set is undefined, not 0)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def derived(runs: Runs, steps: list[int], max_steps: int = MAX_STEPS, val: str = VAL) -> dict[str, np.ndarray]:
    """Validation rates at ``steps``, each of shape (seeds, steps). verl averages every reward
    extra over the validation episodes, so a conditional rate is a ratio of two such means:

    - ``steps_per_success``: mean steps of successful episodes, from ``len_gain`` = success * (1 - s/S_max)
      (``max_steps``: the reward's S_max);
    - ``tool_when_beneficial`` / ``tool_when_not``: share of episodes that called a tool among
      tasks whose oracle uses a tool / uses none;
    - ``decision_tool_when_shorter`` / ``decision_tool_when_gui_shorter``: share of decisions
      answered by tools among those where tools / the GUI are strictly shorter from that state.
    """
    get = {key: series(runs, val.format(key), steps).reshape(len(runs), len(steps)) for key in (
        "success", "len_gain", "used_tool", "tool_beneficial", "used_tool_beneficial", "decisions_tool",
        "decisions_tool_tool", "decisions_gui", "decisions_gui_tool")}
    return {
        "success": get["success"],
        "steps_per_success": max_steps * (1 - ratio(get["len_gain"], get["success"])),
        "tool_when_beneficial": ratio(get["used_tool_beneficial"], get["tool_beneficial"]),
        "tool_when_not": ratio(get["used_tool"] - get["used_tool_beneficial"], 1 - get["tool_beneficial"]),
        "decision_tool_when_shorter": ratio(get["decisions_tool_tool"], get["decisions_tool"]),
        "decision_tool_when_gui_shorter": ratio(get["decisions_gui_tool"], get["decisions_gui"]),
    }


# --- statistics ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    diff: float  # mean(a) - mean(b)
    se: float    # sqrt(se_a^2 + se_b^2)

    @property
    def exceeds(self) -> bool:
        """|difference| > 2 standard errors of the difference (False when the SE is undefined)."""
        return bool(np.isfinite(self.se) and abs(self.diff) > 2 * self.se)


def arm_se(values: np.ndarray, episodes: int | None = None) -> tuple[float, float]:
    """Mean and standard error of one arm. For a rate measured on ``episodes`` episodes per seed,
    the SE is at least the binomial one of the pooled episodes, sqrt(p (1 - p) / (episodes * n)):
    with 2-3 seeds the spread between seeds can be near zero by chance (e.g. 0.97 twice), and
    that would call a difference of one episode significant."""
    mean, se, n = mean_and_se(values)
    if episodes and n > 1:
        se = max(se, float(np.sqrt(mean * (1 - mean) / (episodes * n))))
    return mean, se


def compare(arms: dict[str, np.ndarray], episodes: int | None = None) -> list[Comparison]:
    """Every pair of arms (per-seed values each): the difference of means and its standard error
    (independent arms: the SEs add in quadrature; ``arm_se``). Arms with fewer than 2 values give an
    undefined SE."""
    out = []
    for a, b in combinations(arms, 2):
        (ma, sa), (mb, sb) = arm_se(arms[a], episodes), arm_se(arms[b], episodes)
        out.append(Comparison(a, b, ma - mb, float(np.hypot(sa, sb))))
    return out


def comparison_lines(metric: str, arms: dict[str, np.ndarray], digits: int = 2,
                     episodes: int | None = None) -> list[str]:
    """One bullet per pair: the difference, 2 SE, and whether it exceeds them."""
    return [f"- {metric}, {c.a} - {c.b}: {two_se_verdict(c.diff, c.se, digits)}"
            for c in compare(arms, episodes) if np.isfinite(c.diff)]


def reduce_steps(runs: Runs, key: str, how: str) -> np.ndarray:
    """Per seed: ``key`` over the training steps (>= 1), reduced by ``mean`` or ``max``."""
    steps = sorted({s for run in runs.values() for s in run if s >= 1})
    values = series(runs, key, steps).reshape(len(runs), len(steps))
    reducer = np.nanmax if how == "max" else np.nanmean
    return np.array([reducer(row) if np.isfinite(row).any() else np.nan for row in values])


# --- report ----------------------------------------------------------------------------------------
def _step_table(results: dict[str, Runs], name: str, steps: list[int], digits: int = 2) -> list[str]:
    values = {arm: derived(results[arm], steps)[name] for arm in results}
    return table(["step", *results], [[s, *(fmt_mean_se(v[:, j], digits) for v in values.values())]
                                      for j, s in enumerate(steps)]).splitlines()


def seeds_ran(results: dict[str, Runs], steps: int) -> str:
    """Which seeds of each arm reached the last step (what the tables average)."""
    return "; ".join(f"{arm}: seeds {', '.join(map(str, sorted(s for s, run in runs.items() if steps in run))) or 'none'}"
                     for arm, runs in results.items())


def finished(results: dict[str, Runs], steps: int) -> dict[str, Runs]:
    """Only the runs that reached the last step."""
    return {arm: {s: run for s, run in runs.items() if steps in run} for arm, runs in results.items()}


def reference_lengths(data_dir: Path) -> dict[str, float]:
    """Mean length of the oracle / all-GUI / all-tool plans on the validation tasks, and the share
    of tool-beneficial tasks (``beneficial``); empty when the run's data is not there."""
    import pandas as pd

    path = data_dir / "val.parquet"
    if not path.exists():
        return {}
    info = pd.read_parquet(path)["extra_info"]
    out = {k: float(np.mean([e["ref_steps"][k] for e in info])) for k in ("oracle", "gui", "tool")}
    return {**out, "beneficial": float(np.mean([bool(e["tool_beneficial"]) for e in info]))}


def reference_text(refs: dict[str, float]) -> str:
    if not refs:
        return ""
    return (f"On the validation tasks the oracle's mixed path takes {refs['oracle']:.1f} env steps on average, "
            f"all-GUI {refs['gui']:.1f}, all-tool {refs['tool']:.1f}; tools help (the oracle calls one) on "
            f"{refs['beneficial']:.0%} of them.")


def estimators_section(results: dict[str, Runs], steps: int, refs: dict[str, float], plot: str) -> list[str]:
    vs = logged_steps(results, VAL.format("success"))
    last = {arm: derived(runs, vs) for arm, runs in results.items()}
    lines = [
        "### (a) grpo vs gigpo vs hgpo (synchronous, verl's PPO loss)", "",
        f"Runs that reached step {steps}: {seeds_ran(results, steps)}. {reference_text(refs)}", "",
        "**Held-out success** (64 validation instances, one episode each at temperature 1; mean ± standard "
        "error over seeds):", "", *_step_table(results, "success", vs), "",
        "**Env steps per successful episode** (validation; shorter is better):", "",
        *_step_table(results, "steps_per_success", vs, 1), "",
        f"**Differences at the last validation (step {vs[-1] if vs else '-'})**, computed by the script "
        "(difference of means vs 2 standard errors of the difference; for success rates the SE of an arm "
        f"is at least the binomial SE of its {VAL_EPISODES} x seeds episodes):", "",
        *comparison_lines("success", {a: last_finite(d["success"]) for a, d in last.items()}, episodes=VAL_EPISODES),
        *comparison_lines("steps per success", {a: last_finite(d["steps_per_success"]) for a, d in last.items()}, 1),
        *comparison_lines("learning speed (success averaged over all validations)",
                          {a: np.nanmean(d["success"], axis=1) for a, d in last.items()},
                          episodes=VAL_EPISODES * len(vs)),
        "",
        "### (b) When to switch: tool use where tools are shorter vs where the GUI is", "",
        table(["arm", "step", "tool use, tools help (task)", "tool use, tools do not help (task)",
               "T where tools shorter (decision)", "T where GUI shorter (decision)", "goal met (decision)"],
              [[arm, vs[j], *(fmt_mean_se(d[k][:, j]) for k in ("tool_when_beneficial", "tool_when_not",
                                                                "decision_tool_when_shorter",
                                                                "decision_tool_when_gui_shorter")),
                goal_met(d["decision_tool_when_shorter"][:, j], d["decision_tool_when_gui_shorter"][:, j])]
               for arm, d in last.items() for j in (sorted({0, len(vs) - 1}) if vs else [])]),
    ]
    lines += ["", *comparison_lines("T where tools shorter minus T where GUI shorter (final, per seed)", {
        a: last_finite(d["decision_tool_when_shorter"]) - last_finite(d["decision_tool_when_gui_shorter"]) for a, d in last.items()})]
    lines += ["", f"![text_hybrid estimators]({plot})", ""]
    return lines


def goal_met(tool_rate: np.ndarray, gui_rate: np.ndarray) -> str:
    """``yes`` when the mean rates meet the goal (>= 80% where tools are shorter, <= 20% where not)."""
    return {"n/a": "n/a", "met": "yes"}.get(goal_gap(tool_rate, gui_rate), "no")


def goal_gap(tool_when_shorter: np.ndarray, tool_when_gui_shorter: np.ndarray) -> str:
    """How far the mean per-decision tool rates (one value per seed) are from the goal ("met" when
    both sides are), or "n/a" without finite values."""
    t, g = mean_and_se(tool_when_shorter)[0], mean_and_se(tool_when_gui_shorter)[0]
    if not (np.isfinite(t) and np.isfinite(g)):
        return "n/a"
    short, over = max(0.0, GOAL_TOOL - t), max(0.0, g - GOAL_GUI)
    return "met" if short == over == 0 else f"T {short:.2f} short of {GOAL_TOOL}, {over:.2f} over {GOAL_GUI}"


def old_logits_section(results: dict[str, Runs], steps: int, plot: str) -> list[str]:
    vs = logged_steps(results, VAL.format("success"))
    success = {arm: last_finite(derived(runs, vs)["success"]) for arm, runs in results.items()}
    arms = list(results)
    lines = [
        "### (c) Old logits under real staleness (verl's colocate_async, hgpo)", "",
        f"Runs that reached step {steps}: {seeds_ran(results, steps)}.", "",
        table(["metric", *arms], [[f"held-out success, step {vs[-1] if vs else '-'}",
                                   *(fmt_mean_se(success[a]) for a in arms)]]
              + [[label, *(fmt_mean_se(reduce_steps(results[a], key, how), 3 if "fraction" in label or "KL" in label
                                       else 2) for a in arms)] for label, (key, how) in ASYNC_KEYS.items()]),
    ]
    speed = {arm: np.nanmean(derived(runs, vs)["success"], axis=1) for arm, runs in results.items()}
    lines += ["", "**Differences**, computed by the script (as in (a)):", "",
              *comparison_lines("final success", success, episodes=VAL_EPISODES),
              *comparison_lines("learning speed (success averaged over all validations)", speed,
                                episodes=VAL_EPISODES * len(vs))]
    for label in ("PPO clip fraction", "rejection-masked fraction (token_k1 band)", "masked fraction, stale tokens",
                  "time per step (s)"):
        key, how = ASYNC_KEYS[label]
        lines += comparison_lines(label, {a: reduce_steps(results[a], key, how) for a in arms}, 3)
    lines += ["", f"![text_hybrid old logits]({plot})", ""]
    return lines


def plot(results: dict[str, Runs], panels: list[tuple[str, str]], title: str, path: Path,
         lines: dict[str, dict[str, float]] | None = None) -> None:
    """Validation curves, mean ± standard error over seeds, one panel per derived metric, with
    dashed reference lines per panel (``lines[name] = {label: y}``)."""
    vs = logged_steps(results, VAL.format("success"))
    with figure(path, 1, len(panels), (4.6 * len(panels), 3.8), 100, title, title_size=10) as axes:
        for ax, (name, panel_title) in zip(axes[0], panels):
            for i, (arm, runs) in enumerate(results.items()):
                if not runs:
                    continue
                values = derived(runs, vs)[name]
                stats = [mean_and_se(values[:, j]) for j in range(len(vs))]
                mean = np.array([m for m, _, _ in stats])
                se = np.nan_to_num(np.array([s for _, s, _ in stats]))
                ax.plot(vs, mean, "o-", color=f"C{i}", label=arm, markersize=3)
                ax.fill_between(vs, mean - se, mean + se, color=f"C{i}", alpha=0.2)
            for k, (label, y) in enumerate((lines or {}).get(name, {}).items()):
                ax.axhline(y, color=("0.1", "0.45", "0.7")[k % 3], linestyle="--", linewidth=0.9,
                           label=f"{label} ({y:.1f})")
            if name.startswith(("success", "tool", "decision")):
                ax.set_ylim(0, 1.02)
            ax.set(title=panel_title, xlabel="training step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)


def report(results: dict[str, dict[str, Runs]], steps: int, command: str, runs_info: list[dict], refs: dict[str, float],
           plots: dict[str, Path]) -> str:
    walls = [i["wall_s"] for i in runs_info]
    lines = [
        HEADING, "",
        # the recipe, the goal of (b) and the design of (c) are the page's own prose, above doc_sections.GENERATED
        f"{machine_line({'all': runs_info})} `{command}`. "
        + (f"Wall time per run {np.mean(walls):.0f} s (min {min(walls):.0f}, max {max(walls):.0f}, "
           f"{len(walls)} runs timed here)." if walls else "Wall times not recorded (runs reused)."),
        "",
    ]
    if "estimators" in results:
        lines += estimators_section(finished(results["estimators"], steps), steps, refs,
                                    os.path.relpath(plots["estimators"], REPO / "docs"))
    if "old_logits" in results:
        lines += old_logits_section(finished(results["old_logits"], steps), steps,
                                    os.path.relpath(plots["old_logits"], REPO / "docs"))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = study_parser(__doc__, REPO / "runs/text_hybrid_study", steps=25, seeds=[0, 1, 2])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    args = parser.parse_args(argv)
    # the command that makes these runs (``--report-only`` and output paths only re-report them)
    command = study_command("text_hybrid_study", parser, args, always=("steps", "seeds"))
    results: dict[str, dict[str, Runs]] = {p: {arm: {} for arm in PARTS[p]} for p in args.parts}
    runs_info: list[dict] = []
    arms = [(part, arm, env) for part in args.parts for arm, env in PARTS[part].items()]
    done = sweep(SCRIPT, args.out, [(arm, f"{env['MODE']}-{env['ADV']}-{env['LOSS']}-{env['PROVIDER']}", env)
                                    for _, arm, env in arms], args.seeds, args.steps, args.attempts, args.report_only)
    for (seed, arm, info, steps), (part, *_) in zip(done, arms * len(args.seeds)):
        runs_info += [info] if info else []
        if steps:
            results[part][arm][seed] = steps
    refs = reference_lengths(args.out / f"sync-grpo-vanilla-current-seed{args.seeds[0]}" / "data")
    plots = {"estimators": args.img / "text_hybrid_estimators.png", "old_logits": args.img / "text_hybrid_old_logits.png"}
    if "estimators" in results:
        plot(finished(results["estimators"], args.steps), [
            ("success", "held-out success"), ("steps_per_success", "env steps per success"),
            ("decision_tool_when_shorter", "T where tools shorter"),
            ("decision_tool_when_gui_shorter", "T where GUI shorter")],
            "text_hybrid, sync: grpo vs gigpo vs hgpo (mean ± SE over seeds)", plots["estimators"],
            {"steps_per_success": {f"{k} plan": refs[k] for k in ("oracle", "tool", "gui") if k in refs},
             "decision_tool_when_shorter": {"goal >= 0.8": GOAL_TOOL},
             "decision_tool_when_gui_shorter": {"goal <= 0.2": GOAL_GUI}})
    if "old_logits" in results:
        plot(finished(results["old_logits"], args.steps), [("success", "held-out success"),
                                                           ("steps_per_success", "env steps per success")],
             "text_hybrid, colocate_async: old-logit providers (mean ± SE)", plots["old_logits"])
    publish(target(args), HEADING, report(results, args.steps, command, runs_info, refs, plots))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
