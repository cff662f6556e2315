"""Start-up checks for GPU runs: is this machine ready for the config, and do the batches divide?

A GPU script started on the wrong machine fails late in verl: without CUDA at Ray's resource
check or in a worker, without vLLM when the first replica starts (minutes in), with a too-new
transformers somewhere in model loading, and with micro-batches that do not divide a rank's rows
at the first log-prob computation (``data size must be divisible by force_group_size *
micro_batch_size_per_gpu``, verl's ``workers/engine/utils.py``). The verl-ext trainers and
``verl-ext doctor`` run these checks first and name the package, the version wanted and the pip
extra, or the batch rule and the keys to change.

Each check returns a list of problems (empty: fine) and reads only the config and installed
package metadata, so it is cheap and testable without a GPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version


# Rollout engine -> (distribution, pip extra that brings the version verl pins).
ROLLOUT_ENGINES: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "pip install 'verl[vllm]==0.9.1' 'verl-ext[vllm]'"),
    "sglang": ("sglang", "pip install 'verl[sglang]==0.9.1'"),
}


def select(config: Any, path: str, default: Any = None) -> Any:
    """``config.a.b.c`` for ``path="a.b.c"`` (DictConfig, dict or attributes); ``default`` where missing or None."""
    node = config
    for part in path.split("."):
        if node is None:
            return default
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def verl_requirement(distribution: str, extra: str | None = None) -> Requirement | None:
    """verl's own requirement on ``distribution`` (base, or under ``extra``), from its metadata."""
    for line in importlib.metadata.requires("verl") or []:
        requirement = Requirement(line)
        if requirement.name.lower() != distribution.lower():
            continue
        in_extra = requirement.marker is not None and "extra" in str(requirement.marker)
        if extra is None and not in_extra:
            return requirement
        if extra is not None and requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
            return requirement
    return None


def version_problem(distribution: str, wanted: Requirement | None, installed: str | None, fix: str) -> str | None:
    """One sentence when ``installed`` does not satisfy ``wanted`` (None: not installed)."""
    spec = str(wanted.specifier) if wanted is not None and wanted.specifier else ""
    if installed is None:
        return f"{distribution}{spec} is needed but not installed; {fix}"
    if wanted is not None and wanted.specifier and not wanted.specifier.contains(Version(installed), prereleases=True):
        return f"{distribution} {installed} is installed but verl 0.9.1 needs {distribution}{spec}; {fix}"
    return None


def machine_problems(config: Any, cuda_available: Callable[[], bool] | None = None,
                     version_of: Callable[[str], str | None] = installed_version,
                     module_present: Callable[[str], bool] | None = None) -> list[str]:
    """Whether this machine can run ``config`` on its accelerator: CUDA, rollout engine, transformers,
    flash-attn. The callables are the probes (injectable for tests of the messages)."""
    if module_present is None:
        def module_present(name: str) -> bool:
            return importlib.util.find_spec(name) is not None
    device = str(select(config, "trainer.device", "cuda"))
    problems = []
    if device == "cuda":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available
        if not cuda_available():
            problems.append(
                "trainer.device=cuda but torch sees no CUDA device (torch "
                f"{version_of('torch') or 'not installed'}); run on a GPU machine with a CUDA build of torch==2.11.0 "
                "(verl 0.9.1's pin), or use the cpu backend: +plugins/backend=cpu with VERL_PLATFORM=cpu"
            )
    engine = str(select(config, "actor_rollout_ref.rollout.name", ""))
    if engine in ROLLOUT_ENGINES:
        distribution, fix = ROLLOUT_ENGINES[engine]
        wanted = verl_requirement(distribution, extra=engine)
        problem = version_problem(distribution, wanted, version_of(distribution), fix)
        if problem:
            problems.append(f"actor_rollout_ref.rollout.name={engine}: {problem}")
    problem = version_problem("transformers", verl_requirement("transformers"), version_of("transformers"),
                              "pip install 'transformers>=5.5.3,<5.11' (verl 0.9.1's base requirement)")
    if problem:
        problems.append(problem)
    for role in ("actor_rollout_ref", "critic"):
        model = select(config, f"{role}.model")
        if model is None or (role == "critic" and not _critic_used(config)):
            continue
        strategy = select(config, "critic.strategy" if role == "critic" else f"{role}.actor.strategy", "fsdp")
        if str(strategy) == "megatron":  # TransformerEngine's attention (megatron_checks), not HF's
            continue
        # verl's default attention; use_remove_padding alone has a pure-torch fallback in verl
        attention = str(select(model, "override_config.attn_implementation", "flash_attention_2"))
        if device == "cuda" and attention == "flash_attention_2" and not module_present("flash_attn"):
            problems.append(
                f"{role}.model: attn_implementation=flash_attention_2 (verl's default) but flash-attn is not "
                f"installed; pip install 'verl[flash-attn-cu130torch211]==0.9.1', or set "
                f"+{role}.model.override_config.attn_implementation=sdpa (with {role}.model.use_remove_padding=false "
                "where packed sequences are slow)"
            )
    return problems


