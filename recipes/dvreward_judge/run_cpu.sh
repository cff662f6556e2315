#!/usr/bin/env bash
# dvreward_judge on the cpu backend: the recipe's config (GRPO, every reward from DVReward) with the
# tiny random policy, trained by verl's own `python -m verl.trainer.main_ppo`; a judge server runs on
# 127.0.0.1 next to it and is stopped on exit. A few minutes on 2 cores.
#   bash recipes/dvreward_judge/run_cpu.sh [hydra overrides...]
#   STEPS=6 OUT=runs/... JUDGE_MODEL=/path/to/instruct-model bash recipes/dvreward_judge/run_cpu.sh
# The judge: by default `verl-ext judge-server --fake-answers cpu_judge_answers.json`, a rule-based
# stand-in served through the real HTTP/log-prob path (the tiny random model's vocabulary has no
# yes/no token, so it cannot judge). Its rules depend on the response (a "." or a "<" changes the
# quality answers) and fail every question about kites with HTTP 503, so some trajectories are
# flagged and kept out of training. JUDGE_MODEL=<dir> serves a transformers chat model instead.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=${STEPS:-6}
# each judge its own folder: verl's file logger starts metrics.jsonl afresh
OUT=${OUT:-$PWD/runs/dvreward_judge/judge-$(basename "${JUDGE_MODEL:-fake-answers}")-steps$STEPS}
export VERL_PLATFORM=cpu             # the cpu platform is picked per process, before config is read
export RAY_DEDUP_LOGS=0
export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-60}  # loaded 2-core machines
export VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl"   # verl's `file` logger: one JSON line per step

[ -f "$OUT/model/config.json" ] || verl-ext make-tiny-model "$OUT/model" --seed 0
verl-ext prepare-data dv_describe "$OUT/data" --train-size 64 --val-size 16

if [ -n "${JUDGE_MODEL:-}" ]; then
    JUDGE_ARGS=(--model "$JUDGE_MODEL" --device cpu)
else
    JUDGE_ARGS=(--fake-answers "$HERE/cpu_judge_answers.json")
fi
rm -f "$OUT/judge.port"
verl-ext judge-server "${JUDGE_ARGS[@]}" --served-model-name judge --port-file "$OUT/judge.port" \
    >"$OUT/judge.log" 2>&1 &
JUDGE_PID=$!
trap 'kill "$JUDGE_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1200); do   # up to 2 minutes for a model to load
    [ -f "$OUT/judge.port" ] && break
    kill -0 "$JUDGE_PID" 2>/dev/null || { cat "$OUT/judge.log" >&2; echo "judge-server exited" >&2; exit 1; }
    sleep 0.1
done
[ -f "$OUT/judge.port" ] || { echo "judge-server did not start in 2 minutes ($OUT/judge.log)" >&2; exit 1; }
JUDGE_URL="http://127.0.0.1:$(cat "$OUT/judge.port")/v1"
echo "judge: $JUDGE_URL (log: $OUT/judge.log)"

# 8 prompts x 4 rollouts per step, 4 questions each: 128 judge calls a step. One retry, quickly:
# the injected 503s are permanent, and a real outage should be flagged rather than waited out.
# A random model often scores the same on every rollout of a step: train on through such steps
# (verl-ext stops a run at a step without learning signal by default).
python -m verl.trainer.main_ppo --config-dir "$HERE" +recipe=dvreward_judge +plugins/backend=cpu \
    data.train_files="$OUT/data/train.parquet" \
    data.val_files="$OUT/data/val.parquet" \
    data.train_batch_size=8 \
    data.max_prompt_length=96 \
    data.max_response_length=16 \
    actor_rollout_ref.model.path="$OUT/model" \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    reward.reward_kwargs.dvreward.judge_url="$JUDGE_URL" \
    +reward.reward_kwargs.dvreward.max_retries=1 \
    +reward.reward_kwargs.dvreward.backoff_s=0.05 \
    trainer.logger='[console,file]' \
    trainer.experiment_name=grpo_dv_describe_cpu \
    trainer.default_local_dir="$OUT/checkpoints" \
    hydra.run.dir="$OUT/hydra" \
    trainer.total_training_steps="$STEPS" \
    trainer.save_freq=-1 \
    trainer.test_freq="$STEPS" \
    trainer.val_before_train=false \
    trainer.resume_mode=disable \
    +trainer.v1.verl_ext.stop_on_zero_signal=false \
    "$@"

echo
echo "verl-ext dvreward_judge (cpu) finished."
echo "  per-step metrics: $VERL_FILE_LOGGER_PATH (verl_ext/dvreward/*, verl_ext/invalid_reward/*)"
