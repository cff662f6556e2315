"""The flagship GPU recipe scripts as written, one after another on one node with random weights: their per-step time breakdown.

    python -m scripts.bench.flagship_gpu_scripts --out runs/flagship --steps 5 --n-gpus 8   # on the GPU machine
    python -m scripts.bench.flagship_gpu_scripts --results runs/flagship                   # rewrite the docs section

Each script in :data:`SCRIPTS` runs as a user runs it, ``bash recipes/<script> <overrides>``; the driver
sets only what the scripts read from their environment and the Hydra overrides they pass on (``"$@"``):

* ``MODEL`` (and the judge's ``JUDGE_MODEL``): random weights of the script's architecture, built under
  ``--out`` (nothing is downloaded); ``DATA_DIR``: the script's own ``verl-ext prepare-data`` call;
* the run: ``trainer.total_training_steps``, no checkpoints, no validation;
* the GPUs: ``N_GPUS`` (the DVReward script: training and judge GPUs in its 6:2 ratio), and a parallel
  size (``TP``, ``PP``, ``ROLLOUT_TP``) only where the script's default does not divide it;
* what this machine lacks, each change recorded: no Chromium -> the browserless ``text_hybrid`` tasks (VL
  scripts: their agent loop with ``screenshots: false``); no flash-attn -> verl's sdpa attention (VL
  scripts: also without remove-padding, whose Qwen2.5-VL attention calls flash-attn directly).

A script that cannot run here (Megatron without TransformerEngine's torch extension; a VL script whose
processor verl cannot build) is recorded with the reason; a failed run with its error. ``--only`` picks
scripts, ``--override KEY=VALUE`` adds an override to every script (recorded). Finished runs are reused.

Docs section (``--write``; printed otherwise): docs/results.md, "## GPU: flagship scripts".
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scripts.bench.gpu_step_breakdown import machine_info
from scripts.bench.learning_runs import median_after_first, timing_phases
from scripts.bench.launch import REPO, RunFailed, RunSpec, load_steps, run
from scripts.bench.report import script_parser, publish, table, target

HEADING = "## GPU: flagship scripts"
RECIPES = REPO / "recipes"
JUDGE_SHARE = 4  # the DVReward script's judge gets 1 GPU in 4 (its default: 6 training + 2 judge)
PARALLEL_KEYS = ("TP", "PP", "ROLLOUT_TP")
# verl 0.9.1 builds Megatron models with TransformerEngine; its torch extension has no wheel
MEGATRON_MODULES = ("megatron.core", "mbridge", "transformer_engine", "transformer_engine_torch")
RUN_OVERRIDES = ["trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false"]
# what the steps did, next to their times (random weights rarely write a tool call or stop early)
WORK_KEYS = ("prompt_length/mean", "response_length/mean", "num_turns/mean",
             "verl_ext/invalid_reward/excluded_fraction")


@dataclass(frozen=True)
class Script:
    path: str  # under recipes/
    arch: str  # MODEL: random weights of this verl_ext.tiny_model architecture
    judge_arch: str | None = None  # JUDGE_MODEL, for the scripts that serve a judge

    @property
    def text(self) -> str:
        return (RECIPES / self.path).read_text()

    @property
    def slug(self) -> str:
        return self.path.removesuffix(".sh").replace("/", "-")


SCRIPTS = (
    Script("toolcua_hybrid/run_fsdp_qwen25_1p5b.sh", "qwen2.5-1.5b"),
    Script("toolcua_hybrid/run_fsdp_qwen25vl_7b.sh", "qwen2.5-vl-7b"),
    Script("toolcua_hybrid/run_megatron_qwen25vl_7b.sh", "qwen2.5-vl-7b"),
    Script("dvreward_judge/run_fsdp_qwen25_1p5b.sh", "qwen2.5-1.5b", judge_arch="qwen2.5-7b"),
)


@dataclass(frozen=True)
class Machine:
    """What decides how the scripts can run here."""

    chromium: bool
    flash_attn: bool
    megatron_missing: tuple[str, ...] = ()


def probe_machine() -> Machine:
    present = importlib.util.find_spec
    return Machine(
        chromium=any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")),
        flash_attn=present("flash_attn") is not None,
        megatron_missing=tuple(m for m in MEGATRON_MODULES if not _module_present(m)),
    )


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


@dataclass
class Plan:
    """How one script runs: its environment, the overrides appended, what differs from the script
    as written (one sentence each), the data it needs, or why it does not run here."""

    env: dict[str, str]
    overrides: list[str]
    changes: list[str] = field(default_factory=list)
    data: tuple[str, list[str]] = ("", [])
    skip: str | None = None


def script_defaults(text: str) -> dict[str, str]:
    """``KEY=${KEY:-value}`` lines of a script: the env variables it reads, with their defaults."""
    return {m[1]: m[2] for m in re.finditer(r"^(\w+)=\$\{\1:-([^}]*)\}", text, re.MULTILINE)}


def prepare_data_call(text: str) -> tuple[str, list[str]]:
    """The dataset and size arguments of the script's ``verl-ext prepare-data`` line."""
    match = re.search(r'verl-ext prepare-data (\w+) "\$DATA_DIR" ([^>\n]*)', text)
    if match is None:
        raise ValueError("the script has no `verl-ext prepare-data <dataset> \"$DATA_DIR\" ...` line")
    return match[1], match[2].split()


