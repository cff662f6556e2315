"""verl-ext's runtime replacements of verl names (patches/README.md lists them): each still
targets real verl code, and each takes effect in the verl code path that uses the replaced name.
A failing `still_needed` test means verl changed the patched code: review or drop the patch; a
failing behavioural test means verl no longer calls the replaced name or the patch stopped working."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_ext import patches

REPO = Path(__file__).resolve().parents[2]
# the vLLM patches have their own tests below: verl's vLLM modules need vllm (absent here), and they share one page
OUTSIDE_VLLM = tuple(p for p in patches.ALL if p not in patches.VLLM_PATCHES)


@pytest.mark.parametrize("patch", OUTSIDE_VLLM, ids=lambda p: p.name)
def test_patch_target_still_exists_in_verl(patch):
    assert patch.still_needed(), f"{patch.module}.{patch.target} no longer contains {patch.snippet!r}"


@pytest.mark.parametrize("patch", OUTSIDE_VLLM, ids=lambda p: p.name)
def test_patch_is_documented_in_patches_folder(patch):
    doc = REPO / "patches" / f"{patch.name}.md"
    assert doc.exists(), f"missing {doc}"
    text = doc.read_text()
    assert patch.module in text and patch.snippet in text


def test_separate_async_logs_without_colocated_replicas():
    """verl's own module logger, as ``PPOTrainerSeparateAsync._setup`` calls it with
    ``hybrid_engine=False`` (``flush=True``), logs instead of raising (the trainer run:
    ``tests/e2e/test_separate_async_e2e.py``, snapshot without colocated replicas)."""
    import logging

    from verl.trainer.ppo.v1 import trainer_separate_async

    assert "separate_async_log_flush" in patches.APPLIED  # applied at `import verl` by verl-ext's plugin
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    trainer_separate_async.logger.logger.addHandler(handler)
    try:
        trainer_separate_async.logger.warning("hybrid replicas disabled", flush=True)
    finally:
        trainer_separate_async.logger.logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["hybrid replicas disabled"]


def test_backend_string_dedupe():
    assert patches._dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert patches._dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert patches._dedupe_backend("gloo") == "gloo"
    assert patches._dedupe_backend(None) is None


def test_offload_policy_patch_never_pins_and_keeps_the_type():
    module = importlib.import_module("verl.workers.engine.fsdp.transformer_impl")
    original = module.CPUOffloadPolicy
    try:
        patches._patch_offload_pin_memory(module)
        policy = module.CPUOffloadPolicy(pin_memory=True)
        assert policy.pin_memory is False
        assert isinstance(policy, original)  # FSDP2 checks isinstance(offload_policy, CPUOffloadPolicy)
        patches._patch_offload_pin_memory(module)  # idempotent
        assert module.CPUOffloadPolicy.__mro__[1] is original
    finally:
        module.CPUOffloadPolicy = original


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_valuehead_patch_loads_the_attention_the_config_names(tiny_model_dir, attention):
    """verl hard-codes flash-attention 2; the patch loads what the config carries (verl's
    HFModelConfig sets it from ``override_config.attn_implementation``)."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    module = importlib.import_module("verl.utils.model")
    original = module.load_valuehead_model
    descriptor = AutoModelForTokenClassification.__dict__.get("from_pretrained")
    try:
        patches._patch_valuehead_attention(module)
        config = AutoConfig.from_pretrained(tiny_model_dir, attn_implementation=attention)
        config.num_labels = 1
        model = module.load_valuehead_model(tiny_model_dir, torch.float32, config, False)
        assert model.config._attn_implementation == attention
        assert AutoModelForTokenClassification.__dict__.get("from_pretrained") is descriptor  # restored
    finally:
        module.load_valuehead_model = original


def test_init_process_group_patch_dedupes_gloo(monkeypatch):
    import torch.distributed as dist

    seen = {}
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: seen.update(kw))
    patches._patch_init_process_group(None)
    dist.init_process_group(backend="cpu:gloo,cpu:gloo", rank=0, world_size=1)
    assert seen["backend"] == "cpu:gloo"


