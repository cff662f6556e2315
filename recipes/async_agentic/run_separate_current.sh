#!/usr/bin/env bash
# async_agentic on separate pools (verl's separate_async), old-logit provider `current`: verl's own anchor: the weights its sync window started from (exact only for that window's tokens).
#   ROLLOUT_GPUS=4 bash recipes/async_agentic/run_separate_current.sh [hydra overrides...]     (env: see async_common.sh)
MODE=separate_async exec bash "$(dirname "$0")/async_common.sh" current "$@"
