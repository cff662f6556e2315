#!/usr/bin/env bash
# async_agentic on separate pools (verl's separate_async), old-logit provider `dedicated`: exact: a forward-only copy of the policy in the trainer's dtype (on the actor's GPU; algorithm.old_logits.dedicated.gpu=own for a free one) scores each segment as vLLM returns it.
#   ROLLOUT_GPUS=4 bash recipes/async_agentic/run_separate_dedicated.sh [hydra overrides...]     (env: see async_common.sh)
MODE=separate_async exec bash "$(dirname "$0")/async_common.sh" dedicated "$@"