# verl's own code paths on the cpu platform: the process group as verl's workers start it, then
# a forward-only (reference) engine and a critic (value-head) engine built by verl's FSDP2 engine.
ENGINES_ON_CPU = """
import os, socket, sys
os.environ.update(VERL_PLATFORM="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); os.environ["MASTER_PORT"] = str(s.getsockname()[1])
import torch
from verl.utils.distributed import initialize_global_process_group_ray
from verl.trainer.config import CheckpointConfig
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
from verl.workers.engine import EngineRegistry
from verl_ext import patches

initialize_global_process_group_ray()  # builds "cpu:gloo,cpu:gloo" (gloo_backend_dedupe)
assert torch.distributed.get_world_size() == 1

def engine(model_type, forward_only):
    model = HFModelConfig(path=sys.argv[1], model_type=model_type, use_remove_padding=False,
                          override_config={"attn_implementation": "sdpa"})
    config = FSDPEngineConfig(strategy="fsdp2", forward_only=forward_only, use_torch_compile=False,
                              mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"})
    built = EngineRegistry.new(model_type=model_type, backend="fsdp2", model_config=model, engine_config=config,
                               optimizer_config=FSDPOptimizerConfig(lr=1e-3), checkpoint_config=CheckpointConfig())
    built.initialize()
    return built

ref = engine("language_model", True)  # offload_no_pin_memory: verl asks for pinned memory here
policy = ref.module._get_fsdp_state()._fsdp_param_group.offload_policy
assert getattr(type(policy), "_verl_ext_patched", False) and policy.pin_memory is False, policy
critic = engine("value_model", False)  # valuehead_sdpa: verl asks for flash-attention 2 here, the config for sdpa
assert critic.module.config._attn_implementation == "sdpa"
# model_copy_to_host: separate_async's window anchor, as DetachActorWorker saves and restores it
from verl.utils import fsdp_utils
saved, spec = fsdp_utils.fsdp2_sharded_save_to_cpu(critic.module)
kept = [p.to_local().clone() for p in critic.module.parameters()]
with torch.no_grad():
    for p in critic.module.parameters():
        p.add_(1.0)  # an optimizer step after the save
fsdp_utils.fsdp2_sharded_load_from_cpu(critic.module, saved, spec)
assert all(torch.equal(p.to_local(), k) for p, k in zip(critic.module.parameters(), kept)), "the save followed the step"
print("applied:", ",".join(sorted(patches.APPLIED)))
"""


def test_cpu_patches_take_effect_in_verls_own_engine_build(tiny_model_dir):
    proc = subprocess.run([sys.executable, "-c", ENGINES_ON_CPU, tiny_model_dir], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert ("applied: gloo_backend_dedupe,logprob_row_blocks,model_copy_to_host,offload_no_pin_memory,valuehead_sdpa"
            in proc.stdout)


def test_old_logit_state_wraps_the_optimizer_step_verls_train_batch_calls():
    """``install_worker_state`` replaces ``engine.optimizer_step`` on the engine instance; verl's
    ``BaseEngine.train_batch`` (which the FSDP engine does not override) must still call it."""
    import torch
    from types import SimpleNamespace

    from tensordict import TensorDict
    from verl.workers.engine.base import BaseEngine
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from verl_ext.old_logits import OldLogitsConfig
    from verl_ext.old_logits.worker_side import STATE_ATTR, install_worker_state

    assert "train_batch" not in vars(FSDPEngine), "the FSDP engine now has its own train_batch: re-check the wrapper"

    class OneLinear(BaseEngine):  # verl's engine interface over one nn.Linear and SGD
        def __init__(self):
            self.module = torch.nn.Linear(3, 1)
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.5)

        def optimizer_zero_grad(self):
            self.optimizer.zero_grad()

        def forward_backward_batch(self, data, loss_function, forward_only=False):
            loss_function(self.module(data["x"])).backward()
            return {"metrics": {}}

        def optimizer_step(self):
            self.optimizer.step()
            return 1.0

        def is_mp_src_rank_with_outputs(self):
            return True

    engine = OneLinear()
    worker = SimpleNamespace(actor=SimpleNamespace(engine=engine))
    install_worker_state(worker, OldLogitsConfig.from_config({"provider": "ewma", "ewma": {"com": 1.0}}, None), 1, 0)
    state = getattr(worker, STATE_ATTR)
    before = [p.detach().clone() for p in engine.module.parameters()]
    engine.train_batch(TensorDict({"x": torch.ones(2, 3)}, batch_size=2), lambda out: out.sum())  # verl's own
    assert state.ewma.num_updates == 1  # the wrapper ran around verl's optimizer_step call
    assert any(not torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))


