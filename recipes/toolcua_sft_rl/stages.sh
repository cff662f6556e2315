# ToolCUA's staged pipeline, SFT -> RFT -> online RL: the stages, shared by run_cpu.sh and run_gpu.sh
# (sourced, not run). The caller sets HERE (this folder), MODEL (what stage 1 starts from), OUT, SEED,
# TEMPLATES, the stage knobs below and three arrays of backend settings:
#   SFT_LAUNCH   the launcher of verl's SFT trainer (torchrun ...)
#   SFT_BACKEND  sft_trainer settings of the backend (device, engine, precision, attention)
#   PPO_BACKEND  main_ppo settings of the backend (+plugins/backend=cpu, or rollout/GPU counts)
# then calls run_stages "$@": the script's arguments are extra main_ppo overrides of stages 2 and 3.
# Each stage hands its HF checkpoint to the next through MODEL; SKIP_SFT=1 / SKIP_RFT=1 / SKIP_RL=1
# skip a stage (it then hands on what it was given); REUSE_STAGES=1 hands on a checkpoint a trainer run
# of an earlier start already finished in $OUT instead of training it again.
# Each trainer run keeps the config it composed (before Ray starts) in $OUT/hydra/<stage>/.hydra/
# (config.yaml, overrides.yaml) rather than in ./outputs/<date>/ of the directory it was started from.

SKIP_SFT=${SKIP_SFT:-0}
SKIP_RFT=${SKIP_RFT:-0}
SKIP_RL=${SKIP_RL:-0}
REUSE_STAGES=${REUSE_STAGES:-0}      # 1: a trainer run whose checkpoint of its last step is already in $OUT is not
                                     # run again (a pipeline restarted after a crash resumes at the stage that failed)
case "$REUSE_STAGES" in
    0|1) ;;
    *) echo "verl-ext toolcua_sft_rl: REUSE_STAGES must be 0 or 1, got '$REUSE_STAGES'" >&2; exit 2 ;;
esac
RL_TEST_FREQ=${RL_TEST_FREQ:--1}     # validate every N online RL steps as well (-1: only before)
RL_VAL_ONLY=${RL_VAL_ONLY:-false}    # true: validate the model handed to stage 3 and stop (no online RL)
TOOL_TERM=${TOOL_TERM:-task}         # R_tool of the path reward: task (ToolCUA's) | decision (per decision)
SFT_MAX_LENGTH=${SFT_MAX_LENGTH:-8192}   # tokens of one SFT row (a whole transcript, or a warm-up decision); longer rows are refused
whole_number() {  # whole_number KNOB [HINT]: stop (exit 2, naming KNOB) unless its value is a whole number >= 1
    case "${!1}" in
        ''|*[!0-9]*|0*) echo "verl-ext toolcua_sft_rl: $1 must be a whole number >= 1${2:+ ($2)}, got '${!1}'" >&2; exit 2 ;;
    esac
}
held_out_rows() {  # held_out_rows BATCH: held-out rows of an SFT run (stage 1 or the warm-up): verl's SFT trainer
    # validates in batches of BATCH rows and drops an incomplete one, so fewer would leave no batch (val/loss NaN)
    echo $(($1 > 4 ? $1 : 4))
}
RFT_WARMUP_STEPS=${RFT_WARMUP_STEPS:-0}   # warm-up SFT steps on the switching steps before the RL half (0: none)
RFT_WARMUP_BATCH=${RFT_WARMUP_BATCH:-$SFT_BATCH}   # warm-up rows a step (decisions are shorter than transcripts)
whole_number RFT_WARMUP_BATCH
RFT_WARMUP_LR=${RFT_WARMUP_LR:-3e-3}
RFT_WARMUP_TARGETS=${RFT_WARMUP_TARGETS:-both}   # the warm-up's targets at each training decision: both options'
                                     # first calls (no preference, 2 rows a decision) | shorter (the shorter way's only)
case "$RFT_WARMUP_TARGETS" in
    both) WARMUP_ROWS=$((2 * RFT_ROWS)) ;;
    shorter) WARMUP_ROWS=$RFT_ROWS ;;
    *) echo "verl-ext toolcua_sft_rl: RFT_WARMUP_TARGETS must be both or shorter, got '$RFT_WARMUP_TARGETS'" >&2; exit 2 ;;
