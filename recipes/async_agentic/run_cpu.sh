#!/usr/bin/env bash
# async_agentic on the cpu backend: recipes/toolcua_hybrid/run_cpu.sh (tiny model, MiniDesk in
# headless Chromium, action menu) with recipe/async_agentic.yaml on top (verl's colocate_async
# trainer + verl-ext hooks) and the old-logit provider PROVIDER. Minutes on 2 cores.
#   PROVIDER=current|rollout|snapshot|ewma|loglinear bash recipes/async_agentic/run_cpu.sh [hydra overrides...]
# Everything else (OUT, STEPS, SEED, ADV, TEMPLATES) as in recipes/toolcua_hybrid/run_cpu.sh.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PROVIDER=${PROVIDER:-ewma}
if [ "${LOSS:-ppo_ewma}" != ppo_ewma ]; then
    # LOSS=vanilla removes the old-logit provider this recipe is about
    echo "async_agentic compares old-logit providers under the ppo_ewma loss; unset LOSS (got '$LOSS')" >&2
    exit 2
fi
export LOSS=ppo_ewma                 # toolcua_hybrid/run_cpu.sh defaults to vanilla (synchronous)
export OUT=${OUT:-$PWD/runs/async_agentic/cpu-$PROVIDER}

exec bash "$HERE/../toolcua_hybrid/run_cpu.sh" \
    hydra.searchpath="[file://$HERE]" \
    'recipe=[toolcua_hybrid,async_agentic]' \
    plugins/old_logits="$PROVIDER" \
    trainer.experiment_name="async_${PROVIDER}_cpu" \
    "$@"
