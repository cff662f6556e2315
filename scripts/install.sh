#!/usr/bin/env bash
# Set up verl-ext in ./.venv on a fresh Debian machine.
#   bash scripts/install.sh           # torch (CPU build where available), verl 0.9.1, verl-ext with the
#                                     # browser envs (+ Debian's chromium) and the judge: the quickstart
#   bash scripts/install.sh --test    # + test/benchmark and MCP extras
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
echo "[install] torch 2.13.0"
.venv/bin/pip install -q torch==2.13.0
echo "[install] verl 0.9.1 + verl-ext[$extras]"
.venv/bin/pip install -q -e ".[$extras]"
.venv/bin/verl-ext doctor >/dev/null || { .venv/bin/verl-ext doctor; exit 1; }
echo "[install] done: . .venv/bin/activate"
