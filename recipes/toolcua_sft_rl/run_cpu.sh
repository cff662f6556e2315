#!/usr/bin/env bash
# ToolCUA's staged pipeline, SFT -> RFT -> online RL, on the cpu backend (no browser, no GPU):
#   1. SFT of the tiny model on oracle demonstrations (TextHybrid tasks written as the hybrid_gui_tool
#      loop's function-call transcripts, `verl-ext prepare-data text_hybrid_sft`) with verl's own
#      trainer (`torchrun -m verl.trainer.sft_trainer`);
#   2. RFT: single-turn RL on critical switching steps (GUI-vs-tool decisions of TextHybrid tasks as
#      the loop's prompts, `verl-ext prepare-data text_hybrid_decisions`) with `main_ppo`, GRPO, the
#      decision_turn loop and the per-decision reward (verl_ext.rewards.decision_reward), from stage 1;
#   3. online RL from stage 2 with `main_ppo`: hybrid_gui_tool in the function-call format (hermes
#      <tool_call>), the Tool-Efficient Path Reward (+plugins/reward=tool_path; R_tool per task or, with
#      TOOL_TERM=decision, per decision), GRPO, verl-ext's sync trainer.
# Each stage hands its HF checkpoint to the next; SKIP_SFT=1 / SKIP_RFT=1 / SKIP_RL=1 skip a stage
# (a skipped stage hands on what it was given: the fresh tiny model, or INIT_MODEL).
#   bash recipes/toolcua_sft_rl/run_cpu.sh [main_ppo overrides of stage 3...]
#   SEED=0 SFT_STEPS=150 RFT_STEPS=20 STEPS=4 TEMPLATES=settings_panel OUT=runs/... bash recipes/toolcua_sft_rl/run_cpu.sh
set -euo pipefail

SEED=${SEED:-0}
MODEL_WIDTH=${MODEL_WIDTH:-128}      # hidden size of the tiny model (the SFT settings below were measured at 128)
# SFT: many one-transcript steps, cosine to 0. The format (a parseable <tool_call>) appears late and
# at once: at lr 3e-3 150 steps still loop on JSON keys (0 of 22 held-out turns parse) and 250 parse
# on all 22; at lr 6e-3 150 steps parse on all 22 (recipes/toolcua_sft_rl/README.md, "Measured").
SFT_STEPS=${SFT_STEPS:-150}          # SFT optimizer steps (batch SFT_BATCH transcripts)
SFT_BATCH=${SFT_BATCH:-1}
SFT_LR=${SFT_LR:-6e-3}
SFT_WARMUP=${SFT_WARMUP:-10}         # linear warmup steps, then cosine decay to 0 at SFT_STEPS
SFT_EVAL_ROWS=${SFT_EVAL_ROWS:-4}    # held-out transcripts for `verl-ext eval-sft` (0: skip)
RFT_STEPS=${RFT_STEPS:-20}           # single-turn RL steps on critical switching steps
RFT_BATCH=${RFT_BATCH:-8}            # decisions per RFT step (x RFT_N samples each: GRPO groups)
RFT_N=${RFT_N:-4}
RFT_LR=${RFT_LR:-1e-4}
RFT_RESPONSE_LENGTH=${RFT_RESPONSE_LENGTH:-128}   # one call is ~30-60 tokens with the 512-token vocabulary
RFT_ROWS=${RFT_ROWS:-128}            # decision rows for training
RFT_VAL_ROWS=${RFT_VAL_ROWS:-16}     # decision rows of held-out task instances, greedy before and after RFT
STEPS=${STEPS:-4}                    # online RL training steps
RL_VAL_SIZE=${RL_VAL_SIZE:-8}        # held-out tasks validated (greedy) before online RL
RL_TEST_FREQ=${RL_TEST_FREQ:--1}     # validate every N online RL steps as well (-1: only before)
RL_VAL_ONLY=${RL_VAL_ONLY:-false}    # true: validate the model handed to stage 3 and stop (no online RL)
TOOL_TERM=${TOOL_TERM:-task}         # R_tool of the path reward: task (ToolCUA's) | decision (per decision)
SKIP_SFT=${SKIP_SFT:-0}
SKIP_RFT=${SKIP_RFT:-0}
SKIP_RL=${SKIP_RL:-0}
OUT=${OUT:-$PWD/runs/toolcua_sft_rl/seed$SEED}
# The settings app has the shortest pages (~4k tokens a transcript with the 512-token vocabulary);
# any TextHybrid apps work: settings_panel,contacts_book,file_manager,inventory_sheet.
TEMPLATES=${TEMPLATES:-settings_panel}
MAX_TURNS=${MAX_TURNS:-10}           # model turns (= env steps) per RL episode
export VERL_PLATFORM=cpu             # the cpu platform is picked per process, before config is read
export RAY_DEDUP_LOGS=0
export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-60}  # loaded 2-core machines

