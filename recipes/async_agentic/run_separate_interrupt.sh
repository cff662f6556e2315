#!/usr/bin/env bash
# async_agentic on separate pools (verl's separate_async), old-logit provider `interrupt`: exact: right after each weight sync the trainer scores every segment of the version it ended (aborted prefixes included) under its copy of that version.
#   ROLLOUT_GPUS=4 bash recipes/async_agentic/run_separate_interrupt.sh [hydra overrides...]     (env: see async_common.sh)
MODE=separate_async exec bash "$(dirname "$0")/async_common.sh" interrupt "$@"
