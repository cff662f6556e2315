#!/usr/bin/env bash
# async_agentic, old-logit provider `snapshot`: exact: per-token old log-probs from host-RAM snapshots of the weights each token came from.
#   bash recipes/async_agentic/run_snapshot.sh [hydra overrides...]     (env: see async_common.sh)
exec bash "$(dirname "$0")/async_common.sh" snapshot "$@"
