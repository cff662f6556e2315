#!/usr/bin/env bash
# ToolCUA's staged pipeline, SFT -> RFT -> online RL, on the cpu backend (no browser, no GPU); the
# stages are recipes/toolcua_sft_rl/stages.sh (run_gpu.sh runs the same ones on GPUs):
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
#   bash recipes/toolcua_sft_rl/run_cpu.sh [main_ppo overrides of stages 2 and 3...]
#   SEED=0 SFT_STEPS=150 RFT_STEPS=10 STEPS=4 TEMPLATES=settings_panel OUT=runs/... bash recipes/toolcua_sft_rl/run_cpu.sh
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SEED=${SEED:-0}
MODEL_WIDTH=${MODEL_WIDTH:-128}      # hidden size of the tiny model (the SFT settings below were measured at 128)
# SFT: many one-transcript steps, cosine to 0. The format (a parseable <tool_call>) appears late and
# at once: at lr 3e-3 150 steps still loop on JSON keys (0 of 22 held-out turns parse) and 250 parse
# on all 22; at lr 6e-3 150 steps parse on all 22 (recipes/toolcua_sft_rl/README.md, "Measured").
SFT_STEPS=${SFT_STEPS:-150}          # SFT optimizer steps (batch SFT_BATCH transcripts)
SFT_BATCH=${SFT_BATCH:-1}
SFT_ROWS=${SFT_ROWS:-$((SFT_STEPS * SFT_BATCH < 64 ? SFT_STEPS * SFT_BATCH : 64))}   # demonstrations (epochs beyond 64)
SFT_LR=${SFT_LR:-6e-3}
SFT_WARMUP=${SFT_WARMUP:-10}         # linear warmup steps, then cosine decay to 0 at SFT_STEPS
SFT_EVAL_ROWS=${SFT_EVAL_ROWS:-4}    # held-out transcripts for `verl-ext eval-sft` (0: skip)
RFT_STEPS=${RFT_STEPS:-10}           # single-turn RL steps on critical switching steps
RFT_BATCH=${RFT_BATCH:-4}            # decisions per RFT step (x RFT_N samples each: GRPO groups)
RFT_N=${RFT_N:-4}
RFT_LR=${RFT_LR:-1e-4}
RFT_CHOICE_WEIGHT=${RFT_CHOICE_WEIGHT:-2}   # weight of R_choice: naming the shorter way's function, parseable or not (0: off)
RFT_ROWS=${RFT_ROWS:-128}            # decision rows for training
RFT_VAL_ROWS=${RFT_VAL_ROWS:-16}     # decision rows of held-out task instances, greedy before and after RFT
RFT_PROMPT_LENGTH=${RFT_PROMPT_LENGTH:-8192}      # a decision prompt is the transcript so far: up to ~4.7k tokens (settings_panel, measured)
RFT_RESPONSE_LENGTH=${RFT_RESPONSE_LENGTH:-128}   # one call is ~30-60 tokens with the 512-token vocabulary
STEPS=${STEPS:-4}                    # online RL training steps
RL_BATCH=${RL_BATCH:-4}              # tasks per online RL step (x RL_N rollouts)
RL_N=${RL_N:-4}
RL_LR=${RL_LR:-1e-4}
RL_ROWS=${RL_ROWS:-64}
RL_VAL_SIZE=${RL_VAL_SIZE:-8}        # held-out tasks validated (greedy) before online RL
RL_PROMPT_LENGTH=${RL_PROMPT_LENGTH:-4096}
RL_RESPONSE_LENGTH=${RL_RESPONSE_LENGTH:-2048}
MAX_TURNS=${MAX_TURNS:-10}           # model turns (= env steps) per RL episode
# each configuration its own folder: verl's file logger starts metrics.jsonl afresh (other knobs: set OUT)
OUT=${OUT:-$PWD/runs/toolcua_sft_rl/sft$SFT_STEPS-rft$RFT_STEPS-rl$STEPS-seed$SEED}
# The settings app has the shortest pages (~4k tokens a transcript with the 512-token vocabulary);
# any TextHybrid apps work: settings_panel,contacts_book,file_manager,inventory_sheet.
TEMPLATES=${TEMPLATES:-settings_panel}
export VERL_PLATFORM=cpu             # the cpu platform is picked per process, before config is read
export RAY_DEDUP_LOGS=0
export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-60}  # loaded 2-core machines

MODEL=${INIT_MODEL:-$OUT/model}      # what stage 1 starts from
[ -n "${INIT_MODEL:-}" ] || [ -f "$OUT/model/config.json" ] || \
    verl-ext make-tiny-model "$OUT/model" --seed "$SEED" --hidden-size "$MODEL_WIDTH"

# fp32 compute in every stage, as the cpu backend's RL (and faster than bf16 here); sdpa attention.
SFT_LAUNCH=(torchrun --standalone --nproc_per_node=1)
SFT_BACKEND=(
    trainer.device=cpu
    model.use_remove_padding=false
    +model.override_config.attn_implementation=sdpa
    model.enable_gradient_checkpointing=false
    engine.use_torch_compile=false
    engine.dtype=float32
    '++engine.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
)
PPO_BACKEND=(
    +plugins/backend=cpu
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
)
# shellcheck source=recipes/toolcua_sft_rl/stages.sh
source "$HERE/stages.sh"
# stages 2 and 3 start from a tiny model: train on through steps where every rollout scores the same
# (verl-ext stops a run at a step without learning signal by default)
run_stages +trainer.v1.verl_ext.stop_on_zero_signal=false "$@"
