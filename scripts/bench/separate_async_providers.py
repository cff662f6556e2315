"""Old-logit providers under verl's ``separate_async`` trainer: how exact each is, what the correction removes, what the hooks cost.

    python -m scripts.bench.separate_async_providers --backend cpu --out runs/separate_async_cpu
    python -m scripts.bench.separate_async_providers --backend gpu --out runs/separate_async_gpu --parallel 4
    python -m scripts.bench.separate_async_providers --backend cpu --results runs/separate_async_cpu   # table only

Arms: ``verl`` (verl's own ``separate_async`` trainer, no verl-ext hook) and every provider under
``verl_ext_separate_async`` (``current`` is verl's own anchor, the weights its sync window started from,
with the hooks around it). Every arm: the same seed, verl's PPO loss, GRPO and the same rollout correction
(token IS truncated at 2, token_k1 band [0.998, 1.002] on ρ = π_old/μ, tight enough to fire on bf16
numerics), a bf16 rollout against the trainer, so the band's rate on fresh tokens is the numerics rate and
what it adds on stale tokens is staleness left in ρ. Partial rollouts span windows (bound 2).

- cpu: ``recipes/quickstart/run_cpu.sh``, a standalone ``hf`` replica on a fake GPU of its own; one run at a time.
- gpu: ``recipes/text_corridor/run_gpu.sh`` with ``MODE=separate_async SHARE_CARD=1``; ``--parallel N`` runs
  N arms side by side on the card (each with a fixed KV cache), and step times are compared within one batch.

The table, per arm over the steps after the first: the exact-token share, the band's masked fraction of
fresh and stale tokens, the truncated fraction of stale tokens, the hooks' share of the step and the
median step time against ``verl``'s.

Docs section (``--write``; printed otherwise): docs/results.md, "## separate_async: old-logit providers (<backend>)".
"""

from __future__ import annotations

import json
from pathlib import Path

from scripts.bench.launch import RunSpec, card_slots, gpu_environment, launch, load_steps
from scripts.bench.learning_runs import after_warmup, mean_of, median_of
from scripts.bench.report import pct, publish, script_parser, target
from scripts.bench.report import table as md_table  # table() below is the docs section

PLAIN = "verl"
ARMS = (PLAIN, "current", "snapshot", "ewma", "loglinear", "rollout", "dedicated", "interrupt")
CORRECTION = ("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0",
              "algorithm.rollout_correction.rollout_rs=token_k1",
              "algorithm.rollout_correction.rollout_rs_threshold=0.998_1.002")
# the cpu backend's separate pools: the quickstart's batch of 8 prompts as two local updates of 4
CPU_SEPARATE = ("trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1", "ray_kwargs.ray_init.num_gpus=2",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=host_memory",
                "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.max_num_seqs=8",
                "data.max_response_length=256", "trainer.v1.sampler.max_off_policy_strategy=wait",
                "trainer.v1.sampler.max_off_policy_threshold=2", "trainer.val_before_train=false", "trainer.test_freq=-1")
HEADING = "## separate_async: old-logit providers ({backend})"
C = "old_logits/correction/"


def arm_run(backend: str, arm: str) -> tuple[str, dict[str, str], list[str]]:
    """(recipe script, environment, Hydra overrides) of one arm."""
    if backend == "cpu":
        mode = "trainer.v1.trainer_mode=" + ("separate_async" if arm == PLAIN else "verl_ext_separate_async")
        provider = [] if arm == PLAIN else [f"+plugins/old_logits={arm}"]
        return "quickstart/run_cpu.sh", {}, [mode, *CPU_SEPARATE, *CORRECTION, *provider]
    env = {"MODE": "separate_async", "SHARE_CARD": "1", "ADV": "grpo", "LOSS": "vanilla", "WARMUP": "1", "BOUND": "2",
           "SAMPLER": "wait", "MAX_NUM_SEQS": "8", "KV_CACHE_BYTES": str(4 << 30),
           "PROVIDER": "none" if arm == PLAIN else arm}
    return "text_corridor/run_gpu.sh", env, list(CORRECTION)


def summarise(steps: dict[int, dict[str, float]]) -> dict[str, float]:
    """The table's numbers of one run (steps after the first)."""
    later = after_warmup([steps])
    means = {"exact": "old_logits/exact_token_share", "stale": f"{C}stale_token_frac", "masked_fresh":
             f"{C}masked_fresh", "masked_stale": f"{C}masked_stale", "truncated_stale": f"{C}truncated_stale"}
    return {**{name: mean_of(later, key) for name, key in means.items()},
            "hooks": median_of(later, "verl_ext/time/share_of_step"), "step_s": median_of(later, "timing_s/step")}


def table(out: Path, arms: tuple[str, ...]) -> str:
    rows = {arm: summarise(load_steps(out / arm / "metrics.jsonl")) for arm in arms}
    plain = rows.get(PLAIN, {}).get("step_s", float("nan"))
    return md_table(
        ["arm", "exact-token share", "stale tokens", "masked fresh", "masked stale", "truncated stale",
         "hooks' share of the step", "step time vs `verl`"],
        [[f"`{arm}`", "—" if arm == PLAIN or r["exact"] != r["exact"] else f"{r['exact']:.3f}",  # verl's own logs none
          *(pct(r[k], 1) for k in ("stale", "masked_fresh", "masked_stale", "truncated_stale", "hooks")),
          "1.00" if arm == PLAIN else ("—" if r["step_s"] != r["step_s"] else f"{r['step_s'] / plain:.2f}")]
         for arm, r in rows.items()])


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--backend", choices=("cpu", "gpu"), required=True)
    parser.add_argument("--out", type=Path, help="runs folder (one subfolder per arm; finished arms are kept)")
    parser.add_argument("--results", type=Path, help="write the table from this runs folder, run nothing")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=1, help="arms run side by side (gpu: on one card)")
    args = parser.parse_args(argv)
    out = args.results or args.out
    if out is None:
        parser.error("give --out (run) or --results (table only)")
    arms = tuple(args.arms)
    if args.results is None:
        info = gpu_environment() if args.backend == "gpu" else {}
        specs = [RunSpec(arm, script, out / arm, args.steps, env, overrides, info)
                 for arm in arms for script, env, overrides in [arm_run(args.backend, arm)]]
        launch(specs, card_slots([], args.parallel), cpus=16 if args.backend == "gpu" else 2)
    command = (f"python -m scripts.bench.separate_async_providers --backend {args.backend} --steps {args.steps} "
               f"--parallel {args.parallel} --arms {' '.join(arms)}")
    recorded = [out / arm / "run.json" for arm in arms if (out / arm / "run.json").exists()]
    first = json.loads(recorded[0].read_text()) if recorded else {}  # the card and versions of a gpu run
    machine = ", ".join(f"{k} {v}" for k, v in first.items() if k in ("card", "torch", "vllm", "verl"))
    section = "\n".join([
        HEADING.format(backend=args.backend), "",
        f"Command: `{command}`" + (f" ({machine})." if machine else " (the cpu backend, 2 cores)."), "",
        table(out, arms), "",
    ])
    publish(target(args), HEADING.format(backend=args.backend), section)


if __name__ == "__main__":
    main()
