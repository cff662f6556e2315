"""Runtime patches applied to verl where it has no extension point.

``PATCHES`` apply on the cpu backend only; ``ENGINE_PATCHES`` on every backend (verl's log-prob
fallback, which runs wherever flash-attn's cross-entropy is missing: every CPU, and GPUs without
flash-attn such as the offline bundle's); ``VLLM_PATCHES`` wherever verl imports its vLLM rollout
(GPUs): verl's colocated weight-transfer socket named per Ray cluster; ``TRAINER_PATCHES`` everywhere:
the critic's value model loaded with the configured attention (verl hard-codes flash-attention 2), and
verl's separate_async trainer started without colocated replicas.

Each patch is version-guarded (verl 0.9.1 exactly), idempotent, applied by a post-import hook on
the module it changes, and described in ``patches/<name>.md`` with the verl line it targets and
the upstream change that would remove it. ``APPLIED`` lists what this process patched;
``tests/backends/test_patches_on_cpu.py`` fails when a targeted verl line no longer exists or a
patch stops taking effect in verl's own code path. The replacements that apply on every backend
(the advantage hook and the replay-buffer ``sample`` wrapper in ``verl_ext/trainer.py``, the
optimizer-step wrapper in ``verl_ext/old_logits/worker_side.py``) are listed in ``patches/README.md`` too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from verl_ext import VERL_VERSION
from verl_ext._post_import import when_imported

if TYPE_CHECKING:  # torch is imported where a patch runs, not when verl-ext loads
    import torch

logger = logging.getLogger("verl_ext")


@dataclass(frozen=True)
class Patch:
    name: str
    module: str  # the verl module the patch changes
    target: str  # qualified name inside ``module`` whose source holds ``snippet``
    snippet: str  # the verl source text the patch exists because of
    apply: Callable[[object], None]  # receives the imported module
    replaces: str  # ``module:name`` the patch rebinds (verl_ext.replacements lists it)

    def target_source(self) -> str:
        obj = importlib.import_module(self.module)
        for part in self.target.split("."):
            obj = getattr(obj, part)
        if getattr(obj, "_verl_ext_patched", False) and self.name in REPLACED:  # rebound here: read verl's
            obj = REPLACED[self.name]
        return inspect.getsource(obj)

    def still_needed(self) -> bool:
        """True while verl still contains the code this patch works around."""
        return self.snippet in self.target_source()

    def snippet_in_module_file(self) -> bool:
        """``still_needed`` without importing ``module`` (verl's vLLM modules need vllm to import):
        the snippet is in the module's source file."""
        root = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
        path = root.joinpath(*self.module.split(".")[1:]).with_suffix(".py")
        return self.snippet in path.read_text()


APPLIED: list[str] = []
SKIPPED: dict[str, str] = {}
REPLACED: dict[str, Callable] = {}  # patch name -> the verl function it replaced (where one was), in this process


def _dedupe_backend(backend: str | None) -> str | None:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: keep the first backend per device type."""
    if not backend or "," not in backend:
        return backend
    seen: dict[str, str] = {}
    for part in backend.split(","):
        device = part.split(":", 1)[0] if ":" in part else part
        seen.setdefault(device, part)
    return ",".join(seen.values())


def _patch_init_process_group(_module: object) -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_verl_ext_patched", False):
        return

    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _dedupe_backend(kwargs["backend"])
        elif args:
            args = (_dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._verl_ext_patched = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def _patch_valuehead_attention(module: object) -> None:
    original = module.load_valuehead_model
    if getattr(original, "_verl_ext_patched", False):
        return
    import transformers

    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        # verl hard-codes attn_implementation="flash_attention_2"; use the attention the critic's
        # config asks for (critic.model.override_config.attn_implementation, which verl's
        # HFModelConfig put into model_config) by rewriting that argument for the duration of the call.
        configured = getattr(model_config, "_attn_implementation", None) or "flash_attention_2"
        auto_classes = (transformers.AutoModelForTokenClassification, transformers.AutoModelForCausalLM)
        own = {cls: cls.__dict__.get("from_pretrained") for cls in auto_classes}

        def with_configured_attention(bound_from_pretrained):
            def from_pretrained(_cls, *args, **kwargs):
                if kwargs.get("attn_implementation") == "flash_attention_2":
                    kwargs["attn_implementation"] = configured
                return bound_from_pretrained(*args, **kwargs)

            return classmethod(from_pretrained)

        try:
            for cls in auto_classes:
                cls.from_pretrained = with_configured_attention(cls.from_pretrained)
            return original(local_path, torch_dtype, model_config, trust_remote_code)
        finally:
            for cls, descriptor in own.items():
                if descriptor is None:
                    delattr(cls, "from_pretrained")
                else:
                    cls.from_pretrained = descriptor

    load_valuehead_model._verl_ext_patched = True  # type: ignore[attr-defined]
    module.load_valuehead_model = load_valuehead_model


def _patch_offload_pin_memory(module: object) -> None:
    base = module.CPUOffloadPolicy
    if getattr(base, "_verl_ext_patched", False):
        return

    # A subclass, so FSDP2's isinstance checks still hold; pinning needs an accelerator.
    class CPUOffloadPolicyNoPin(base):  # type: ignore[misc, valid-type]
        _verl_ext_patched = True

        def __init__(self, pin_memory: bool = False, **kwargs):
            super().__init__(pin_memory=False, **kwargs)

    module.CPUOffloadPolicy = CPUOffloadPolicyNoPin


def _patch_model_copy_to_host(module: object) -> None:
    original = module.fsdp2_sharded_save_to_cpu
    if getattr(original, "_verl_ext_patched", False):
        return
    REPLACED["model_copy_to_host"] = original

    def fsdp2_sharded_save_to_cpu(model):
        # on the cpu backend `.cpu()` returns the parameter shard itself: without a copy the "saved"
        # weights follow every optimizer step (verl's separate_async anchor would be the live weights)
        state, spec = original(model)
        return {name: (tensor.clone(), tensor_spec) for name, (tensor, tensor_spec) in state.items()}, spec

    fsdp2_sharded_save_to_cpu._verl_ext_patched = True  # type: ignore[attr-defined]
    module.fsdp2_sharded_save_to_cpu = fsdp2_sharded_save_to_cpu  # read at call time by DetachActorWorker


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="gloo_backend_dedupe",
        module="verl.utils.distributed",
        target="initialize_global_process_group_ray",
        snippet='f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"',
        apply=_patch_init_process_group,
        replaces="torch.distributed:init_process_group",
    ),
    Patch(
        name="offload_no_pin_memory",
        module="verl.workers.engine.fsdp.transformer_impl",
        target="FSDPEngine._build_fsdp_module",
        snippet="CPUOffloadPolicy(pin_memory=True)",
        apply=_patch_offload_pin_memory,
        replaces="verl.workers.engine.fsdp.transformer_impl:CPUOffloadPolicy",
    ),
    Patch(
        name="model_copy_to_host",
        module="verl.utils.fsdp_utils",
        target="fsdp2_sharded_save_to_cpu",
        snippet="local_cpu_tensor = local_gpu_tensor.detach().cpu()",
        apply=_patch_model_copy_to_host,
        replaces="verl.utils.fsdp_utils:fsdp2_sharded_save_to_cpu",
    ),
)


# --- verl's log-prob fallback, a block of rows at a time (every backend) ---------------------------
# Without flash-attn's cross-entropy, ``verl.utils.torch_functional.logprobs_from_logits`` calls
# ``logprobs_from_logits_v2``, which loops over the first dimension one row at a time to bound peak
# memory. verl's FSDP engine passes it the packed logits, ``(total_tokens, vocab)``, so the loop runs
# once per *token*: 240k ``log_softmax`` calls (and as many backward nodes) in 12 SFT steps of 4
# transcripts, 4.2 s a step on an H200 for a 2.5M-parameter model whose forward + backward of the same
# tokens takes 0.03 s (docs/results.md, "GPU: where a step of the tiny model goes").
ROW_BLOCKS_SWITCH = "VERL_EXT_LOGPROB_ROW_BLOCKS"  # "0": keep verl's row-at-a-time loop
LOGPROB_BLOCK_ELEMENTS = 1 << 20  # logits per block: a few MiB, cache-sized (2^26 was slower on CPU for a 151k vocabulary)
ROW_ALONE_ELEMENTS = 1 << 15  # longer rows go one at a time, as in verl: their reduction may be split across
# threads, so summing them as part of a block could round differently (CPU: 2^15 is torch's reduction grain)


def logprobs_in_row_blocks(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """verl's ``logprobs_from_logits_v2`` with the same per-row math, over blocks of rows holding at
    most ``LOGPROB_BLOCK_ELEMENTS`` logits instead of one row at a time (rows longer than
    ``ROW_ALONE_ELEMENTS`` still one at a time).

    logits: ``(rows, ..., vocab)``; labels: ``(rows, ...)``; returns ``(rows, ...)``. float32/64:
    ``logit[label] - logsumexp(logits)``; other dtypes (bf16): ``log_softmax`` then gather, as verl.
    """
    import torch
    import torch.nn.functional as F

    per_row = logits[0].numel() if logits.shape[0] else 1
    rows = 1 if per_row > ROW_ALONE_ELEMENTS else max(1, LOGPROB_BLOCK_ELEMENTS // max(per_row, 1))
    blocks = []
    for block, block_labels in zip(logits.split(rows), labels.split(rows), strict=True):
        index = block_labels.unsqueeze(-1)
        if logits.dtype in (torch.float32, torch.float64):
            blocks.append(torch.gather(block, -1, index).squeeze(-1) - torch.logsumexp(block, dim=-1))
        else:  # verl: logsumexp is unstable in bf16
            blocks.append(F.log_softmax(block, dim=-1).gather(-1, index).squeeze(-1))
    return torch.cat(blocks) if blocks else labels.new_empty(labels.shape, dtype=logits.dtype)


def _patch_logprob_row_blocks(module: object) -> None:
    if getattr(module.logprobs_from_logits_v2, "_verl_ext_patched", False):
        return
    REPLACED["logprob_row_blocks"] = module.logprobs_from_logits_v2
    logprobs_in_row_blocks._verl_ext_patched = True  # type: ignore[attr-defined]
    module.logprobs_from_logits_v2 = logprobs_in_row_blocks  # looked up at call time by logprobs_from_logits


ENGINE_PATCHES: tuple[Patch, ...] = (
    Patch(
        name="logprob_row_blocks",
        module="verl.utils.torch_functional",
        target="logprobs_from_logits_v2",
        snippet="for row_logits, row_labels in zip(logits, labels, strict=True):",
        apply=_patch_logprob_row_blocks,
        replaces="verl.utils.torch_functional:logprobs_from_logits_v2",
    ),
)


# --- verl's colocated weight-transfer socket, per Ray cluster (every backend with vLLM) -----------
# verl names the ZMQ socket through which the trainer sends each weight version to its colocated vLLM
# workers ``/tmp/rl-colocate-zmq-<ray job id>-replica-<r>-rank-<k>.sock``: the trainer side in
# ``ServerAdapter.__init__``, the vLLM worker side from ``VERL_RAY_JOB_ID``, which
# ``vLLMHttpServer.__init__`` sets for the workers it starts. Every Ray cluster that ``main_ppo``
# starts numbers its first job ``01000000``, so concurrent runs on one host share the path and one
# run's vLLM worker can read another run's weight messages (seen: docs/howto/share_a_gpu_host.md,
# "Several runs on one host"). Both sides get the Ray cluster's session in the job-id part of the name.
SCOPE_SWITCH = "VERL_EXT_SCOPE_WEIGHT_SOCKET"  # "0": leave verl's socket name alone


def scoped_job_id(job_id: str, session_name: str) -> str:
    """``job_id`` made unique per Ray cluster: a short hash of the cluster's session name (the same
    in every process of a cluster, different between clusters). Short, because the socket path must
    stay under the 107 characters a Unix socket path may have."""
    return f"{job_id}-{hashlib.sha1(session_name.encode()).hexdigest()[:8]}"


def _ray_ids() -> tuple[str, str]:
    import ray

    context = ray.get_runtime_context()
    return context.get_job_id(), context.get_session_name()


def _run_after_init(cls: type, after: Callable[[object], None]) -> None:
    """Make ``cls.__init__`` call ``after(self)`` once verl's own constructor has run (once)."""
    if getattr(cls.__init__, "_verl_ext_scoped", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        after(self)

    __init__._verl_ext_scoped = True
    cls.__init__ = __init__


def _scope_worker_job_id(_server: object) -> None:
    job_id, session = _ray_ids()
    os.environ["VERL_RAY_JOB_ID"] = scoped_job_id(job_id, session)


def _scope_trainer_socket(adapter) -> None:
    job_id, session = _ray_ids()
    adapter.zmq_handle = adapter.zmq_handle.replace(f"-zmq-{job_id}-", f"-zmq-{scoped_job_id(job_id, session)}-", 1)


def _patch_server_job_id(module: object) -> None:
    """After verl's ``vLLMHttpServer.__init__`` set ``VERL_RAY_JOB_ID`` for the vLLM workers it
    will start, scope it to this Ray cluster (the workers build their socket name from it)."""
    _run_after_init(module.vLLMHttpServer, _scope_worker_job_id)


def _patch_adapter_socket(module: object) -> None:
    """After verl's ``ServerAdapter.__init__`` named the trainer's end of the socket, put the same
    scoped job id in it as the vLLM workers get."""
    _run_after_init(module.ServerAdapter, _scope_trainer_socket)


VLLM_PATCHES: tuple[Patch, ...] = (  # both or neither: the two ends must name the same socket
    Patch(
        name="weight_socket_per_cluster_server",
        module="verl.workers.rollout.vllm_rollout.vllm_async_server",
        target="vLLMHttpServer.__init__",
        snippet='os.environ["VERL_RAY_JOB_ID"] = ray.get_runtime_context().get_job_id()',
        apply=_patch_server_job_id,
        replaces="verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.__init__",
    ),
    Patch(
        name="weight_socket_per_cluster_adapter",
        module="verl.workers.rollout.vllm_rollout.vllm_rollout",
        target="ServerAdapter.__init__",
        snippet='self.zmq_handle = f"ipc:///tmp/rl-colocate-zmq-{job_id}-replica-{self.replica_rank}-rank-{local_rank}.sock"',
        apply=_patch_adapter_socket,
        replaces="verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.__init__",
    ),
)


# --- verl's separate_async trainer without colocated replicas (every backend) ---------------------
# ``PPOTrainerSeparateAsync._setup`` logs "hybrid replicas disabled" with ``logger.info(..., flush=True)``
# when ``actor_rollout_ref.hybrid_engine=False``: ``logging.Logger`` takes no ``flush`` and raises
# ``TypeError``, so that setting (rollout on the standalone pool only) cannot start in verl 0.9.1.


class _DropFlush(logging.LoggerAdapter):
    """verl's module logger, taking (and ignoring) a ``flush`` keyword."""

    _verl_ext_patched = True

    def process(self, msg, kwargs):
        kwargs.pop("flush", None)
        return msg, kwargs


def _patch_separate_async_log(module: object) -> None:
    if not isinstance(module.logger, _DropFlush):
        module.logger = _DropFlush(module.logger, {})


TRAINER_PATCHES: tuple[Patch, ...] = (
    Patch(
        name="valuehead_sdpa",
        module="verl.utils.model",
        target="load_valuehead_model",
        snippet='attn_implementation="flash_attention_2"',
        apply=_patch_valuehead_attention,
        replaces="verl.utils.model:load_valuehead_model",
    ),
    Patch(
        name="separate_async_log_flush",
        module="verl.trainer.ppo.v1.trainer_separate_async",
        target="PPOTrainerSeparateAsync._setup",
        snippet="flush=True,",
        apply=_patch_separate_async_log,
        replaces="verl.trainer.ppo.v1.trainer_separate_async:logger",
    ),
)

# Every patch, whatever its scope: the cpu backend's first, then every backend's, then vLLM's
# (doctor lists them in this order).
ALL: tuple[Patch, ...] = (*PATCHES, *ENGINE_PATCHES, *TRAINER_PATCHES, *VLLM_PATCHES)


def cpu_backend_active() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"


def _verl_version() -> str | None:
    """The installed distribution's version first: a hook may fire while ``verl/__init__`` is still
    running (it imports torch_functional before it sets ``verl.__version__``); a source tree on
    ``PYTHONPATH`` has no distribution, and by then its ``verl.__version__`` may be set."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return getattr(sys.modules.get("verl"), "__version__", None)


def _apply(patch: Patch) -> None:
    found = _verl_version()
    if found != VERL_VERSION:
        SKIPPED[patch.name] = f"verl {found} != {VERL_VERSION}"
        logger.warning("verl-ext: patch %s skipped: written for verl %s, found %s", patch.name, VERL_VERSION, found)
        return
    patch.apply(importlib.import_module(patch.module))
    if patch.name not in APPLIED:
        APPLIED.append(patch.name)


def install() -> None:
    """Apply each patch when its verl module is imported: ``PATCHES`` on the cpu backend only,
    ``ENGINE_PATCHES`` everywhere unless ``VERL_EXT_LOGPROB_ROW_BLOCKS=0``, ``VLLM_PATCHES``
    everywhere unless ``VERL_EXT_SCOPE_WEIGHT_SOCKET=0`` (set it for the whole run: the trainer's
    and the servers' processes must agree), ``TRAINER_PATCHES`` everywhere."""
    selected = (list(PATCHES) if cpu_backend_active() else []) + list(TRAINER_PATCHES)
    if os.environ.get(ROW_BLOCKS_SWITCH, "1").strip() != "0":
        selected += ENGINE_PATCHES
    if os.environ.get(SCOPE_SWITCH, "1").strip() != "0":
        selected += VLLM_PATCHES
    for patch in selected:
        when_imported(patch.module, lambda patch=patch: _apply(patch))
