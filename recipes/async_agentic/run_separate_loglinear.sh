#!/usr/bin/env bash
# async_agentic on separate pools (verl's separate_async), old-logit provider `loglinear`: AReaL's log-linear proxy, a negative control (a widened clip of the total ratio).
#   ROLLOUT_GPUS=4 bash recipes/async_agentic/run_separate_loglinear.sh [hydra overrides...]     (env: see async_common.sh)
MODE=separate_async exec bash "$(dirname "$0")/async_common.sh" loglinear "$@"
