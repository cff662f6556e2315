"""Per-step time and memory on one GPU: plain verl GRPO vs verl-ext (hgpo + ppo_ewma + ewma, and with ``snapshot``).

    python -m scripts.bench.gpu_step_breakdown --steps 8 --out /tmp/bench     # on the GPU machine
    python -m scripts.bench.gpu_step_breakdown --results /tmp/bench            # rewrite the docs table

Same model, batch and steps through ``recipes/text_corridor/run_gpu.sh``, the arms one after another on the
same GPU. Each phase is verl's own ``timing_s/*`` (median over the steps after the first); verl-ext's
overhead is what its hooks add to the phases they run in, against the plain arm: the advantage phase, the
old-log-prob phase, the actor update (EWMA update) and the weight sync (snapshot save). Memory comes from
verl's ``perf/*`` metrics.

Docs section (``--write``; printed otherwise): docs/results.md, "## GPU: per-step breakdown".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scripts.bench.launch import RunFailed, RunSpec, load_steps, run
from scripts.bench.learning_runs import median_after_first, run_folder, timing_phases
from scripts.bench.report import gib, publish, script_parser, target
from scripts.bench.report import table as md_table  # table() below is the docs section

HEADING = "## GPU: per-step breakdown"
ARMS = {  # name -> run_gpu.sh environment
    "verl GRPO": dict(ADV="grpo", LOSS="vanilla", PROVIDER="none"),
    "verl-ext hgpo + ppo_ewma + ewma": dict(ADV="hgpo", LOSS="ppo_ewma", PROVIDER="ewma"),
    "verl-ext hgpo + ppo_ewma + snapshot": dict(ADV="hgpo", LOSS="ppo_ewma", PROVIDER="snapshot"),
}
# verl's phase timers that verl-ext's hooks run inside
HOOKED_PHASES = ("adv", "old_log_prob", "update_actor", "update_weights")


def machine_info(context: str) -> dict:
    """The card and the versions a GPU benchmark's table names (``machine.json``)."""
    import torch

    info = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__, "context": context}
    for module in ("vllm", "verl", "transformers"):
        info[module] = __import__(module).__version__
    return info


def run_arms(out: Path, steps: int, context: str) -> None:
    info = machine_info(context)
    out.mkdir(parents=True, exist_ok=True)
    for name, env in ARMS.items():
        try:  # one after another on the same GPU
            run(RunSpec(name, "text_corridor/run_gpu.sh", out / run_folder(name), steps, env), attempts=1)
        except RunFailed as failed:
            raise SystemExit(f"{failed}:\n{failed.log.read_text(errors='replace')[-4000:]}") from None
    model_info = out / run_folder(next(iter(ARMS))) / "model" / "verl_ext_tiny_model.json"
    info["parameters"] = json.loads(model_info.read_text())["parameters"]
    (out / "machine.json").write_text(json.dumps(info))


def table(results: Path) -> str:
    info = json.loads((results / "machine.json").read_text())
    runs = {name: load_steps(results / run_folder(name) / "metrics.jsonl") for name in ARMS}
    phases = timing_phases(runs.values())
    steps = sorted(next(iter(runs.values())))
    lines = [
        HEADING, "",
        f"`python -m scripts.bench.gpu_step_breakdown --steps {len(steps)}` on **{info['card']}** (torch "
        f"{info['torch']}, vLLM {info['vllm']}, verl {info['verl']}, transformers {info['transformers']}): "
        f"{info['parameters'] / 1e6:.0f} M parameters; medians over steps 2-{steps[-1]}."
        + (f" Run context: {info['context']}" if info.get("context") else ""), "",
        md_table(["phase (verl's `timing_s/*`)", *ARMS],
                 [[phase, *(f"{median_after_first(runs[n], 'timing_s/' + phase):.3f}" for n in ARMS)] for phase in phases]),
    ]
    base = runs[next(iter(ARMS))]
    step_base = median_after_first(base, "timing_s/step")
    params = info["parameters"]
    rows = []
    for name in list(ARMS)[1:]:
        added = sum(median_after_first(runs[name], f"timing_s/{p}") - median_after_first(base, f"timing_s/{p}")
                    for p in HOOKED_PHASES)
        rows.append([name, f"{added:+.3f} s", f"{added / step_base:+.1%}",
                     *(gib(b, 4 * params, 1) for b in state_bytes(name, params, runs[name]))])
    lines += ["", md_table(["verl-ext arm", "time added in the hooked phases", "share of the plain step",
                            "GPU memory added", "host memory added"], rows), ""]
    return "\n".join(lines)


def state_bytes(arm: str, params: int, steps: dict[int, dict]) -> tuple[int, int]:
    """(GPU bytes, host bytes) of verl-ext's old-logit state for ``arm``, over all ranks."""
    fp32 = 4 * params
    if arm.endswith("ewma"):
        return fp32, fp32  # fp32 shadow on the GPU; live shards backed up on the host during a swap
    if arm.endswith("snapshot"):
        versions = max(m.get("old_logits/snapshot/versions", 0) for m in steps.values())
        return 0, int(versions) * fp32
    return 0, 0


def main(argv: list[str]) -> int:
    parser = script_parser(__doc__, context=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, help="run the arms, writing each run under this folder")
    parser.add_argument("--results", type=Path, help="a folder written by --out: (re)write the docs table")
    args = parser.parse_args(argv)
    if args.out:
        run_arms(args.out, args.steps, args.context)
    results = args.results or args.out
    if results is None:
        parser.error("give --out (run) or --results (tabulate)")
    publish(target(args), HEADING, table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
