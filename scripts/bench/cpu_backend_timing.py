"""Per-phase time of one verl training step on the cpu backend, from verl's own ``timing_s/*`` metrics.

A quickstart run (``recipes/quickstart/run_cpu.sh``: GRPO, tiny Qwen2, 8 prompts x 4 samples, 16 response tokens).

    python -m scripts.bench.cpu_backend_timing --write                 # runs the quickstart (about 3 min)
    python -m scripts.bench.cpu_backend_timing --metrics runs/quickstart/metrics.jsonl   # an earlier run

Docs section (``--write``; printed otherwise): docs/results.md, "## cpu backend: verl's trainer on 2 CPU cores".
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from scripts.bench.launch import RunSpec, load_steps, run
from scripts.bench.report import publish, script_parser, table, target

HEADING = "## cpu backend: verl's trainer on 2 CPU cores"
PHASES = {  # verl metric -> what it times
    "timing_s/gen": "gen (hf rollout, 32 sequences)",
    "timing_s/old_log_prob": "old_log_prob",
    "timing_s/adv": "adv",
    "timing_s/update_actor": "update_actor",
    "timing_s/update_weights": "update_weights (trainer -> hf server)",
    "timing_s/step": "step total",
}


def section(steps: dict[int, dict], wall_s: float | None, load: float) -> str:
    """Medians over every training step after the first (warm-up) one."""
    trained = sorted(s for s in steps if s >= 1 and "timing_s/step" in steps[s])
    steady = trained[1:] or trained
    diffs = [steps[s]["training/rollout_probs_diff_max"] for s in trained if "training/rollout_probs_diff_max" in steps[s]]
    lines = [
        HEADING, "",
        f"Measured {time.strftime('%Y-%m-%d', time.gmtime())} with `python -m scripts.bench.cpu_backend_timing` on a "
        f"{os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}, no GPU) shared with other jobs (load "
        f"average {load:.1f} at the end): the quickstart recipe (GRPO, tiny Qwen2, 8 prompts x 4 samples, 16 response "
        f"tokens), verl's own per-step `timing_s/*` metrics, median over steps {steady[0]}-{steady[-1]} (step 1 is "
        "the warm-up).", "",
        table(["phase", "seconds per step (median)", "min-max"],
              [[label, f"{statistics.median(v):.2f}", f"{min(v):.2f}-{max(v):.2f}"] for key, label in PHASES.items()
               for v in [[steps[s][key] for s in steady if key in steps[s]]] if v]),
    ]
    if diffs:
        lines += ["", f"`training/rollout_probs_diff_max` (rollout vs trainer log-probs, fp32 on both sides): "
                      f"{min(diffs):.1e} to {max(diffs):.1e} over steps {trained[0]}-{trained[-1]}."]
    if wall_s is not None:
        lines += ["", f"The whole run ({len(trained)} steps, Ray start-up, validations and checkpoint included) "
                      f"took {wall_s / 60:.1f} minutes of wall time."]
    return "\n".join(lines) + "\n\n"  # a blank line before the next section


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--metrics", type=Path, help="metrics.jsonl of an earlier quickstart run (no new run)")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    wall_s = None
    if args.metrics is None:
        out = Path(tempfile.mkdtemp(prefix="cpu_backend_timing_"))
        # the run's wall time: Ray start-up, validations and checkpoint included
        wall_s = run(RunSpec("quickstart", "quickstart/run_cpu.sh", out, args.steps), attempts=1)
        args.metrics = out / "metrics.jsonl"
    publish(target(args), HEADING, section(load_steps(args.metrics), wall_s, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
