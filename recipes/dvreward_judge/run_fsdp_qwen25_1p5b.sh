#!/usr/bin/env bash
# dvreward_judge on Qwen2.5-1.5B-Instruct, judged by Qwen2.5-7B-Instruct: 1 node x 8 GPUs. FSDP2
# training + vLLM rollout on 6 GPUs; the judge is served by verl's own GenRM path on the other 2
# (its own resource pool, one vLLM replica per GPU behind verl's reward router), and the `dvreward`
# manager posts every question to that router while rollouts stream in.
#   bash recipes/dvreward_judge/run_fsdp_qwen25_1p5b.sh [hydra overrides...]
# Env: MODEL, JUDGE_MODEL, DATA_DIR, OUT, N_GPUS (training), JUDGE_GPUS, LOGGER.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
JUDGE_MODEL=${JUDGE_MODEL:-Qwen/Qwen2.5-7B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/verl_ext/dv_describe}
OUT=${OUT:-$PWD/runs/dvreward_judge/qwen25_1p5b_fsdp}
N_GPUS=${N_GPUS:-6}
JUDGE_GPUS=${JUDGE_GPUS:-2}
LOGGER=${LOGGER:-[console,file]}
export VERL_FILE_LOGGER_PATH=${VERL_FILE_LOGGER_PATH:-$OUT/metrics.jsonl}

# Templated prompts with templated questions; for your own prompts run `verl-ext dv-questions`
# against the judge (or any instruct LLM) first and point DATA_DIR at its output.
[ -f "$DATA_DIR/train.parquet" ] || verl-ext prepare-data dv_describe "$DATA_DIR" --train-size 4096 --val-size 256 >&2

# 128 prompts x 4 rollouts x 4 questions = 2048 judge requests a step, ~450 prompt tokens and 4
# answer tokens each. GenRM rules (docs/reference/dvreward.md): enable_resource_pool=True (the
# colocated path sends no extra_info, so every trajectory would be flagged) and a custom reward
# function set (the recipe's format check), or verl never calls the manager. The judge's engine must
# stay awake while rollouts stream (free_cache_engine=false: verl only wakes it on the colocated path).
exec python -m verl.trainer.main_ppo --config-dir "$HERE" +recipe=dvreward_judge \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/val.parquet" \
    data.train_batch_size=128 \
    data.max_prompt_length=256 \
    data.max_response_length=128 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
    reward.num_workers=8 \
    reward.reward_model.enable=true \
    reward.reward_model.enable_resource_pool=true \
    reward.reward_model.n_gpus_per_node="$JUDGE_GPUS" \
    reward.reward_model.nnodes=1 \
    reward.reward_model.model_path="$JUDGE_MODEL" \
    reward.reward_model.rollout.name=vllm \
    reward.reward_model.rollout.tensor_model_parallel_size=1 \
    reward.reward_model.rollout.gpu_memory_utilization=0.85 \
    reward.reward_model.rollout.free_cache_engine=false \
    reward.reward_model.rollout.prompt_length=1024 \
    reward.reward_model.rollout.response_length=16 \
    +reward.reward_kwargs.dvreward.max_concurrency=64 \
    +reward.reward_kwargs.dvreward.timeout_s=120 \
    trainer.logger="$LOGGER" \
    trainer.experiment_name=qwen25_1p5b_fsdp2_judge_qwen25_7b \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes=1 \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps=200 \
    trainer.save_freq=50 \
    trainer.test_freq=25 \
    "$@"
