#!/usr/bin/env bash
# toolcua_hybrid on the cpu backend: the recipe's config (MiniDesk in headless Chromium, HGPO,
# Tool-Efficient Path Reward) with the tiny random model playing the T/G action menu, trained by
# verl's own `python -m verl.trainer.main_ppo`. Minutes on 2 cores.
# This run is synchronous, so it uses verl's PPO loss: PPO-EWMA (+ EWMA old logits, the recipe's
# GPU default) learned slower here (docs/results.md, "toolcua_hybrid learning") and, in the
# text_hybrid study, under real staleness too ("text_hybrid study"). LOSS=ppo_ewma switches it
# back on; recipes/async_agentic/run_cpu.sh runs it under staleness.
#   bash recipes/toolcua_hybrid/run_cpu.sh [hydra overrides...]
#   ADV=grpo|gigpo|hgpo LOSS=vanilla|ppo_ewma SEED=0 STEPS=30 OUT=runs/... bash recipes/toolcua_hybrid/run_cpu.sh
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ADV=${ADV:-hgpo}
LOSS=${LOSS:-vanilla}
SEED=${SEED:-0}
STEPS=${STEPS:-30}
OUT=${OUT:-$PWD/runs/toolcua_hybrid/$ADV-$LOSS-seed$SEED}
# Four tasks where tools shorten the path and four where the GUI path earns the reward
# (tool_beneficial false): the policy has to tell them apart from the instruction.
TEMPLATES=${TEMPLATES:-mail_send,files_rename,calendar_add,sheet_sort,settings_theme,settings_toggle,sheet_set_cell,calendar_delete_title}
MAX_STEPS=8                          # = max_steps in agent_loops_cpu.yaml
export VERL_PLATFORM=cpu             # the cpu platform is picked per process, before config is read
export RAY_DEDUP_LOGS=0
export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-60}  # loaded 2-core machines
export VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl"   # verl's `file` logger: one JSON line per step

case "$LOSS" in
  ppo_ewma) LOSS_ARGS=() ;;
  # vanilla: verl's PPO clip loss with verl's own old log-probs (the recipe's ewma/ppo_ewma off)
  vanilla) LOSS_ARGS=('~plugins/loss' '~plugins/old_logits') ;;
  *) echo "LOSS must be ppo_ewma or vanilla, got '$LOSS'" >&2; exit 2 ;;
esac

[ -f "$OUT/model/config.json" ] || verl-ext make-tiny-model "$OUT/model" --seed "$SEED"
verl-ext prepare-data minidesk "$OUT/data" --train-size 512 --val-size 64 --seed "$SEED" --templates "$TEMPLATES"

# lr 3e-3 and two optimizer steps per training step: a random model, a few dozen steps on 2 cores.
# Validation samples at temperature 1 like training (a greedy random model repeats one answer).
# A random model often scores the same on every rollout of a step: train on through such steps
# (verl-ext stops a run at a step without learning signal by default).
python -m verl.trainer.main_ppo --config-dir "$HERE" +recipe=toolcua_hybrid +plugins/backend=cpu \
    "${LOSS_ARGS[@]}" \
    algorithm.adv_estimator="$ADV" \
    algorithm.hgpo.history_length=$((MAX_STEPS - 1)) \
    algorithm.path_length_reward.max_steps=$MAX_STEPS \
    reward.custom_reward_function.reward_kwargs.max_steps=$MAX_STEPS \
    data.train_files="$OUT/data/train.parquet" \
    data.val_files="$OUT/data/val.parquet" \
    data.train_batch_size=8 \
    data.max_prompt_length=256 \
    data.max_response_length=512 \
    data.seed="$SEED" \
    actor_rollout_ref.model.path="$OUT/model" \
    actor_rollout_ref.actor.optim.lr=3e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=$MAX_STEPS \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loops_cpu.yaml" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=true \
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
    trainer.logger='[console,file]' \
    trainer.experiment_name="${ADV}_${LOSS}_seed${SEED}_cpu" \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps="$STEPS" \
    trainer.save_freq="$STEPS" \
    trainer.test_freq=5 \
    trainer.val_before_train=true \
    trainer.resume_mode=disable \
    +trainer.v1.verl_ext.stop_on_zero_signal=false \
    "$@"

echo
echo "verl-ext toolcua_hybrid ($ADV, $LOSS) finished."
echo "  per-step metrics: $VERL_FILE_LOGGER_PATH"
echo "  checkpoint:       $OUT/checkpoints/global_step_$STEPS"
# Held-out instances: training draws task seeds below 1e6, validation from 1e6 to 2e6.
echo "  evaluate it:      verl-ext eval --env minidesk --policy checkpoint:$OUT/checkpoints/global_step_$STEPS \\"
echo "                      --action-format menu --max-steps $MAX_STEPS --seeds 2000000-2000007 --tasks $TEMPLATES"