class _OneBatchStore:
    """TransferQueue's two batch calls over one in-memory TensorDict (the storage, not the code
    under test): gets return the stored fields that exist, puts add fields."""

    def __init__(self, keys: list[str], fields):
        self.keys, self.data = keys, fields

    def kv_batch_get(self, keys, partition_id, select_fields):
        assert list(keys) == self.keys
        return self.data.select(*select_fields, strict=False).clone()

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue.metadata import KVBatchMeta

        assert list(keys) == self.keys
        self.data.update(fields)
        return KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id)


def test_advantage_hook_runs_the_step_aware_estimator_inside_verls_compute_advantage(monkeypatch):
    """The verl-ext trainers replace ``trainer_base.compute_advantage_for_multi_trajectories`` for
    the duration of verl's own ``_compute_advantage``. Through verl's stub registration, gigpo
    would raise StepMetadataRequiredError; here it must write the glue's advantages, and verl's
    function must be back in place afterwards."""
    import torch
    import transfer_queue as tq
    from tensordict import NonTensorStack, TensorDict
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.v1 import trainer_base

    from verl_ext.advantages.verl_glue import compute_token_advantages
    from verl_ext.compose import compose
    from verl_ext.steps import StepMetadata
    from verl_ext.trainer import VerlExtTrainerSync

    lengths, success, uids = [3, 5, 4, 2], [1.0, 0.0, 0.0, 1.0], ["g0", "g0", "g1", "g1"]
    extra = [StepMetadata(f"t{i}", [0, 1], ["s", f"s{i % 2}"], [0.0, r], spans=[[0, 1], [1, n]]).to_extra_fields()
             for i, (n, r) in enumerate(zip(lengths, success))]
    masks = [torch.ones(n, dtype=torch.int64) for n in lengths]
    scores = [torch.nn.functional.pad(torch.tensor([r]), (n - 1, 0)) for n, r in zip(lengths, success)]
    jagged = lambda rows: torch.nested.as_nested_tensor(rows, layout=torch.jagged)  # noqa: E731
    keys = [f"k{i}" for i in range(len(lengths))]
    store = _OneBatchStore(keys, TensorDict({
        "response_mask": jagged(masks), "rm_scores": jagged(scores),
        "uid": NonTensorStack(*uids), "extra_fields": NonTensorStack(*extra)}, batch_size=len(keys)))
    monkeypatch.setattr(tq, "kv_batch_get", store.kv_batch_get)
    monkeypatch.setattr(tq, "kv_batch_put", store.kv_batch_put)

    trainer = object.__new__(VerlExtTrainerSync)  # only _compute_advantage runs: no workers needed
    trainer.config = compose(["+plugins/advantage=gigpo", "actor_rollout_ref.rollout.n=2"])
    # what verl's and verl-ext's __init__ set that _compute_advantage reads: one local update per step
    trainer.local_trigger_step, trainer.parameter_sync_step, trainer.verl_ext_config = 0, 1, {}
    verls = trainer_base.compute_advantage_for_multi_trajectories
    trainer._compute_advantage(KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train"), {})

    assert trainer_base.compute_advantage_for_multi_trajectories is verls
    written = store.data.select("advantages").to_padded_tensor()["advantages"]
    expected, _ = compute_token_advantages(
        "gigpo", response_mask=torch.nn.utils.rnn.pad_sequence(masks, batch_first=True), extra_fields=extra,
        uids=uids, scores=torch.tensor(success), algo_config=trainer.config.algorithm, row_keys=keys)
    torch.testing.assert_close(written, expected)
    assert written.abs().sum() > 0


def test_dedicated_scorer_gets_each_version_in_verls_weight_sync_before_generation_resumes():
    """``_after_each_weight_sync`` replaces ``update_weights`` on the trainer's checkpoint manager
    instance; verl's own ``on_step_end`` (colocate_async) must call it, and the hook must run
    before verl resumes generation, so the scorer holds a version before any token of it exists."""
    from verl_ext.trainer import VerlExtTrainerColocateAsync, _after_each_weight_sync

    calls = []

    class Replicas:  # the checkpoint manager's side effects, recorded (the code under test is verl's)
        def update_weights(self, global_steps=None):
            calls.append(("update", global_steps))

        def resume_generation_replicas(self):
            calls.append(("resume",))

    trainer = object.__new__(VerlExtTrainerColocateAsync)
    trainer.checkpoint_manager, trainer.timing_raw, trainer.global_steps = Replicas(), {}, 3
    _after_each_weight_sync(trainer.checkpoint_manager, lambda version: calls.append(("scorer", version)))
    trainer.on_step_end()  # verl's PPOTrainerColocateAsync.on_step_end
    assert calls == [("update", 3), ("scorer", 3), ("resume",)]
    calls.clear()
    trainer.checkpoint_manager.update_weights()  # verl's _validate re-sends the current weights
    assert calls == [("update", None)]


def test_rollout_side_providers_get_verls_vllm_replica_with_counting_servers_while_the_trainer_builds():
    """``counting_rollout_replicas`` re-registers verl's ``vllm`` replica loader for the duration of
    the trainer's ``_setup``; verl's ``LLMServerManager`` resolves its replica class through that
    registry (``get_rollout_replica_class``), and the loader is verl's again afterwards. (The
    counting replica itself imports vLLM: it runs in ``tests/gpu/test_exact_providers_vllm.py``.)"""
    import inspect

    from verl.workers.rollout import llm_server
    from verl.workers.rollout.replica import RolloutReplicaRegistry, get_rollout_replica_class

    from verl_ext.old_logits.rollout_side import counting_rollout_replicas

    assert "get_rollout_replica_class(" in inspect.getsource(llm_server.LLMServerManager.__init__)
    assert "RolloutReplicaRegistry.get(rollout)" in inspect.getsource(get_rollout_replica_class)
    verls = RolloutReplicaRegistry._registry["vllm"]
    with counting_rollout_replicas("vllm", needed=True):
        loader = RolloutReplicaRegistry._registry["vllm"]
        assert loader is not verls and "SegmentCountingVLLMReplica" in inspect.getsource(loader)
    assert RolloutReplicaRegistry._registry["vllm"] is verls
    for rollout, needed in (("vllm", False), ("hf", True)):  # nothing to count / hf counts natively
        with counting_rollout_replicas(rollout, needed):
            assert RolloutReplicaRegistry._registry["vllm"] is verls


# --- verl's log-prob fallback in blocks of rows (every backend) -----------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(3000, 64), (3, 50, 64), (4, 40000)],
                         ids=["packed tokens x vocab", "batch x seq x vocab", "rows longer than a block takes"])
