#!/usr/bin/env bash
# Quickstart: GRPO on "What is a plus b?" with a tiny random Qwen2 model, trained by verl's own
# `python -m verl.trainer.main_ppo` on the verl-ext cpu backend. About 3 minutes on 2 cores.
# Extra Hydra overrides are passed through: bash recipes/quickstart/run_cpu.sh trainer.total_training_steps=4
# A random model's answers often all score the same within a step (no learning signal); the recipe
# trains on through such steps (stop_on_zero_signal=false; by default verl-ext stops the run there).
set -euo pipefail

OUT=${OUT:-$PWD/runs/quickstart}
STEPS=${STEPS:-12}
export VERL_PLATFORM=cpu            # the cpu platform is picked per process, before config is read
export RAY_DEDUP_LOGS=0
export VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl"   # verl's `file` logger: one JSON line per step

[ -f "$OUT/model/config.json" ] || verl-ext make-tiny-model "$OUT/model" --seed 0
verl-ext prepare-data arithmetic "$OUT/data" --train-size 256 --val-size 32

python -m verl.trainer.main_ppo +plugins/backend=cpu trainer.v1.trainer_mode=verl_ext_sync \
    algorithm.adv_estimator=grpo \
    data.train_files="$OUT/data/train.parquet" \
    data.val_files="$OUT/data/val.parquet" \
    data.train_batch_size=8 \
    data.max_prompt_length=64 \
    data.max_response_length=16 \
    actor_rollout_ref.model.path="$OUT/model" \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    reward.custom_reward_function.path=pkg://verl_ext.rewards.arithmetic \
    reward.custom_reward_function.name=compute_score \
    trainer.logger='[console,file]' \
    trainer.project_name=verl_ext_quickstart \
    trainer.experiment_name=grpo_arithmetic_cpu \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps="$STEPS" \
    trainer.save_freq="$STEPS" \
    trainer.test_freq=6 \
    trainer.val_before_train=true \
    trainer.resume_mode=disable \
    +trainer.v1.verl_ext.stop_on_zero_signal=false \
    "$@"

echo
echo "verl-ext quickstart finished."
echo "  per-step metrics: $VERL_FILE_LOGGER_PATH"
echo "  checkpoints:      $OUT/checkpoints"
