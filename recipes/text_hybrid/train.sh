# text_hybrid: what run_cpu.sh and run_gpu.sh share (sourced, not run). The caller sets HERE (this
# folder), BACKEND (cpu | gpu: the run's name and OUT folder), BACKEND_ARGS (main_ppo settings of the
# backend), TINY_MODEL (verl-ext make-tiny-model options of the random model built when MODEL is
# unset), then calls train "$@" (the script's arguments are extra main_ppo overrides).
# ADV picks the menu's rollout too: step_grouped plays UI-S1's semi-online rollout against the
# oracle (agent_loops_cpu_semi_online.yaml), himac and hiper planner/executor turns
# (agent_loops_cpu_plan_execute.yaml; hiper adds verl's critic, the policy's model again); the others
# play the menu freely (agent_loops_cpu.yaml). The agent-loop files are the tiny model's T/G menu on
# either backend.

RECIPES=$HERE/..
SEED=${SEED:-0}
STEPS=${STEPS:-30}
LR=${LR:-3e-3}
BATCH=${BATCH:-8}                    # prompts a step (x 4 rollouts); two optimizer steps of half of them
ADV=${ADV:-hgpo}
LOSS=${LOSS:-vanilla}                # verl's PPO loss; ppo_ewma pairs with PROVIDER=ewma
MODE=${MODE:-sync}
PROVIDER=${PROVIDER:-$([ "$LOSS" = ppo_ewma ] && echo ewma || echo current)}
OUT=${OUT:-$PWD/runs/text_hybrid$([ "$BACKEND" = cpu ] || echo "_$BACKEND")/$MODE-$ADV-$LOSS-$PROVIDER-seed$SEED}
MAX_STEPS=24                         # = max_steps in agent_loops_cpu.yaml (env steps, S_max)
MAX_TURNS=7                          # one turn per decision: 4-6 decisions, plus one spare
RESPONSE_LENGTH=512
LOOPS=agent_loops_cpu.yaml
ADV_ARGS=(algorithm.adv_estimator="$ADV")
case "$ADV" in
  step_grouped)
    LOOPS=agent_loops_cpu_semi_online.yaml
    ADV_ARGS=(plugins/advantage=step_grouped) ;;   # the fragment: UI-S1's per-step scores as they are
  himac|hiper)
    LOOPS=agent_loops_cpu_plan_execute.yaml
    MAX_TURNS=24                     # a planner turn per decision + an executor turn per env step
    RESPONSE_LENGTH=3072
    ADV_ARGS=(plugins/advantage="$ADV") ;;
esac
export RAY_DEDUP_LOGS=0
export VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl"   # verl's `file` logger: one JSON line per step

# The toolcua_hybrid recipe brings hgpo + ppo_ewma + ewma; the loss and provider are picked here.
case "$LOSS" in
  ppo_ewma) LOSS_ARGS=() ;;
  vanilla) LOSS_ARGS=('~plugins/loss') ;;   # verl's PPO clip loss
  *) echo "LOSS must be vanilla or ppo_ewma, got '$LOSS'" >&2; exit 2 ;;
esac
case "$MODE" in
  sync) MODE_ARGS=(+recipe=toolcua_hybrid) ;;
  # verl's colocate_async + the verl-ext hooks (recipe async_agentic), 3 batches queued ahead of
  # the trainer instead of the recipe's 2 (2 gave a staleness of 1 in a 3-step run here; 3 gave 2-3 in the study)
  colocate_async) MODE_ARGS=(hydra.searchpath="[file://$RECIPES/async_agentic]" '+recipe=[toolcua_hybrid,async_agentic]'
                             trainer.v1.colocate_async.num_warmup_batches=3) ;;
  *) echo "MODE must be sync or colocate_async, got '$MODE'" >&2; exit 2 ;;
esac
if [ "$MODE" = sync ] && [ "$LOSS" = vanilla ] && [ "$PROVIDER" = current ]; then
    PROVIDER_ARGS=('~plugins/old_logits')     # plain verl: its own recomputed old log-probs
else
    PROVIDER_ARGS=(plugins/old_logits="$PROVIDER")
fi

train() {
    if [ -z "${MODEL:-}" ]; then
        MODEL=$OUT/model
        [ -f "$MODEL/config.json" ] || verl-ext make-tiny-model "$MODEL" --seed "$SEED" "${TINY_MODEL[@]}"
    fi
    if [ "$ADV" = hiper ]; then      # HiPER's per-step values: verl's critic (the policy's model, a value head)
        ADV_ARGS+=(critic.enable=true critic.model.path="$MODEL" critic.ppo_mini_batch_size=4
                   critic.ppo_micro_batch_size_per_gpu=16 critic.optim.lr=1e-3)
    fi
    verl-ext prepare-data text_hybrid "$OUT/data" --train-size 512 --val-size 64 --seed "$SEED"

    # lr 3e-3 (LR) and two optimizer steps per training step: a random model, a few dozen steps.
    # Validation samples at temperature 1 like training (a greedy random model repeats one answer).
    # A random model often scores the same on every rollout of a step: train on through such steps
    # (verl-ext stops a run at a step without learning signal by default).
    python -m verl.trainer.main_ppo --config-dir "$RECIPES/toolcua_hybrid" "${BACKEND_ARGS[@]}" \
        "${MODE_ARGS[@]}" "${LOSS_ARGS[@]}" "${PROVIDER_ARGS[@]}" \
        "${ADV_ARGS[@]}" \
        algorithm.hgpo.history_length=$((MAX_TURNS - 1)) \
        algorithm.path_length_reward.max_steps=$MAX_STEPS \
        reward.custom_reward_function.reward_kwargs.max_steps=$MAX_STEPS \
        data.train_files="$OUT/data/train.parquet" \
        data.val_files="$OUT/data/val.parquet" \
        data.train_batch_size="$BATCH" \
        data.max_prompt_length=512 \
        data.max_response_length=$RESPONSE_LENGTH \
        data.seed="$SEED" \
        actor_rollout_ref.model.path="$MODEL" \
        actor_rollout_ref.actor.optim.lr="$LR" \
        actor_rollout_ref.actor.ppo_mini_batch_size=$((BATCH / 2)) \
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
        actor_rollout_ref.rollout.n=4 \
        actor_rollout_ref.rollout.multi_turn.max_assistant_turns=$MAX_TURNS \
        actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/$LOOPS" \
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
        actor_rollout_ref.rollout.val_kwargs.do_sample=true \
        actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
        trainer.logger='[console,file]' \
        trainer.project_name=verl_ext_text_hybrid \
        trainer.experiment_name="${MODE}_${ADV}_${LOSS}_${PROVIDER}_seed${SEED}_$BACKEND" \
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
    echo "verl-ext text_hybrid ($BACKEND, $MODE, $ADV, $LOSS, $PROVIDER) finished; per-step metrics: $VERL_FILE_LOGGER_PATH"
}
