#!/usr/bin/env bash
# text_hybrid on one GPU node: the cpu recipe's runs (run_cpu.sh, train.sh) with FSDP2 training and
# vLLM rollout. The tiny random model answers the T/G menu, so this checks that every agent-loop
# rollout (free, UI-S1's semi-online, planner/executor) and its estimator run on vLLM
# (tests/gpu/test_step_aware_loops_gpu.py), not a skill.
#   bash recipes/text_hybrid/run_gpu.sh [hydra overrides...]
# Env: as run_cpu.sh (SEED, STEPS, LR, ADV, LOSS, MODE, PROVIDER, MODEL, OUT), plus
#   N_GPUS [1], BATCH (prompts a step) [8 x N_GPUS], GPU_MEM (vLLM's gpu_memory_utilization) [0.3], KV_CACHE_BYTES [unset: vLLM profiles
#   free memory; set it when several runs share a card, docs/howto/share_a_gpu_host.md]
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
N_GPUS=${N_GPUS:-1}
GPU_MEM=${GPU_MEM:-0.3}
BATCH=${BATCH:-$((8 * N_GPUS))}       # 8 prompts per GPU: every rank gets the same rows
BACKEND=gpu
# head dim 64 (vLLM's attention kernels take no head dim of 16, the cpu model's); ~2.5M parameters
TINY_MODEL=(--hidden-size 256 --layers 4 --dtype bfloat16)
# No flash-attn wheel: padded sdpa (use_remove_padding=false), for the critic (hiper) as well.
BACKEND_ARGS=(
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.model.use_remove_padding=false
    ++actor_rollout_ref.model.override_config.attn_implementation=sdpa
    critic.model.use_remove_padding=false
    ++critic.model.override_config.attn_implementation=sdpa
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEM"
    actor_rollout_ref.rollout.enforce_eager=true   # no CUDA-graph capture: faster start, the model is small
    actor_rollout_ref.rollout.agent.num_workers=2
    +ray_kwargs.ray_init.include_dashboard=false
    trainer.n_gpus_per_node="$N_GPUS"
    trainer.nnodes=1
)
if [ -n "${KV_CACHE_BYTES:-}" ]; then
    BACKEND_ARGS+=("+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=$KV_CACHE_BYTES")
fi
# shellcheck source=recipes/text_hybrid/train.sh
source "$HERE/train.sh"
train "$@"