esac
SHOW_TODO=${SHOW_TODO:-0}            # 1: every observation ends with the task's items still to do (TextHybridEnv
                                     # show_todo), in the SFT demonstrations, the decision rows and the online loop alike
case "$SHOW_TODO" in
    0) TODO_FLAG=() ;;
    1) TODO_FLAG=(--show-todo) ;;
    *) echo "verl-ext toolcua_sft_rl: SHOW_TODO must be 0 or 1, got '$SHOW_TODO'" >&2; exit 2 ;;
esac
SFT_TOOL_OVERSAMPLE=${SFT_TOOL_OVERSAMPLE:-1}   # SFT demonstrations with an app-tool call written this many times
                                     # (prepare-data --tool-oversample; 1: each once, the held-out rows always once)
whole_number SFT_TOOL_OVERSAMPLE "1: no oversampling"
SFT_DECISION_WEIGHT=${SFT_DECISION_WEIGHT:-1}   # SFT loss weight of the decision tokens (each call's function name up to
                                     # where it parts from the other way's: GUI vs tool), the other tokens 1;
                                     # verl_ext.datasets.demos.DecisionWeightedSFTDataset (1: verl's loss as is)
RFT_WARMUP_DECISION_WEIGHT=${RFT_WARMUP_DECISION_WEIGHT:-1}   # the same weight in the RFT warm-up: large (e.g. 100)
                                     # puts its loss on the choice, which the whole call's other tokens dilute
for knob in SFT_DECISION_WEIGHT RFT_WARMUP_DECISION_WEIGHT; do
    if ! [[ "${!knob}" =~ ^[0-9]+(\.[0-9]+)?$ ]] || ! awk "BEGIN { exit !(${!knob} > 0) }"; then
        echo "verl-ext toolcua_sft_rl: $knob must be a number > 0 (1: no weighting), got '${!knob}'" >&2; exit 2
    fi
done
RFT_BALANCE=${RFT_BALANCE:-0}        # 1: the RFT stage's training decisions half GUI-shorter, half tools-shorter
                                     # (prepare-data --balance-labels; held-out decisions keep the tasks' own mix)
case "$RFT_BALANCE" in
    0) BALANCE_FLAG=() ;;
    1) BALANCE_FLAG=(--balance-labels)
       [ $((RFT_ROWS % 2)) -eq 0 ] || { echo "verl-ext toolcua_sft_rl: RFT_BALANCE=1 needs an even RFT_ROWS (half per label), got '$RFT_ROWS'" >&2; exit 2; } ;;
    *) echo "verl-ext toolcua_sft_rl: RFT_BALANCE must be 0 or 1, got '$RFT_BALANCE'" >&2; exit 2 ;;
esac
RFT_ARGS=${RFT_ARGS:-}               # extra main_ppo overrides of stage 2 only (space-separated)
SFT_ARGS=${SFT_ARGS:-}               # extra sft_trainer overrides of stage 1 (space-separated)
if [ -n "${SFT_LAUNCHER:-}" ]; then  # another launcher of the SFT trainer (space-separated), e.g. `python`
    read -ra SFT_LAUNCH <<< "$SFT_LAUNCHER"
fi

# --- 1. SFT: verl's multi-turn SFT trainer on oracle demonstrations (the hybrid_gui_tool loop's
# function-call transcripts); the rows' messages/tools are JSON text, decoded by
# verl_ext.datasets.demos.JsonMultiTurnSFTDataset (parquet would add null keys to the tool schemas).
# total_epochs is only a bound: the run stops at SFT_STEPS.
# DECISION_WEIGHT (default 1) != 1 swaps in DecisionWeightedSFTDataset, a subclass that puts that weight
# in the loss_mask at each call's decision tokens (verl's sft_loss is a loss_mask-weighted token mean).
finished() {  # finished CKPT_DIR STEPS: REUSE_STAGES=1 and a trainer run saved its step-STEPS checkpoint there
    # (verl writes latest_checkpointed_iteration.txt once the checkpoint is saved)
    [ "$REUSE_STAGES" = 1 ] && [ "$(cat "$1/latest_checkpointed_iteration.txt" 2> /dev/null)" = "$2" ] &&
        echo "verl-ext toolcua_sft_rl: reusing the finished run in $1 (step $2; REUSE_STAGES=1)"
}

