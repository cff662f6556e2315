#!/usr/bin/env bash
# async_agentic on the cpu backend: recipes/toolcua_hybrid/run_cpu.sh (tiny model, MiniDesk in
# headless Chromium, action menu) with recipe/async_agentic.yaml on top (verl's colocate_async
# trainer + verl-ext hooks, or with MODE=separate_async verl's separate_async trainer: a standalone
# hf replica on a fake GPU of its own, weights through host memory) and the old-logit provider
# PROVIDER. Minutes on 2 cores.
#   PROVIDER=current|rollout|snapshot|ewma|loglinear|dedicated|interrupt MODE=colocate_async|separate_async \
#       bash recipes/async_agentic/run_cpu.sh [hydra overrides...]
# Everything else (OUT, STEPS, SEED, ADV, TEMPLATES) as in recipes/toolcua_hybrid/run_cpu.sh.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PROVIDER=${PROVIDER:-ewma}
MODE=${MODE:-colocate_async}
if [ "${LOSS:-ppo_ewma}" != ppo_ewma ]; then
    # LOSS=vanilla removes the old-logit provider this recipe is about
    echo "async_agentic compares old-logit providers under the ppo_ewma loss; unset LOSS (got '$LOSS')" >&2
    exit 2
fi
recipes=toolcua_hybrid,async_agentic
pools=()
case "$MODE" in
colocate_async) ;;
separate_async)
    # one fake GPU each for the trainer and the standalone hf replica; the base script's batch of 8
    # prompts x 4 is two local updates of 4 prompts, 16 rows each
    recipes=$recipes,separate_async
    pools=(trainer.v1.separate_async.parameter_sync_step=2 actor_rollout_ref.rollout.n_gpus_per_node=1
           actor_rollout_ref.rollout.checkpoint_engine.backend=host_memory ray_kwargs.ray_init.num_gpus=2
           actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16) ;;
*) echo "MODE=$MODE: choose colocate_async or separate_async" >&2; exit 2 ;;
esac
export LOSS=ppo_ewma                 # toolcua_hybrid/run_cpu.sh defaults to vanilla (synchronous)
export OUT=${OUT:-$PWD/runs/async_agentic/cpu-$MODE-$PROVIDER-${ADV:-hgpo}-seed${SEED:-0}}

exec bash "$HERE/../toolcua_hybrid/run_cpu.sh" \
    hydra.searchpath="[file://$HERE]" \
    "recipe=[$recipes]" \
    plugins/old_logits="$PROVIDER" \
    "${pools[@]}" \
    trainer.experiment_name="async_${MODE}_${PROVIDER}_cpu" \
    "$@"