def _critic_used(config: Any) -> bool:
    return bool(select(config, "critic.enable", False)) or str(select(config, "algorithm.adv_estimator", "")) == "gae"


def data_parallel_size(config: Any) -> int:
    """FSDP: GPUs / Ulysses sequence parallel; Megatron: GPUs / (TP x PP x CP)."""
    gpus = int(select(config, "trainer.n_gpus_per_node", 1)) * int(select(config, "trainer.nnodes", 1))
    actor = select(config, "actor_rollout_ref.actor")
    if str(select(actor, "strategy", "fsdp")) == "megatron":
        model_parallel = 1
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            model_parallel *= int(select(actor, f"megatron.{key}", 1))
        return max(1, gpus // model_parallel)
    return max(1, gpus // int(select(actor, "ulysses_sequence_parallel_size", 1) or 1))


def batch_problems(config: Any) -> list[str]:
    """The rule verl's engines enforce with fixed micro-batches (``use_dynamic_bsz=false``): the rows
    each data-parallel rank gets must be a multiple of that stage's ``*_micro_batch_size_per_gpu``.

    Rows per rank: ``data.train_batch_size / parameter_sync_step * rollout.n / dp`` for log-prob
    forwards (old, ref; verl's async trainers sample the batch in ``trainer.v1.<mode>.parameter_sync_step``
    local updates, 1 unless set) and ``actor.ppo_mini_batch_size * rollout.n / dp`` for each update
    mini-batch, where ``dp`` is :func:`data_parallel_size`. Dynamic batch sizes
    (``use_dynamic_bsz=true``) have no such rule.
    """
    n = int(select(config, "actor_rollout_ref.rollout.n", 1))
    dp = data_parallel_size(config)
    mode = str(select(config, "trainer.v1.trainer_mode", "sync")).removeprefix("verl_ext_")  # the verl mode it extends
    sync_step = max(1, int(select(config, f"trainer.v1.{mode}.parameter_sync_step", 1)))
    train_rows = int(select(config, "data.train_batch_size", 0)) // sync_step * n
    mini_rows = int(select(config, "actor_rollout_ref.actor.ppo_mini_batch_size", 0)) * n
    dynamic = bool(select(config, "actor_rollout_ref.actor.use_dynamic_bsz", False))
    stages = [
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
         train_rows, "data.train_batch_size / parameter_sync_step * rollout.n"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.use_dynamic_bsz",
         mini_rows, "actor.ppo_mini_batch_size * rollout.n"),
    ]
    if select(config, "actor_rollout_ref.actor.use_kl_loss", False) or select(config, "algorithm.use_kl_in_reward", False):
        stages.append(("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                       "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", train_rows,
                       "data.train_batch_size / parameter_sync_step * rollout.n"))
    problems = []
    for micro_key, dynamic_key, rows, rows_formula in stages:
        micro = select(config, micro_key)
        if micro is None or bool(select(config, dynamic_key, dynamic)):
            continue
        micro = int(micro)
        if rows % dp or (rows // dp) % micro:
            per_rank = f"{rows}/{dp} = {rows / dp:g}"
            problems.append(
                f"{micro_key}={micro} does not divide the rows each of the {dp} data-parallel ranks gets "
                f"({rows_formula} / dp = {per_rank}); verl needs rows per rank to be a multiple of it. "
                f"Pick a micro-batch that divides {rows // dp if rows % dp == 0 else 'an integer row count'}, scale "
                f"data.train_batch_size / ppo_mini_batch_size with the GPU count, or set use_dynamic_bsz=true"
            )
    return problems


def readiness_report() -> tuple[list[str], bool]:
    """``verl-ext doctor``'s GPU section: one line per item, and whether a vLLM + FSDP GPU run can start
    here (CUDA visible, vLLM at verl's pin, transformers in verl's range; flash-attn is optional)."""
    import torch

    lines, ready = [], True
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        lines.append(f"CUDA: {torch.cuda.device_count()} x {', '.join(names)} (torch {torch.__version__})")
    else:
        lines.append(f"CUDA: not visible (torch {torch.__version__}): GPU scripts refuse to start; the cpu backend works")
        ready = False
    for distribution, extra in (("vllm", "vllm"), ("transformers", None)):
        wanted = verl_requirement(distribution, extra=extra)
        installed = installed_version(distribution)
        fix = ROLLOUT_ENGINES["vllm"][1] if distribution == "vllm" else "pip install 'transformers>=5.5.3,<5.11'"
        problem = version_problem(distribution, wanted, installed, fix)
        lines.append(f"{distribution}: {installed or 'not installed'}" + (f" -- {problem}" if problem else " (ok)"))
        ready = ready and problem is None
    if importlib.util.find_spec("flash_attn") is not None:
        lines.append(f"flash-attn: {installed_version('flash-attn') or 'present'} (ok)")
    else:
        lines.append("flash-attn: not installed -- run with actor_rollout_ref.model.use_remove_padding=false and "
                     "+actor_rollout_ref.model.override_config.attn_implementation=sdpa (as recipes/text_corridor/run_gpu.sh)")
    return lines, ready
