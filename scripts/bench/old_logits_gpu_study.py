"""Old-logit providers end to end on one H200: bf16 vLLM rollout against the FSDP2 trainer, under real staleness.

    python -m scripts.bench.old_logits_gpu_study --dry-run        # every unfinished run's command, runs nothing
    python -m scripts.bench.old_logits_gpu_study --steps 60 --seeds 0 1 2

``recipes/text_corridor/run_gpu.sh`` (verl's ``main_ppo``, colocate_async, FSDP2 + vLLM) with a tiny random
Qwen2 (hidden 256, 4 layers: head dim 64 for vLLM's FlashAttention) for every arm of a fair comparison: the
same ``ppo_ewma`` loss and rollout correction (token IS truncated at 2 + token_k1 band [0.5, 2]); only the
old-logit source differs (``ARMS``), plus fp32-rollout controls for ``current`` and ``snapshot``. Staleness
from ``num_warmup_batches`` 3 and 6 (bound 2x), ``--steps`` (>= 60) steps, ``--seeds`` (>= 3) seeds per arm.

Runs share the card, at most ``--parallel`` at a time, each vLLM engine with a fixed KV cache and starts spaced,
while the host has ``--min-free-gb`` available (the options' help says why); the study runs 2 TransferQueue
storage units and 2 reward workers (``SHARED_OVERRIDES``). Each run writes ``metrics.jsonl`` and ``run.json``
under ``--out/<warmup>/<arm>/seed<k>``; finished runs are reused. The report (``--report-only``): success
curve, area under it, steps to 0.8, masked fraction by cause (fresh = numerics, stale), clip fraction, max IS
ratio, collapses, time per step; mean ± SE, paired differences with 2-SE verdicts over the seeds an arm shares
with ``current``. ``--keep-runs SOURCE`` copies a machine's finished runs into ``--out``, cut to ``REPORT_KEYS``.

Docs section (``--write``; printed otherwise): docs/results.md, "## GPU: old-logit study".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from scripts.bench.launch import REPO, RunSpec, card_slots, finished_walls, gpu_environment, launch, load_steps, run
from scripts.bench.learning_runs import run_folder, series
from scripts.bench.report import script_parser, publish, table, target
from scripts.bench.stats import collapsed, fmt_mean_se, paired_verdict

HEADING = "## GPU: old-logit study"
SCRIPT = "text_corridor/run_gpu.sh"  # under recipes/
FP32_TRAINER = ("++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
                "++actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
                "++actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32")
# The correction every arm shares (recipes/async_agentic's), and validation for the success curve.
SHARED_OVERRIDES = (
    "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0",
    "algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
    "trainer.test_freq=10", "trainer.val_before_train=true", "trainer.save_freq=-1",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    # Host memory per run, so more runs share a machine: verl's 8 reward workers (0.52 GB each) and 8
    # TransferQueue storage units (0.38 GB each, Ray's figures on the H200) serve a 32-row batch with 2.
    "reward.num_workers=2", "transfer_queue.backend.SimpleStorage.num_data_storage_units=2",
)
# STOP_ON_ZERO_SIGNAL: the corridor saturates, and a step where every group succeeds carries no signal;
# the study trains on through it (run_gpu.sh would stop there, given a MODEL). VLLM_USE_DEEP_GEMM=0:
# vLLM's fp8 path otherwise warms up DeepGEMM's kernels for ~5 min per engine before the first step.
SHARED_ENV = {"MODE": "colocate_async", "ADV": "hgpo", "LOSS": "ppo_ewma", "ROLLOUT": "vllm", "LR": "3e-3",
              "GPU_MEM": "0.1", "STOP_ON_ZERO_SIGNAL": "false", "VLLM_USE_DEEP_GEMM": "0"}
# How far the policy moves per version. `base` is the corridor at the cpu runs' learning rate, which every
# arm solves; `large_steps` is the mechanism study's lr x10 with 4 epochs, where on CPU `current` lost
# 0.06 final reward against `snapshot` : the regime the repair is for.
SETTINGS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {  # name -> (env, extra overrides)
    "base": ({}, ()),
    "large_steps": ({"LR": "3e-2"}, ("actor_rollout_ref.actor.ppo_epochs=4",)),
    # vLLM's online fp8 (verl's rollout.quantization=fp8) against the bf16 trainer: a numerics mismatch
    # that fires the band on fresh tokens, which bf16 alone never did (masked fresh 0.0000 above)
    "fp8_rollout": ({"ROLLOUT_QUANT": "fp8"}, ()),
    "bf16_rollout": ({"ROLLOUT_QUANT": "none"}, ()),  # the fp8 settings' control, run beside them
    "fp8_rollout_kv": ({"ROLLOUT_QUANT": "fp8_kv"}, ()),
}
ARMS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {  # label -> (env, extra overrides)
    "current": ({"PROVIDER": "current"}, ()),
    "rollout": ({"PROVIDER": "rollout"}, ()),
    "snapshot": ({"PROVIDER": "snapshot"}, ()),
    "ewma": ({"PROVIDER": "ewma"}, ()),
    "ewma_bound": ({"PROVIDER": "ewma_bound"}, ()),
    "loglinear": ({"PROVIDER": "loglinear"}, ()),
    "current, fp32 rollout": ({"PROVIDER": "current", "ROLLOUT_DTYPE": "float32"}, FP32_TRAINER),
    "snapshot, fp32 rollout": ({"PROVIDER": "snapshot", "ROLLOUT_DTYPE": "float32"}, FP32_TRAINER),
}
# What the report and the EWMA calibration check read: --keep-runs cuts a run's metrics.jsonl to these
# (a 60-step run logs ~160 metrics a step, 0.4 MB; these make it 35 kB).
REPORT_KEYS = (
    "critic/score/mean", "val-aux/verl_ext/text_corridor/success/mean@1", "actor/pg_clipfrac", "timing_s/step",
    "rollout_corr/kl", "rollout_corr/rollout_is_max", "training/rollout_probs_diff_max",
    "training/off_policy/trajectory_staleness/max", "training/off_policy/trajectory_staleness/mean",
    "old_logits/stale/version_gap_max", "old_logits/correction/stale_token_frac",
    *(f"old_logits/correction/{what}_{cause}" for what in ("kl", "abs_log_ratio_p99") for cause in ("fresh", "stale")),
    *(f"old_logits/correction/{what}_{cause}" for what in ("masked", "truncated")
      for cause in ("fresh", "stale", "staleness_excess")),
    "old_logits/ewma/beta", "old_logits/ewma/age_steps", "old_logits/token_age_steps/mean",
    "old_logits/token_age_steps/stale_mean",
)
WARMUPS = (3, 6)
SUCCESS = "critic/score/mean"  # the episode success (verl_ext.rewards.text_env)
VAL_SUCCESS = "val-aux/verl_ext/text_corridor/success/mean@1"
TARGET = 0.8


# vLLM's sleep() compares the card's free memory before and after, which other runs on the card change
# ("Memory usage increased after sleeping": 12 of 16 failures on 2026-11-28); an engine kept awake
# never sleeps. Memory only: the weights still reach vLLM by the same update after every step.
ENGINE_AWAKE = ("actor_rollout_ref.rollout.free_cache_engine=false",)


def run_spec(arm: str, warmup: int, seed: int, steps: int, out: Path, kv_cache_bytes: int = 0,
             engine_awake: bool = False, setting: str = "base") -> dict:
    """Environment and arguments of one run of ``SCRIPT``; runs of a setting other than ``base``
    live under ``out/<setting>``."""
    env, extra = ARMS[arm]
    setting_env, setting_extra = SETTINGS[setting]
    root = out if setting == "base" else out / setting
    run_dir = root / f"warmup{warmup}" / run_folder(arm) / f"seed{seed}"
    kv_cache = {"KV_CACHE_BYTES": str(kv_cache_bytes)} if kv_cache_bytes else {}
    return {
        "arm": arm, "warmup": warmup, "seed": seed, "out": str(run_dir),
        "env": {**SHARED_ENV, **setting_env, **env, **kv_cache, "WARMUP": str(warmup), "BOUND": str(2 * warmup),
                "SEED": str(seed), "STEPS": str(steps), "OUT": str(run_dir), "MODEL": str(run_dir / "model")},
        "args": [*SHARED_OVERRIDES, *setting_extra, *extra, *(ENGINE_AWAKE if engine_awake else ())],
    }


def all_specs(args: argparse.Namespace) -> list[dict]:
    """Seed-major, so a study cut short still compares every arm."""
    return [run_spec(arm, warmup, seed, args.steps, args.out, args.kv_cache_bytes, args.engine_awake, args.setting)
            for seed in args.seeds for warmup in args.warmups for arm in args.arms]


def heading(setting: str) -> str:
    return HEADING if setting == "base" else f"{HEADING}, {setting.replace('_', ' ')}"


def execute(spec: RunSpec, attempts: int, env: dict[str, str]) -> None:
    """``run``, after making the run's tiny model (head dim 256 / 4 = 64: vLLM's FlashAttention takes it)."""
    model = Path(spec.env["MODEL"])
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "verl_ext.cli", "make-tiny-model", str(model), "--hidden-size",
                        "256", "--layers", "4", "--seed", spec.env["SEED"]], check=True, env={**os.environ, **env})
    print(f"{spec.label}: done in {run(spec, attempts, env):.0f} s", flush=True)


def run_all(args: argparse.Namespace) -> None:
    """Runs every unfinished spec, ``--parallel`` slots spread over ``--gpus``, starts spaced (see the
    module doc); starts none that would end after ``--budget-s`` (a run's expected wall time: the
    longest one finished, else ``--run-s``). A failed run is started again up to ``--retries`` times
    (start-up failures on a crowded host are mostly transient: a port taken between verl's pick and
    its bind, a thread limit)."""
    info = gpu_environment()
    specs = [RunSpec(f"{s['arm']} warmup {s['warmup']} seed {s['seed']}", SCRIPT, Path(s["out"]), args.steps, s["env"],
                     s["args"], {**info, "overrides": s["args"]}) for s in all_specs(args)]
    launch(specs, card_slots(args.gpus, args.parallel), attempts=args.retries + 1, execute=execute,
           start_gap_s=args.start_gap_s if args.kv_cache_bytes else args.stagger_s, min_free_gb=args.min_free_gb,
           budget_s=args.budget_s, expected_s=lambda _: max(finished_walls(args.out), default=args.run_s))


def keep_runs(source: Path, args: argparse.Namespace) -> list[str]:
    """Copies every run of the plan that reached ``--steps`` under ``source`` (another machine's
    ``--out``) into ``--out``, its metrics cut to ``REPORT_KEYS``; an existing finished run is kept.
    Returns the runs copied."""
    copied = []
    for spec in all_specs(args):
        src = source / Path(spec["out"]).relative_to(args.out)
        dst = Path(spec["out"])
        if args.steps not in load_steps(src / "metrics.jsonl") or args.steps in load_steps(dst / "metrics.jsonl"):
            continue
        dst.mkdir(parents=True, exist_ok=True)
        with open(src / "metrics.jsonl") as lines, open(dst / "metrics.jsonl", "w") as cut:
            for line in lines:
                record = json.loads(line)
                record["data"] = {k: v for k, v in record["data"].items() if k in REPORT_KEYS}
                cut.write(json.dumps(record) + "\n")
        if (src / "run.json").exists():
            (dst / "run.json").write_text((src / "run.json").read_text())
        copied.append(f"{spec['arm']} warmup {spec['warmup']} seed {spec['seed']}")
    return copied


# --- report --------------------------------------------------------------------------------------
def steps_to(curve: np.ndarray, target: float, window: int = 5) -> np.ndarray:
    """Per seed: the first step whose ``window``-step moving average reaches ``target`` (NaN: never)."""
    out = np.full(curve.shape[0], np.nan)
    for i, row in enumerate(curve):
        smooth = np.convolve(np.nan_to_num(row), np.ones(window) / window, mode="valid")
        hit = np.flatnonzero(smooth >= target)
        if len(hit):
            out[i] = hit[0] + window
    return out


def summary(runs: dict[int, dict], n_steps: int, phase_steps: int) -> dict[str, np.ndarray]:
    """Per seed: the success curve's summaries over all ``n_steps``; the correction's and the clip's
    over the learning phase, the first ``phase_steps`` (the corridor saturates: once every episode
    succeeds the policy stops moving and stale tokens stop drifting, in every arm alike)."""
    steps, runs = list(range(1, n_steps + 1)), dict(sorted(runs.items()))
    success = series(runs, SUCCESS, steps)
    phase = slice(0, phase_steps)
    final = np.nanmean(success[:, -5:], axis=1)
    peak = np.nanmax(np.array([np.convolve(np.nan_to_num(r), np.ones(5) / 5, mode="valid") for r in success]), axis=1)
    row = {
        "final success (last 5 steps)": final,
        "success AUC": np.nanmean(success, axis=1),
        f"steps to {TARGET}": steps_to(success, TARGET),
        "collapses": collapsed(final, peak),
    }
    for label, key in (("numerics KL, fresh tokens", "old_logits/correction/kl_fresh"),
                       ("p99 |log ρ|, fresh tokens", "old_logits/correction/abs_log_ratio_p99_fresh"),
                       ("masked, fresh tokens (numerics)", "old_logits/correction/masked_fresh"),
                       ("masked, stale tokens", "old_logits/correction/masked_stale"),
                       ("IS-truncated, stale tokens", "old_logits/correction/truncated_stale"),
                       ("clip fraction", "actor/pg_clipfrac"), ("time per step (s)", "timing_s/step")):
        row[label] = np.nanmean(series(runs, key, steps)[:, phase], axis=1)
    row["max IS ratio"] = np.nanmax(series(runs, "rollout_corr/rollout_is_max", steps)[:, phase], axis=1)
    return row


def load_results(args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """results[warmup][arm] = {seed: {step: metrics}} of the runs that reached ``--steps``."""
    results: dict[int, dict[str, dict[int, dict]]] = {}
    infos = []
    for spec in all_specs(args):
        run_dir = Path(spec["out"])
        steps = load_steps(run_dir / "metrics.jsonl")
        if args.steps in steps:
            results.setdefault(spec["warmup"], {}).setdefault(spec["arm"], {})[spec["seed"]] = steps
            if (run_dir / "run.json").exists():
                infos.append(json.loads((run_dir / "run.json").read_text()))
    return results, infos


def report(args: argparse.Namespace) -> str:
    results, infos = load_results(args)
    card = infos[0] if infos else {}
    walls = [i["wall_s"] for i in infos]
    setting_env, setting_extra = SETTINGS[args.setting]
    lr = setting_env.get("LR", SHARED_ENV["LR"])
    lines = [heading(args.setting), "",
             f"`python -m scripts.bench.old_logits_gpu_study --steps {args.steps} --seeds "
             f"{' '.join(map(str, args.seeds))}"
             + ("" if args.setting == "base" else f" --setting {args.setting}")
             + f"`: {card.get('card', 'card not recorded')}; torch {card.get('torch')}, "
             f"vLLM {card.get('vllm')}, verl {card.get('verl')}, transformers {card.get('transformers')}. "
             # the recipe, the arms' loss and correction are the page's own prose, above doc_sections.GENERATED
             f"lr {lr}{''.join(f', `{o}`' for o in setting_extra)}. "
             + (f"Run context: {args.context} " if args.context else "")
             + (f"{len(walls)} runs, {np.mean(walls) / 60:.0f} min each on average (several share the card)."
                if walls else "No run recorded yet."), ""]
    columns = [("final success (last 5 steps)", 3), ("success AUC", 3), (f"steps to {TARGET}", 1), ("collapses", 0),
               ("numerics KL, fresh tokens", 6), ("p99 |log ρ|, fresh tokens", 3), ("masked, fresh tokens (numerics)", 4), ("masked, stale tokens", 4), ("IS-truncated, stale tokens", 4),
               ("clip fraction", 3), ("max IS ratio", 2), ("time per step (s)", 1)]
    for warmup, arms in sorted(results.items()):
        rows = {arm: summary(runs, args.steps, args.phase_steps) for arm, runs in arms.items()}
        lines += [f"### num_warmup_batches = {warmup} (staleness bound {2 * warmup})", "",
                  table(["arm", "seeds", *(c for c, _ in columns)],
                        [[arm, len(arms[arm]), *(fmt_mean_se(row[c], d) for c, d in columns)] for arm, row in rows.items()])]
        lines += ["", f"Masked and truncated fractions, clip fraction, max IS ratio and time per step: means over "
                  f"steps 1-{args.phase_steps} (the learning phase). Differences paired by seed (final success; "
                  "success AUC; masked, stale tokens):", ""]
        common = {arm: sorted(set(arms[arm]) & set(arms.get("current", {}))) for arm in rows if arm != "current"}
        paired = [arm for arm, seeds in common.items() if len(seeds) >= 2]
        if not paired:
            lines.append("- no arm shares two or more seeds with `current`: no paired differences.")
        for arm in paired:
            pair = {name: summary({s: runs[s] for s in common[arm]}, args.steps, args.phase_steps)
                    for name, runs in ((arm, arms[arm]), ("current", arms["current"]))}
            lines.append(f"- {arm} − current (seeds {', '.join(map(str, common[arm]))}): " + "; ".join(
                paired_verdict(pair[arm][k], pair["current"][k])
                for k in ("final success (last 5 steps)", "success AUC", "masked, stale tokens")))
        for arm in (a for a in arms if ARMS[a][0]["PROVIDER"].startswith("ewma")):
            late = list(range(11, args.steps + 1))  # after the queue of stale batches filled up
            age = [np.nanmean(series(arms[arm], key, late)) for key in
                   ("old_logits/ewma/age_steps", "old_logits/token_age_steps/mean", "old_logits/ewma/beta")]
            if all(np.isfinite(age)):
                lines.append(f"- {arm} calibration (steps 11-{args.steps}, all seeds): the EWMA's age "
                             f"{age[0]:.2f} optimizer steps against the batch tokens' mean age {age[1]:.2f} "
                             f"(beta {age[2]:.3f} on average)")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = script_parser(__doc__, context=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--warmups", type=int, nargs="+", default=list(WARMUPS),
                        help="num_warmup_batches values (staleness bound 2x each)")
    parser.add_argument("--parallel", type=int, default=6, help="runs at once, all cards together")
    parser.add_argument("--gpus", type=int, nargs="*", default=[], metavar="INDEX",
                        help="cards to spread the runs over (e.g. --gpus 0 3): the --parallel slots take them in turn "
                        "as their CUDA_VISIBLE_DEVICES; none given: every run sees every card")
    parser.add_argument("--kv-cache-bytes", type=int, default=1 << 30,
                        help="vLLM KV cache per run (skips its memory profiling); 0: profile, starts staggered")
    parser.add_argument("--start-gap-s", type=float, default=20.0, help="seconds between starts with a fixed KV cache")
    parser.add_argument("--setting", choices=list(SETTINGS), default="base",
                        help="step size per version (see SETTINGS); runs of another setting go under --out/<setting> "
                        "and into their own docs section")
    parser.add_argument("--engine-awake", action="store_true",
                        help="keep each vLLM engine awake between steps (free_cache_engine=false; see ENGINE_AWAKE)")
    parser.add_argument("--min-free-gb", type=float, default=16.0,
                        help="start a run only while the host has this much memory available (a run peaks at ~13 GB "
                        "while it starts; below ~5%% free Ray's memory monitor kills workers of every run)")
    parser.add_argument("--phase-steps", type=int, default=20,
                        help="report the correction's fractions over the first this many steps (the learning phase)")
    parser.add_argument("--stagger-s", type=float, default=180.0,
                        help="without a fixed KV cache: seconds between starts (one engine profiles at a time)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), metavar="ARM",
                        help=f"arms to run, in this order within each seed and warm-up (default: all: {list(ARMS)})")
    parser.add_argument("--retries", type=int, default=1, help="times a failed run is queued again")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="start no run that would end after this")
    parser.add_argument("--run-s", type=float, default=600.0, help="a run's expected wall time until one has finished")
    parser.add_argument("--out", type=Path, default=REPO / "runs/old_logits_gpu_study")
    parser.add_argument("--dry-run", action="store_true", help="print every run's environment and command; run nothing")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report the runs under --out")
    parser.add_argument("--keep-runs", type=Path, metavar="SOURCE",
                        help="copy the finished runs under SOURCE (another machine's --out) into --out, their metrics "
                        "cut to what the report reads, then report")
    args = parser.parse_args(argv)
    if args.steps < 60 or len(args.seeds) < 3:
        print("warning: a comparison needs >= 60 steps and >= 3 seeds per arm", file=sys.stderr)
    if args.dry_run:
        for spec in all_specs(args):
            if args.steps in load_steps(Path(spec["out"]) / "metrics.jsonl"):
                continue  # finished: run_all skips it too
            print(json.dumps({**spec, "command": ["bash", f"recipes/{SCRIPT}", *spec["args"]]}))
        return 0
    if args.keep_runs:
        copied = keep_runs(args.keep_runs, args)
        print(f"kept {len(copied)} runs: {'; '.join(copied) or 'none new'}")
    elif not args.report_only:
        run_all(args)
    publish(target(args), heading(args.setting), report(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
