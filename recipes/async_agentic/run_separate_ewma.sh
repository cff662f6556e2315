#!/usr/bin/env bash
# async_agentic on separate pools (verl's separate_async), old-logit provider `ewma`: PPO-EWMA: an fp32 EWMA of the training weights as the proximal policy, no extra forward.
#   ROLLOUT_GPUS=4 bash recipes/async_agentic/run_separate_ewma.sh [hydra overrides...]     (env: see async_common.sh)
MODE=separate_async exec bash "$(dirname "$0")/async_common.sh" ewma "$@"