def test_logprob_row_blocks_equals_verls_loop_bit_for_bit_with_gradients(shape, dtype):
    import torch

    verls = patches.REPLACED["logprob_row_blocks"]  # applied in this process by verl-ext's plugin at `import verl`
    torch.manual_seed(0)
    logits = (3 * torch.randn(*shape)).to(getattr(torch, dtype))
    labels = torch.randint(0, shape[-1], shape[:-1])
    outputs, grads = [], []
    for fn in (verls, patches.logprobs_in_row_blocks):
        x = logits.clone().requires_grad_()
        out = fn(x, labels)
        out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype))
        outputs.append(out.detach())
        grads.append(x.grad)
    assert outputs[0].shape == shape[:-1]
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(grads[0], grads[1])


def test_logprob_row_blocks_is_what_verls_engine_calls_one_block_not_one_row_per_token(monkeypatch):
    """verl's FSDP engine calls ``logprobs_from_logits`` (imported by name) on the packed
    ``(tokens, vocab)`` logits; without flash-attn that calls ``logprobs_from_logits_v2`` from
    torch_functional's globals, once per token in verl's loop, once per block after the patch."""
    import torch
    from verl.utils import torch_functional
    from verl.workers.engine.fsdp import transformer_impl

    assert "logprob_row_blocks" in patches.APPLIED
    assert not torch_functional.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE  # the fallback is verl's path here
    calls = []
    real = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    logits, labels = torch.randn(2000, 32), torch.randint(0, 32, (2000,))
    out = transformer_impl.logprobs_from_logits(logits=logits, labels=labels)
    assert len(calls) == 1 and out.shape == (2000,)
    calls.clear()
    patches.REPLACED["logprob_row_blocks"](logits, labels)
    assert len(calls) == 2000  # verl's own loop: one row (here: one token) at a time


