#!/usr/bin/env bash
# Shared by run_<provider>.sh and run_separate_<provider>.sh: a toolcua_hybrid GPU script (BASE)
# with recipe/async_agentic.yaml on top and the old-logit provider given as the first argument.
#   bash recipes/async_agentic/async_common.sh <provider> [hydra overrides...]
# Env: MODE (colocate_async | separate_async [colocate_async]); separate_async: ROLLOUT_GPUS of the
# node's N_GPUS form the standalone rollout pool [half], the rest train. BASE (run_fsdp_qwen25_1p5b.sh |
# run_fsdp_qwen25vl_7b.sh in recipes/toolcua_hybrid), OUT, and everything BASE reads (MODEL, DATA_DIR, N_GPUS, ...).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PROVIDER=$1
shift
MODE=${MODE:-colocate_async}
BASE=${BASE:-run_fsdp_qwen25_1p5b.sh}
SETUP=${BASE#run_}
SETUP=${SETUP%.sh}                   # e.g. fsdp_qwen25_1p5b
recipes=toolcua_hybrid,async_agentic
pools=()
case "$MODE" in
colocate_async) ;;
separate_async)
    recipes=$recipes,separate_async
    N_GPUS=${N_GPUS:-8}
    ROLLOUT_GPUS=${ROLLOUT_GPUS:-$((N_GPUS / 2))}
    [ "$ROLLOUT_GPUS" -gt 0 ] && [ "$ROLLOUT_GPUS" -lt "$N_GPUS" ] || {
        echo "ROLLOUT_GPUS=$ROLLOUT_GPUS: the rollout pool takes 1..$((N_GPUS - 1)) of N_GPUS=$N_GPUS" >&2; exit 2; }
    export N_GPUS=$((N_GPUS - ROLLOUT_GPUS))   # what BASE gives the trainer
    pools=(actor_rollout_ref.rollout.n_gpus_per_node="$ROLLOUT_GPUS") ;;
*) echo "MODE=$MODE: choose colocate_async or separate_async" >&2; exit 2 ;;
esac
export OUT=${OUT:-$PWD/runs/async_agentic/$SETUP-$MODE-$PROVIDER}

exec bash "$HERE/../toolcua_hybrid/$BASE" \
    hydra.searchpath="[file://$HERE]" \
    "recipe=[$recipes]" \
    plugins/old_logits="$PROVIDER" \
    "${pools[@]}" \
    trainer.experiment_name="${SETUP}_${MODE}_$PROVIDER" \
    "$@"
