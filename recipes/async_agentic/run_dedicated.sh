#!/usr/bin/env bash
# async_agentic, old-logit provider `dedicated`: exact: a forward-only copy of the policy in the trainer's dtype (on the actor's GPU; algorithm.old_logits.dedicated.gpu=own for a free one) scores each segment as vLLM returns it.
#   bash recipes/async_agentic/run_dedicated.sh [hydra overrides...]     (env: see async_common.sh)
exec bash "$(dirname "$0")/async_common.sh" dedicated "$@"
