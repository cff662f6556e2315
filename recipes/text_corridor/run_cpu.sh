#!/usr/bin/env bash
# Stepwise advantages on a multi-step text env: the tiny random Qwen2 model plays TextCorridor
# (verl_ext/envs/text_corridor.py) through the `text_env` agent loop, trained by verl's own
# `python -m verl.trainer.main_ppo` on the verl-ext cpu backend.
#   ADV=gigpo|hgpo|grpo bash recipes/text_corridor/run_cpu.sh [hydra overrides...]
# SEED sets the tiny model's init and the data; OUT, STEPS as in the quickstart.
set -euo pipefail

ADV=${ADV:-gigpo}
SEED=${SEED:-0}
OUT=${OUT:-$PWD/runs/text_corridor/$ADV-seed$SEED}
STEPS=${STEPS:-30}
export VERL_PLATFORM=cpu            # the cpu platform is picked per process, before config is read
export RAY_DEDUP_LOGS=0
# On a loaded 2-core machine the raylet's heartbeats lag and Ray declares its own node dead
# (default: 5 missed 3 s checks); tolerate about 3 minutes instead.
export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-60}
export VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl"   # verl's `file` logger: one JSON line per step

[ -f "$OUT/model/config.json" ] || verl-ext make-tiny-model "$OUT/model" --seed "$SEED"
verl-ext prepare-data text_corridor "$OUT/data" --train-size 512 --val-size 64 --seed "$SEED"

# The step-aware estimators read algorithm.<name>.*; gamma=0.95 as in the GiGPO/HGPO scripts
# (the GiGPO and HGPO reference scripts, langfengQ/verl-agent @ 20bd331), everything else at the reference defaults.
# lr 3e-3 and two optimizer steps per training step (mini-batches of 4 prompts): the model is random
# and the budget is a few dozen steps on 2 cores.
# Each rollout turn is at most 6 tokens (text_env's max_action_tokens); 6 turns + 5 observations
# (about 17 tokens each) fit in 144 response tokens.
# Validation samples at temperature 1, like training: a greedy random model says the same thing in
# every state, which measures nothing.
# A random model often scores the same on every rollout of a step: train on through such steps
# (verl-ext stops a run at a step without learning signal by default).
python -m verl.trainer.main_ppo +plugins/backend=cpu trainer.v1.trainer_mode=verl_ext_sync \
    algorithm.adv_estimator="$ADV" \
    +algorithm.gigpo.gamma=0.95 \
    +algorithm.hgpo.gamma=0.95 \
    data.train_files="$OUT/data/train.parquet" \
    data.val_files="$OUT/data/val.parquet" \
    data.train_batch_size=8 \
    data.max_prompt_length=96 \
    data.max_response_length=144 \
    data.seed="$SEED" \
    actor_rollout_ref.model.path="$OUT/model" \
    actor_rollout_ref.actor.optim.lr=3e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=true \
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
    reward.custom_reward_function.path=pkg://verl_ext.rewards.text_env \
    reward.custom_reward_function.name=compute_score \
    trainer.logger='[console,file]' \
    trainer.project_name=verl_ext_text_corridor \
    trainer.experiment_name="${ADV}_seed${SEED}_cpu" \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps="$STEPS" \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.val_before_train=true \
    trainer.resume_mode=disable \
    +trainer.v1.verl_ext.stop_on_zero_signal=false \
    "$@"

echo
echo "verl-ext text_corridor ($ADV) finished."
echo "  per-step metrics: $VERL_FILE_LOGGER_PATH"