def fit_divisor(value: int, n_gpus: int) -> int:
    """The largest divisor of ``n_gpus`` not above ``value`` (a parallel size the GPUs can hold)."""
    return max(d for d in range(1, min(value, n_gpus) + 1) if n_gpus % d == 0)


def plan(script: Script, n_gpus: int, steps: int, machine: Machine, root: Path, extra: tuple[str, ...] = ()) -> Plan:
    """How ``script`` runs on ``n_gpus`` GPUs of ``machine`` with its models and data under ``root``;
    ``extra``: Hydra overrides for every script (``--override``), recorded as changes too."""
    text = script.text
    defaults = script_defaults(text)
    vision = "agent_loops_vl.yaml" in text
    megatron = "ppo_megatron_trainer" in text
    env = {"MODEL": str(root / "models" / script.arch), "OUT": str(root / script.slug)}
    result = Plan(env, [f"trainer.total_training_steps={steps}", *RUN_OVERRIDES])
    result.changes.append(f"{steps} steps, no checkpoints, no validation (`trainer.total_training_steps={steps}`, "
                          "`save_freq=-1`, `test_freq=-1`, `val_before_train=false`)")
    if script.judge_arch:
        env["JUDGE_MODEL"] = str(root / "models" / script.judge_arch)
        judge = max(1, n_gpus // JUDGE_SHARE)
        env.update(N_GPUS=str(n_gpus - judge), JUDGE_GPUS=str(judge))
        result.changes.append(f"JUDGE_MODEL: random weights of {script.judge_arch}'s shapes too; rows it cannot score "
                              "are kept out of training (`verl_ext/invalid_reward/excluded_fraction` above)")
        if (env["N_GPUS"], env["JUDGE_GPUS"]) != (defaults["N_GPUS"], defaults["JUDGE_GPUS"]):
            result.changes.append(f"N_GPUS={n_gpus - judge} for training + JUDGE_GPUS={judge} for the judge "
                                  f"(script: {defaults['N_GPUS']} + {defaults['JUDGE_GPUS']})")
    else:
        env["N_GPUS"] = str(n_gpus)
        if env["N_GPUS"] != defaults["N_GPUS"]:
            result.changes.append(f"N_GPUS={n_gpus} (script: {defaults['N_GPUS']})")
        for key in PARALLEL_KEYS:
            if key in defaults and fit_divisor(int(defaults[key]), n_gpus) != int(defaults[key]):
                env[key] = str(fit_divisor(int(defaults[key]), n_gpus))
                result.changes.append(f"{key}={env[key]} (script: {defaults[key]}; {n_gpus} GPUs)")

    family, sizes = prepare_data_call(text)
    if family == "minidesk" and not machine.chromium:
        family = "text_hybrid"
        result.changes.append("data: the browserless `text_hybrid` tasks instead of MiniDesk (no Chromium here); "
                              "same agent loop, env tools and reward")
        if vision:
            result.overrides.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={text_only_loops(root)}")
            result.changes.append("agent_loops_vl.yaml with `screenshots: false` (text_hybrid renders no screenshot): "
                                  "the vision tower sees no image")
    env["DATA_DIR"] = str(root / "data" / family)
    result.data = (family, sizes)

    if megatron and machine.megatron_missing:
        result.skip = (f"not installed here: {', '.join(machine.megatron_missing)}. verl 0.9.1 builds Megatron models "
                       "with TransformerEngine, whose torch extension has no wheel (docs/reference/old_logits.md, "
                       "\"Megatron\")")
    elif not megatron and not machine.flash_attn:
        result.overrides.append("+actor_rollout_ref.model.override_config.attn_implementation=sdpa")
        result.changes.append("attention: sdpa (`override_config.attn_implementation=sdpa`; flash-attn is not "
                              "installed here)")
        if vision:
            result.overrides.append("actor_rollout_ref.model.use_remove_padding=false")
            result.changes.append("`use_remove_padding=false`: verl's Qwen2.5-VL remove-padding attention calls "
                                  "flash-attn directly")
    result.overrides += extra
    result.changes += [f"`{override}` (given with --override)" for override in extra]
    return result


def text_only_loops(root: Path) -> Path:
    return root / "agent_loops_vl_text.yaml"


def write_text_only_loops(root: Path) -> None:
    """agent_loops_vl.yaml with ``screenshots: false``, every other setting as the scripts have it."""
    from omegaconf import OmegaConf

    loops = OmegaConf.load(RECIPES / "toolcua_hybrid" / "agent_loops_vl.yaml")
    for loop in loops:
        loop.screenshots = False
    root.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(loops, text_only_loops(root))


def build(root: Path, plans: dict[Script, Plan]) -> None:
    """The random models (bf16, initialised on the GPU when there is one) and the data the plans name.
    Each model is built in a subprocess, so no GPU memory stays with this process during the runs."""
    import torch

    from verl_ext.data import main as prepare_data

    device = "cuda" if torch.cuda.is_available() else "cpu"
    for arch in sorted({a for s, p in plans.items() if not p.skip for a in (s.arch, s.judge_arch) if a}):
        folder = root / "models" / arch
        if not (folder / "verl_ext_tiny_model.json").exists():  # written last: a finished build
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "verl_ext.cli", "make-tiny-model", str(folder), "--arch", arch,
                            "--dtype", "bfloat16", "--device", device], check=True)
            print(f"[flagship] {arch}: built in {time.perf_counter() - start:.0f} s on {device}", flush=True)
    for p in plans.values():
        family, sizes = p.data
        if not p.skip and not (Path(p.env["DATA_DIR"]) / "train.parquet").exists():
            prepare_data([family, p.env["DATA_DIR"], *sizes])
        if any(o.startswith("actor_rollout_ref.rollout.agent.agent_loop_config_path=") for o in p.overrides):
            write_text_only_loops(root)


