#!/usr/bin/env bash
# async_agentic, old-logit provider `loglinear`: AReaL's log-linear proxy, a negative control (a widened clip of the total ratio).
#   bash recipes/async_agentic/run_loglinear.sh [hydra overrides...]     (env: see async_common.sh)
exec bash "$(dirname "$0")/async_common.sh" loglinear "$@"