sft_run() {  # sft_run DATA_DIR STEPS BATCH LR WARMUP_STEPS CKPT_DIR NAME METRICS [DECISION_WEIGHT]: verl's SFT trainer from $MODEL
    local data=$1 steps=$2 batch=$3 lr=$4 warmup=$5 ckpt=$6 name=$7 metrics=$8 weight=${9:-1}
    rm -f "$metrics"  # verl's file logger appends: a run started again must not add to a failed one's lines
    local dataset=(data.custom_cls.name=JsonMultiTurnSFTDataset)
    if [ "$weight" != 1 ]; then
        dataset=(data.custom_cls.name=DecisionWeightedSFTDataset +data.decision_weight="$weight")
    fi
    # shellcheck disable=SC2086  # SFT_ARGS: space-separated overrides
    VERL_FILE_LOGGER_PATH="$metrics" "${SFT_LAUNCH[@]}" -m verl.trainer.sft_trainer \
        "${SFT_BACKEND[@]}" \
        data.train_files="$data/train.parquet" \
        data.val_files="$data/val.parquet" \
        data.custom_cls.path=pkg://verl_ext.datasets.demos \
        "${dataset[@]}" \
        data.train_batch_size="$batch" \
        data.micro_batch_size_per_gpu=1 \
        data.max_length="$SFT_MAX_LENGTH" \
        data.max_token_len_per_gpu=$((2 * SFT_MAX_LENGTH)) \
        data.num_workers=0 \
        model.path="$MODEL" \
        engine.strategy=fsdp2 \
        optim.lr="$lr" \
        optim.lr_warmup_steps="$warmup" \
        optim.lr_scheduler_type=cosine \
        'optim.betas=[0.9,0.95]' \
        'checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
        trainer.seed="$SEED" \
        'trainer.logger=[console,file]' \
        trainer.project_name=toolcua_sft_rl \
        trainer.experiment_name="${name}_seed$SEED" \
        trainer.total_training_steps="$steps" \
        trainer.total_epochs=1000 \
        trainer.save_freq="$steps" \
        trainer.test_freq="$steps" \
        trainer.default_local_dir="$ckpt" \
        trainer.resume_mode=disable \
        hydra.run.dir="$OUT/hydra/$name" \
        $SFT_ARGS
}

sft_stage() {
    if ! finished "$OUT/sft" "$SFT_STEPS"; then
        verl-ext prepare-data text_hybrid_sft "$OUT/sft_data" --train-size "$SFT_ROWS" \
            --val-size "$(held_out_rows "$SFT_BATCH")" --seed "$SEED" --templates "$TEMPLATES" \
            --tool-oversample "$SFT_TOOL_OVERSAMPLE" "${TODO_FLAG[@]}"
        sft_run "$OUT/sft_data" "$SFT_STEPS" "$SFT_BATCH" "$SFT_LR" "$SFT_WARMUP" "$OUT/sft" sft "$OUT/sft_metrics.jsonl" \
            "$SFT_DECISION_WEIGHT"
    fi
    MODEL="$OUT/sft/global_step_$SFT_STEPS/huggingface"   # weights + tokenizer in HF format (hf_model)
    # What SFT taught: greedy replies at every turn of held-out transcripts (the oracle's earlier
    # turns as context), parsed with verl's hermes parser as the agent loop parses them.
    # SFT_MIN_TOOL_RATE (unset: no gate) stops the pipeline here when the SFT model calls the oracle's
    # tool at fewer of the held-out tool turns (tool_turn_call_rate) than that.
    if [ "$SFT_EVAL_ROWS" -gt 0 ]; then
        verl-ext eval-sft "$MODEL" "$OUT/sft_data/val.parquet" --max-rows "$SFT_EVAL_ROWS" --out "$OUT/sft_eval.json" \
            ${SFT_MIN_TOOL_RATE:+--min-tool-turn-rate "$SFT_MIN_TOOL_RATE"}
    elif [ -n "${SFT_MIN_TOOL_RATE:-}" ]; then
        echo "verl-ext toolcua_sft_rl: SFT_MIN_TOOL_RATE=$SFT_MIN_TOOL_RATE needs the held-out eval; set SFT_EVAL_ROWS > 0 (or unset SFT_MIN_TOOL_RATE)" >&2
        return 2
    fi
}

