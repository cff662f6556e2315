#!/usr/bin/env bash
# async_agentic, old-logit provider `ewma`: PPO-EWMA: an fp32 EWMA of the training weights as the proximal policy, no extra forward.
#   bash recipes/async_agentic/run_ewma.sh [hydra overrides...]     (env: see async_common.sh)
exec bash "$(dirname "$0")/async_common.sh" ewma "$@"