def processor_problem(model: str) -> str | None:
    """verl builds a VL model's processor with ``AutoProcessor`` and silently trains without images
    when that fails (``hf_processor`` returns None); say so before a run starts."""
    from verl.utils.tokenizer import hf_processor

    if hf_processor(model) is None:
        return (f"verl's hf_processor({model}) returned None: AutoProcessor cannot load the Qwen2.5-VL processor "
                "here (its video processor needs torchvision)")
    return None


def run_script(script: Script, p: Plan, steps: int, timeout_s: int) -> dict:
    """Run one script once (or reuse a finished run) and write its record, ``run.json``."""
    spec = RunSpec(script.path, script.path, Path(p.env["OUT"]), steps, p.env, p.overrides, timeout_s=timeout_s)
    record_path = spec.out / "run.json"
    if spec.done() and record_path.exists():
        return json.loads(record_path.read_text())
    spec.out.mkdir(parents=True, exist_ok=True)
    record = {"script": script.path, **asdict(p), "steps": steps}
    if p.skip is None and "JUDGE_MODEL" not in p.env and "agent_loops_vl" in script.text:
        p.skip = processor_problem(p.env["MODEL"])
        record["skip"] = p.skip
    if p.skip is None:
        try:
            record.update(exit_code=0, wall_s=run(spec, attempts=1))
        except RunFailed as failed:
            record.update(exit_code=f"killed after {timeout_s} s" if failed.timed_out else failed.returncode,
                          wall_s=failed.wall_s, error=failure_line(failed.log.read_text(errors="replace")))
        finally:
            stop_ray()
    record_path.write_text(json.dumps(record, indent=1))
    return record


def stop_ray() -> None:
    """Frees the GPUs for the next script: a crashed run can leave Ray workers behind."""
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


