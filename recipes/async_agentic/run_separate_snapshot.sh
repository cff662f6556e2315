#!/usr/bin/env bash
# async_agentic on separate pools (verl's separate_async), old-logit provider `snapshot`: exact: per-token old log-probs from host-RAM snapshots of the weights each token came from.
#   ROLLOUT_GPUS=4 bash recipes/async_agentic/run_separate_snapshot.sh [hydra overrides...]     (env: see async_common.sh)
MODE=separate_async exec bash "$(dirname "$0")/async_common.sh" snapshot "$@"
