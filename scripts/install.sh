#!/usr/bin/env bash
# Set up verl-ext in ./.venv on a fresh Debian machine.
#   bash scripts/install.sh           # torch, verl 0.9.1, verl-ext with the browser envs (+ Debian's
#                                     # chromium) and the judge: the quickstart
#   bash scripts/install.sh --test    # + test/benchmark and MCP extras
#   TORCH_INDEX_URL=<index> bash scripts/install.sh   # torch from that index (a CPU wheel index)
# Without TORCH_INDEX_URL, torch comes from pip's configured index; on Linux x86_64 PyPI's default
# torch wheel is the CUDA build (several GB, and it runs on a CPU too).
set -euo pipefail
cd "$(dirname "$0")/.."

extras="gui,judge"
if [ "${1:-}" = "--test" ]; then
    extras="dev,gui,judge,mcp"
fi
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "[install] chromium + chromium-driver from Debian (browser environments)"
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# torch first and pinned, so no dependency can pull a different (CUDA) build afterwards.
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    echo "[install] torch 2.13.0 from $TORCH_INDEX_URL"
    .venv/bin/pip install -q --index-url "$TORCH_INDEX_URL" torch==2.13.0
else
    echo "[install] torch 2.13.0 from pip's configured index (PyPI's Linux x86_64 wheel is the CUDA build," \
         "several GB; TORCH_INDEX_URL=<CPU wheel index> picks another)"
    .venv/bin/pip install -q torch==2.13.0
fi
echo "[install] torch build: $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
echo "[install] verl 0.9.1 + verl-ext[$extras]"
.venv/bin/pip install -q -e ".[$extras]"
.venv/bin/verl-ext doctor >/dev/null || { .venv/bin/verl-ext doctor; exit 1; }
echo "[install] done: . .venv/bin/activate"
