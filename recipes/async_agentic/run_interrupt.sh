#!/usr/bin/env bash
# async_agentic, old-logit provider `interrupt`: exact: at each weight sync, before the optimizer step, the trainer scores every segment vLLM generated since the last sync, aborted prefixes included.
#   bash recipes/async_agentic/run_interrupt.sh [hydra overrides...]     (env: see async_common.sh)
exec bash "$(dirname "$0")/async_common.sh" interrupt "$@"
