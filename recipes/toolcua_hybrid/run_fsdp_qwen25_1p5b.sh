#!/usr/bin/env bash
# toolcua_hybrid on Qwen2.5-1.5B-Instruct, text only (page text observations, no screenshots):
# 1 node x 8 GPUs, FSDP2 training, vLLM rollout, one training row per episode (agent_loops.yaml).
#   bash recipes/toolcua_hybrid/run_fsdp_qwen25_1p5b.sh [hydra overrides...]
# Env: MODEL, DATA_DIR, OUT, N_GPUS, NNODES, ROLLOUT_TP, LOGGER.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/verl_ext/minidesk}
OUT=${OUT:-$PWD/runs/toolcua_hybrid/qwen25_1p5b_fsdp}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
ROLLOUT_TP=${ROLLOUT_TP:-1}          # one vLLM replica per GPU
LOGGER=${LOGGER:-[console,file]}
export VERL_FILE_LOGGER_PATH=${VERL_FILE_LOGGER_PATH:-$OUT/metrics.jsonl}

[ -f "$DATA_DIR/train.parquet" ] || verl-ext prepare-data minidesk "$DATA_DIR" --train-size 4096 --val-size 128 >&2

# 64 tasks x 8 rollouts per step. The first prompt (system, tool schemas, task, first page) is
# ~1.5k tokens; each of up to 15 turns adds a call (~100 tokens) and an observation (~300).
exec python -m verl.trainer.main_ppo --config-dir "$HERE" +recipe=toolcua_hybrid \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=64 \
    data.max_prompt_length=2048 \
    data.max_response_length=8192 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=49152 \
    actor_rollout_ref.rollout.agent.num_workers=8 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loops.yaml" \
    trainer.logger="$LOGGER" \
    trainer.experiment_name=qwen25_1p5b_fsdp2 \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps=300 \
    trainer.save_freq=25 \
    trainer.test_freq=25 \
    "$@"