MODEL=${INIT_MODEL:-$OUT/model}      # what stage 1 starts from
[ -n "${INIT_MODEL:-}" ] || [ -f "$OUT/model/config.json" ] || \
    verl-ext make-tiny-model "$OUT/model" --seed "$SEED" --hidden-size "$MODEL_WIDTH"


# --- 1. SFT: verl's multi-turn SFT trainer; the rows' messages/tools are JSON text, decoded by
# verl_ext.envs.demos.JsonMultiTurnSFTDataset (parquet would add null keys to the tool schemas).
# fp32 compute as the cpu backend's RL (and faster than bf16 here); total_epochs is only a bound, the
# run stops at SFT_STEPS.
sft_stage() {
verl-ext prepare-data text_hybrid_sft "$OUT/sft_data" --train-size $((SFT_STEPS * SFT_BATCH < 64 ? SFT_STEPS * SFT_BATCH : 64)) \
    --val-size 4 --seed "$SEED" --templates "$TEMPLATES"
VERL_FILE_LOGGER_PATH="$OUT/sft_metrics.jsonl" torchrun --standalone --nproc_per_node=1 -m verl.trainer.sft_trainer \
    data.train_files="$OUT/sft_data/train.parquet" \
    data.val_files="$OUT/sft_data/val.parquet" \
    data.custom_cls.path=pkg://verl_ext.envs.demos \
    data.custom_cls.name=JsonMultiTurnSFTDataset \
    data.train_batch_size="$SFT_BATCH" \
    data.micro_batch_size_per_gpu=1 \
    data.max_length=8192 \
    data.max_token_len_per_gpu=16384 \
    data.num_workers=0 \
    model.path="$MODEL" \
    model.use_remove_padding=false \
    +model.override_config.attn_implementation=sdpa \
    model.enable_gradient_checkpointing=false \
    engine.strategy=fsdp2 \
    engine.use_torch_compile=false \
    engine.dtype=float32 \
    '++engine.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}' \
    optim.lr="$SFT_LR" \
    optim.lr_warmup_steps="$SFT_WARMUP" \
    optim.lr_scheduler_type=cosine \
    'optim.betas=[0.9,0.95]' \
    'checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
    trainer.device=cpu \
    trainer.seed="$SEED" \
    'trainer.logger=[console,file]' \
    trainer.project_name=toolcua_sft_rl \
    trainer.experiment_name="sft_seed$SEED" \
    trainer.total_training_steps="$SFT_STEPS" \
    trainer.total_epochs=1000 \
    trainer.save_freq="$SFT_STEPS" \
    trainer.test_freq="$SFT_STEPS" \
    trainer.default_local_dir="$OUT/sft" \
    trainer.resume_mode=disable
MODEL="$OUT/sft/global_step_$SFT_STEPS/huggingface"   # weights + tokenizer in HF format (hf_model)
# What SFT taught: greedy replies at every turn of held-out transcripts (the oracle's earlier turns as
# context), parsed with verl's hermes parser as the agent loop parses them.
if [ "$SFT_EVAL_ROWS" -gt 0 ]; then
    verl-ext eval-sft "$MODEL" "$OUT/sft_data/val.parquet" --max-rows "$SFT_EVAL_ROWS" --out "$OUT/sft_eval.json"
fi
}

