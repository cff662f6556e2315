#!/usr/bin/env bash
# ToolCUA's staged pipeline, SFT -> RFT -> online RL, on GPUs: the stages of run_cpu.sh
# (recipes/toolcua_sft_rl/stages.sh) with FSDP2 training and vLLM rollout on one node.
#   1. SFT on oracle demonstrations (function-call transcripts of TextHybrid tasks), verl's sft_trainer;
#   2. RFT: single-turn RL on critical switching steps (decision_turn loop, per-decision reward), main_ppo;
#   3. online RL: hybrid_gui_tool writing function calls, Tool-Efficient Path Reward, main_ppo.
#   bash recipes/toolcua_sft_rl/run_gpu.sh [main_ppo overrides of stages 2 and 3...]
# Env: MODEL [Qwen/Qwen2.5-1.5B-Instruct], N_GPUS [8], OUT, SEED, TEMPLATES [all four apps], the
# stage knobs below, SKIP_SFT / SKIP_RFT / SKIP_RL, TOOL_TERM (task | decision), RFT_ARGS,
# ATTENTION [flash_attention_2 where flash-attn imports, else sdpa].
# The settings are a starting point: this script is composition-checked on cpu
# (tests/test_recipe_scripts.py); on one H200 all three stages ran for three seeds of a 4-layer 256-wide
# random model (scripts/bench/toolcua_pipeline_study.py --backend gpu --parallel; docs/results.md, "GPU:
# ToolCUA pipeline study: all arms"); a 1000-step warm-up of 16 decisions (RFT_WARMUP_BATCH) + 20 GRPO
# steps brought the held-out decisions to T 0.73 / 0.01. REUSE_STAGES=1 resumes a pipeline at the stage that failed. Without flash-attn,
# verl-ext's logprob_row_blocks patch (on by default) is what
# makes a GRPO step of 32 x 8 decisions of the tiny model 16.5 s instead of ~250-290 s (docs/results.md).
# SFT_MAX_LENGTH (stages.sh, default 8192) bounds an SFT row: with the byte-level tokenizer of
# verl-ext make-tiny-model one of 256 transcripts took 8229 tokens (refused); 16384 ran.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
N_GPUS=${N_GPUS:-8}
SEED=${SEED:-0}
TEMPLATES=${TEMPLATES:-settings_panel,contacts_book,file_manager,inventory_sheet}
SFT_STEPS=${SFT_STEPS:-300}          # batch SFT_BATCH transcripts
SFT_BATCH=${SFT_BATCH:-32}
SFT_ROWS=${SFT_ROWS:-2048}
SFT_LR=${SFT_LR:-1e-5}
SFT_WARMUP=${SFT_WARMUP:-20}
SFT_EVAL_ROWS=${SFT_EVAL_ROWS:-0}    # verl-ext eval-sft decodes on one device: off by default here
RFT_STEPS=${RFT_STEPS:-50}
RFT_BATCH=${RFT_BATCH:-64}           # decisions per step (x RFT_N samples: GRPO groups)
RFT_N=${RFT_N:-8}
RFT_LR=${RFT_LR:-1e-6}
RFT_CHOICE_WEIGHT=${RFT_CHOICE_WEIGHT:-2}   # weight of R_choice (verl_ext/rewards/decision_reward.py; 0: off)
RFT_WARMUP_STEPS=${RFT_WARMUP_STEPS:-0}   # warm-up SFT steps on the switching steps before the RL half (0: none)
RFT_WARMUP_LR=${RFT_WARMUP_LR:-1e-5}
RFT_ROWS=${RFT_ROWS:-4096}
RFT_VAL_ROWS=${RFT_VAL_ROWS:-256}
RFT_PROMPT_LENGTH=${RFT_PROMPT_LENGTH:-8192}
RFT_RESPONSE_LENGTH=${RFT_RESPONSE_LENGTH:-512}
STEPS=${STEPS:-200}                  # online RL steps
RL_BATCH=${RL_BATCH:-64}
RL_N=${RL_N:-8}
RL_LR=${RL_LR:-1e-6}
RL_ROWS=${RL_ROWS:-4096}
RL_VAL_SIZE=${RL_VAL_SIZE:-128}
RL_PROMPT_LENGTH=${RL_PROMPT_LENGTH:-4096}
RL_RESPONSE_LENGTH=${RL_RESPONSE_LENGTH:-8192}
MAX_TURNS=${MAX_TURNS:-24}           # TextHybrid's reference plans take 4 to 19 steps
# each configuration its own folder: verl's file logger starts metrics.jsonl afresh (other knobs: set OUT)
OUT=${OUT:-$PWD/runs/toolcua_sft_rl_gpu/$(basename "$MODEL")-sft$SFT_STEPS-rft$RFT_STEPS-rl$STEPS-seed$SEED}
export RAY_DEDUP_LOGS=0

# Attention: flash-attn with verl's padding-free path where flash-attn is installed, else padded sdpa
# (verl's default, flash_attention_2, fails at model load without it; the offline GPU bundle has none).
ATTENTION=${ATTENTION:-$(python3 -c "import flash_attn" > /dev/null 2>&1 && echo flash_attention_2 || echo sdpa)}
case "$ATTENTION" in
flash_attention_2) REMOVE_PADDING=true ;;
sdpa) REMOVE_PADDING=false ;;
*) echo "verl-ext toolcua_sft_rl: ATTENTION must be flash_attention_2 or sdpa, got '$ATTENTION'" >&2; exit 2 ;;
esac

SFT_LAUNCH=(torchrun --standalone --nproc_per_node="$N_GPUS")
SFT_BACKEND=(model.enable_gradient_checkpointing=true model.use_remove_padding="$REMOVE_PADDING"
             +model.override_config.attn_implementation="$ATTENTION")
PPO_BACKEND=(
    actor_rollout_ref.model.use_remove_padding="$REMOVE_PADDING"
    +actor_rollout_ref.model.override_config.attn_implementation="$ATTENTION"
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.use_dynamic_bsz=true
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=49152
    actor_rollout_ref.rollout.agent.num_workers=8
    trainer.n_gpus_per_node="$N_GPUS"
    trainer.nnodes=1
)
# shellcheck source=recipes/toolcua_sft_rl/stages.sh
source "$HERE/stages.sh"
run_stages "$@"
