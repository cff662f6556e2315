#!/usr/bin/env bash
# async_agentic, old-logit provider `current`: verl's default: old log-probs recomputed with the current weights (staleness mixed into the IS correction).
#   bash recipes/async_agentic/run_current.sh [hydra overrides...]     (env: see async_common.sh)
exec bash "$(dirname "$0")/async_common.sh" current "$@"
