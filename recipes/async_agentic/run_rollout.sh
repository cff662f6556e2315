#!/usr/bin/env bash
# async_agentic, old-logit provider `rollout`: the inference engine's log-probs (verl bypass mode; the loss switches to bypass_mode).
#   bash recipes/async_agentic/run_rollout.sh [hydra overrides...]     (env: see async_common.sh)
exec bash "$(dirname "$0")/async_common.sh" rollout "$@"