# --- 2. RFT: single-turn RL on critical switching steps (ToolCUA's Tool-Bootstrapped GUI RFT).
# Each row is one GUI-vs-tool decision of a TextHybrid task (on and off the oracle's path), its prompt
# the hybrid_gui_tool transcript up to that turn with the episode's tools (decision_turn builds it with
# verl's Continuous-Token builder, as the multi-turn loop does); the reward is 1 for one parseable call
# plus best/remaining steps of the chosen way (verl_ext/rewards/decision_reward.py). Rows store the
# prompt as JSON text, decoded by verl_ext.envs.decisions.DecisionDataset (data.custom_cls).
rft_stage() {
verl-ext prepare-data text_hybrid_decisions "$OUT/rft_data" --train-size "$RFT_ROWS" --val-size "$RFT_VAL_ROWS" --seed "$SEED" \
    --templates "$TEMPLATES"
VERL_FILE_LOGGER_PATH="$OUT/rft_metrics.jsonl" python -m verl.trainer.main_ppo \
    +plugins/backend=cpu \
    algorithm.adv_estimator=grpo \
    data.train_files="$OUT/rft_data/train.parquet" \
    data.val_files="$OUT/rft_data/val.parquet" \
    data.custom_cls.path=pkg://verl_ext.envs.decisions \
    data.custom_cls.name=DecisionDataset \
    data.filter_overlong_prompts=false \
    data.train_batch_size="$RFT_BATCH" \
    data.max_prompt_length=8192 \
    data.max_response_length="$RFT_RESPONSE_LENGTH" \
    data.seed="$SEED" \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr="$RFT_LR" \
    actor_rollout_ref.actor.ppo_mini_batch_size="$RFT_BATCH" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]' \
    actor_rollout_ref.rollout.n="$RFT_N" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.multi_turn.format=hermes \
    actor_rollout_ref.rollout.agent.default_agent_loop=decision_turn \
    reward.custom_reward_function.path=pkg://verl_ext.rewards.decision_reward \
    reward.custom_reward_function.name=compute_score \
    trainer.logger='[console,file]' \
    trainer.project_name=toolcua_sft_rl \
    trainer.experiment_name="rft_seed$SEED" \
    trainer.default_local_dir="$OUT/rft" \
    trainer.total_training_steps="$RFT_STEPS" \
    trainer.save_freq="$RFT_STEPS" \
    trainer.test_freq="$RFT_STEPS" \
    trainer.val_before_train=true \
    trainer.resume_mode=disable
MODEL="$OUT/rft/global_step_$RFT_STEPS/actor/huggingface"
}

# --- 3. online RL from the RFT (or SFT) checkpoint. Validation before training is greedy: it measures
# the model it starts from on held-out tasks (val-aux/verl_ext/text_hybrid/{valid_call_rate,format_ok,success}).
rl_stage() {
verl-ext prepare-data text_hybrid "$OUT/rl_data" --train-size 64 --val-size "$RL_VAL_SIZE" --seed "$SEED" \
    --templates "$TEMPLATES"
VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" python -m verl.trainer.main_ppo \
    +plugins/backend=cpu +plugins/env=minidesk +plugins/reward=tool_path \
    reward.custom_reward_function.reward_kwargs.tool_term="$TOOL_TERM" \
    algorithm.adv_estimator=grpo \
    data.train_files="$OUT/rl_data/train.parquet" \
    data.val_files="$OUT/rl_data/val.parquet" \
    data.train_batch_size=4 \
    data.max_prompt_length=4096 \
    data.max_response_length=2048 \
    data.seed="$SEED" \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
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
    "$@"
}

stage() {  # stage NAME SKIP FUNCTION [args]: run it (timed) unless skipped
    local name=$1 skip=$2; shift 2
    if [ "$skip" = 1 ]; then echo "verl-ext toolcua_sft_rl: $name skipped (model: $MODEL)"; return; fi
    local start=$SECONDS
    "$@"
    echo "verl-ext toolcua_sft_rl: $name took $((SECONDS - start)) s (model: $MODEL)" | tee -a "$OUT/stage_times.txt"
}
mkdir -p "$OUT"
stage sft "$SKIP_SFT" sft_stage
stage rft "$SKIP_RFT" rft_stage
stage rl "$SKIP_RL" rl_stage "$@"

echo
echo "verl-ext toolcua_sft_rl finished; final model of the skippable stages: $MODEL"
echo "  SFT: $OUT/sft_metrics.jsonl, held-out calls $OUT/sft_eval.json (valid_call_rate: parseable; exact_call_rate: the oracle's call)"
echo "  RFT: $OUT/rft_metrics.jsonl (val-core/.../reward, val-aux/.../{chose_better,tool_call,better_tool}: per-decision choices)"
echo "  RL:  $OUT/metrics.jsonl (step 0: val-aux/... of the model it starts from; then verl_ext/episode/*)"
echo "  stage wall times: $OUT/stage_times.txt"