def test_version_guard_reads_the_distribution_and_skips_when_verl_has_no_version_yet(monkeypatch):
    """A post-import hook can fire while verl/__init__ is still running (no ``verl.__version__`` yet): the
    guard reads the installed distribution; without one (a source tree on PYTHONPATH) it reads the module's
    attribute, and where neither exists the patch is skipped with the reason, not applied blind."""
    import importlib.metadata
    import types

    assert patches._verl_version() == patches.VERL_VERSION  # the installed distribution

    def no_distribution(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", no_distribution)
    monkeypatch.setitem(sys.modules, "verl", types.SimpleNamespace(__version__=patches.VERL_VERSION))
    assert patches._verl_version() == patches.VERL_VERSION
    monkeypatch.setitem(sys.modules, "verl", types.SimpleNamespace())  # partly initialised: no version yet
    applied = []
    patch = patches.Patch(name="probe", module="json", target="dumps", snippet="", apply=applied.append, replaces="json:dumps")
    patches._apply(patch)
    assert applied == [] and patches.SKIPPED.pop("probe") == f"verl None != {patches.VERL_VERSION}"


def test_logprob_row_blocks_can_be_switched_off():
    code = "import verl.utils.torch_functional as f; from verl_ext import patches; print(sorted(patches.APPLIED), f.logprobs_from_logits_v2.__name__)"
    env = {**os.environ, patches.ROW_BLOCKS_SWITCH: "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "logprob_row_blocks" not in proc.stdout and "logprobs_from_logits_v2" in proc.stdout


# --- verl's weight-transfer socket, per Ray cluster (applies wherever verl's vLLM rollout runs) ----
@pytest.mark.parametrize("patch", patches.VLLM_PATCHES, ids=lambda p: p.name)
def test_vllm_patch_target_still_exists_in_verls_source(patch):
    # read, not imported: verl's vLLM modules need vllm, which the cpu install does not have
    assert patch.snippet_in_module_file(), f"{patch.module} no longer contains {patch.snippet!r}"
    doc = (REPO / "patches" / "weight_socket_per_cluster.md").read_text()
    assert patch.module in doc and patch.snippet in doc


def test_scoped_job_id_differs_between_ray_clusters_and_keeps_the_socket_path_short():
    a = patches.scoped_job_id("01000000", "session_2026-11-28_07-35-12_123456_4242")
    b = patches.scoped_job_id("01000000", "session_2026-11-28_07-35-12_123457_4243")
    assert a != b and a.startswith("01000000-")
    assert a == patches.scoped_job_id("01000000", "session_2026-11-28_07-35-12_123456_4242")  # every process agrees
    path = f"/tmp/rl-colocate-zmq-{a}-replica-15-rank-7.sock"
    assert len(path) < 107  # a Unix socket path's limit


def test_both_ends_of_the_weight_socket_get_the_same_cluster_scoped_name():
    """In a Ray process, the two wrapped constructors (around stand-ins doing exactly what the
    patches' snippets in verl do) give the trainer's end and the vLLM workers' end the same name,
    and a name other clusters' runs do not have."""
    import os
    import types

    import ray

    class vLLMHttpServer:  # noqa: N801 - verl's name: the line of vllm_async_server.py the patch targets
        def __init__(self):
            os.environ["VERL_RAY_JOB_ID"] = ray.get_runtime_context().get_job_id()

    class ServerAdapter:  # vllm_rollout.py's naming of the trainer's end
        def __init__(self, replica_rank=0, local_rank=0):
            self.replica_rank = replica_rank
            job_id = ray.get_runtime_context().get_job_id()
            self.zmq_handle = f"ipc:///tmp/rl-colocate-zmq-{job_id}-replica-{self.replica_rank}-rank-{local_rank}.sock"

    def worker_end(replica_rank=0, trainer_rank=0):  # utils.py's _get_zmq_handle, in the vLLM worker
        job_id = os.environ.get("VERL_RAY_JOB_ID", "0")
        return f"ipc:///tmp/rl-colocate-zmq-{job_id}-replica-{replica_rank}-rank-{trainer_rank}.sock"

    server_module = types.SimpleNamespace(vLLMHttpServer=vLLMHttpServer)
    adapter_module = types.SimpleNamespace(ServerAdapter=ServerAdapter)
    saved = os.environ.get("VERL_RAY_JOB_ID")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        unscoped = ServerAdapter().zmq_handle
        patches._patch_server_job_id(server_module)
        patches._patch_adapter_socket(adapter_module)
        patches._patch_adapter_socket(adapter_module)  # idempotent
        vLLMHttpServer()
        trainer_end = ServerAdapter().zmq_handle
        assert trainer_end == worker_end()
        assert trainer_end != unscoped
        session = ray.get_runtime_context().get_session_name()
        assert patches.scoped_job_id(ray.get_runtime_context().get_job_id(), session) in trainer_end
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("VERL_RAY_JOB_ID", None)
        else:
            os.environ["VERL_RAY_JOB_ID"] = saved
