#!/usr/bin/env bash
# toolcua_hybrid on Qwen2.5-VL-7B-Instruct: 1 node x 8 GPUs (80 GB class), FSDP2 training, vLLM
# rollout, a screenshot of the page in every prompt (agent_loops_vl.yaml: one row per turn).
#   bash recipes/toolcua_hybrid/run_fsdp_qwen25vl_7b.sh [hydra overrides...]
# Env: MODEL (a Qwen2.5-VL / Qwen3-VL 7-8B checkpoint or hub id), DATA_DIR, OUT, N_GPUS, NNODES,
# ROLLOUT_TP, LOGGER (e.g. '[console,wandb]').
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/verl_ext/minidesk}
OUT=${OUT:-$PWD/runs/toolcua_hybrid/qwen25vl_7b_fsdp}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
ROLLOUT_TP=${ROLLOUT_TP:-2}          # 4 vLLM replicas on 8 GPUs; screenshots make prompts long
LOGGER=${LOGGER:-[console,file]}
export VERL_FILE_LOGGER_PATH=${VERL_FILE_LOGGER_PATH:-$OUT/metrics.jsonl}

# stdout is left to main_ppo alone (`--cfg job` dry runs print the config there)
[ -f "$DATA_DIR/train.parquet" ] || verl-ext prepare-data minidesk "$DATA_DIR" --train-size 4096 --val-size 128 >&2

# 32 tasks x 8 rollouts per step, up to 15 rows per episode (one per turn): prompts are
# system + tool schemas (~1k tokens) + history + page text + screenshot (~1k tokens).
# Dynamic batch sizes: rows differ a lot in length, so micro-batches are packed by tokens.
exec python -m verl.trainer.main_ppo --config-dir "$HERE" +recipe=toolcua_hybrid \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=32 \
    data.max_prompt_length=4096 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=false \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    +actor_rollout_ref.rollout.limit_images=1 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loops_vl.yaml" \
    algorithm.hgpo.history_length=2 \
    trainer.logger="$LOGGER" \
    trainer.experiment_name=qwen25vl_7b_fsdp2 \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps=300 \
    trainer.save_freq=25 \
    trainer.test_freq=25 \
    "$@"
