#!/usr/bin/env bash
# text_hybrid on the cpu backend: the when-to-switch study's recipe. The toolcua_hybrid recipe
# (Tool-Efficient Path Reward, step advantages, old-logit plugins) on the browserless text_hybrid
# apps, with the tiny random model answering one T/G decision per subgoal, trained by verl's own
# `python -m verl.trainer.main_ppo` on the cpu backend. A few minutes on 2 cores.
#   bash recipes/text_hybrid/run_cpu.sh [hydra overrides...]
#   SEED=0 STEPS=30 LR=3e-3 ADV=grpo|gigpo|hgpo|step_grouped|himac|hiper LOSS=vanilla|ppo_ewma \
#   MODE=sync|colocate_async PROVIDER=current|snapshot|ewma|... MODEL=<path> OUT=runs/... bash recipes/text_hybrid/run_cpu.sh
# The settings both backends share, and what ADV picks: train.sh.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BACKEND=cpu
BACKEND_ARGS=(+plugins/backend=cpu)
TINY_MODEL=()                        # verl-ext make-tiny-model's default: ~0.1M parameters
export VERL_PLATFORM=cpu             # the cpu platform is picked per process, before config is read
export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-60}  # loaded 2-core machines
# shellcheck source=recipes/text_hybrid/train.sh
source "$HERE/train.sh"
train "$@"
