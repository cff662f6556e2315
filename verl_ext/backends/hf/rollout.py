"""The ``hf`` rollout backend: verl's rollout-replica protocol over ``HFGenerationEngine``.

Three pieces, matching how verl 0.9.1 drives vLLM/SGLang:

- ``HFRolloutServer``: a Ray actor (one per replica) that serves ``generate`` token-in/token-out
  and the lifecycle calls verl's replica and checkpoint manager make (sleep/wake, abort/resume
  for partial rollouts, weight updates, global-step stamping).
- ``HFReplica``: the ``RolloutReplica`` that launches the server next to the training workers.
- ``HFServerAdapter``: the ``BaseRollout`` that lives inside each hybrid actor worker and pushes
  the trainer's weights to its replica's server after every step.

Each ``TokenOutput`` carries ``extra_fields["global_steps"]`` (the weight version that produced
its tokens, as vLLM's does) and ``extra_fields["token_global_steps"]`` (one version per token).
One server call never spans a weight update (updates happen while generation is paused), so
a resumed partial rollout's per-token versions are the concatenation of its calls' versions.

The ``dedicated`` old-logit provider's scorer is this server's forward-only twin
(``verl_ext.backends.hf.old_logit_scorer``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass, fields
from typing import Any

import ray
import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

from verl_ext.backends.hf.fp8_rollout import Fp8Rollout
from verl_ext.backends.hf.hf_engine import GenerationRequest, HFGenerationEngine
from verl_ext.backends.hf.wire import WireTensor, named_from_wire, to_wire
from verl_ext.old_logits.segment_log import ServedSegments
from verl_ext.waits import check_timeout, wait_for

logger = logging.getLogger("verl_ext.hf_rollout")

# How long the server waits after the first queued request for others to join its batch.
BATCH_WINDOW_S = 0.01


HF_KEY = "actor_rollout_ref.rollout.engine_kwargs.hf"


@dataclass(frozen=True)
class HFServerTimeouts:
    """``actor_rollout_ref.rollout.engine_kwargs.hf``: bounds on the trainer's waits for an ``hf``
    rollout server (verl keeps each engine's own settings under ``engine_kwargs.<engine>``).

    Attributes:
        start_timeout_s: the server actor's start and model load (a fresh Ray worker imports
            torch and transformers and reads the checkpoint: minutes on a cold node).
        update_timeout_s: one weight update (the full state crosses Ray's object store and is
            copied into the model on the host CPU).
    """

    start_timeout_s: float = 1800.0
    update_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for field in fields(self):
            check_timeout(f"{HF_KEY}.{field.name}", getattr(self, field.name))

    @classmethod
    def from_rollout(cls, config: Any) -> HFServerTimeouts:
        """From ``config.engine_kwargs.hf`` (a RolloutConfig or its DictConfig); names an unknown key."""
        values = dict((config.engine_kwargs or {}).get("hf") or {})
        unknown = sorted(set(values) - {field.name for field in fields(cls)})
        if unknown:
            raise ValueError(f"unknown key(s) {[f'{HF_KEY}.{k}' for k in unknown]} for the hf rollout")
        return cls(**{k: float(v) for k, v in values.items()})


def server_actor_name(replica_rank: int, suffix: str = "") -> str:
    return f"hf_rollout_server_{replica_rank}{suffix}"


def rollout_dtype(name: str) -> torch.dtype:
    """``actor_rollout_ref.rollout.dtype`` as a torch dtype: the precision the ``hf`` server
    computes in (as vLLM's ``dtype``). The cpu backend fragment sets ``float32``, the trainer's
    precision, so rollout and trainer agree to ~1e-9; ``bfloat16`` gives a real train/inference
    mismatch (bf16 weights, activations and logits against the fp32 trainer)."""
    dtypes = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
              "float16": torch.float16, "fp16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"actor_rollout_ref.rollout.dtype={name!r} is not supported by the hf rollout; "
                         f"use one of {sorted(dtypes)}")
    return dtypes[name]


class HFRolloutServer(ServedSegments):
    """Token-in/token-out generation server for one replica (runs as a Ray actor). It counts the
    segments it serves per weight version (``served_segments``) for the exact old-logit providers.

    Args:
        dtype: the precision to load the model in; None: ``config.dtype`` (``rollout_dtype``).
        device: where the model runs (the rollout server: the host CPU).
        quantization: ``"fp8"`` simulates vLLM's online fp8 (``fp8_rollout``); ``"config"`` (the
            default): ``config.quantization``, verl's ``actor_rollout_ref.rollout.quantization``.
    """

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, replica_rank: int,
                 dtype: torch.dtype | None = None, device: str = "cpu", quantization: str | None = "config") -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        config = omega_conf_to_dataclass(config)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.config = config
        self.replica_rank = replica_rank
        torch.set_num_threads(max(1, int(os.environ.get("VERL_EXT_HF_ROLLOUT_THREADS", "1"))))
        model = AutoModelForCausalLM.from_pretrained(
            model_config.local_path,
            dtype=dtype or rollout_dtype(config.dtype),
            attn_implementation="sdpa",
            trust_remote_code=model_config.trust_remote_code,
        ).to(device)
        tokenizer = model_config.tokenizer
        eos = set()
        try:
            gen_eos = GenerationConfig.from_pretrained(model_config.local_path).eos_token_id
            eos |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        except OSError:
            pass
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
        if quantization == "config":
            quantization = config.quantization
        fp8 = Fp8Rollout(model, quantization) if quantization is not None else None
        self.engine = HFGenerationEngine(model, eos, pad, seed=config.seed + replica_rank,
                                         after_load=fp8.requantize if fp8 is not None else None)
        self.max_batch = max(1, int(config.max_num_seqs or 64))
        self.global_steps: int | None = None

        self._queue: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._running = 0  # requests inside the batch being decoded
        self._batch_done: asyncio.Event | None = None
        # Generation gate for partial rollouts: closed by abort_all_requests, opened by resume.
        self._abort = threading.Event()
        self._gate_open: asyncio.Event | None = None
        self._rejecting = False

    # ------------------------------------------------------------------ generation
    def _ensure_loop(self) -> None:
        if self._loop_task is None:
            self._wakeup = asyncio.Event()
            self._batch_done = asyncio.Event()
            self._batch_done.set()
            self._gate_open = asyncio.Event()
            self._gate_open.set()
            self._loop_task = asyncio.get_running_loop().create_task(self._batch_loop())

    def _max_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        max_model_len = self.config.max_model_len or (self.config.prompt_length + self.config.response_length)
        room = max_model_len - prompt_len
        if room < 1:
            raise ValueError(
                f"prompt of {prompt_len} tokens leaves no room within max_model_len={max_model_len}; "
                "raise actor_rollout_ref.rollout.max_model_len or shorten the prompt"
            )
        requested = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        if requested is None:  # vLLM's default budget, so the two backends behave alike
            requested = min(
                self.config.response_length, self.config.prompt_length + self.config.response_length - prompt_len
            )
        return max(1, min(int(requested), room))

    def _aborted_output(self) -> TokenOutput:
        return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted", extra_fields=self._version_fields(0))

    def _version_fields(self, n_tokens: int) -> dict[str, Any]:
        return {"global_steps": self.global_steps, "token_global_steps": [self.global_steps] * n_tokens}

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        priority: int = 0,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data or video_data or audio_data:
            raise NotImplementedError("the hf rollout backend is text-only; use vLLM/SGLang for multimodal models")
        self._ensure_loop()
        while not self._gate_open.is_set():
            if self._rejecting:
                return self._aborted_output()
            await self._gate_open.wait()
        prompt_ids = [int(t) for t in prompt_ids]
        stop = sampling_params.get("stop_token_ids") or []
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=self._max_tokens(len(prompt_ids), sampling_params),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=int(sampling_params.get("top_k", -1) or -1),
            repetition_penalty=float(sampling_params.get("repetition_penalty", 1.0) or 1.0),
            stop_token_ids=frozenset(int(t) for t in stop),
            ignore_eos=bool(sampling_params.get("ignore_eos", self.config.ignore_eos)),
        )
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        self._wakeup.set()
        await future
        stop_reason = {"stop": "completed", "length": "completed", "abort": "aborted"}[request.finish_reason]
        return TokenOutput(
            token_ids=request.tokens,
            log_probs=request.log_probs if sampling_params.get("logprobs", True) else None,
            stop_reason=stop_reason,
            extra_fields=self._version_fields(len(request.tokens)),
        )

    async def _batch_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(BATCH_WINDOW_S)
            await self._gate_open.wait()
            taken, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            if not self._queue:
                self._wakeup.clear()
            if not taken:
                continue
            requests = [r for r, _ in taken]
            self._running = len(requests)
            self._batch_done.clear()
            try:
                await asyncio.to_thread(self.engine.generate, requests, self._abort.is_set)
                for request, future in taken:
                    if request.tokens:  # counted before the result is released and before an abort returns
                        self.count_served(self.global_steps)
                    future.set_result(None)
            except Exception as exc:  # a failed batch fails its requests, not the server
                logger.exception("hf rollout batch failed")
                for _, future in taken:
                    if not future.done():
                        future.set_exception(exc)
            finally:
                self._running = 0
                self._batch_done.set()

    # ------------------------------------------------------------------ partial rollout
    async def abort_all_requests(self, reject_request: bool = False, **kwargs: Any) -> dict[str, Any]:
        """Stop decoding; in-flight requests return their tokens so far as ``aborted``."""
        self._ensure_loop()
        self._gate_open.clear()
        self._rejecting = reject_request
        self._abort.set()
        queued, self._queue = self._queue, []
        for request, future in queued:  # never started: return empty aborted outputs
            request.finish_reason = "abort"
            future.set_result(None)
        aborted = self._running + len(queued)
        await self._batch_done.wait()
        return {"aborted_count": aborted, "request_ids": []}

    async def resume_generation(self) -> None:
        self._ensure_loop()
        self._abort.clear()
        self._rejecting = False
        self._gate_open.set()

    # ------------------------------------------------------------------ weights
    async def update_weights(self, named_tensors: dict[str, WireTensor], global_steps: int | None) -> int:
        """Loads full weights (``wire.named_to_wire``) and stamps them ``global_steps``."""
        loaded = await asyncio.to_thread(self.engine.load_weights, named_from_wire(named_tensors))
        if global_steps is not None:
            self.global_steps = global_steps
        return loaded

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def get_global_steps(self) -> int | None:
        return self.global_steps

    # ------------------------------------------------------------------ lifecycle no-ops
    # A CPU model has no device memory to free and no KV cache that outlives a batch.
    async def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    async def sleep(self) -> None:
        pass

    async def clear_kv_cache(self) -> None:
        pass

    async def release_kv_cache(self) -> None:
        pass

    async def resume_kv_cache(self) -> None:
        pass

    async def start_profile(self, **kwargs: Any) -> None:
        pass

    async def stop_profile(self) -> None:
        pass


class HFReplica(RolloutReplica):
    """A rollout replica served by one ``HFRolloutServer`` actor on the replica's first node."""

    async def launch_servers(self) -> None:
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
            placement = {
                "scheduling_strategy": ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_id, soft=False
                )
            }
        else:
            placement = {}
        role = "_reward" if self.is_reward_model else "_teacher" if self.is_teacher_model else ""
        name = server_actor_name(self.replica_rank, f"{role}{self.name_suffix}")
        server = (
            ray.remote(HFRolloutServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency, **placement)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        timeout_s = HFServerTimeouts.from_rollout(self.config).start_timeout_s
        # surfaces model-loading errors here, not at first use
        await wait_for(server.get_global_steps.remote(), timeout_s, f"the hf rollout server (Ray actor {name})",
                       "start and load the model", f"{HF_KEY}.start_timeout_s")
        self.servers = [server]
        self._server_handle = server
        # Only a load-balancer key: agent loops talk to the handle, not over HTTP.
        self._server_address = f"hf://{name}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(BaseRollout):
    """Lives in each hybrid actor worker; sends the trainer's weights to its replica's server."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        replica_world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // replica_world if replica_rank == -1 else replica_rank
        self.is_leader = rank % replica_world == 0
        self.sleep_level = 2  # read by verl's worker for sglang only; kept for protocol parity
        self.update_timeout_s = HFServerTimeouts.from_rollout(self.config).update_timeout_s
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        pass

    async def release(self) -> None:
        pass

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: int | None = None, **kwargs):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf rollout supports wire_format='named_tensors' only, got {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("hf rollout: LoRA adapters must be merged (actor_rollout_ref.model.lora.merge=True)")
        # Every rank iterates: for FSDP the generator all-gathers each tensor collectively. A checkpoint
        # engine of separate pools (verl_ext.backends.host_memory) hands an asynchronous iterator.
        state = {name: to_wire(tensor.detach().to("cpu", copy=True))
                 async for name, tensor in ensure_async_iterator(weights)}
        if self.is_leader:
            await wait_for(self._server_handle().update_weights.remote(state, global_steps), self.update_timeout_s,
                           f"the hf rollout server (Ray actor {server_actor_name(self.replica_rank)})",
                           f"load the weights of version {global_steps}", f"{HF_KEY}.update_timeout_s")