# --- 2. RFT: single-turn RL on critical switching steps (ToolCUA's Tool-Bootstrapped GUI RFT).
# Each row is one GUI-vs-tool decision of a TextHybrid task (on and off the oracle's path), its prompt
# the hybrid_gui_tool transcript up to that turn with the episode's tools (decision_turn builds it with
# verl's Continuous-Token builder, as the multi-turn loop does); the reward is RFT_CHOICE_WEIGHT for
# naming a function of the shorter way (read from the reply's text, parseable or not), 1 for one
# parseable call, plus best/remaining steps of the chosen way (verl_ext/rewards/decision_reward.py). Rows store the
# prompt as JSON text, decoded by verl_ext.datasets.decisions.DecisionDataset (data.custom_cls).
rft_stage() {
    # Warm-up SFT on the same training decisions, both options' first calls as targets (no preference):
    # how to write either call at a switching step, so that the RL half samples both (RFT_WARMUP_STEPS=0: off).
    # RFT_WARMUP_TARGETS=shorter: the shorter way's call only, the RL half's label taught directly.
    if [ "$RFT_WARMUP_STEPS" -gt 0 ]; then
        if ! finished "$OUT/rft_warmup" "$RFT_WARMUP_STEPS"; then
            verl-ext prepare-data text_hybrid_switch_warmup "$OUT/rft_warmup_data" --train-size "$WARMUP_ROWS" \
                --val-size "$(held_out_rows "$RFT_WARMUP_BATCH")" --seed "$SEED" --templates "$TEMPLATES" \
                --warmup-targets "$RFT_WARMUP_TARGETS" "${TODO_FLAG[@]}"
            sft_run "$OUT/rft_warmup_data" "$RFT_WARMUP_STEPS" "$RFT_WARMUP_BATCH" "$RFT_WARMUP_LR" 0 "$OUT/rft_warmup" rft_warmup \
                "$OUT/rft_warmup_metrics.jsonl" "$RFT_WARMUP_DECISION_WEIGHT"
        fi
        MODEL="$OUT/rft_warmup/global_step_$RFT_WARMUP_STEPS/huggingface"
    fi
    if finished "$OUT/rft" "$RFT_STEPS"; then
        MODEL="$OUT/rft/global_step_$RFT_STEPS/actor/huggingface"
        return
    fi
    rm -f "$OUT/rft_metrics.jsonl"  # verl's file logger appends
    verl-ext prepare-data text_hybrid_decisions "$OUT/rft_data" --train-size "$RFT_ROWS" --val-size "$RFT_VAL_ROWS" \
        --seed "$SEED" --templates "$TEMPLATES" "${TODO_FLAG[@]}" "${BALANCE_FLAG[@]}"
    # shellcheck disable=SC2086  # RFT_ARGS: space-separated overrides
    VERL_FILE_LOGGER_PATH="$OUT/rft_metrics.jsonl" python -m verl.trainer.main_ppo \
        "${PPO_BACKEND[@]}" trainer.v1.trainer_mode=verl_ext_sync \
        algorithm.adv_estimator=grpo \
        data.train_files="$OUT/rft_data/train.parquet" \
        data.val_files="$OUT/rft_data/val.parquet" \
        data.custom_cls.path=pkg://verl_ext.datasets.decisions \
        data.custom_cls.name=DecisionDataset \
        data.filter_overlong_prompts=false \
        data.train_batch_size="$RFT_BATCH" \
        data.max_prompt_length="$RFT_PROMPT_LENGTH" \
        data.max_response_length="$RFT_RESPONSE_LENGTH" \
        data.seed="$SEED" \
        actor_rollout_ref.model.path="$MODEL" \
        actor_rollout_ref.actor.optim.lr="$RFT_LR" \
        actor_rollout_ref.actor.ppo_mini_batch_size="$RFT_BATCH" \
        'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
        actor_rollout_ref.rollout.n="$RFT_N" \
        actor_rollout_ref.rollout.multi_turn.format=hermes \
        actor_rollout_ref.rollout.agent.default_agent_loop=decision_turn \
        reward.custom_reward_function.path=pkg://verl_ext.rewards.decision_reward \
        reward.custom_reward_function.name=compute_score \
        +reward.custom_reward_function.reward_kwargs.choice_weight="$RFT_CHOICE_WEIGHT" \
        trainer.logger='[console,file]' \
        trainer.project_name=toolcua_sft_rl \
        trainer.experiment_name="rft_seed$SEED" \
        trainer.default_local_dir="$OUT/rft" \
        trainer.total_training_steps="$RFT_STEPS" \
        trainer.save_freq="$RFT_STEPS" \
        trainer.test_freq="$RFT_STEPS" \
        trainer.val_before_train=true \
        trainer.resume_mode=disable \
        hydra.run.dir="$OUT/hydra/rft" \
        $RFT_ARGS "$@"
    MODEL="$OUT/rft/global_step_$RFT_STEPS/actor/huggingface"
}

