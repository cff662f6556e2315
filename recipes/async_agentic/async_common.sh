#!/usr/bin/env bash
# Shared by run_<provider>.sh: a toolcua_hybrid GPU script (BASE) with recipe/async_agentic.yaml
# on top and the old-logit provider given as the first argument.
#   bash recipes/async_agentic/async_common.sh <provider> [hydra overrides...]
# Env: BASE (run_fsdp_qwen25_1p5b.sh | run_fsdp_qwen25vl_7b.sh in recipes/toolcua_hybrid), OUT,
# and everything BASE reads (MODEL, DATA_DIR, N_GPUS, ...).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PROVIDER=$1
shift
BASE=${BASE:-run_fsdp_qwen25_1p5b.sh}
SETUP=${BASE#run_}
SETUP=${SETUP%.sh}                   # e.g. fsdp_qwen25_1p5b
export OUT=${OUT:-$PWD/runs/async_agentic/$SETUP-$PROVIDER}

exec bash "$HERE/../toolcua_hybrid/$BASE" \
    hydra.searchpath="[file://$HERE]" \
    'recipe=[toolcua_hybrid,async_agentic]' \
    plugins/old_logits="$PROVIDER" \
    trainer.experiment_name="${SETUP}_$PROVIDER" \
    "$@"
