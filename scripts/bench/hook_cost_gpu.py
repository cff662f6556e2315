"""verl-ext's own cost per training step on one H200: every hook's share of verl's step, per old-logit provider.

    python -m scripts.bench.hook_cost_gpu --dry-run                                 # every run's command
    python -m scripts.bench.hook_cost_gpu --out runs/hook_cost --budget-s 540       # run what is not done yet
    python -m scripts.bench.hook_cost_gpu --results runs/hook_cost --context "..."  # (re)write the docs section

``recipes/text_corridor/run_gpu.sh`` (FSDP2 + vLLM on one GPU, ``colocate_async`` with batches queued ahead of the
trainer, so stale tokens reach every provider), GRPO and verl's PPO loss, random weights of Qwen2.5 shapes
(``POINTS``; the 7B points' memory settings and what they cost are in their notes). Arms (``ARMS``): the providers
and ``verl`` (no verl-ext hook), on request the variants of ``ARM_OVERRIDES``; ``--repeats`` interleaved (every
arm once, in a rotated order, before any arm again), so host noise hits every arm alike; ``--gpus 0 1`` runs one
run per card side by side. Runs done in ``--out`` are skipped and ``--budget-s`` starts no run that would not
finish in time, so the same command continues; a run folder keeps ``metrics.jsonl``, ``run.json`` and its log's
tail only, small enough to carry between machines.

The table, per model size and arm: the hooks' share of the step (median over the steps after ``--warmup``),
each hook's share (mean), ``timing_s/old_log_prob`` against plain verl's, the bytes verl-ext's state holds in
GPU and host memory, and the targets (``TARGET_SHARE``, ``SNAPSHOT_SAVE_TARGET``); a failed arm is listed with
the error its log ends with.

Docs section (``--write``; printed otherwise): docs/results.md, "## GPU: per-step breakdown" (the hook-cost tables).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from scripts.bench.gpu_step_breakdown import HEADING
from scripts.bench.launch import REPO, RunSpec, card_slots, finished_walls, launch, load_steps, run
from scripts.bench.learning_runs import after_warmup, mean_of, median_of
from scripts.bench.report import gib, pct, publish, script_parser, target
from scripts.bench.report import table as md_table  # table() below is the docs section

TIME = "verl_ext/time/"
MEM = "verl_ext/mem/"
SHARE = f"{TIME}share_of_step"
TOTAL = f"{TIME}total"
PLAIN = "verl"
ARMS = {"current": "current", "snapshot": "snapshot", "ewma": "ewma", "loglinear": "loglinear", PLAIN: "none",
        "dedicated": "dedicated", "interrupt": "interrupt", "ewma_device": "ewma", "snapshot_device": "snapshot",
        "ewma_one_pass": "ewma", "snapshot_bf16": "snapshot"}
# arms that differ from their provider's arm in its settings only: the live weights wait on the GPU during a
# swap; ewma_one_pass is ewma_device whose fresh tokens take the EWMA too (fresh_exact=false), so that
# one forward under the EWMA weights stands in for verl's own and there is no extra forward; snapshot_bf16
# stores the copies in bfloat16 (exact for the bf16 forward, half the host memory and copy time)
ARM_OVERRIDES = {"ewma_device": ("algorithm.old_logits.swap_backup=device",),
                 "snapshot_device": ("algorithm.old_logits.swap_backup=device",),
                 "ewma_one_pass": ("algorithm.old_logits.swap_backup=device",
                                   "algorithm.old_logits.ewma.fresh_exact=false"),
                 "snapshot_bf16": ("algorithm.old_logits.snapshot.dtype=bf16",)}
DEFAULT_ARMS = ["current", "snapshot", "ewma", "loglinear", PLAIN]
TARGET_SHARE = {"current": 0.03, "ewma": 0.03, "loglinear": 0.03}  # by provider: of the step, all hooks together
# Timed by the workers on the GPU stream (verl_ext.old_logits.worker_side.WORKER_SWAP_HOOK): the driver's
# call returns before the copies end, and the next span on the driver (an extra forward) may wait for
# them, so adding both counts that wait twice: the total is an upper bound by up to this hook's time.
DEVICE_ONLY = ("weight_swap_gpu",)
SNAPSHOT_SAVE_TARGET = 0.01  # the save's time left on the critical path: queueing the copies + waiting for them
SAVE_HOOKS = ("snapshot_save", "snapshot_save_wait")
SCRIPT = "text_corridor/run_gpu.sh"
COMMON_ENV = {"ADV": "grpo", "LOSS": "vanilla", "MODE": "colocate_async", "ROLLOUT": "vllm", "N_GPUS": "1"}
# every arm: no checkpoint (a 7B one is ~100 GB and no part of a step)
COMMON_OVERRIDES = ("trainer.save_freq=-1",)


@dataclass(frozen=True)
class Point:
    """One model size: its ``make-tiny-model`` architecture and the settings it needs on one card."""

    arch: str
    env: tuple[tuple[str, str], ...] = ()
    overrides: tuple[str, ...] = ()
    note: str = ""
    init_device: str = "cpu"  # where make-tiny-model draws the random weights (cuda: 7B in seconds, not minutes)


POINT_7B = Point(
    "qwen2.5-7b",
    env=(("BOUND", "2"), ("WARMUP", "1")),
    overrides=("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",),
    note="Adam state offloaded to host memory (optimizer_offload=true) and trajectories spanning at most 2 "
    "weight versions (BOUND=2: one stale version, one snapshot copy) in every arm, to fit one 139 GB card and "
    "the host's memory; earlier runs used BOUND=1, which in verl's count of "
    "versions spanned evicts every stale sample (no stale token: their provider targets are not measured)",
    init_device="cuda",
)
POINTS = {
    "0.5b": Point("qwen2.5-0.5b"),
    "1.5b": Point("qwen2.5-1.5b"),
    "7b": POINT_7B,
    # the 7B point's settings on two cards: FSDP2 shards the parameters, Adam state and the EWMA shadow
    # over both (the batch doubles with N_GPUS), so the ewma arm that does not fit one card runs
    "7b_2gpu": replace(POINT_7B, env=(*POINT_7B.env, ("N_GPUS", "2")),
                       note="the 7b point's settings on two cards (N_GPUS=2: FSDP2 over both, the batch doubled)"),
    # the snapshot save's cost at 7B on a host too small for two copies: a save happens every step whether or
    # not a batch holds stale tokens, so its critical-path share needs no stale tokens (the BOUND=1 setting)
    "7b_bound1": replace(POINT_7B, env=(("BOUND", "1"), ("WARMUP", "1")),
                         note="the 7b point with BOUND=1 (one snapshot copy, no stale tokens: the save's cost only)"),
}
DEFAULT_POINTS = ["0.5b", "1.5b", "7b"]  # one card each; 7b_2gpu on request


@dataclass(frozen=True)
class Run:
    point: str
    arm: str
    repeat: int

    def folder(self, out: Path) -> Path:
        return out / self.point / f"{self.arm}_r{self.repeat}"

    def env(self, out: Path, models: Path, steps: int, kv_cache_bytes: int = 0) -> dict[str, str]:
        kv_cache = {"KV_CACHE_BYTES": str(kv_cache_bytes)} if kv_cache_bytes else {}
        return {**COMMON_ENV, **dict(POINTS[self.point].env), **kv_cache, "PROVIDER": ARMS[self.arm],
                "MODEL": str(model_dir(self.point, models)), "OUT": str(self.folder(out)), "STEPS": str(steps)}

    def overrides(self) -> list[str]:
        return [*COMMON_OVERRIDES, *POINTS[self.point].overrides, *ARM_OVERRIDES.get(self.arm, ())]

    def spec(self, out: Path, models: Path, steps: int, kv_cache_bytes: int = 0) -> RunSpec:
        return RunSpec(f"{self.point} {self.arm} repeat {self.repeat}", SCRIPT, self.folder(out), steps,
                       self.env(out, models, steps, kv_cache_bytes), self.overrides())


def plan(points: list[str], arms: list[str], repeats: int) -> list[Run]:
    """Every (point, arm, repeat), repeats interleaved: all arms of repeat r (in an order rotated by
    r, so no arm always runs first after a model's start) before any arm of repeat r + 1."""
    runs = []
    for repeat in range(repeats):
        for point in points:
            order = arms[repeat % len(arms):] + arms[: repeat % len(arms)]
            runs += [Run(point, arm, repeat) for arm in order]
    return runs


def model_dir(point: str, models: Path) -> Path:
    """Where ``point``'s random weights are: one folder per architecture, shared by the points that use it."""
    return models / POINTS[point].arch


def model_command(point: str, models: Path) -> list[str]:
    return ["verl-ext", "make-tiny-model", str(model_dir(point, models)), "--arch", POINTS[point].arch,
            "--dtype", "bfloat16", "--seed", "0", "--device", POINTS[point].init_device]


def execute(spec: RunSpec, attempts: int, env: dict[str, str]) -> None:
    """``run``, keeping ``metrics.jsonl``, ``run.json`` and the log's tail only, so that the results
    folder stays small enough to carry between machines; a failed run keeps no metrics (the table
    would count it)."""
    print(f"[hook_cost] {spec.label} {env.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    try:
        run(spec, attempts, env)
    except RuntimeError:
        (spec.out / "metrics.jsonl").unlink(missing_ok=True)
        raise
    finally:
        logs = sorted(spec.out.glob("run[0-9]*.log"))
        if logs:
            (spec.out / "run_tail.log").write_bytes(logs[-1].read_bytes()[-200_000:])
        for path in [*logs, spec.out / "data", spec.out / "checkpoints"]:
            subprocess.run(["rm", "-rf", str(path)], check=False)


def run_all(args: argparse.Namespace) -> int:
    runs = plan(args.points, args.arms, args.repeats)
    specs = [r.spec(args.out, args.models, args.steps, args.kv_cache_bytes) for r in runs]
    if args.dry_run:
        for command in dict.fromkeys(" ".join(model_command(point, args.models)) for point in args.points):
            print(command)  # once per model folder: points of one architecture share it
        for spec in specs:
            print(spec.command())
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.out / "machine.json").exists():
        (args.out / "machine.json").write_text(json.dumps(describe_machine(args.context)))
    for point in args.points:
        if not (model_dir(point, args.models) / "config.json").exists():
            subprocess.run(model_command(point, args.models), check=True)
        _record_parameters(args.out, point, args.models)
    # one attempt: a failed run is started again by the next call of the same command
    left = launch(specs, card_slots(args.gpus), attempts=1, execute=execute, budget_s=args.budget_s,
                  expected_s=lambda spec: max(60.0, 1.2 * expected_wall(args.out, spec.out.parent.name)))
    print(f"[hook_cost] {len(runs) - len(left)} of {len(runs)} runs done"
          + (f"; {len(left)} left: run the same command again" if left else ""))
    return 0


def expected_wall(out: Path, point: str) -> float:
    """How long a run of ``point`` takes: the longest finished one there (any point's, else 0)."""
    return max(finished_walls(out / point) or finished_walls(out) or [0.0])


def describe_machine(context: str) -> dict:
    """The card, the versions and the timer's own cost on this machine, each measured in a child
    process: CUDA initialised here would hold GPU memory through every run."""
    def child(*args: str) -> str:  # run from the repository root: scripts.bench is importable there
        return subprocess.run([sys.executable, *args], check=True, capture_output=True, text=True, cwd=REPO).stdout

    info = json.loads(child("-c", f"import json; from scripts.bench.gpu_step_breakdown import machine_info; "
                                  f"print(json.dumps(machine_info({context!r})))"))
    info["timer_overhead_us"] = json.loads(child("-m", "scripts.bench.hook_timer_overhead", "--json"))
    return info


def _record_parameters(out: Path, point: str, models: Path) -> None:
    path = out / "parameters.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    if point not in known:
        known[point] = json.loads((model_dir(point, models) / "verl_ext_tiny_model.json").read_text())["parameters"]
        path.write_text(json.dumps(known))


# ----------------------------------------------------------------------------- the table


def _ratio(x: float, base: float) -> str:
    return "—" if x != x or base != base or not base else f"{x / base:.2f}x"


def hook_share(hook: str):
    """A step's share of ``timing_s/step`` spent in ``hook`` (0 on a step where it did not run)."""
    return lambda m: m.get(f"{TIME}{hook}", 0.0) / m["timing_s/step"] if TOTAL in m else None


def memory(steps: list[dict], where: str) -> float:
    """Largest bytes verl-ext's state held in ``where`` (gpu | host) on any step, all state summed."""
    return max((sum(v for k, v in m.items() if k.startswith(MEM) and k.endswith(f"/{where}_bytes"))
                for m in steps), default=0.0)


def target_cell(arm: str, share: float, save_share: float, stale: float) -> tuple[str, str | None]:
    """(table cell, sentence for the closing note when the target is missed or not measured). ``stale``:
    the share of trained tokens from an older weight version; with none, the stale-token path of a
    provider (extra forwards, swaps, the EWMA anchor) never ran, so a share target is not measured.
    ``snapshot``'s target, the save's time on the critical path, is paid at every version whatever
    the batches hold."""
    if ARMS[arm] in TARGET_SHARE:
        if stale == 0:
            why = "not measured: no stale token in the counted steps"
            return why, why
        limit, value, what = TARGET_SHARE[ARMS[arm]], share, "hooks"
    elif ARMS[arm] == "snapshot":
        limit, value, what = SNAPSHOT_SAVE_TARGET, save_share, "save on the critical path"
    else:
        return "—", None
    if value != value:
        return "no data", None
    if value <= limit:
        return f"{what} ≤ {limit:.0%}: met", None
    miss = f"{what} {value:.2%} > {limit:.0%}: missed by {(value - limit) * 100:.2f} pp"
    return miss, miss


def table(folders: list[Path], warmup: int) -> str:
    """The docs section: what every run is, then each results folder (one machine and code version) in turn."""
    lines = [
        HEADING, "",
        # what the arms run and what the columns mean are the page's own prose, above doc_sections.GENERATED
        f"`python -m scripts.bench.hook_cost_gpu --results ...`: shares over the steps after step {warmup}.",
    ]
    missed: list[str] = []
    for results in folders:
        lines += folder_lines(results, warmup, missed)
    lines += ["", "Targets missed or not measured: " + "; ".join(missed) + "." if missed else
              "Every target is met: `current`, `ewma` and `loglinear` hooks at most 3% of the step, `snapshot`'s "
              "save at most 1% on the critical path.", ""]
    return "\n".join(lines)


def folder_lines(results: Path, warmup: int, missed: list[str]) -> list[str]:
    """One results folder's tables (its card, versions and run context first); appends the targets its
    arms miss to ``missed``."""
    info = json.loads((results / "machine.json").read_text())
    parameters = json.loads((results / "parameters.json").read_text())
    points = [p for p in POINTS if (results / p).is_dir()]
    name = results.resolve().relative_to(REPO) if results.resolve().is_relative_to(REPO) else results
    lines = ["", f"### `{name}`: {info['card']}", "",
             f"torch {info['torch']}, vLLM {info['vllm']}, verl {info['verl']}, transformers {info['transformers']}."
             + (f" Run context: {info['context']}" if info.get("context") else "")]
    overhead = info.get("timer_overhead_us", {})
    if overhead:
        lines += ["", "Timing itself (`scripts/bench/hook_timer_overhead.py`, on this machine): "
                  + "; ".join(f"{us['span']:.1f} µs per span on the {clock} clock, {us['collect']:.2f} µs per span "
                              "to read once per step" for clock, us in overhead.items()) + "."]
    for point in points:
        runs = {arm: [load_steps(f / "metrics.jsonl") for f in sorted((results / point).glob(f"{arm}_r*"))]
                for arm in ARMS}
        runs = {arm: r for arm, r in runs.items() if any(r)}
        steps = {arm: after_warmup(r, warmup) for arm, r in runs.items()}
        fp32 = 4.0 * parameters[point]
        plain_old = median_of(steps.get(PLAIN, []), lambda m: m.get("timing_s/old_log_prob"))
        lines += ["", f"#### {point}: {parameters[point] / 1e6:.0f} M parameters ({POINTS[point].arch})"
                  + (f"; {POINTS[point].note}" if POINTS[point].note else ""), ""]
        rows = []
        hooks = sorted({k.removeprefix(TIME) for s in steps.values() for m in s for k in m
                        if k.startswith(TIME) and k not in (SHARE, TOTAL)})
        for arm, arm_steps in steps.items():
            share = median_of(arm_steps, lambda m: m.get(SHARE))
            save = median_of(arm_steps, lambda m: sum(hook_share(h)(m) for h in SAVE_HOOKS) if TOTAL in m else None)
            stale = mean_of(arm_steps, stale_share)
            cell, miss = target_cell(arm, share, save, stale)
            if miss and miss.startswith("not measured"):
                missed.append(f"{results.name} {point} {arm}: {miss}")
            elif miss:
                top = max(hooks, key=lambda h: mean_of(arm_steps, hook_share(h)))
                missed.append(f"{results.name} {point} {arm}: {miss} (largest hook: {top}, "
                              f"{pct(mean_of(arm_steps, hook_share(top)))} of the step on average)")
            old = median_of(arm_steps, lambda m: m.get("timing_s/old_log_prob"))
            rows.append([arm, f"{len(runs[arm])} x {len(arm_steps) // max(1, len(runs[arm]))}",
                         f"{median_of(arm_steps, lambda m: m.get('timing_s/step')):.2f}", pct(share), cell,
                         f"{old:.3f}", _ratio(old, plain_old), gib(memory(arm_steps, "gpu"), fp32),
                         gib(memory(arm_steps, "host"), fp32), pct(stale) if stale == stale else "—"])
        failures = failed_arms(results / point, runs)
        for arm, reason in failures.items():
            rows.append([arm, "0 finished", "—", "—", "not measured: the run failed (below)", *["—"] * 5])
            if ARMS[arm] in TARGET_SHARE or ARMS[arm] == "snapshot":
                missed.append(f"{results.name} {point} {arm}: the run failed ({reason}): its target is not measured")
        lines.append(md_table(["arm", "runs x steps", "step (s)", "verl-ext hooks, share of step", "target",
                            "old_log_prob (s)", "vs plain verl", "GPU memory", "host memory", "stale tokens"], rows))
        for arm, reason in failures.items():
            lines += ["", f"`{arm}` failed: {reason} (its folder's `run_tail.log`)."]
        ext_arms = [a for a in steps if a != PLAIN]
        share_rows = [[hook, *(pct(mean_of(steps[a], hook_share(hook))) for a in ext_arms)] for hook in hooks]
        share_rows.append(["**all hooks**", *(pct(mean_of(steps[a], lambda m: m.get(SHARE))) for a in ext_arms)])
        lines += ["", md_table(["hook: share of step (mean)", *ext_arms], share_rows)]
        for arm in (a for a in ext_arms if any(f"{TIME}{h}" in m for h in DEVICE_ONLY for m in steps[a])):
            without = median_of(steps[arm], lambda m: (m[SHARE] - sum(m.get(f"{TIME}{h}", 0.0) for h in DEVICE_ONLY)
                                                      / m["timing_s/step"]) if SHARE in m else None)
            lines += ["", f"`{arm}`: {', '.join(DEVICE_ONLY)} is GPU-stream time of the weight copies, which the "
                      "driver's next span may also wait for; without it the hooks' share is "
                      f"{pct(without)} (median), the lower bound of the total above."]
        for arm in (a for a in ext_arms if ARMS[a] in ("snapshot", "ewma")):
            extra = mean_of(steps[arm], lambda m: m.get(f"{TIME}extra_forwards", 0.0) if TOTAL in m else None)
            if extra == extra and extra > 0:
                lines += ["", f"`{arm}`'s extra forwards (one per weight set a batch needs beyond verl's own pass: "
                          + ("the older versions present" if ARMS[arm] == "snapshot" else
                             "the EWMA weights, on steps with stale tokens; fresh tokens keep verl's exact pass")
                          + f") take {extra:.3f} s per step on average, "
                          + (f"{_ratio(extra, plain_old)} verl's own old-log-prob phase ({plain_old:.3f} s), which "
                             "is their floor." if plain_old == plain_old else
                             "not compared with verl's own old-log-prob phase (their floor): no `verl` run here.")]
    return lines


def stale_share(step: dict) -> float | None:
    """Share of a step's trained tokens from an older weight version (``old_logits/stale/frac_d0`` is
    the share with none); None where no provider logged it (plain verl)."""
    fresh = step.get("old_logits/stale/frac_d0")
    return None if fresh is None else 1.0 - fresh


def failed_arms(point_dir: Path, finished: dict[str, list]) -> dict[str, str]:
    """Arms with a run folder at ``point_dir`` but no finished run -> the error their log ends with."""
    failed = {}
    for arm in (a for a in ARMS if a not in finished):
        tails = sorted(point_dir.glob(f"{arm}_r*/run_tail.log"))
        if tails:
            errors = [line.strip() for line in tails[-1].read_text(errors="replace").splitlines()
                      if re.match(r"\s*[\w.]*(Error|Exception)\b.*:", line)]
            failed[arm] = (errors[-1][:160] + ("..." if len(errors[-1]) > 160 else "")) if errors else "no error in its log"
    return failed


def main(argv: list[str]) -> int:
    parser = script_parser(__doc__, context=True)
    parser.add_argument("--points", nargs="+", choices=list(POINTS), default=DEFAULT_POINTS)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=DEFAULT_ARMS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first --warmup are not counted)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "hook_cost")
    parser.add_argument("--models", type=Path, default=Path("/tmp/verl_ext_hook_cost_models"))
    parser.add_argument("--gpus", type=int, nargs="*", default=[], metavar="INDEX",
                        help="cards to run on side by side, one run per card at a time, each pulling the plan's next run "
                        "(CUDA_VISIBLE_DEVICES; thread pools capped to each run's share of the cores); none given: one "
                        "run at a time on every card the process sees")
    parser.add_argument("--kv-cache-bytes", type=int, default=0,
                        help="a fixed vLLM KV cache per run (run_gpu.sh's KV_CACHE_BYTES): needed when other runs "
                        "share the card, whose freeing memory breaks vLLM's start-up profiling; 0: vLLM profiles")
    parser.add_argument("--budget-s", type=float, default=540.0, help="start no run that would end after this")
    parser.add_argument("--dry-run", action="store_true", help="print every run's command and exit")
    parser.add_argument("--results", type=Path, nargs="+",
                        help="folders written by --out (one machine and code version each): (re)write the docs section")
    args = parser.parse_args(argv)
    if args.steps - args.warmup < 5:
        parser.error(f"--steps {args.steps} - --warmup {args.warmup} < 5: the medians need >= 5 steps per run")
    if args.results is None:
        return run_all(args)
    section = table(args.results, args.warmup)
    publish(target(args), HEADING, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
