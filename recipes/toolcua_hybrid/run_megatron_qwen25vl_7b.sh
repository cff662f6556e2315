#!/usr/bin/env bash
# toolcua_hybrid on Qwen2.5-VL-7B-Instruct with verl's Megatron engine (mbridge loads the HF
# checkpoint): 1 node x 8 GPUs, TP=2 x PP=1 x DP=4 for training, vLLM rollout, screenshots on.
#   bash recipes/toolcua_hybrid/run_megatron_qwen25vl_7b.sh [hydra overrides...]
# Env: MODEL, DATA_DIR, OUT, N_GPUS, NNODES, TP, PP, ROLLOUT_TP, LOGGER, ATTENTION.
# Needs TransformerEngine, megatron-core and Megatron-Bridge (`verl-ext bundle --extras megatron`;
# the verl-ext trainer refuses to start without them, naming the package and the fix).
# One GPU (what ran on an H200 is in docs/howto/megatron.md): N_GPUS=1 TP=1 ROLLOUT_TP=1, plus
#   data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 and a smaller model
#   (MODEL=<verl-ext make-tiny-model DIR --arch qwen2.5-vl-7b>); TP=2 PP=2 on 4 GPUs composes
#   (tests/test_flagship_gpu_scripts_on_cpu.py).
# Old logits: the recipe's `ewma` provider tracks each rank's bf16 Megatron model parameters
# (every model chunk; not the optimizer's fp32 main copies) and swaps them in place.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/verl_ext/minidesk}
OUT=${OUT:-$PWD/runs/toolcua_hybrid/qwen25vl_7b_megatron}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
TP=${TP:-2}                          # as verl's own Qwen2.5-VL-7B Megatron example
PP=${PP:-1}                          # PP>1 splits the LLM layers; the vision tower stays on stage 0
ROLLOUT_TP=${ROLLOUT_TP:-2}
LOGGER=${LOGGER:-[console,file]}
ATTENTION=${ATTENTION:-fused}          # TransformerEngine's cuDNN attention; `flash` needs flash-attn
export VERL_FILE_LOGGER_PATH=${VERL_FILE_LOGGER_PATH:-$OUT/metrics.jsonl}
export CUDA_DEVICE_MAX_CONNECTIONS=1   # Megatron overlaps TP communication with compute only with 1

[ -f "$DATA_DIR/train.parquet" ] || verl-ext prepare-data minidesk "$DATA_DIR" --train-size 4096 --val-size 128 >&2

# Same batch, lengths and agent loop as run_fsdp_qwen25vl_7b.sh, so the two engines compare.
exec python -m verl.trainer.main_ppo --config-name ppo_megatron_trainer --config-dir "$HERE" +recipe=toolcua_hybrid \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=32 \
    data.max_prompt_length=4096 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$TP" \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$PP" \
    actor_rollout_ref.actor.megatron.param_offload=false \
    actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend="$ATTENTION" \
    actor_rollout_ref.actor.megatron.optimizer_offload=false \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    +actor_rollout_ref.rollout.limit_images=1 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loops_vl.yaml" \
    algorithm.hgpo.history_length=2 \
    trainer.logger="$LOGGER" \
    trainer.experiment_name=qwen25vl_7b_megatron_tp${TP}_pp${PP} \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps=300 \
    trainer.save_freq=25 \
    trainer.test_freq=25 \
    "$@"
