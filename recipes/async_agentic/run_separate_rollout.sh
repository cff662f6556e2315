#!/usr/bin/env bash
# async_agentic on separate pools (verl's separate_async), old-logit provider `rollout`: the inference engine's log-probs (verl bypass mode; the loss switches to bypass_mode).
#   ROLLOUT_GPUS=4 bash recipes/async_agentic/run_separate_rollout.sh [hydra overrides...]     (env: see async_common.sh)
MODE=separate_async exec bash "$(dirname "$0")/async_common.sh" rollout "$@"