def failure_line(log: str) -> str:
    """The last line of a log that names an error (else its last line): what the table quotes."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"Error|Exception|Traceback|Killed", line)]
    return (errors or lines or ["(empty log)"])[-1][:300]


def section(results: Path) -> str:
    """The docs section from a ``--out`` folder (copied anywhere: only paths under it are read)."""
    info = json.loads((results / "machine.json").read_text())
    steps = info["steps"]
    records = {s: json.loads((results / s.slug / "run.json").read_text()) for s in SCRIPTS
               if (results / s.slug / "run.json").exists()}
    metrics = {s: load_steps(results / s.slug / "metrics.jsonl") for s in records}
    ran = [s for s in records if metrics[s]]
    lines = [
        HEADING, "",
        f"`python -m scripts.bench.flagship_gpu_scripts --steps {steps} --n-gpus {info['n_gpus']}` on "
        f"**{info['n_gpus']} x {info['card']}** (torch {info['torch']}, vLLM {info['vllm']}, verl {info['verl']}, "
        f"transformers {info['transformers']}): medians over steps 2-{steps}."
        + (f" Run context: {info['context']}" if info.get("context") else ""), "",
    ]
    if ran:
        phases = timing_phases(metrics[s] for s in ran)
        def cells(key: str, spec: str) -> list[str]:
            return ["-" if c != c else f"{c:{spec}}" for c in (median_after_first(metrics[s], key) for s in ran)]

        rows = [[phase, *cells(f"timing_s/{phase}", ".1f")] for phase in phases]
        rows += [[f"`{key}`", *cells(key, ".3g")] for key in WORK_KEYS if set(cells(key, ".3g")) != {"-"}]
        rows += [["steps logged", *(max(metrics[s]) for s in ran)],
                 ["wall time of the run (s)", *(f"{records[s]['wall_s']:.0f}" for s in ran)]]
        lines.append(table(["phase (verl's `timing_s/*`)", *(f"`{s.path}`" for s in ran)], rows))
        lines.append("")
    lines += ["Changed against the scripts as written (everything else is the script's):", ""]
    lines += [f"* `{s.path}`: " + "; ".join(r["changes"]) + "." for s, r in records.items() if not r["skip"]]
    not_run = [f"* `{s.path}`: not run: {r['skip']}." for s, r in records.items() if r["skip"]]
    not_run += [f"* `{s.path}`: exit {r['exit_code']} after {max(metrics[s], default=0)} of {steps} steps: "
                f"`{r.get('error', '')}`" for s, r in records.items()
                if not r["skip"] and (r["exit_code"] != 0 or max(metrics[s], default=0) < steps)]
    not_run += [f"* `{s.path}`: not run (no `run.json` under the results folder)." for s in SCRIPTS if s not in records]
    if not_run:
        lines += ["", "Not run, or not to the end:", "", *not_run]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = script_parser(__doc__, context=True)
    parser.add_argument("--out", type=Path, help="build, run the scripts and keep everything under this folder")
    parser.add_argument("--results", type=Path, help="a folder written by --out: (re)write the docs section")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--n-gpus", type=int, default=8)
    parser.add_argument("--only", nargs="+", metavar="SCRIPT", help="run these scripts only (paths under recipes/)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for every script (repeatable), recorded in the table")
    parser.add_argument("--timeout-min", type=float, default=40.0, help="per script, start-up included")
    args = parser.parse_args(argv)
    if args.out is None and args.results is None:
        parser.error("give --out (run) or --results (tabulate)")
    if args.out:
        import torch

        if torch.cuda.device_count() < args.n_gpus:
            parser.error(f"--n-gpus {args.n_gpus}, but torch sees {torch.cuda.device_count()} CUDA device(s) here")
        args.out = args.out.resolve()
        chosen = [s for s in SCRIPTS if not args.only or s.path in args.only]
        unknown = set(args.only or ()) - {s.path for s in SCRIPTS}
        if unknown:
            parser.error(f"--only: unknown script(s) {sorted(unknown)}; choose from {[s.path for s in SCRIPTS]}")
        machine = probe_machine()
        plans = {s: plan(s, args.n_gpus, args.steps, machine, args.out, tuple(args.override)) for s in chosen}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "machine.json").write_text(json.dumps(
            {**machine_info(args.context), **asdict(machine), "n_gpus": args.n_gpus, "steps": args.steps}))
        build(args.out, plans)
        for s, p in plans.items():
            print(f"[flagship] {s.path}: {'skipped: ' + p.skip if p.skip else 'running'}", flush=True)
            record = run_script(s, p, args.steps, int(args.timeout_min * 60))
            print(f"[flagship] {s.path}: {record.get('skip') or record.get('exit_code')}", flush=True)
    publish(target(args), HEADING, section(args.results or args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