# --- 3. online RL from the RFT (or SFT) checkpoint: hybrid_gui_tool writing function calls, the
# Tool-Efficient Path Reward (+plugins/reward=tool_path). Validation before training is greedy: it
# measures the model it starts from on held-out tasks (val-aux/verl_ext/text_hybrid/*).
rl_stage() {
    verl-ext prepare-data text_hybrid "$OUT/rl_data" --train-size "$RL_ROWS" --val-size "$RL_VAL_SIZE" --seed "$SEED" \
        --templates "$TEMPLATES"
    local loop_config=()
    if [ "$SHOW_TODO" = 1 ]; then  # the loop's env must show the to-do list as the SFT and RFT rows did
        loop_config=(actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loops_show_todo.yaml")
    fi
    rm -f "$OUT/metrics.jsonl"  # verl's file logger appends
    VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" python -m verl.trainer.main_ppo \
        "${PPO_BACKEND[@]}" +plugins/env=minidesk +plugins/reward=tool_path trainer.v1.trainer_mode=verl_ext_sync \
        "${loop_config[@]}" \
        reward.custom_reward_function.reward_kwargs.tool_term="$TOOL_TERM" \
        algorithm.adv_estimator=grpo \
        data.train_files="$OUT/rl_data/train.parquet" \
        data.val_files="$OUT/rl_data/val.parquet" \
        data.train_batch_size="$RL_BATCH" \
        data.max_prompt_length="$RL_PROMPT_LENGTH" \
        data.max_response_length="$RL_RESPONSE_LENGTH" \
        data.seed="$SEED" \
        actor_rollout_ref.model.path="$MODEL" \
        actor_rollout_ref.actor.optim.lr="$RL_LR" \
        actor_rollout_ref.actor.ppo_mini_batch_size="$RL_BATCH" \
        actor_rollout_ref.rollout.n="$RL_N" \
        actor_rollout_ref.rollout.multi_turn.max_assistant_turns="$MAX_TURNS" \
        trainer.logger='[console,file]' \
        trainer.project_name=toolcua_sft_rl \
        trainer.experiment_name="rl_seed$SEED" \
        trainer.default_local_dir="$OUT/checkpoints" \
        trainer.total_training_steps="$STEPS" \
        trainer.save_freq=-1 \
        trainer.test_freq="$RL_TEST_FREQ" \
        trainer.val_before_train=true \
        trainer.val_only="$RL_VAL_ONLY" \
        trainer.resume_mode=disable \
        hydra.run.dir="$OUT/hydra/rl" \
        "$@"
}

stage() {  # stage NAME SKIP FUNCTION [args]: run it (timed, in $OUT/stage_times.txt) unless skipped
    local name=$1 skip=$2
    shift 2
    if [ "$skip" = 1 ]; then
        echo "verl-ext toolcua_sft_rl: $name skipped (model: $MODEL)"
        return
    fi
    local start=$SECONDS
    "$@"
    echo "verl-ext toolcua_sft_rl: $name took $((SECONDS - start)) s (model: $MODEL)" | tee -a "$OUT/stage_times.txt"
}

run_stages() {
    mkdir -p "$OUT"
    stage sft "$SKIP_SFT" sft_stage
    stage rft "$SKIP_RFT" rft_stage "$@"
    stage rl "$SKIP_RL" rl_stage "$@"
    echo
    echo "verl-ext toolcua_sft_rl finished; the last stage's model: $MODEL"
    echo "  SFT: $OUT/sft_metrics.jsonl, held-out calls $OUT/sft_eval.json (valid_call_rate: parseable; exact_call_rate: the oracle's call; tool_turn_call_rate: the oracle's tool at its tool turns)"
    echo "  RFT: $OUT/rft_metrics.jsonl (val-aux/verl_ext/text_hybrid_decisions/{chose_better,tool_call,...}: held-out decisions)"
    echo "  RL:  $OUT/metrics.jsonl (step 0: val-aux/... of the model it starts from; then verl_ext/episode/*)"
    echo "  stage wall times: $OUT/stage_times.txt"
}
